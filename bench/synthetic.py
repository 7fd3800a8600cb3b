"""Synthetic programs of a chosen size, for timing passes.

Each block scales ``h``, adds its two halves (two slices feeding compute,
which an AOTI backend turns into free views) and concatenates them back; every
fiftieth block also returns a slice and a select of ``h``, so the graph holds
many views that need no copy and some outputs that do, as a model does.
"""

from __future__ import annotations

import torch
from torch import nn

NODES_PER_BLOCK = 6


class Blocks(nn.Module):
    def __init__(self, blocks: int):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        outputs = []
        h = x
        for i in range(self.blocks):
            h = h * 1.0001 + 0.5
            halves = h[:, :8] + h[:, 8:]
            h = torch.cat([halves, halves], dim=1)
            if i % 50 == 0:
                outputs += [h[:, :8], h[:, 3]]
        return tuple(outputs)


class ViewHeavyBlocks(nn.Module):
    """Every block slices, selects, expands and unsqueezes: many view copies for an AOTI backend to convert,
    each feeding compute; every twentieth block also returns a slice and a transpose."""

    def __init__(self, blocks: int):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        outputs = []
        h = x
        for i in range(self.blocks):
            row = h[:, 1:13]
            first = row.select(1, 0).unsqueeze(1).expand(-1, 12)
            h = torch.cat([row + first, h[:, :4] * 0.5], dim=1)
            if i % 20 == 0:
                outputs += [h[:, :8], h.transpose(0, 1)]
        return tuple(outputs)


VIEW_HEAVY_NODES_PER_BLOCK = 10


def export_view_heavy(nodes: int) -> torch.export.ExportedProgram:
    """An ATen program of about ``nodes`` nodes, most of them views."""
    return torch.export.export(
        ViewHeavyBlocks(max(1, nodes // VIEW_HEAVY_NODES_PER_BLOCK)), (torch.randn(4, 16),)
    )


def export_blocks(nodes: int) -> torch.export.ExportedProgram:
    """An ATen program of about ``nodes`` nodes."""
    return torch.export.export(Blocks(max(1, nodes // NODES_PER_BLOCK)), (torch.randn(4, 16),))

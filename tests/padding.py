"""Heads whose matmuls the device's benchmark may pad, and Inductor's ``pad_mm`` forced on the CPU as ground truth.

``pad_mm`` pads only CUDA matmuls, with Triton present, where a benchmark on the
device says the padded kernel is faster. ``forced_pad_mm`` opens its device and
Triton checks and sets ``force_shape_pad``, so that an AOTInductor compile on the
CPU takes the padded branch for every matmul it can pad: what a GPU whose
benchmark says "pad" compiles. It pads more than any device would (the
compute-bound test is skipped too): a program fixed for a device that would not
pad an output is not expected to hold under it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator
from unittest import mock

import torch
from torch import nn

VOCAB = 50257
"""GPT-2's vocabulary: odd, so the LM head's N is unaligned for every dtype."""
HIDDEN = 256
TOKENS = 128
"""A prefill of 128 tokens through a 256-wide head: arithmetic intensity 85, above half the machine balance of
any sm90 device (compute-bound: the benchmark decides)."""
ACTIONS, FEATURES, BATCH = 14, 256, 4
"""A small action head: bfloat16 with K > M and K > N, compute-bound below sm90 by Inductor's own rule."""


@contextlib.contextmanager
def forced_pad_mm() -> Iterator[None]:
    """Inductor's ``pad_mm`` pads every matmul it can, on the CPU too, for the compiles inside."""
    from torch._inductor.fx_passes import pad_mm

    with mock.patch.object(pad_mm, "check_device", lambda *args: True), \
            mock.patch.object(pad_mm, "has_triton", lambda *args, **kwargs: True), \
            torch._inductor.config.patch(force_shape_pad=True):
        yield


class Heads(nn.Module):
    """An LM prefill head over an odd vocabulary and a small robot action head, in one method."""

    def __init__(self):
        super().__init__()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.action_head = nn.Linear(FEATURES, ACTIONS)

    def forward(self, hidden, features):
        logits = self.lm_head(hidden)
        return {"logits": logits, "actions": self.action_head(features), "last": logits[:, -1, :]}


def heads_inputs(seed: int = 0) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, TOKENS, HIDDEN, generator=generator).to(torch.bfloat16),
        torch.randn(BATCH, FEATURES, generator=generator).to(torch.bfloat16),
    )


def export_heads() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(Heads().to(torch.bfloat16).eval(), heads_inputs())

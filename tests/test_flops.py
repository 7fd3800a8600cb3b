"""The FLOPs pushdown weighs are torch's own counter's for the ops it knows, one per element for the rest."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from strideguard.decide.pushdown import graph_flops, plan_pushdowns


class ConvThenHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.up = nn.ConvTranspose2d(4, 2, 2, stride=2)
        self.head = nn.Linear(2 * 12 * 12, 10)

    def forward(self, image, keys, queries):
        features = self.up(self.conv(image)).flatten(1)
        scores = torch.bmm(queries, keys.transpose(1, 2))
        return torch.relu(self.head(features)), scores


def test_gemms_and_convolutions_count_as_torchs_counter_counts_them_and_other_ops_per_element():
    inputs = (torch.randn(2, 3, 6, 6), torch.randn(2, 7, 5), torch.randn(2, 3, 5))
    model = ConvThenHead().eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        logits, _ = model(*inputs)
    program = torch.export.export(model, inputs)
    assert graph_flops(program.graph) == counter.get_total_flops() + logits.numel()  # the relu, one per element


def test_a_pushdown_through_a_gemm_saves_what_the_counter_says_the_cut_rows_cost():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(16, 40, bias=False)

        def forward(self, hidden):
            return self.head(hidden)[:, -1, :]

    hidden = torch.randn(2, 9, 16)
    program = torch.export.export(Head().eval(), (hidden,))
    (pushdown,) = plan_pushdowns(program.graph)
    with FlopCounterMode(display=False) as full:
        Head()(hidden)
    with FlopCounterMode(display=False) as cut:
        Head()(hidden[:, -1:, :])
    assert (pushdown.flops_before, pushdown.flops_after) == (full.get_total_flops(), cut.get_total_flops())

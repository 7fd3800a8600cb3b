"""What changed in Inductor between the torches strideguard is tested with, where the library depends on it.

Torch 2.13.0 (with ExecuTorch 1.5.1) and torch 2.14.1 alone (``make test-torch2.14``)
differ in how Inductor lowers a few ops: 2.14 lowers ``_efficientzerotensor`` as
computed values (an expand of a 0-d constant) and realizes a returned one
separately, where 2.13 calls it as a fallback kernel; ``normal.Tensor_Tensor``,
``normal_functional`` and ``nonzero_static`` change between a fallback and a
decomposition or lowering. Each is returned here with views of it, the base
returned and not, and checked against the installed torch's own lowering, so
each lane checks its own torch.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import strideguard
from strideguard import Action
from strideguard.program import density
from strideguard.compiler.oracle.lowering import lower_outputs
from strideguard.prove.proof import PROOF_KEY


class ChangedLowerings(nn.Module):
    def forward(self, x, mean, std):
        zeros = torch.ops.aten._efficientzerotensor.default([4, 6], dtype=torch.float32)
        hidden_zeros = torch.ops.aten._efficientzerotensor.default([4, 6], dtype=torch.float32)
        noise = torch.normal(mean, std)
        hidden_noise = torch.ops.aten.normal_functional.default(mean)
        picked = torch.nonzero_static(x > 0, size=5)
        return (
            zeros[:, :3], zeros, hidden_zeros[1:, 2:],       # 0-2 the zero tensor, returned and not
            noise[:, 1:], noise, noise.T, hidden_noise[::2],  # 3-6 normal.Tensor_Tensor, normal_functional
            picked[:, :1], picked,                           # 7-8 nonzero_static
            zeros + x,                                       # 9 compute that reads it
        )


def _program():
    inputs = (torch.randn(4, 6), torch.zeros(4, 6), torch.ones(4, 6))
    return torch.export.export(ChangedLowerings(), inputs)


@pytest.mark.lowers
def test_views_of_ops_whose_lowering_changed_are_predicted_by_the_installed_inductor():
    program = _program()
    report = strideguard.inspect(program)
    lowering = lower_outputs(program)
    for record, lowered in zip(report.outputs, lowering.outputs):
        needed = density.has_layout(lowered.shape, lowered.strides, record.target_dim_order) is not True
        copied = record.action is Action.COPY
        if record.in_target_layout is None:
            assert copied, f"[{record.index}] left to Inductor but not copied"
            continue
        assert tuple(record.strides) == tuple(lowered.strides), (
            f"[{record.index}] {record.cause}: predicted {record.strides}, torch {torch.__version__}'s Inductor "
            f"lowers {lowered.strides}"
        )
        assert copied == needed, f"[{record.index}] {record.cause}: copied {copied}, needed {needed}"


@pytest.mark.lowers
def test_every_output_lands_in_layout_on_the_installed_torch():
    program = _program()
    for fixed in (strideguard.densify_outputs(program), strideguard.densify_outputs(program, exact=True)):
        for index, lowered in enumerate(lower_outputs(fixed).outputs):
            order = density.identity_order(len(lowered.shape))
            assert density.has_layout(lowered.shape, lowered.strides, order) is True, (index, lowered.strides)
    proof = strideguard.densify_outputs(program, exact=True).graph_module.meta[PROOF_KEY]
    assert proof.rounds == 1

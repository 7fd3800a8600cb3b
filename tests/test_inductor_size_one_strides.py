"""A returned result's size-one dimensions come back with the strides Inductor's own graph gives them.

Inductor returns a graph output with the traced strides where they are
significant, and in its size-one dimensions with the strides its decomposed
graph traced for the node (``ir.try_match_insignificant_strides``). Its
``softmax`` decomposition lays a transposed input's result out in the input's
order where torch's kernel makes it contiguous, and every op reading it
inherits that: ``add(softmax(transpose(x)))`` of shape ``[1, 1, 4, 1]``,
traced ``(4, 4, 1, 1)``, comes back ``(4, 4, 1, 4)`` (found by ``make fuzz``
after pushdown, kept as
``regressions/pushdown-a-pointwise-of-a-transposed-piece-keeps-its-size-one-stride.json``).
Each result here is returned from one program, and the prediction is
checked, to the letter, against the installed Inductor's lowering: decided
(never left to Inductor), and copied exactly where it comes back strided.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import strideguard
from strideguard import Action
from strideguard.program import density
from strideguard.compiler.oracle.lowering import lower_outputs

READERS = {
    "softmax": lambda t: t.softmax(-1),
    "add of softmax (the fuzz's)": lambda t: t.softmax(-1) + 1.5,
    "mul of add of softmax": lambda t: (t.softmax(-1) + 1.5) * 2,
    "exp of log_softmax": lambda t: t.log_softmax(-1).exp(),
    "sum of two softmaxes": lambda t: t.softmax(-1) + t.softmax(-1).neg(),
    "neg of softmax, unsqueezed then computed on": lambda t: (t.softmax(-1).unsqueeze(0) * 3).neg(),
    "matrix product of softmax": lambda t: t.softmax(-1).squeeze(0) @ torch.ones(1, 3),
}
STRIDED = {"softmax", "add of softmax (the fuzz's)", "mul of add of softmax", "exp of log_softmax", "sum of two softmaxes"}
"""Those Inductor returns strided (torch 2.13 and 2.14 alike): all but the matrix product and the result
computed on after an ``unsqueeze``, as measured."""


class Readers(nn.Module):
    def forward(self, x, y):
        transposed = x.transpose(3, 2)  # [1, 1, 4, 1], strides (4, 4, 1, 4)
        wide = y.transpose(3, 2)  # [2, 3, 4, 5]: no size-one dimension, nothing to re-stride
        return tuple(reader(transposed) for reader in READERS.values()) + tuple(
            reader(wide) for name, reader in READERS.items() if "matrix" not in name
        )


@pytest.fixture(scope="module")
def program():
    return torch.export.export(Readers(), (torch.randn(1, 1, 1, 4), torch.randn(2, 3, 5, 4)))


def _names():
    return [f"{name} of a transposed [1, 1, 1, 4]" for name in READERS] + [
        f"{name} of a transposed [2, 3, 5, 4]" for name in READERS if "matrix" not in name
    ]


@pytest.mark.lowers
def test_size_one_strides_are_predicted_as_inductor_lowers_them(program):
    records = strideguard.inspect(program).outputs
    lowered = lower_outputs(program).outputs
    names = _names()
    assert len(names) == len(records) == len(lowered)
    strided = []
    for name, record, low in zip(names, records, lowered):
        assert record.in_target_layout is not None, f"{name}: left to Inductor ({record.explanation})"
        assert tuple(record.strides) == tuple(low.strides), f"{name}: predicted {record.strides}, lowered {low.strides}"
        needed = density.has_layout(low.shape, low.strides, record.target_dim_order) is not True
        assert (record.action is Action.COPY) == needed, f"{name}: copied {record.action}, needed {needed}"
        if needed:
            strided.append(name.split(" of a transposed")[0])
    assert set(strided) == STRIDED


@pytest.mark.lowers
def test_the_fixed_program_lowers_every_result_in_layout(program):
    fixed = strideguard.densify_outputs(program)
    lowered = lower_outputs(fixed).outputs
    for name, low in zip(_names(), lowered):
        assert density.has_layout(low.shape, low.strides, density.identity_order(len(low.shape))) is True, (
            f"{name}: {low.strides} after densify_outputs")
    inputs = (torch.randn(1, 1, 1, 4), torch.randn(2, 3, 5, 4))
    for want, got in zip(program.module()(*inputs), fixed.module()(*inputs)):
        assert torch.equal(want, got)


@pytest.mark.lowers
def test_past_its_budget_the_walk_leaves_the_result_to_inductor_and_it_is_copied(program, monkeypatch):
    """Working the values out is bounded (``INDUCTOR_VALUE_BUDGET`` nodes a plan): past it, a returned result
    with a size-one dimension is left to Inductor, copied, and the copy holds."""
    from strideguard.compiler.predictor import compiled_layout

    monkeypatch.setattr(compiled_layout, "INDUCTOR_VALUE_BUDGET", 1)
    records = strideguard.inspect(program).outputs
    names = _names()
    left = 0
    for name, record in zip(names, records):
        if 1 in record.shape:
            assert record.in_target_layout is None and record.action is Action.COPY, (name, record.explanation)
            assert "size-one dimensions" in record.explanation
            left += 1
        else:  # nothing to re-stride: the walk is not asked
            assert record.in_target_layout is not None, (name, record.explanation)
    assert left > len(READERS)
    fixed = lower_outputs(strideguard.densify_outputs(program)).outputs
    assert all(density.has_layout(low.shape, low.strides, density.identity_order(len(low.shape))) is True for low in fixed)

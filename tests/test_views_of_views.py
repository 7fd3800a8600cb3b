"""A view wrapped around a view that Inductor cannot unwrap to its storage comes back as a copy.

Inductor lowers ``diagonal``, ``unfold`` and a same-width ``view(dtype)`` by
wrapping their input whole; taken of a view that is not plain strides over a
buffer, the result can no longer be returned as a view, and Inductor copies it,
dense in the order of the traced strides (found by ``make fuzz``: a
``diagonal`` of a ``diagonal`` of an input, traced ``(21, 10)``, comes back
``(2, 1)``). Each chain here is returned from one program, over an input, a
weight and a matrix product, and the prediction is checked against the
installed Inductor's own lowering: the sealed ones decided (no copy where
Inductor's own is already dense), the others still views.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import strideguard
from strideguard import Action
from strideguard.program import density
from strideguard.compiler.oracle.lowering import lower_outputs

SEALED = {
    "diagonal of diagonal": lambda t: t.diagonal(0, 0, 1).diagonal(),
    "diagonal of a permuted diagonal": lambda t: t.diagonal(0, 0, 1).permute(2, 0, 1).diagonal(0, 1, 2),
    "unfold of unfold": lambda t: t.unfold(3, 2, 1).unfold(2, 2, 1),
    "diagonal of an unsqueezed diagonal": lambda t: t.diagonal(0, 0, 1).unsqueeze(0).diagonal(0, 1, 2),
    "dtype view of diagonal": lambda t: t.diagonal(0, 0, 1).view(torch.int32),
    "dtype view of a sliced diagonal": lambda t: t.diagonal(0, 0, 1)[1:].view(torch.int32),
    "expand of diagonal of diagonal": lambda t: t.diagonal(0, 0, 1).diagonal()[:1].expand(3, -1),
    "transpose of diagonal of diagonal": lambda t: t.diagonal(0, 0, 1).diagonal().t(),
    "detached squeeze of diagonals (the fuzz's)": lambda t: t.diagonal(0, 0, 2).diagonal().detach().squeeze(0),
}
VIEWS = {
    "diagonal": lambda t: t.diagonal(0, 2, 3),
    "slice of diagonal": lambda t: t.diagonal(0, 2, 3)[:, 1:],
    "diagonal of dtype view": lambda t: t.view(torch.int32).diagonal(0, 0, 1),
    "diagonal of a slice": lambda t: t[:, 1:].diagonal(0, 0, 1),
    "one element of diagonal of diagonal": lambda t: t[:1, :1].diagonal(0, 2, 3)[..., :1].diagonal(0, 0, 1),
}


class ViewsOfViews(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4, 5, 5))

    def forward(self, x, a, b):
        product = (a @ b).reshape(4, 4, 5, 5)
        outputs = []
        for base in (x, self.weight, product):
            outputs += [chain(base) for chain in SEALED.values()]
            outputs += [chain(base) for chain in VIEWS.values()]
        returned = x.diagonal(0, 2, 3)
        # Returned itself, the first diagonal is realized as a view: the one taken of it stays a view.
        outputs += [returned, returned.diagonal(0, 0, 1)]
        return tuple(outputs)


@pytest.fixture(scope="module")
def judged():
    program = torch.export.export(ViewsOfViews(), (torch.randn(4, 4, 5, 5), torch.randn(16, 25), torch.randn(25, 25)))
    return strideguard.inspect(program).outputs, lower_outputs(program).outputs


def _names():
    names = []
    for base in ("input", "weight", "matrix product"):
        names += [(f"{name} of the {base}", name in SEALED) for name in (*SEALED, *VIEWS)]
    return names + [("diagonal, returned", False), ("diagonal of a returned diagonal", False)]


@pytest.mark.lowers
def test_views_of_views_are_predicted_as_inductor_lowers_them(judged):
    records, lowered = judged
    names = _names()
    assert len(names) == len(records)
    sealed_seen = 0
    for (name, sealed), record, low in zip(names, records, lowered):
        needed = density.has_layout(low.shape, low.strides, record.target_dim_order) is not True
        if sealed and density.is_non_overlapping_and_dense(low.shape, low.strides) is True:
            sealed_seen += 1
            assert record.in_target_layout is not None, f"{name}: Inductor's copy is decided, left undecided"
        if record.in_target_layout is None:
            assert record.action is Action.COPY, f"{name}: undecided but not copied"
            continue
        assert tuple(record.strides) == tuple(low.strides), f"{name}: predicted {record.strides}, lowered {low.strides}"
        assert (record.action is Action.COPY) == needed, f"{name}: copied {record.action}, needed {needed}"
    assert sealed_seen >= 2 * len(SEALED)


class ViewPairBackToAStepSlice(nn.Module):
    def forward(self, x):
        return x.view(1, -1)[-2:1:3].reshape(-1).view(1, -1).to(torch.float32).view(1, 1, -1).to(torch.bfloat16)


@pytest.mark.lowers
def test_a_view_pair_inductor_undoes_leaves_the_reader_to_inductor():
    """``reshape(-1)`` then ``view(1, -1)`` gives back the shape of the step-3 slice they view: Inductor's
    ``pointless_view_pair`` replaces the pair with the slice, whose size-one stride is three times the
    traced one, and the ``to`` reading it keeps it, so the output came back ``(18, 6, 1)`` where the traced
    ``(6, 6, 1)`` was predicted and nothing copied (found by ``make fuzz`` on torch 2.13; torch 2.14 keeps
    ``(6, 6, 1)`` here, and the copy is then one too many)."""
    program = torch.export.export(ViewPairBackToAStepSlice(), (torch.randn(6, dtype=torch.float16),))
    [untouched] = lower_outputs(program).outputs
    assert untouched.strides in {(18, 6, 1), (6, 6, 1)}
    [report] = strideguard.inspect(program).outputs
    assert report.action is Action.COPY
    [fixed] = lower_outputs(strideguard.densify_outputs(program)).outputs
    assert fixed.strides == (6, 6, 1)

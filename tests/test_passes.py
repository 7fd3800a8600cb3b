"""One test per pass, in ExecuTorch's style: a tiny graph, the nodes before and after, a value check.

Each pass is run alone on a private copy of a small program's graph, with the
plan made by hand where it reads one, so that a test fails for the pass it
names. (``push_pieces_into_producers`` is tested per rule in
``test_pushdown_rules.py``.) Nothing here lowers or compiles.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from strideguard.decide.facts import analyze_outputs
from strideguard.decide.subject import subject_of
from strideguard.program.dialect import detach_retargets, Dialect, dialect_of, graph_ops
from strideguard.fix.passes.detach_copy_to_alias_copy import detach_copy_to_alias_copy
from strideguard.program.copies import CopyForm, copy_form_for
from strideguard.fix.passes.insert_output_copies import insert_output_copies
from strideguard.fix.passes.view_copies_to_views import convert_views
from strideguard.program.copies import COPY_TAG
from strideguard.program.exported import copy_graph, rebuild
from strideguard.decide.view_conversion import STRIDEGUARD, plan_view_conversion

from .conftest import needs_executorch

aten = torch.ops.aten


def targets(graph: torch.fx.Graph) -> list:
    return [node.target for node in graph.nodes if node.op == "call_function"]


def run(program, graph, *inputs):
    with torch.no_grad():
        return rebuild(program, graph).module()(*inputs)


class TransposeAndSum(nn.Module):
    def forward(self, x, counts):
        return x.t(), x + 1, counts.t()


def test_insert_output_copies_copies_exactly_the_outputs_it_is_told_to_in_a_form_inductor_keeps():
    x, counts = torch.randn(3, 4), torch.arange(12, dtype=torch.int32).reshape(3, 4)
    program = torch.export.export(TransposeAndSum(), (x, counts))
    graph = copy_graph(program)
    facts = analyze_outputs(graph, subject_of(program, "test"))
    assert [fact.copied for fact in facts] == [True, False, True]
    before = targets(graph)

    inserted = insert_output_copies(graph, facts, Dialect.ATEN, lambda node: node.meta["val"])

    assert len(inserted) == 2
    assert sorted(map(str, targets(graph))) == sorted(map(str, before + [
        aten.clone.default, aten.neg.default, aten.neg.default,
        aten.clone.default, aten.bitwise_not.default, aten.bitwise_not.default,
    ]))
    returned = graph.output_node().args[0]
    assert returned[0].target is aten.neg.default and returned[2].target is aten.bitwise_not.default
    assert all(node.meta["custom"][COPY_TAG] == CopyForm.KEPT.value for node in inserted)
    assert returned[1].target is aten.add.Tensor
    want, got = TransposeAndSum()(x, counts), run(program, graph, x, counts)
    for expected, value in zip(want, got):
        assert torch.equal(value, expected) and value.is_contiguous()


def test_a_dtype_with_no_involution_is_copied_by_a_clone_alone():
    assert copy_form_for(torch.empty(2, dtype=torch.float8_e4m3fn), Dialect.ATEN) is CopyForm.CLONE
    assert copy_form_for(torch.empty(2), Dialect.ATEN) is CopyForm.KEPT


class PieceAndDetach(nn.Module):
    def forward(self, x):
        return (x * 2)[:, :2], (x + 1).detach() * 3


@needs_executorch
def test_convert_views_retargets_the_planned_view_copies_and_replays_their_values():
    from strideguard.testing.executorch_cpu import aoti_edge_program

    x = torch.randn(3, 4)
    edge = aoti_edge_program(torch.export.export(PieceAndDetach(), (x,)), skip_dim_order=False)
    graph = copy_graph(edge)
    conversion = plan_view_conversion(graph, graph_ops(graph), STRIDEGUARD)
    planned = dict(conversion.targets)
    assert planned, "no view copy planned"
    copies_before = {node.name: node.target for node in planned}

    changed = convert_views(conversion)

    assert changed == len(planned)
    for node, view_op in planned.items():
        assert node.target is view_op and node.target is not copies_before[node.name]
        base = node.args[0].meta["val"]
        assert node.meta["val"].untyped_storage()._cdata == base.untyped_storage()._cdata, "not recomputed as a view"
    for expected, value in zip(PieceAndDetach()(x), run(edge, graph, x)):
        torch.testing.assert_close(value, expected, rtol=0, atol=0)


@needs_executorch
@pytest.mark.parametrize("skip_dim_order", [False, True], ids=["dim-order", "memory-format"])
def test_detach_copy_becomes_alias_copy_and_nothing_else_changes(skip_dim_order):
    from strideguard.testing.executorch_cpu import aoti_edge_program

    x = torch.randn(3, 4)
    edge = aoti_edge_program(torch.export.export(PieceAndDetach(), (x,)), skip_dim_order=skip_dim_order)
    assert dialect_of(edge).is_edge
    graph = copy_graph(edge)
    before = [str(t) for t in targets(graph)]
    assert any("detach_copy" in t for t in before), before

    changed = detach_copy_to_alias_copy(detach_retargets(graph_ops(graph), dialect_of(edge)))

    after = [str(t) for t in targets(graph)]
    assert changed == sum("detach_copy" in t for t in before)
    assert [t.replace("detach_copy", "alias_copy") for t in before] == after
    for expected, value in zip(PieceAndDetach()(x), run(edge, graph, x)):
        torch.testing.assert_close(value, expected, rtol=0, atol=0)

"""What the pass's speed work must not change, checked on every kept fuzz failure at once.

The kept records are the programs that once broke strideguard: the most
re-laid, aliased and oddly shaped graphs the project has. Combined into one
ATen program and its two Edge forms, they check two shortcuts against the
plain way of doing the same thing:

- ``compiler.predictor.relayout.RelaidNodes`` decides a node only when asked, inputs first,
  and remembers. Asked in any order it must give what one pass over the graph
  in order gives (the way ``relaid_nodes`` did it before).
- ``program.exported.copy_of_graph`` builds each node without its positional
  arguments and sets them after. It must give what ``copy.deepcopy`` of the
  graph gives (with the original names), and leave the graph it copies alone.
"""

from __future__ import annotations

import copy
import json
import operator
import random

import pytest
import torch

from strideguard.compiler.predictor import relayout
from strideguard.program.ops import is_view_op
from strideguard.program.exported import _keeping_names, copy_of_graph
from strideguard.program.dialect import graph_ops
from strideguard.decide.view_conversion import NO_CONVERSION, STRIDEGUARD, plan_view_conversion

from . import generated
from .conftest import HAS_EXECUTORCH


def _kept_specs() -> list[generated.ProgramSpec]:
    return [
        generated.ProgramSpec.from_json(json.loads(path.read_text())["spec"])
        for path in sorted(generated.REGRESSIONS.glob("*.json"))
    ]


@pytest.fixture(scope="module")
def kept_programs() -> list[tuple[str, torch.export.ExportedProgram]]:
    specs = _kept_specs()
    assert len(specs) >= 40
    programs = [("ATen", generated.export_combined(specs))]
    if HAS_EXECUTORCH:
        for skip_dim_order in (False, True):
            edge = generated.edge_program(generated.export_combined(specs), skip_dim_order=skip_dim_order)
            programs.append((f"Edge (skip_dim_order={skip_dim_order})", edge))
    return programs


def _relaid_in_one_pass(graph: torch.fx.Graph, conversion) -> set:
    """The old way: every node in graph order, each reading what its inputs were decided to be."""
    questions = conversion.relaid()  # only its per-node question, ``changed``
    reached, relaid = set(), set()
    for node in graph.nodes:
        if questions.changed(node):
            reached.add(node)
            continue
        if node.op != "call_function" or not any(source in reached for source in node.all_input_nodes):
            continue
        op = conversion.view_values.op_of(node)
        if relayout.lays_out_its_own_result(node, op):
            continue
        reached.add(node)
        if not (node.target is operator.getitem or (is_view_op(op) and not relayout._converts_dtype(node))):
            relaid.add(node)
    return relaid


def test_relaid_nodes_asked_in_any_order_give_what_one_pass_over_the_graph_gives(kept_programs):
    for name, program in kept_programs:
        graph = program.graph
        conversion = plan_view_conversion(graph, graph_ops(graph), STRIDEGUARD if "Edge" in name else NO_CONVERSION)
        expected = _relaid_in_one_pass(graph, conversion)
        assert expected, f"{name}: nothing re-laid, so the comparison proves nothing"
        nodes = list(graph.nodes)
        shuffled = nodes[:]
        random.Random(0).shuffle(shuffled)
        for order_name, order in (("graph order", nodes), ("reversed", nodes[::-1]), ("shuffled", shuffled)):
            relaid = conversion.relaid()
            found = {node for node in order if node in relaid}
            assert found == expected, (
                f"{name}, asked in {order_name}: {sorted(n.name for n in found ^ expected)} differ"
            )


def _described(graph: torch.fx.Graph) -> list[tuple]:
    return [
        (node.name, node.op, str(node.target), str(node.args), str(node.kwargs), node.type,
         [user.name for user in node.users], sorted(node.meta))
        for node in graph.nodes
    ]


class _Branches(torch.nn.Module):
    def forward(self, input, flag):  # noqa: A002 - a placeholder named after a builtin, which FX renames
        return torch.cond(flag.sum() > 0, lambda x: x.t() + 1, lambda x: x.t() - 1, (input,)), input[:, :2]


def test_the_graph_copy_is_what_deepcopy_gives_and_leaves_the_original_alone(kept_programs):
    unseen = torch.export.export(_Branches(), (torch.randn(3, 4), torch.ones(2)))
    for name, program in [*kept_programs, ("cond, an input named input", unseen)]:
        graph = program.graph
        before = _described(graph)
        # what the copy was before: torch's deepcopy, with the names FX renames (``input``) put back
        copied, reference = copy_of_graph(graph), _keeping_names(graph, copy.deepcopy(graph))
        assert _described(graph) == before, f"{name}: the copy changed the original"
        assert _described(copied) == _described(reference), name
        assert copied.python_code("self").src == reference.python_code("self").src, name
        copied.lint()
        for old, new in zip(graph.nodes, copied.nodes):
            assert new.meta is not old.meta, f"{name}: {old.name}'s metadata dict is shared"
            assert all(new.meta[key] is value for key, value in old.meta.items()), (
                f"{name}: {old.name}'s metadata values are not the original's (the fake values' storages tell views apart)"
            )

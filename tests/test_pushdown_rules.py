"""One case per pushdown rule, in ExecuTorch's style: a tiny graph, the nodes before and after, a value check.

Each case returns a piece of a value computed by the op under test. Where the
rule commutes, the fixed program runs that op on a smaller piece (every node
of the op computes fewer elements than the original's did), and the values
match the unfixed program's within the pushdown tolerance. Where it must not
(a reduction over the cut dimension, dropout in training, a piece spanning
two inputs of a ``cat``), the op still computes its full size. Nothing here
lowers or compiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import nn

import strideguard
from strideguard import PUSHDOWN_TOLERANCE
from strideguard.decide.pushdown import plan_pushdowns

aten = torch.ops.aten


class Lambda(nn.Module):
    def __init__(self, function: Callable, **parameters: torch.Tensor):
        super().__init__()
        self.function = function
        for name, value in parameters.items():
            self.register_parameter(name, nn.Parameter(value))

    def forward(self, *args):
        return self.function(self, *args)


@dataclass
class Case:
    name: str
    module: Callable[[], nn.Module]
    inputs: Callable[[], tuple]
    op: torch._ops.OpOverload
    pushed: bool = True

    def __str__(self) -> str:
        return self.name


def x3() -> tuple:
    return (torch.randn(2, 5, 8),)


def with_linear(function: Callable) -> Callable[[], nn.Module]:
    def build():
        module = Lambda(function)
        module.linear = nn.Linear(8, 6)
        return module

    return build


def plain(function: Callable, **parameters: Callable[[], torch.Tensor]) -> Callable[[], nn.Module]:
    return lambda: Lambda(function, **{name: make() for name, make in parameters.items()})


CASES = [
    Case("linear, a column cut narrows the weight", with_linear(lambda m, x: m.linear(x)[..., :3]), x3, aten.linear.default),
    Case("linear, a row cut narrows the input", with_linear(lambda m, x: m.linear(x)[:, -1]), x3, aten.linear.default),
    Case("addmm by rows", plain(lambda m, a: torch.addmm(m.b, a, m.w)[:2], w=lambda: torch.randn(4, 6), b=lambda: torch.randn(6)),
         lambda: (torch.randn(5, 4),), aten.addmm.default),
    Case("mm by columns", plain(lambda m, a: torch.mm(a, m.w)[:, 1:4], w=lambda: torch.randn(4, 6)),
         lambda: (torch.randn(5, 4),), aten.mm.default),
    Case("bmm by batch", lambda: Lambda(lambda m, a, b: torch.bmm(a, b)[1]),
         lambda: (torch.randn(3, 4, 5), torch.randn(3, 5, 2)), aten.bmm.default),
    Case("bmm by rows", lambda: Lambda(lambda m, a, b: torch.bmm(a, b)[:, -1]),
         lambda: (torch.randn(3, 4, 5), torch.randn(3, 5, 2)), aten.bmm.default),
    Case("layer_norm over another dimension", plain(lambda m, x: nn.functional.layer_norm(x * 2, (8,), m.w)[:, -1], w=lambda: torch.randn(8)),
         x3, aten.layer_norm.default),
    Case("layer_norm over the cut dimension", plain(lambda m, x: nn.functional.layer_norm(x * 2, (8,), m.w)[..., :3], w=lambda: torch.randn(8)),
         x3, aten.layer_norm.default, pushed=False),
    Case("rms_norm over another dimension", plain(lambda m, x: nn.functional.rms_norm(x * 2, (8,), m.w)[:, -1], w=lambda: torch.randn(8)),
         x3, aten.rms_norm.default),
    Case("softmax over another dimension", lambda: Lambda(lambda m, x: torch.softmax(x * 2, -1)[:, -1]), x3, aten.softmax.int),
    Case("softmax over the cut dimension", lambda: Lambda(lambda m, x: torch.softmax(x * 2, -1)[..., :3]), x3, aten.softmax.int, pushed=False),
    Case("sum keeping the cut dimension", lambda: Lambda(lambda m, x: (x * 2).sum(-1, keepdim=True)[:, -1]), x3, aten.sum.dim_IntList),
    Case("mean dropping a dimension before the cut", lambda: Lambda(lambda m, x: (x * 2).mean(1)[:, :3]), x3, aten.mean.dim),
    Case("amax keeping its dimension", lambda: Lambda(lambda m, x: (x * 2).amax(1, keepdim=True)[..., :3]), x3, aten.amax.default),
    Case("embedding by position", plain(lambda m, i: nn.functional.embedding(i, m.table)[:, -1], table=lambda: torch.randn(10, 8)),
         lambda: (torch.randint(0, 10, (2, 5)),), aten.embedding.default),
    Case("embedding by feature", plain(lambda m, i: nn.functional.embedding(i, m.table)[..., :3], table=lambda: torch.randn(10, 8)),
         lambda: (torch.randint(0, 10, (2, 5)),), aten.embedding.default),
    Case("a reshape that splits the last dimension", lambda: Lambda(lambda m, x: (x * 2).reshape(2, 5, 2, 4)[:, -1]), x3, aten.mul.Tensor),
    Case("a transpose", lambda: Lambda(lambda m, x: (x * 2).transpose(1, 2)[..., -1]), x3, aten.mul.Tensor),
    Case("a permute", lambda: Lambda(lambda m, x: (x * 2).permute(2, 0, 1)[:3]), x3, aten.mul.Tensor),
    Case("an unsqueeze", lambda: Lambda(lambda m, x: (x * 2).unsqueeze(1)[:, :, -1]), x3, aten.mul.Tensor),
    Case("a slice of a slice", lambda: Lambda(lambda m, x: (x * 2)[:, 1:4][:, -1]), x3, aten.mul.Tensor),
    Case("a select under the cut", lambda: Lambda(lambda m, x: (x * 2).select(2, 0)[:, -1]), x3, aten.mul.Tensor),
    Case("dropout outside training", lambda: Lambda(lambda m, x: aten.dropout.default(x * 2, 0.5, False)[:, -1]), x3, aten.mul.Tensor),
    Case("dropout in training", lambda: Lambda(lambda m, x: aten.dropout.default(x * 2, 0.5, True)[:, -1]), x3, aten.mul.Tensor,
         pushed=False),
    Case("cat along another dimension", lambda: Lambda(lambda m, x: torch.cat([x * 2, x + 1], dim=2)[:, -1]), x3, aten.mul.Tensor),
    Case("cat, the piece inside one input", lambda: Lambda(lambda m, x: torch.cat([x * 2, x + 1], dim=1)[:, 6:9]), x3, aten.add.Tensor),
    Case("cat, the piece across two inputs", lambda: Lambda(lambda m, x: torch.cat([x * 2, x + 1], dim=1)[:, 4:6]), x3, aten.cat.default,
         pushed=False),
    Case("a broadcast operand narrowed with it", plain(lambda m, x: (x * m.scale)[..., :3], scale=lambda: torch.randn(8)), x3,
         aten.mul.Tensor),
    Case("a split piece", lambda: Lambda(lambda m, x: torch.split(x * 2, 3, dim=2)[1]), x3, aten.mul.Tensor),
    Case("a conversion of dtype", lambda: Lambda(lambda m, x: (x * 2).to(torch.float16)[:, -1]), x3, aten.mul.Tensor),
]


def sizes_computed_by(program: torch.export.ExportedProgram, op: torch._ops.OpOverload) -> list[int]:
    return [n.meta["val"].numel() for n in program.graph.nodes if n.target is op and isinstance(n.meta.get("val"), torch.Tensor)]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_rule_moves_the_cut_into_its_op_or_leaves_it(case: Case):
    torch.manual_seed(0)
    module, inputs = case.module().eval(), case.inputs()
    program = torch.export.export(module, inputs)
    before = sizes_computed_by(program, case.op)
    assert before, f"the export has no {case.op}"
    fixed = strideguard.densify_outputs(program, pushdown=True)
    after = sizes_computed_by(fixed, case.op)
    if case.pushed:
        assert plan_pushdowns(program.graph), "no pushdown was planned"
        assert after and max(after) < min(before), f"{case.op} computes {after} elements, against {before} before"
    else:
        assert after == before, f"{case.op} was recomputed on a piece: {after} elements, against {before}"
    if case.name == "dropout in training":
        return  # its mask is drawn afresh on every call: no two runs agree
    want, got = program.module()(*inputs), fixed.module()(*inputs)
    torch.testing.assert_close(got, want, rtol=PUSHDOWN_TOLERANCE[0], atol=PUSHDOWN_TOLERANCE[1])


def test_every_rule_has_a_case():
    """Each rule function in the table carries a node of some case above into its pushed region (the
    ``matmul`` rule: the hand-built graph below)."""
    from strideguard.decide.pushdown import rules

    exercised = {rules._matmul}
    for case in CASES:
        if case.pushed:
            program = torch.export.export(case.module().eval(), case.inputs())
            exercised |= {rules.rule_for(node) for pushdown in plan_pushdowns(program.graph) for node in pushdown.region}
    missing = sorted(rule.__name__ for rule in set(rules._RULES.values()) - exercised)
    assert not missing, f"rules without a case: {missing}"


def test_planning_pushdowns_leaves_the_handed_graph_alone():
    """``make_plan`` applies pushdowns to a working copy it owns, never to the graph it is handed."""
    from strideguard.decide.subject import subject_of
    from strideguard.fix.engine import Choices, Pushdowns, program_plan
    from strideguard.decide.view_conversion import STRIDEGUARD

    case = CASES[0]
    program = torch.export.export(case.module().eval(), case.inputs())
    before = str(program.graph)
    plan = program_plan(subject_of(program, "test"), STRIDEGUARD, choices=Choices(pushdowns=Pushdowns.APPLIED))
    assert plan.pushdowns and plan.graph is not program.graph
    assert str(program.graph) == before


def test_matmul_which_export_decomposes_is_pushed_through_in_a_graph_that_keeps_it():
    """``torch.export`` turns ``matmul`` into ``mm``/``bmm``, but a graph built by a tool that keeps
    composite ops can hold it: the rule narrows the rows of the first operand."""
    from strideguard.program.dialect import Dialect
    from strideguard.fix.passes.push_pieces_into_producers import push_pieces_into_producers

    a, b = torch.randn(3, 4, 5), torch.randn(5, 6)
    graph = torch.fx.Graph()
    first, second = graph.placeholder("a"), graph.placeholder("b")
    first.meta["val"], second.meta["val"] = a, b
    product = graph.call_function(aten.matmul.default, (first, second))
    product.meta["val"] = torch.matmul(a, b)
    last = graph.call_function(aten.select.int, (product, 1, -1))
    last.meta["val"] = product.meta["val"][:, -1]
    graph.output((last,))
    want = torch.fx.GraphModule(nn.Module(), graph)(a, b)[0]
    (pushdown,) = plan_pushdowns(graph)
    push_pieces_into_producers(graph, [pushdown], Dialect.ATEN)
    (matmul,) = [n for n in graph.nodes if n.target is aten.matmul.default]
    assert tuple(matmul.meta["val"].shape) == (3, 1, 6)
    torch.testing.assert_close(torch.fx.GraphModule(nn.Module(), graph)(a, b)[0], want)

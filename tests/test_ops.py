"""The op families: every overload of a member belongs, an Edge op answers as its ATen op, anything else is refused."""

from __future__ import annotations

import operator

import pytest
import torch

from strideguard.program import ops

from .conftest import needs_executorch

aten = torch.ops.aten

FAMILIES = {
    name: family for name, family in vars(ops).items() if name.isupper() and isinstance(family, frozenset)
}


def _case(function, *shapes):
    return function, tuple(torch.randn(*shape) for shape in shapes)


REAL_GRAPHS = {
    # case: (what it computes, the ops its exported graphs carry for it: {dialect: [(op, family), ...]})
    "view": (_case(lambda x: x.view(-1) + 1, (4, 6)), {"aten": [("view", "RESHAPES")], "edge": [("view_copy", "RESHAPES")]}),
    "permute": (_case(lambda x: x.permute(1, 0) + 1, (4, 6)), {"aten": [("permute", "PERMUTES")], "edge": [("permute_copy", "PERMUTES")]}),
    "transpose": (_case(lambda x: x.transpose(0, 1) + 1, (4, 6)), {"aten": [("transpose", "TRANSPOSES")], "edge": [("permute_copy", "PERMUTES")]}),
    "t": (_case(lambda x: x.t() + 1, (4, 6)), {"aten": [("t", "MATRIX_TRANSPOSES")], "edge": [("permute_copy", "PERMUTES")]}),
    "unsqueeze": (_case(lambda x: x.unsqueeze(0) + 1, (4, 6)), {"aten": [("unsqueeze", "UNSQUEEZES")], "edge": [("unsqueeze_copy", "UNSQUEEZES")]}),
    "slice": (_case(lambda x: x[:, 1:3] + 1, (4, 6)), {"aten": [("slice", "SLICES")], "edge": [("slice_copy", "SLICES")]}),
    "select": (_case(lambda x: x[0] + 1, (4, 6)), {"aten": [("select", "SELECTS")], "edge": [("select_copy", "SELECTS")]}),
    "narrow": (_case(lambda x: x.narrow(1, 1, 2) + 1, (4, 6)), {"aten": [("narrow", "NARROWS")], "edge": [("slice_copy", "SLICES")]}),
    "split": (_case(lambda x: x.split(2, dim=1)[1] + 1, (4, 6)), {"aten": [("split", "SPLITS")], "edge": [("split_with_sizes_copy", "SPLITS")]}),
    "chunk": (_case(lambda x: x.chunk(3, dim=1)[2] + 1, (4, 6)), {"aten": [("chunk", "SPLITS")], "edge": [("split_with_sizes_copy", "SPLITS")]}),
    "unbind": (_case(lambda x: x.unbind(0)[1] + 1, (4, 6)), {"aten": [("unbind", "UNBINDS")], "edge": [("slice_copy", "SLICES")]}),
    "stack": (_case(lambda x: torch.stack([x, x]) + 1, (4, 6)), {"aten": [("stack", "CONCATENATIONS")], "edge": [("cat", "CONCATENATIONS"), ("view_copy", "RESHAPES")]}),
    "mm": (_case(lambda x, w: x @ w, (4, 6), (6, 5)), {"aten": [("matmul", "GEMMS")], "edge": [("mm", "GEMMS"), ("mm", "GEMM_KERNELS")]}),
    "linear": (_case(lambda x, w: torch.nn.functional.linear(x, w, torch.ones(5)), (4, 6), (5, 6)), {"aten": [("linear", "GEMMS")], "edge": [("permute_copy", "PERMUTES"), ("addmm", "GEMMS"), ("addmm", "GEMM_KERNELS")]}),
    "bmm": (_case(torch.bmm, (2, 3, 4), (2, 4, 5)), {"aten": [("bmm", "GEMMS"), ("bmm", "GEMM_KERNELS")], "edge": [("bmm", "GEMMS"), ("bmm", "GEMM_KERNELS")]}),
    "conv": (_case(torch.nn.functional.conv2d, (1, 3, 8, 8), (2, 3, 3, 3)), {"aten": [("conv2d", "CONVOLUTIONS")], "edge": [("convolution", "CONVOLUTIONS")]}),
    "detach": (_case(lambda x: (x + 1).detach() * 2, (4, 6)), {"aten": [("detach", "ALIASES")], "edge": [("alias_copy", "ALIASES")]}),
    "channels_last": (_case(lambda x: (x + 1).contiguous(memory_format=torch.channels_last), (1, 3, 8, 8)), {"aten": [], "edge": [("_clone_dim_order", "DIM_ORDER_COPIES")]}),
}
"""What each family holds, asked of the graphs torch.export and ExecuTorch's ``to_edge`` really make: ATen's
``contiguous`` and ``to`` stay themselves in an exported graph and are in no family (Inductor decomposes them)."""


class _Calls(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


def _families_carried(program) -> set:
    families = {**FAMILIES, "DIM_ORDER_COPIES": ops.dim_order_copies()}
    return {
        (ops.packet_of(node.target).__name__.split(".")[-1], name)
        for node in program.graph.nodes if node.op == "call_function" and ops.packet_of(node.target) is not None
        for name, family in families.items() if ops.in_family(node.target, family)
    }


@needs_executorch
@pytest.mark.parametrize("case", sorted(REAL_GRAPHS))
def test_each_family_holds_the_ops_real_graphs_carry_and_nothing_else(case):
    from executorch.exir import to_edge

    (function, args), expected = REAL_GRAPHS[case]
    aten_program = torch.export.export(_Calls(function), args)
    edge_program = to_edge(aten_program).exported_program()
    assert _families_carried(aten_program) == set(expected["aten"])
    dim_order_casts = {("_to_dim_order_copy", "DIM_ORDER_COPIES")}  # to_edge's own casts of the inputs
    assert _families_carried(edge_program) - dim_order_casts == set(expected["edge"])


@pytest.mark.parametrize(
    "op, family",
    [
        (aten.cat.default, ops.CONCATENATIONS),
        (aten.stack.default, ops.CONCATENATIONS),
        (aten.narrow.default, ops.NARROWS),
        (aten.narrow_copy.default, ops.NARROWS),
        (aten.slice.Tensor, ops.SLICES),
        (aten.slice_copy.Tensor, ops.SLICES),
        (aten.select_copy.int, ops.SELECTS),
        (aten.split.Tensor, ops.SPLITS),
        (aten.split_with_sizes_copy.default, ops.SPLITS),
        (aten.chunk.default, ops.SPLITS),
        (aten.unbind_copy.int, ops.UNBINDS),
        (aten.view_copy.default, ops.RESHAPES),
        (aten._unsafe_view.default, ops.RESHAPES),
        (aten.t_copy.default, ops.MATRIX_TRANSPOSES),
        (aten.addmm.default, ops.GEMMS),
        (aten.linear.default, ops.GEMMS),
        (aten._int_mm.default, ops.GEMM_KERNELS),
        (aten.conv2d.padding, ops.CONVOLUTIONS),
        (aten._convolution.deprecated, ops.CONVOLUTIONS),
        (aten._to_copy.default, ops.MEMORY_FORMAT_COPIES),
        (aten.detach_copy.default, ops.ALIASES),
    ],
)
def test_every_overload_of_a_member_belongs(op, family):
    assert ops.in_family(op, family)
    assert ops.packet_of(op) is op.overloadpacket


@pytest.mark.parametrize(
    "op, family",
    [
        (aten.narrow.default, ops.SLICES),
        (aten.slice.Tensor, ops.NARROWS),
        (aten.select.int, ops.UNBINDS),
        (aten.cat.default, ops.SPLITS),
        (aten.view.default, ops.PERMUTES),
        (aten.linear.default, ops.GEMM_KERNELS),
        (aten._int_mm.default, ops.GEMMS),
        (aten.mm.default, ops.CONVOLUTIONS),
        (aten.clone.default, ops.ALIASES),
    ],
)
def test_an_op_outside_a_family_is_refused(op, family):
    assert not ops.in_family(op, family)


@pytest.mark.parametrize("target", [operator.getitem, torch.add, aten.cat, None])
def test_a_target_that_is_no_op_overload_belongs_nowhere(target):
    assert ops.packet_of(target) is None
    assert not any(ops.in_family(target, family) for family in FAMILIES.values())


@needs_executorch
@pytest.mark.parametrize(
    "name, overload, family",
    [
        ("slice_copy", "Tensor", ops.SLICES),
        ("narrow_copy", "default", ops.NARROWS),
        ("cat", "default", ops.CONCATENATIONS),
        ("view_copy", "default", ops.RESHAPES),
    ],
)
def test_an_edge_op_answers_as_its_aten_op(name, overload, family):
    from executorch.exir.dialects._ops import ops as executorch_ops

    edge_op = getattr(getattr(executorch_ops.edge.aten, name), overload)
    assert ops.packet_of(edge_op) is getattr(aten, name)
    assert ops.in_family(edge_op, family)
    assert [ops.in_family(edge_op, f) for f in FAMILIES.values()] == [
        ops.in_family(getattr(getattr(aten, name), overload), f) for f in FAMILIES.values()
    ]


@needs_executorch
def test_dim_order_copies_are_found_once_executorch_registers_them(monkeypatch):
    from executorch.exir.dialects._ops import ops as executorch_ops

    monkeypatch.setattr(ops, "_dim_order_copies", None)
    monkeypatch.setattr(ops, "_DIM_ORDER_COPY_NAMES", ("_not_registered_yet",))
    assert ops.dim_order_copies() == frozenset()
    monkeypatch.undo()
    monkeypatch.setattr(ops, "_dim_order_copies", None)
    edge_clone = executorch_ops.edge.dim_order_ops._clone_dim_order.default
    assert ops.in_family(edge_clone, ops.dim_order_copies())
    assert ops.in_family(torch.ops.dim_order_ops._to_dim_order_copy.default, ops.dim_order_copies())
    assert not ops.in_family(aten.clone.default, ops.dim_order_copies())

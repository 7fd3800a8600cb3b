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


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_holds_ops_not_names(name):
    assert FAMILIES[name] and all(isinstance(op, torch._ops.OpOverloadPacket) for op in FAMILIES[name])


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

"""What pushdown reads off a node: its value, a size when it is static, its arguments by name, and
whether it computes anything (a view, an Edge view copy or a type check does not)."""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch
from torch.fx import Node
from torch.fx.operator_schemas import normalize_function

from ...program.dialect import aten_op
from ...program.ops import op_name

aten = torch.ops.aten


def op_label(node: Node) -> str:
    if node.target is operator.getitem:
        return "getitem"
    return op_name(node.target) or str(node.target)


def value_of(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def static_size(value: torch.Tensor, dim: int) -> Optional[int]:
    size = value.shape[dim]
    return size if type(size) is int else None


def tensor_of(node: Any) -> Optional[torch.Tensor]:
    value = value_of(node)
    return value if isinstance(value, torch.Tensor) else None


def arguments_of(node: Node) -> dict[str, Any]:
    """``node``'s arguments by name, defaults filled in, by torch's own normalisation (which names an op's
    ``self`` ``input``); empty where torch cannot name them, which no rule takes for an answer."""
    normalized = normalize_function(aten_op(node.target), node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    return normalized.kwargs if normalized is not None else {}


def slice_bounds(arguments: dict, size: Optional[int]) -> Optional[tuple[int, int, int]]:
    """A slice's ``start, end, step`` made concrete for a dimension of ``size``, as Python's slices are;
    ``None`` where a size or bound is symbolic."""
    start, end, step = arguments.get("start"), arguments.get("end"), arguments.get("step", 1)
    if size is None or not all(isinstance(v, (int, type(None))) for v in (start, end, step)):
        return None
    return slice(start, end, step).indices(size)


def positive_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def checks_only_its_type(node: Node) -> bool:
    """``_assert_tensor_metadata`` of a dtype or device (export writes one for ``.to``): it holds for the
    piece as for the whole, and moves with it."""
    if aten_op(node.target) is not aten._assert_tensor_metadata.default:
        return False
    arguments = arguments_of(node)
    return bool(arguments) and arguments.get("size") is None and arguments.get("stride") is None


def computes(node: Node) -> bool:
    """Not a view, nor an Edge view copy (which the AOTI backends turn back into a view)."""
    op = aten_op(node.target)
    if node.target is operator.getitem or not isinstance(op, torch._ops.OpOverload):
        return node.target is not operator.getitem
    return not (op.is_view or torch.Tag.view_copy in op.tags or checks_only_its_type(node))

"""The rules: how a narrowing of an op's output maps to narrowings of its inputs, one small function per
op family, keyed by overload (``rule_for``). A rule returns each tensor input edge with its narrowing
(``FULL``: read whole), or ``None`` where the op does not commute with the narrowing."""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional, Sequence

import torch
from torch.fx import Node

from .nodes import arguments_of, positive_dim, slice_bounds, static_size, tensor_of
from .pieces import FULL, Narrowing
from ...program import ops
from ...program.dialect import aten_op

aten = torch.ops.aten


Inputs = Optional[list[tuple[Node, Optional[Narrowing]]]]
"""Each tensor input edge with its narrowing (``FULL``: read whole), or ``None``: the op does not commute."""


def _broadcast(node: Node, narrowing: Narrowing, operands: Sequence[Any], batch_dims: int = 0) -> Inputs:
    """A narrowing of a broadcast result: each operand narrowed in the dimension aligned with it, or read
    whole where it has none or a size-one one. ``batch_dims`` trailing dimensions are not broadcast."""
    out = tensor_of(node)
    found = []
    for operand in operands:
        value = tensor_of(operand)
        if value is None:
            continue
        dim = narrowing.dim - (out.dim() - value.dim())
        if dim < 0 or (batch_dims and dim >= value.dim() - batch_dims):
            found.append((operand, FULL))
            continue
        size = value.shape[dim]
        if type(size) is int and size == 1 and static_size(out, narrowing.dim) != 1:
            found.append((operand, FULL))
        elif static_size(value, dim) is None:
            return None
        else:
            found.append((operand, narrowing.on(dim)))
    return found


def _tensor_nodes(node: Node) -> list[Node]:
    return [n for n in node.all_input_nodes if tensor_of(n) is not None]


def _pointwise(node: Node, narrowing: Narrowing) -> Inputs:
    return _broadcast(node, narrowing, _tensor_nodes(node))


def _linear(node: Node, narrowing: Narrowing) -> Inputs:
    arguments = arguments_of(node)
    x, weight, bias = arguments["input"], arguments["weight"], arguments.get("bias")
    out = tensor_of(node)
    if narrowing.dim == out.dim() - 1:
        found = [(x, FULL), (weight, narrowing.on(0))]
        if isinstance(bias, Node):
            found.append((bias, narrowing.on(0)))
        return found
    found = [(x, narrowing), (weight, FULL)]
    return found + ([(bias, FULL)] if isinstance(bias, Node) else [])


def _addmm(node: Node, narrowing: Narrowing) -> Inputs:
    bias, first, second = node.args[:3]
    rows = narrowing.dim == 0
    found = [(first, narrowing if rows else FULL), (second, FULL if rows else narrowing)]
    bias_value = tensor_of(bias)
    if bias_value is None:
        return found
    return found + _broadcast(node, narrowing, [bias])


def _mm(node: Node, narrowing: Narrowing) -> Inputs:
    first, second = node.args[:2]
    if narrowing.dim == 0:
        return [(first, narrowing), (second, FULL)]
    return [(first, FULL), (second, narrowing)]


def _bmm(node: Node, narrowing: Narrowing) -> Inputs:
    first, second = node.args[:2]
    return {
        0: [(first, narrowing), (second, narrowing)],
        1: [(first, narrowing), (second, FULL)],
        2: [(first, FULL), (second, narrowing)],
    }[narrowing.dim]


def _matmul(node: Node, narrowing: Narrowing) -> Inputs:
    first, second = node.args[:2]
    a, b, out = tensor_of(first), tensor_of(second), tensor_of(node)
    if a is None or b is None or a.dim() < 2 or b.dim() < 2:
        return None
    if narrowing.dim == out.dim() - 1:
        return [(first, FULL), (second, narrowing.on(b.dim() - 1))]
    if narrowing.dim == out.dim() - 2:
        return [(first, narrowing.on(a.dim() - 2)), (second, FULL)]
    return _broadcast(node, narrowing, [first, second], batch_dims=2)


def _normalization(node: Node, narrowing: Narrowing) -> Inputs:
    """``layer_norm``, ``native_layer_norm`` and ``rms_norm`` normalize their trailing dimensions."""
    arguments = arguments_of(node)
    x = arguments["input"]
    value = tensor_of(x)
    if narrowing.dim >= value.dim() - len(arguments["normalized_shape"]):
        return None
    others = [n for n in _tensor_nodes(node) if n is not x]
    return [(x, narrowing)] + [(n, FULL) for n in others]


def _softmax(node: Node, narrowing: Narrowing) -> Inputs:
    x, dim = node.args[:2]
    if positive_dim(dim, tensor_of(x).dim()) == narrowing.dim:
        return None
    return [(x, narrowing)]


def _reduction(node: Node, narrowing: Narrowing) -> Inputs:
    arguments = arguments_of(node)
    x = node.args[0]
    value = tensor_of(x)
    dims = arguments.get("dim")
    if dims is None or dims == []:
        return None
    dims = {positive_dim(d, value.dim()) for d in ([dims] if isinstance(dims, int) else dims)}
    if arguments.get("keepdim"):
        dim = narrowing.dim
    else:
        kept = [d for d in range(value.dim()) if d not in dims]
        dim = kept[narrowing.dim]
    if dim in dims:
        return None
    return [(x, narrowing.on(dim))]


def _embedding(node: Node, narrowing: Narrowing) -> Inputs:
    weight, indices = node.args[:2]
    if narrowing.dim == tensor_of(node).dim() - 1:
        return [(weight, narrowing.on(1)), (indices, FULL)]
    return [(weight, FULL), (indices, narrowing)]


def _view(node: Node, narrowing: Narrowing) -> Inputs:
    """A reshape where the narrowed dimension is one of the input's, or the outermost of those it splits into."""
    x = node.args[0]
    value, out = tensor_of(x), tensor_of(node)
    shape, sizes = list(out.shape), list(value.shape)
    if not all(type(s) is int for s in (*shape, *sizes)) or len(node.args) < 2:
        return None
    if not isinstance(node.args[1], (list, tuple)) or len(node.args[1]) != len(shape):
        return None
    before = math.prod(shape[: narrowing.dim])
    for dim in range(len(sizes)):
        if math.prod(sizes[:dim]) != before:
            continue
        if sizes[dim] == 1 and shape[narrowing.dim] != 1:
            continue
        inner = sizes[dim] // shape[narrowing.dim] if shape[narrowing.dim] else 0
        if inner < 1 or inner * shape[narrowing.dim] != sizes[dim]:
            return None
        ends = [math.prod(shape[: k + 1]) for k in range(narrowing.dim, len(shape))]
        if math.prod(sizes[: dim + 1]) not in ends:
            return None
        if inner == 1:
            return [(x, narrowing.on(dim))]
        if narrowing.step != 1:
            return None
        return [(x, narrowing.on(dim).scaled(inner))]
    return None


def _permute(node: Node, narrowing: Narrowing) -> Inputs:
    x = node.args[0]
    ndim = tensor_of(x).dim()
    if ops.in_family(node.target, ops.PERMUTES):
        order = [positive_dim(d, ndim) for d in node.args[1]]
        return [(x, narrowing.on(order[narrowing.dim]))]
    if ops.in_family(node.target, ops.MATRIX_TRANSPOSES):
        first, second = 0, ndim - 1
    else:
        first, second = (positive_dim(d, ndim) for d in node.args[1:3])
    swapped = {first: second, second: first}.get(narrowing.dim, narrowing.dim)
    return [(x, narrowing.on(swapped))]


def _unsqueeze(node: Node, narrowing: Narrowing) -> Inputs:
    x, dim = node.args[:2]
    dim = positive_dim(dim, tensor_of(node).dim())
    if dim == narrowing.dim:
        return None
    return [(x, narrowing.on(narrowing.dim if narrowing.dim < dim else narrowing.dim - 1))]


def _slice(node: Node, narrowing: Narrowing) -> Inputs:
    """A slice of a slice is a slice: along its own dimension the two compose, along another it passes."""
    x = node.args[0]
    value = tensor_of(x)
    arguments = arguments_of(node)
    dim = positive_dim(arguments.get("dim", 0), value.dim())
    if narrowing.dim != dim:
        return [(x, narrowing)]
    bounds = slice_bounds(arguments, static_size(value, dim))
    if bounds is None:
        return None
    start, _, step = bounds
    first = start + narrowing.start * step
    last = start + (narrowing.start + (narrowing.length - 1) * narrowing.step) * step
    return [(x, Narrowing(dim, first, last + 1, step * narrowing.step))]


def _select(node: Node, narrowing: Narrowing) -> Inputs:
    """A select keeps every other dimension: the narrowing moves to the same one of its input."""
    x = node.args[0]
    dim = positive_dim(arguments_of(node)["dim"], tensor_of(x).dim())
    return [(x, narrowing.on(narrowing.dim if narrowing.dim < dim else narrowing.dim + 1))]


def _dropout(node: Node, narrowing: Narrowing) -> Inputs:
    """Dropout outside training is the identity; in training its mask is drawn for the whole value."""
    if not is_identity_dropout(node):
        return None
    return [(node.args[0], narrowing)]


def is_identity_dropout(node: Node) -> bool:
    """A dropout told ``train=False``: it draws nothing, so, unlike FX's judgement of a seeded op, it may
    be removed once nothing reads it."""
    return ops.in_family(node.target, ops.DROPOUTS) and arguments_of(node).get("train") is False


def _cat(node: Node, narrowing: Narrowing) -> Inputs:
    """Along another dimension every input is narrowed; along the concatenated one, the narrowing must
    fall inside one input, which then stands for the whole ``cat`` (``passes_through``)."""
    tensors = node.args[0]
    dim = positive_dim(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0), tensor_of(node).dim())
    values = [tensor_of(t) for t in tensors]
    if any(v is None or v.dim() != tensor_of(node).dim() for v in values):
        return None
    if narrowing.dim != dim:
        return [(t, narrowing) for t in tensors]
    offset = 0
    for tensor, value in zip(tensors, values):
        size = static_size(value, dim)
        if size is None:
            return None
        if offset <= narrowing.start and narrowing.start + (narrowing.length - 1) * narrowing.step < offset + size:
            return [(tensor, narrowing.shifted(offset))]
        offset += size
    return None


def _first_output(node: Node, narrowing: Narrowing) -> Inputs:
    """``getitem(native_layer_norm(...), 0)``: the normalized value of a normalization nobody else reads."""
    parent, index = node.args
    if index != 0 or not isinstance(parent, Node) or aten_op(parent.target) not in _TUPLE_RULES:
        return None
    return [(parent, narrowing)]


_SAME_ELEMENTS = frozenset({
    aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.type_as.default, aten.contiguous.default,
    *(packet.default for packet in ops.MEMORY_FORMAT_COPIES | ops.ALIASES),
})
"""Ops whose result holds their input's elements, converted or as they are: a piece of the result is the op
applied to that piece (ExecuTorch's dim-order copies too, in ``rule_for``)."""

Rule = Callable[[Node, Narrowing], Inputs]

# By overload: another overload of the same op may read other arguments (``view.dtype``, ``to.other``,
# ``mean.default``) or give another dtype (``mm.dtype``).
_RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.linear.default: _linear,
    aten.addmm.default: _addmm,
    aten.mm.default: _mm,
    aten.bmm.default: _bmm,
    aten.matmul.default: _matmul,
    aten.layer_norm.default: _normalization,
    aten.rms_norm.default: _normalization,
    aten.softmax.int: _softmax,
    aten._softmax.default: _softmax,
    aten.log_softmax.int: _softmax,
    aten._log_softmax.default: _softmax,
    aten.sum.dim_IntList: _reduction,
    aten.mean.dim: _reduction,
    aten.amax.default: _reduction,
    aten.amin.default: _reduction,
    aten.embedding.default: _embedding,
    **{packet.default: _view for packet in ops.RESHAPES},
    **{packet.default: _permute for packet in ops.PERMUTES | ops.MATRIX_TRANSPOSES},
    **{packet.int: _permute for packet in ops.TRANSPOSES},
    **{packet.default: _unsqueeze for packet in ops.UNSQUEEZES},
    aten.cat.default: _cat,
    aten.dropout.default: _dropout,
    **{packet.Tensor: _slice for packet in ops.SLICES},
    **{packet.int: _select for packet in ops.SELECTS},
    **dict.fromkeys(_SAME_ELEMENTS, _pointwise),
}

_TUPLE_RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.native_layer_norm.default: _normalization,
}
"""Ops returning a tuple, pushed through when only their first output is read."""

def rule_for(node: Node) -> Optional[Rule]:
    """How ``node``'s op commutes with a narrowing, or ``None`` when it is not known to."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return _first_output
    op = aten_op(node.target)
    if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable:
        return None
    rule = _RULES.get(op) or _TUPLE_RULES.get(op)
    if rule is not None:
        return rule
    if op.overloadpacket in ops.dim_order_copies():
        return _pointwise
    if torch.Tag.pointwise in op.tags and torch.Tag.nondeterministic_seeded not in op.tags:
        return _pointwise
    return None


def passes_through(node: Node, narrowing: Narrowing) -> bool:
    """Whether the narrowed input stands for the node itself: a ``cat`` along the narrowed dimension is
    replaced by the one input holding the piece, and a slice along it is composed into its input's
    narrowing (applied again, it would cut the piece a second time)."""
    if aten_op(node.target) is aten.cat.default:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    elif ops.in_family(node.target, ops.SLICES):
        dim = arguments_of(node).get("dim")
        if dim is None:
            return False
    else:
        return False
    return positive_dim(dim, tensor_of(node).dim()) == narrowing.dim


def returns_a_tuple(node: Node) -> bool:
    """An op pushed through by its first output (``native_layer_norm``): its value is a tuple."""
    return aten_op(node.target) in _TUPLE_RULES

"""Return only what is returned: where a returned slice or select can move into its producers.

A method that returns ``lm_head(h)[:, -1, :]`` computes logits for every
position and keeps one; one that returns ``linear(h)[..., :14]`` computes 16
columns and keeps 14. Cutting the producers' inputs instead, as
``lm_head(h[:, -1:, :])`` or ``linear(h, W[:14], b[:14])``, gives the output
dense by construction, with no copy and less compute.

The plan is found from the graph alone, as data (``Pushdown`` records): for
each returned ``slice``, ``select``, ``narrow`` or ``split``/``chunk``/
``unbind`` piece, a demand (a ``Narrowing`` of a value's output) moves from
each node to its inputs through the ops where the narrowed result is exactly
the op applied to narrowed inputs (``_RULES``), in reverse graph order. A node
joins the pushed region only when every one of its users is in the region and
wants the same narrowing of it: a value that also feeds something else is
computed in full anyway, so recomputing a piece of it would add work. Where
the walk stops (an input, a weight, a reduction over the narrowed dimension,
attention over keys, a value with other users, an op not known to commute),
the narrowing is taken as a slice of that value, in the graph: a weight is
never copied into a new parameter.

``strideguard.passes.push_cuts_into_producers`` applies the plan; the costs
are counted here (``flops``): a GEMM as ``2·M·N·K``, any other op as one per
output element, a view as nothing.
"""

from __future__ import annotations

import heapq
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch.fx import Node

from . import ops
from .dialect import aten_op, op_name

aten = torch.ops.aten

PUSHED_DOWN = "strideguard_pushdown"
"""Key in a pushed node's ``meta["custom"]`` (kept by ``torch.export.save``): the pushdown that made it."""

FULL = None
"""An input an op reads whole (a broadcast operand, the weight of a row cut): not narrowed."""


@dataclass(frozen=True)
class Narrowing:
    """Elements ``start:end:step`` of dimension ``dim`` of a value, keeping the dimension."""

    dim: int
    start: int
    end: int
    step: int = 1

    @property
    def length(self) -> int:
        return max(0, (self.end - self.start + self.step - 1) // self.step)

    def on(self, dim: int) -> "Narrowing":
        return Narrowing(dim, self.start, self.end, self.step)

    def shifted(self, offset: int) -> "Narrowing":
        return Narrowing(self.dim, self.start - offset, self.end - offset, self.step)

    def scaled(self, inner: int) -> "Narrowing":
        """The same rows of a dimension whose elements are ``inner`` times as many (a merged view)."""
        return Narrowing(self.dim, self.start * inner, self.end * inner, 1)


@dataclass(frozen=True)
class ReturnedCut:
    """A returned piece of a value: ``narrowing`` of ``source``, with the dimension dropped for a select."""

    returned: Node
    """The node the program returns (the slice, select, or getitem of a split)."""
    source: Node
    narrowing: Narrowing
    drops_dim: bool
    text: str
    """How the program wrote it: ``select(dim=1, -1)``."""
    consumes: tuple[Node, ...] = ()
    """Nodes between ``source`` and ``returned`` (a split), removed with it."""


@dataclass(frozen=True)
class Pushdown:
    """One returned cut moved upstream: the producers recomputed on narrowed inputs, and where it stopped."""

    output: int
    """Position of the returned value in the graph's output node."""
    cut: ReturnedCut
    region: tuple[Node, ...]
    """Producers recomputed narrowed, in graph order."""
    narrowings: tuple[tuple[Node, Narrowing], ...]
    """The narrowing of each region node's output."""
    inputs: tuple[tuple[Node, Node, Optional[Narrowing]], ...]
    """(region node, input node, narrowing of the input or ``FULL``) for every input edge of the region."""
    flops_before: Optional[int]
    flops_after: Optional[int]

    @property
    def saved(self) -> Optional[float]:
        """The fraction of the region's FLOPs the pushdown saves."""
        if not self.flops_before or self.flops_after is None:
            return None
        return 1.0 - self.flops_after / self.flops_before

    @property
    def description(self) -> str:
        names = [_op_label(node) for node in reversed(self.region)]
        if len(names) == 1:
            return f"{self.cut.text} pushed into {names[0]}"
        return f"{self.cut.text} pushed through {', '.join(names[:-1])} into {names[-1]}"


def _op_label(node: Node) -> str:
    if node.target is operator.getitem:
        return "getitem"
    return op_name(node.target) or str(node.target)


def _value(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def _size(value: torch.Tensor, dim: int) -> Optional[int]:
    size = value.shape[dim]
    return size if type(size) is int else None


def _tensor(node: Any) -> Optional[torch.Tensor]:
    value = _value(node)
    return value if isinstance(value, torch.Tensor) else None


# ---------------------------------------------------------------------------------------------
# Returned cuts


def _functional_packet(target: Any) -> Optional[torch._ops.OpOverloadPacket]:
    """The op behind ``target`` when it returns its result; ``None`` for an ``out=`` overload, which writes
    into an argument, and for a target that is not an op."""
    op = aten_op(target)
    if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable:
        return None
    return op.overloadpacket


def returned_cut(node: Any) -> Optional[ReturnedCut]:
    """``node`` as a narrowing of another value, when it is a slice, select, narrow or split piece."""
    if not isinstance(node, Node) or node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return _piece(node)
    packet = _functional_packet(node.target)
    source = node.args[0] if node.args else None
    value = _tensor(source)
    if value is None or packet is None:
        return None
    arguments = _arguments(node)
    if packet in ops.SLICES:
        dim = _dim(arguments.get("dim", 0), value.dim())
        bounds = _slice_bounds(arguments, _size(value, dim))
        if bounds is None:
            return None
        start, end, step = bounds
        return ReturnedCut(node, source, Narrowing(dim, start, max(start, end), step), False,
                           f"slice(dim={arguments.get('dim', 0)}, {_range(arguments)})")
    if packet in ops.SELECTS or packet in ops.NARROWS:
        dim = _dim(arguments["dim"], value.dim())
        size = _size(value, dim)
        index = arguments.get("index", arguments.get("start"))
        if size is None or not isinstance(index, int):
            return None
        index = index + size if index < 0 else index
        if packet in ops.SELECTS:
            return ReturnedCut(node, source, Narrowing(dim, index, index + 1), True,
                               f"select(dim={arguments['dim']}, {arguments['index']})")
        length = arguments.get("length")
        if not isinstance(length, int):
            return None
        return ReturnedCut(node, source, Narrowing(dim, index, index + length), False,
                           f"narrow(dim={arguments['dim']}, {arguments['start']}, {length})")
    return None


def _piece(node: Node) -> Optional[ReturnedCut]:
    """A ``getitem`` of a split or unbind whose only used piece is this one."""
    parent, index = node.args
    if not isinstance(parent, Node) or parent.op != "call_function" or not isinstance(index, int):
        return None
    packet = _functional_packet(parent.target)
    unread = [user for user in parent.users if user is not node]
    if packet not in ops.SPLITS and packet not in ops.UNBINDS or any(user.users for user in unread):
        return None
    source = parent.args[0]
    value, pieces = _tensor(source), _value(parent)
    if value is None or not isinstance(pieces, (list, tuple)):
        return None
    arguments = _arguments(parent)
    dim = _dim(arguments.get("dim", 0), value.dim())
    if _size(value, dim) is None:
        return None
    if packet in ops.UNBINDS:
        return ReturnedCut(node, source, Narrowing(dim, index, index + 1), True,
                           f"unbind(dim={arguments.get('dim', 0)})[{index}]", consumes=(parent, *unread))
    sizes = [piece.shape[dim] for piece in pieces]
    if not all(type(s) is int for s in sizes):
        return None
    start = sum(sizes[:index])
    name = op_name(parent.target)
    return ReturnedCut(node, source, Narrowing(dim, start, start + sizes[index]), False,
                       f"{name}(dim={arguments.get('dim', 0)})[{index}]", consumes=(parent, *unread))


def _arguments(node: Node) -> dict[str, Any]:
    """``node``'s arguments by name, defaults filled in."""
    op = aten_op(node.target)
    schema = op._schema
    named = {}
    for position, argument in enumerate(schema.arguments):
        if position < len(node.args):
            named[argument.name] = node.args[position]
        elif argument.name in node.kwargs:
            named[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            named[argument.name] = argument.default_value
    return named


def _slice_bounds(arguments: dict, size: Optional[int]) -> Optional[tuple[int, int, int]]:
    """A slice's ``start, end, step`` made concrete for a dimension of ``size``, as Python's slices are;
    ``None`` where a size or bound is symbolic."""
    start, end, step = arguments.get("start"), arguments.get("end"), arguments.get("step", 1)
    if size is None or not all(isinstance(v, (int, type(None))) for v in (start, end, step)):
        return None
    return slice(start, end, step).indices(size)


def _dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def _range(arguments: dict) -> str:
    start, end, step = arguments.get("start"), arguments.get("end"), arguments.get("step", 1)
    text = f"{'' if start is None else start}:{'' if end is None or end >= 2**62 else end}"
    return text + (f":{step}" if step != 1 else "")


# ---------------------------------------------------------------------------------------------
# Rules: how a narrowing of an op's output maps to narrowings of its inputs


Inputs = Optional[list[tuple[Node, Optional[Narrowing]]]]
"""Each tensor input edge with its narrowing (``FULL``: read whole), or ``None``: the op does not commute."""


def _broadcast(node: Node, narrowing: Narrowing, operands: Sequence[Any], batch_dims: int = 0) -> Inputs:
    """A narrowing of a broadcast result: each operand narrowed in the dimension aligned with it, or read
    whole where it has none or a size-one one. ``batch_dims`` trailing dimensions are not broadcast."""
    out = _tensor(node)
    found = []
    for operand in operands:
        value = _tensor(operand)
        if value is None:
            continue
        dim = narrowing.dim - (out.dim() - value.dim())
        if dim < 0 or (batch_dims and dim >= value.dim() - batch_dims):
            found.append((operand, FULL))
            continue
        size = value.shape[dim]
        if type(size) is int and size == 1 and _size(out, narrowing.dim) != 1:
            found.append((operand, FULL))
        elif _size(value, dim) is None:
            return None
        else:
            found.append((operand, narrowing.on(dim)))
    return found


def _tensor_nodes(node: Node) -> list[Node]:
    return [n for n in node.all_input_nodes if _tensor(n) is not None]


def _pointwise(node: Node, narrowing: Narrowing) -> Inputs:
    return _broadcast(node, narrowing, _tensor_nodes(node))


def _linear(node: Node, narrowing: Narrowing) -> Inputs:
    arguments = _arguments(node)
    x, weight, bias = arguments["input"], arguments["weight"], arguments.get("bias")
    out = _tensor(node)
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
    bias_value = _tensor(bias)
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
    a, b, out = _tensor(first), _tensor(second), _tensor(node)
    if a is None or b is None or a.dim() < 2 or b.dim() < 2:
        return None
    if narrowing.dim == out.dim() - 1:
        return [(first, FULL), (second, narrowing.on(b.dim() - 1))]
    if narrowing.dim == out.dim() - 2:
        return [(first, narrowing.on(a.dim() - 2)), (second, FULL)]
    return _broadcast(node, narrowing, [first, second], batch_dims=2)


def _normalization(node: Node, narrowing: Narrowing) -> Inputs:
    """``layer_norm``, ``native_layer_norm`` and ``rms_norm`` normalize their trailing dimensions."""
    arguments = _arguments(node)
    x = arguments["input"]
    value = _tensor(x)
    if narrowing.dim >= value.dim() - len(arguments["normalized_shape"]):
        return None
    others = [n for n in _tensor_nodes(node) if n is not x]
    return [(x, narrowing)] + [(n, FULL) for n in others]


def _softmax(node: Node, narrowing: Narrowing) -> Inputs:
    x, dim = node.args[:2]
    if _dim(dim, _tensor(x).dim()) == narrowing.dim:
        return None
    return [(x, narrowing)]


def _reduction(node: Node, narrowing: Narrowing) -> Inputs:
    arguments = _arguments(node)
    x = node.args[0]
    value = _tensor(x)
    dims = arguments.get("dim")
    if dims is None or dims == []:
        return None
    dims = {_dim(d, value.dim()) for d in ([dims] if isinstance(dims, int) else dims)}
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
    if narrowing.dim == _tensor(node).dim() - 1:
        return [(weight, narrowing.on(1)), (indices, FULL)]
    return [(weight, FULL), (indices, narrowing)]


def _view(node: Node, narrowing: Narrowing) -> Inputs:
    """A reshape where the narrowed dimension is one of the input's, or the outermost of those it splits into."""
    x = node.args[0]
    value, out = _tensor(x), _tensor(node)
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
    ndim = _tensor(x).dim()
    if ops.in_family(node.target, ops.PERMUTES):
        order = [_dim(d, ndim) for d in node.args[1]]
        return [(x, narrowing.on(order[narrowing.dim]))]
    if ops.in_family(node.target, ops.MATRIX_TRANSPOSES):
        first, second = 0, ndim - 1
    else:
        first, second = (_dim(d, ndim) for d in node.args[1:3])
    swapped = {first: second, second: first}.get(narrowing.dim, narrowing.dim)
    return [(x, narrowing.on(swapped))]


def _unsqueeze(node: Node, narrowing: Narrowing) -> Inputs:
    x, dim = node.args[:2]
    dim = _dim(dim, _tensor(node).dim())
    if dim == narrowing.dim:
        return None
    return [(x, narrowing.on(narrowing.dim if narrowing.dim < dim else narrowing.dim - 1))]


def _slice(node: Node, narrowing: Narrowing) -> Inputs:
    """A slice of a slice is a slice: along its own dimension the two compose, along another it passes."""
    x = node.args[0]
    value = _tensor(x)
    arguments = _arguments(node)
    dim = _dim(arguments.get("dim", 0), value.dim())
    if narrowing.dim != dim:
        return [(x, narrowing)]
    bounds = _slice_bounds(arguments, _size(value, dim))
    if bounds is None:
        return None
    start, _, step = bounds
    first = start + narrowing.start * step
    last = start + (narrowing.start + (narrowing.length - 1) * narrowing.step) * step
    return [(x, Narrowing(dim, first, last + 1, step * narrowing.step))]


def _select(node: Node, narrowing: Narrowing) -> Inputs:
    """A select keeps every other dimension: the narrowing moves to the same one of its input."""
    x = node.args[0]
    dim = _dim(_arguments(node)["dim"], _tensor(x).dim())
    return [(x, narrowing.on(narrowing.dim if narrowing.dim < dim else narrowing.dim + 1))]


def _dropout(node: Node, narrowing: Narrowing) -> Inputs:
    """Dropout outside training is the identity; in training its mask is drawn for the whole value."""
    if not is_identity_dropout(node):
        return None
    return [(node.args[0], narrowing)]


def is_identity_dropout(node: Node) -> bool:
    """A dropout told ``train=False``: it draws nothing, so, unlike FX's judgement of a seeded op, it may
    be removed once nothing reads it."""
    return ops.in_family(node.target, ops.DROPOUTS) and _arguments(node).get("train") is False


def _cat(node: Node, narrowing: Narrowing) -> Inputs:
    """Along another dimension every input is narrowed; along the concatenated one, the narrowing must
    fall inside one input, which then stands for the whole ``cat`` (``CAT_PASSES_THROUGH``)."""
    tensors = node.args[0]
    dim = _dim(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0), _tensor(node).dim())
    values = [_tensor(t) for t in tensors]
    if any(v is None or v.dim() != _tensor(node).dim() for v in values):
        return None
    if narrowing.dim != dim:
        return [(t, narrowing) for t in tensors]
    offset = 0
    for tensor, value in zip(tensors, values):
        size = _size(value, dim)
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

CAT_PASSES_THROUGH = "cat"


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
    """A ``cat`` along the narrowed dimension is replaced by the one input holding the piece."""
    if aten_op(node.target) is not aten.cat.default:
        return False
    dim = _dim(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0), _tensor(node).dim())
    return dim == narrowing.dim


# ---------------------------------------------------------------------------------------------
# The walk


def plan_pushdown(position: int, cut: ReturnedCut, order: dict[Node, int]) -> Optional[Pushdown]:
    """How far ``cut`` moves upstream; ``None`` when no producer can be recomputed on a smaller piece.

    ``order`` is each node's position in the graph: nodes are visited latest first, so every user of a node
    has been decided before the node itself."""
    whole = Narrowing(cut.narrowing.dim, 0, _size(_tensor(cut.source), cut.narrowing.dim) or -1)
    if cut.narrowing == whole:
        return None
    consumers = {cut.returned, *cut.consumes}
    reader = cut.consumes[0] if cut.consumes else cut.returned
    wanted: dict[Node, list[tuple[Node, Optional[Narrowing]]]] = {cut.source: [(reader, cut.narrowing)]}
    region: list[Node] = []
    narrowings: dict[Node, Narrowing] = {}
    edges: dict[Node, list[tuple[Node, Optional[Narrowing]]]] = {}
    frontier, queued = [(-order[cut.source], cut.source)], {cut.source}
    while frontier:
        node = heapq.heappop(frontier)[1]
        wants = wanted[node]
        narrowing = wants[0][1]
        users_in_region = all(u in consumers or u in narrowings or checks_only_its_type(u) for u in node.users)
        if narrowing is FULL or not users_in_region or any(n != narrowing for _, n in wants):
            continue
        rule = rule_for(node)
        if rule is None or _tensor(node) is None and aten_op(node.target) not in _TUPLE_RULES:
            continue
        if _tensor(node) is not None and _size(_tensor(node), narrowing.dim) is None:
            continue
        try:
            inputs = rule(node, narrowing)
        except (IndexError, KeyError, TypeError, ValueError):
            inputs = None
        if inputs is None or _reads_one_value_two_ways(inputs):
            continue
        region.append(node)
        narrowings[node] = narrowing
        edges[node] = inputs
        for source, wanted_narrowing in inputs:
            wanted.setdefault(source, []).append((node, wanted_narrowing))
            if source not in queued:
                queued.add(source)
                heapq.heappush(frontier, (-order[source], source))
    if not any(_computes(node) for node in region):
        return None
    region.sort(key=order.__getitem__)
    before, after = _flops(region, narrowings)
    if before is not None and after is not None and after >= before:
        return None
    return Pushdown(
        output=position,
        cut=cut,
        region=tuple(region),
        narrowings=tuple((node, narrowings[node]) for node in region),
        inputs=tuple((node, source, n) for node in region for source, n in edges[node]),
        flops_before=before,
        flops_after=after,
    )


def checks_only_its_type(node: Node) -> bool:
    """``_assert_tensor_metadata`` of a dtype or device (export writes one for ``.to``): it holds for the
    piece as for the whole, and moves with it."""
    if aten_op(node.target) is not aten._assert_tensor_metadata.default:
        return False
    arguments = _arguments(node)
    return arguments.get("size") is None and arguments.get("stride") is None


def _reads_one_value_two_ways(inputs: Sequence[tuple[Node, Optional[Narrowing]]]) -> bool:
    """``mm(a, a)`` narrowed by rows reads ``a`` narrowed and whole: not rewritten."""
    seen: dict[Node, Optional[Narrowing]] = {}
    for source, narrowing in inputs:
        if seen.setdefault(source, narrowing) != narrowing:
            return True
    return False


def _computes(node: Node) -> bool:
    """Not a view, nor an Edge view copy (which the AOTI backends turn back into a view)."""
    op = aten_op(node.target)
    if node.target is operator.getitem or not isinstance(op, torch._ops.OpOverload):
        return node.target is not operator.getitem
    return not (op.is_view or torch.Tag.view_copy in op.tags or checks_only_its_type(node))


def plan_pushdowns(graph: torch.fx.Graph) -> tuple[Pushdown, ...]:
    """A pushdown for every returned cut that can move into at least one producer."""
    found = []
    seen = set()
    order: Optional[dict[Node, int]] = None
    for position, value in enumerate(graph.output_node().args[0]):
        cut = returned_cut(value)
        if cut is None or value in seen or len(value.users) != 1:
            continue
        seen.add(value)
        if order is None:
            order = {node: index for index, node in enumerate(graph.nodes)}
        pushdown = plan_pushdown(position, cut, order)
        if pushdown is not None:
            found.append(pushdown)
    return tuple(found)


def was_pushed_down(graph: torch.fx.Graph) -> bool:
    """Whether a pushdown made any of ``graph``'s nodes (its values may then differ by rounding)."""
    return any(PUSHED_DOWN in node.meta.get("custom", {}) for node in graph.nodes)


# ---------------------------------------------------------------------------------------------
# Cost


_COUNTED_AS_GEMMS = frozenset(packet.default for packet in ops.GEMMS)
_BIAS_FIRST = frozenset({aten.addmm.default, aten.baddbmm.default})


def flops(node: Node, shape: Optional[Sequence[int]] = None) -> Optional[int]:
    """``node``'s cost at its output ``shape`` (its own by default): ``2·(output elements)·K`` for a GEMM,
    one per output element for any other op, nothing for a view; ``None`` where a size is symbolic."""
    value = _value(node)
    if isinstance(value, (list, tuple)):
        value = value[0] if value and isinstance(value[0], torch.Tensor) else None
    if not isinstance(value, torch.Tensor) or not _computes(node):
        return 0
    shape = list(value.shape) if shape is None else list(shape)
    elements = _int(math.prod(shape)) if shape else 1
    if elements is None:
        return None
    op = aten_op(node.target)
    if op in _COUNTED_AS_GEMMS:
        first = _tensor(node.args[1] if op in _BIAS_FIRST else node.args[0])
        contracted = _int(first.shape[-1]) if first is not None and first.dim() else None
        return None if contracted is None else 2 * elements * contracted
    return elements


def graph_flops(graph: torch.fx.Graph) -> Optional[int]:
    """The cost of every op in ``graph``, counted as ``flops`` does; ``None`` where a size is symbolic."""
    total = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        cost = flops(node)
        if cost is None:
            return None
        total += cost
    return total


def _int(size: Any) -> Optional[int]:
    if type(size) is int:
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return int(hint) if hint is not None else None


def _flops(region: Sequence[Node], narrowings: dict) -> tuple[Optional[int], Optional[int]]:
    before = after = 0
    for node in region:
        value = _value(node)
        value = value[0] if isinstance(value, (list, tuple)) else value
        narrowing = narrowings[node]
        shape = list(value.shape)
        shape[narrowing.dim] = narrowing.length
        full, cut = flops(node), flops(node, shape)
        if full is None or cut is None:
            return None, None
        before, after = before + full, after + cut
    return before, after

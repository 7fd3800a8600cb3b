"""Which compute nodes Inductor may lay out otherwise than their traced metadata says, and so what reads them.

The analysis trusts a node's traced strides unless something changes them in
the graph Inductor traces; this module finds those somethings.
"""

from __future__ import annotations

import operator
from functools import partial
from typing import Any, Callable, Iterable, Optional

import torch
from torch.fx import Node

from . import inductor, layout, ops
from .dialect import aten_op, is_view_op
from .program import copy_form_of
from .replay import Geometry, Layout


def relaid_nodes(
    graph: torch.fx.Graph, converted: Iterable[Node], geometry: Callable[[Node], Layout], op_of: Callable[[Node], Any]
) -> set[Node]:
    """Compute nodes whose traced layout Inductor's trace may change, and so what reads them.

    Five things change a node's layout in the graph Inductor traces: a
    view copy made a view hands its users other strides than the copy it
    was; Inductor's own decompositions (a ``cat`` of one non-empty tensor
    becomes a ``clone`` of it, in its layout, and a ``view_copy`` of a
    tensor that is not contiguous a clone of the view, in the view's
    layout); a pair of views that gives back its input's shape, which
    Inductor replaces with that input; and a channels-last input,
    whose layout Inductor carries through copies and concatenations where
    the traced metadata says contiguous (found by ``make fuzz``). An op's result follows its
    inputs' strides (an ``add`` of a transposed view is transposed too), so
    everything computed from such a node may be laid out otherwise than its
    metadata says, up to a GEMM or a copy told its layout (and past that copy
    where its result has a size-one dimension, whose stride it may keep).
    Found in one pass over the graph, from geometries, with a decomposition
    traced only for the few ops whose decomposition can lay out their result
    like an input (and remembered per shape).
    """
    computing = [node for node in graph.nodes if node.op == "call_function"]
    converted = set(converted)
    strides_of = partial(_strides_as_traced, converted=converted, geometry=geometry)
    changed = {node for node in converted if _relaid(geometry(node), node)}
    changed |= {
        node for node, op in ((node, op_of(node)) for node in computing)
        if _decomposition_relays(node, op) or _clones_a_strided_view(node, op) or _undoes_a_view(node, op, op_of, strides_of)
    }
    changed |= {node for node in graph.find_nodes(op="placeholder") if _channels_last_input(node)}
    relaid: set[Node] = set()
    if not changed:
        return relaid
    for node in computing:
        if node in changed or not any(n in changed or n in relaid for n in node.all_input_nodes):
            continue
        op = op_of(node)
        if _lays_out_its_own_result(node, op):
            continue
        if node.target is operator.getitem or (is_view_op(op) and not _converts_dtype(node)):
            changed.add(node)
        else:
            relaid.add(node)
    return relaid


def _converts_dtype(node: Node) -> bool:
    """A ``to`` whose schema may alias its input but whose result has another dtype: compute, whose result
    follows its input's strides (found by ``make fuzz``: ``to(int32)`` of a re-laid ``[1, 1]`` select came
    back with strides ``(2, 2)``)."""
    value = node.meta.get("val")
    source = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], Node) else None
    return isinstance(value, torch.Tensor) and isinstance(source, torch.Tensor) and value.dtype != source.dtype


def _channels_last_input(node: Node) -> bool:
    """A 4-D or 5-D input or weight Inductor may see as channels-last (or whose symbolic sizes cannot tell)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() not in (4, 5):
        return False
    exactly_contiguous = layout.has_layout(value.shape, value.stride(), layout.identity_order(value.dim())) is True
    if not all(type(v) is int for v in (*value.shape, *value.stride())):
        return not exactly_contiguous
    return inductor.concat_may_go_channels_last([value]) and not exactly_contiguous


def _strides_as_traced(node: Node, converted: set[Node], geometry: Callable[[Node], Layout]) -> Optional[tuple]:
    """``node``'s strides in the graph Inductor traces: a converted view's own, else its traced value's."""
    if node in converted and isinstance(found := geometry(node), Geometry):
        return tuple(found.strides)
    value = node.meta.get("val")
    return tuple(value.stride()) if isinstance(value, torch.Tensor) else None


def _undoes_a_view(
    node: Node, op: Any, op_of: Callable[[Node], Any], strides_of: Callable[[Node], Optional[tuple]]
) -> bool:
    """A view of a view that gives back the first one's input shape with other strides (in a size-one
    dimension, where two views of one shape can differ): Inductor's ``pointless_view_pair`` replaces the
    pair with that input, and what reads it follows its strides (found by ``make fuzz``: ``to`` of a
    ``[1, s]`` view of a ``reshape(-1)`` of a step-3 slice came back with the slice's stride ``3*s``)."""
    # Each reaches Inductor's graph passes as ``aten.view``, an Edge ``view_copy`` too (its lowering of the
    # found program returned the slice's ``3*s`` as well).
    first = node.args[0] if node.args and isinstance(node.args[0], Node) else None
    if first is None or not first.args or not isinstance(first.args[0], Node):
        return False
    if not (ops.in_family(op, ops.RESHAPES) and ops.in_family(op_of(first), ops.RESHAPES)):
        return False
    value, source = node.meta.get("val"), first.args[0].meta.get("val")
    if not (isinstance(value, torch.Tensor) and isinstance(source, torch.Tensor)) or not layout.same_sizes(value.shape, source.shape):
        return False
    undone, kept = strides_of(first.args[0]), strides_of(node)
    return undone is not None and kept is not None and not layout.same_sizes(undone, kept)


def _clones_a_strided_view(node: Node, op: Any) -> bool:
    """A ``view_copy`` whose input is not contiguous: traced contiguous, but Inductor decomposes it into the
    view and a ``clone`` that keeps the view's layout, and what reads it follows (found by ``make fuzz``: a
    ``neg`` of a slice of a ``view_copy`` of a channels-last ``_to_dim_order_copy`` came back channels-last).
    Counted as changed without asking which order the view has: the readers are then left to Inductor."""
    if aten_op(op) is not torch.ops.aten.view_copy.default or not node.args or not isinstance(node.args[0], Node):
        return False
    source = node.args[0].meta.get("val")
    return isinstance(source, torch.Tensor) and layout.has_layout(
        source.shape, source.stride(), layout.identity_order(source.dim())
    ) is not True


def _decomposition_relays(node: Node, op: Any) -> bool:
    """Whether Inductor's decomposition gives ``node`` other strides than its metadata says: a concatenation
    may be laid out like one input (one non-empty input: a clone)."""
    if node.op != "call_function" or not ops.in_family(op, ops.CONCATENATIONS):
        return False
    original = node.meta.get("val")
    if not isinstance(original, torch.Tensor):
        return False
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    found = inductor.decomposed(aten_op(op), args, kwargs)
    return found is None or not layout.same_sizes(found.strides, original.stride())


def _relaid(geometry: Layout, node: Node) -> bool:
    """Whether a converted view may make the ops reading it lay out their results otherwise.

    An op that follows its inputs' layout (elementwise ops, ``clone`` and
    ``to`` in ``preserve_format``, ``cat``'s memory format) decides from how
    its input's strides order the dimensions, not from their values: a slice
    keeps its base's order and changes nothing downstream, while a transpose,
    or a permute that moves a size-one dimension, does. So the view reads as
    the copy did when every pair of dimensions compares the same way
    (greater, equal, smaller) in both; anything unproven counts as changed.
    """
    original = node.meta.get("val")
    new = geometry if isinstance(geometry, list) else [geometry]
    old = list(original) if isinstance(original, (list, tuple)) else [original]
    return not all(
        not (isinstance(g, Geometry) and isinstance(o, torch.Tensor))
        or layout.same_order(g.shape, g.strides, o.stride())
        for g, o in zip(new, old)
    )


def _layout_argument(op: torch._ops.OpOverload) -> Optional[str]:
    """The argument telling a copy its result's layout; ``None`` for an op that is not such a copy."""
    if op.overloadpacket in ops.MEMORY_FORMAT_COPIES:
        return "memory_format"
    if op.overloadpacket in ops.dim_order_copies():
        return "dim_order"
    return None


def _lays_out_its_own_result(node: Node, target: Any) -> bool:
    """Ops whose result's layout does not follow their inputs': GEMMs, and copies told their layout
    (``_clone_dim_order(dim_order=...)``, ``clone(memory_format=contiguous)``, strideguard's own output
    copies among them) where no size-one dimension's stride is left to them. Not view copies: Inductor lowers one as a view and a clone, and may keep the
    view's layout (found by ``make fuzz`` on a channels-last input)."""
    op = aten_op(target)
    if not isinstance(op, torch._ops.OpOverload):
        return False
    if op.overloadpacket in ops.GEMMS:
        return True
    argument = _layout_argument(op)
    if argument is None:
        return False
    value = node.kwargs.get(argument)
    if value is None or value is torch.preserve_format:
        return False
    # Not where the result has a size-one dimension, unless it is strideguard's own output copy (proven by the
    # lowering and the compile, tests/test_proven.py): Inductor compares only the strides that matter, and
    # may keep the one it reads there (found by ``make fuzz``: on the Edge path, ``_to_dim_order_copy(
    # dim_order=[0, 1, 2])`` of a re-laid ``[1, 1, s]`` came back with its input's ``3*s`` in the leading
    # dimension).
    result = node.meta.get("val")
    return copy_form_of(node) is not None or not (isinstance(result, torch.Tensor) and layout.has_size_one_dim(result.shape))

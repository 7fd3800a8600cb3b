"""Which compute nodes Inductor may lay out otherwise than their traced metadata says, and so what reads them.

The analysis trusts a node's traced strides unless something changes them in
the graph Inductor traces; this module finds those somethings.
"""

from __future__ import annotations

import operator
from collections import deque
from functools import lru_cache, partial
from typing import Any, Callable, Iterable, Optional

import torch
from torch.fx import Node

from . import inductor
from ...program import density, ops
from ...program.copies import copy_form_of
from ...program.dialect import aten_op
from ...program.ops import is_view_op
from ...program.view_values import beside_traced, Geometries, Geometry


class RelaidNodes:
    """Compute nodes whose traced layout Inductor's trace may change, and so what reads them: ``node in
    relaid``.

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

    Decided node by node as asked, from geometries, and remembered: the
    analysis asks only of the nodes its outputs view, so a node is judged
    only where some output's base reads it, back to the nearest op that lays
    out its own result (a plan of a 1,651-node graph asked of a fraction of
    its nodes, not all of them). A decomposition is traced only for the few
    ops whose decomposition can lay out their result like an input (and
    remembered per shape).
    """

    def __init__(self, converted: Iterable[Node], geometry: Callable[[Node], Geometries], op_of: Callable[[Node], Any]):
        self.converted = set(converted)
        self.geometry = geometry
        self.op_of = op_of
        self._strides_of = partial(_strides_as_traced, converted=self.converted, geometry=geometry)
        self._changed: dict[Node, Optional[str]] = {}
        self._reached: dict[Node, bool] = {}
        """Whether a node may be laid out otherwise than traced: changed itself, or reading what is."""

    def __contains__(self, node: object) -> bool:
        if not isinstance(node, Node) or node.op != "call_function" or not self.reached(node) or self.changed(node):
            return False
        op = self.op_of(node)
        # a view hands its base's layout on unchanged: it is changed with it, not laid out afresh
        return not (node.target is operator.getitem or (is_view_op(op) and not _converts_dtype(node)))

    def changed(self, node: Node) -> bool:
        """Whether ``node``'s own layout changes in the graph Inductor traces (the five causes above)."""
        return self.change(node) is not None

    def change(self, node: Node) -> Optional[str]:
        """How ``node``'s own layout changes in the graph Inductor traces, in words naming the node (one of the
        five causes above), or ``None`` where it does not."""
        if node not in self._changed:
            self._changed[node] = self._changes(node)
        return self._changed[node]

    def origin(self, node: Node) -> Optional[str]:
        """What makes ``node`` laid out otherwise than traced, in words: the nearest node it reads, through ops
        that follow their inputs' layout, whose own layout changes (``change``); ``None`` where nothing does."""
        seen, frontier = set(), deque([node])
        while frontier:
            current = frontier.popleft()
            if current in seen:
                continue
            seen.add(current)
            if self.changed(current):
                return self.change(current)
            if current.op == "call_function" and not lays_out_its_own_result(current, self.op_of(current)):
                frontier.extend(source for source in current.all_input_nodes if self.reached(source))
        return None

    def _changes(self, node: Node) -> Optional[str]:
        if node.op == "placeholder":
            return f"the input {node.name}, which Inductor may see as channels-last" if _channels_last_input(node) else None
        if node.op != "call_function":
            return None
        if node in self.converted and _relaid(self.geometry(node), node):
            return f"{node.name}, a view copy made a view, whose strides order the dimensions otherwise"
        op = self.op_of(node)
        # each check reads one family of ops: asked of the node's packet first, the cheap question
        packet = ops.packet_of(op)
        if packet in ops.CONCATENATIONS and _decomposition_relays(node, op):
            return f"{node.name}, a concatenation Inductor's decomposition lays out like one of its inputs"
        if packet is _VIEW_COPY and _clones_a_strided_view(node, op):
            return f"{node.name}, a view copy Inductor decomposes into a clone in the strided view's layout"
        if packet in ops.RESHAPES and _undoes_a_view(node, op, self.op_of, self._strides_of):
            return f"{node.name}, a pair of views Inductor replaces with their input, which has other strides"
        return None

    def reached(self, node: Node) -> bool:
        """Whether ``node`` is changed or reads, through ops that follow their inputs' layout, what is; with a
        stack of our own, as a model's chains exceed Python's recursion limit. Its inputs are asked first:
        a node that reads a re-laid one is reached whether or not it changes itself, so past the first
        change in a chain nothing needs judging (a third of a plan's time on a view-heavy graph)."""
        reached, op_of, changed = self._reached, self.op_of, self.changed
        stack: list[tuple[Node, Optional[list[Node]]]] = [(node, None)]
        """Each node to decide, with its inputs once they are being decided first."""
        while stack:
            current, inputs = stack.pop()
            if current in reached:
                continue
            if inputs is None:
                if current.op != "call_function" or lays_out_its_own_result(current, op_of(current)):
                    reached[current] = changed(current)
                    continue
                inputs = current.all_input_nodes
                missing = [source for source in inputs if source not in reached]
                if missing:
                    stack.append((current, inputs))
                    stack.extend((source, None) for source in missing)
                    continue
            reached[current] = any(reached[source] for source in inputs) or changed(current)
        return reached[node]


_VIEW_COPY = torch.ops.aten.view_copy


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
    exactly_contiguous = density.has_layout(value.shape, value.stride(), density.identity_order(value.dim())) is True
    if not all(type(v) is int for v in (*value.shape, *value.stride())):
        return not exactly_contiguous
    return inductor.concat_may_go_channels_last([value]) and not exactly_contiguous


def _strides_as_traced(node: Node, converted: set[Node], geometry: Callable[[Node], Geometries]) -> Optional[tuple]:
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
    if not (isinstance(value, torch.Tensor) and isinstance(source, torch.Tensor)) or not density.same_sizes(value.shape, source.shape):
        return False
    undone, kept = strides_of(first.args[0]), strides_of(node)
    return undone is not None and kept is not None and not density.same_sizes(undone, kept)


def _clones_a_strided_view(node: Node, op: Any) -> bool:
    """A ``view_copy`` whose input is not contiguous: traced contiguous, but Inductor decomposes it into the
    view and a ``clone`` that keeps the view's layout, and what reads it follows (found by ``make fuzz``: a
    ``neg`` of a slice of a ``view_copy`` of a channels-last ``_to_dim_order_copy`` came back channels-last).
    Counted as changed without asking which order the view has: the readers are then left to Inductor."""
    if aten_op(op) is not torch.ops.aten.view_copy.default or not node.args or not isinstance(node.args[0], Node):
        return False
    source = node.args[0].meta.get("val")
    return isinstance(source, torch.Tensor) and density.has_layout(
        source.shape, source.stride(), density.identity_order(source.dim())
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
    return found is None or not density.same_sizes(found.strides, original.stride())


def _relaid(geometry: Geometries, node: Node) -> bool:
    """Whether a converted view may make the ops reading it lay out their results otherwise.

    An op that follows its inputs' layout (elementwise ops, ``clone`` and
    ``to`` in ``preserve_format``, ``cat``'s memory format) decides from how
    its input's strides order the dimensions, not from their values: a slice
    keeps its base's order and changes nothing downstream, while a transpose,
    or a permute that moves a size-one dimension, does. So the view reads as
    the copy did when every pair of dimensions compares the same way
    (greater, equal, smaller) in both; anything unproven counts as changed.
    """
    return not all(
        density.same_sizes(g.strides, strides) or density.same_order(g.shape, g.strides, strides)
        for g, strides in beside_traced(geometry, node.meta.get("val"))
    )


def _layout_argument(target: Any) -> Optional[str]:
    """What tells ``target``'s result its layout: ``GEMM`` for a matrix product (its own), the argument
    naming the layout for a copy told one, ``None`` for anything else. Remembered per target: asked of
    nearly every node a re-layout reaches."""
    try:
        return _remembered_layout_argument(target)
    except TypeError:  # an unhashable target
        return _layout_argument_of(target)


GEMM = "gemm"


def _layout_argument_of(target: Any) -> Optional[str]:
    op = aten_op(target)
    if not isinstance(op, torch._ops.OpOverload):
        return None
    if op.overloadpacket in ops.GEMMS:
        return GEMM
    if op.overloadpacket in ops.MEMORY_FORMAT_COPIES:
        return "memory_format"
    if op.overloadpacket in ops.dim_order_copies():
        return "dim_order"
    return None


_remembered_layout_argument = lru_cache(maxsize=None)(_layout_argument_of)


def lays_out_its_own_result(node: Node, target: Any) -> bool:
    """Ops whose result's layout does not follow their inputs': GEMMs, and copies told their layout
    (``_clone_dim_order(dim_order=...)``, ``clone(memory_format=contiguous)``, strideguard's own output
    copies among them) where no size-one dimension's stride is left to them. Not view copies: Inductor
    lowers one as a view and a clone, and may keep the view's layout (found by ``make fuzz`` on a
    channels-last input)."""
    argument = _layout_argument(target)
    if argument is None:
        return False
    if argument is GEMM:
        return True
    value = node.kwargs.get(argument)
    if value is None or value is torch.preserve_format:
        return False
    # Not where the result has a size-one dimension, unless it is strideguard's own output copy (proven by the
    # lowering and the compile, tests/test_proven.py): Inductor compares only the strides that matter, and
    # may keep the one it reads there (found by ``make fuzz``: on the Edge path, ``_to_dim_order_copy(
    # dim_order=[0, 1, 2])`` of a re-laid ``[1, 1, s]`` came back with its input's ``3*s`` in the leading
    # dimension).
    result = node.meta.get("val")
    return copy_form_of(node) is not None or not (isinstance(result, torch.Tensor) and density.has_size_one_dim(result.shape))

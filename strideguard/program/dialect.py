"""Every difference between ATen and the two Edge modes, in one place.

* ATen (``torch.export.export``): views are real views; an output must come
  back contiguous; the copy is ``aten.clone(memory_format=...)``.
* Edge in dim-order mode (ExecuTorch's default ``EdgeCompileConfig``): view
  ops are ``*_copy`` ops until an AOTI backend turns them back into views; the
  promised layout is the dim order of each output's metadata; the verifier
  rejects ``aten.clone`` and wants ``dim_order_ops._clone_dim_order``.
* Edge in memory-format mode (``_skip_dim_order=True``): as above, but the
  verifier wants ``aten.clone(memory_format=...)`` and rejects the dim-order op.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any, Mapping, Optional

import torch
from torch.export import ExportedProgram

from . import density


class Dialect(str, Enum):
    ATEN = "aten"
    EDGE_DIM_ORDER = "edge-dim-order"
    EDGE_MEMORY_FORMAT = "edge-memory-format"

    @property
    def is_edge(self) -> bool:
        return self is not Dialect.ATEN


def dialect_of(program: ExportedProgram) -> Dialect:
    """Read off the program's verifier; a program that lost it is judged by its ops."""
    for verifier in program.verifiers:
        if getattr(verifier, "dialect", None) == "EDGE":
            return Dialect.EDGE_DIM_ORDER if verifier().use_dim_order else Dialect.EDGE_MEMORY_FORMAT
    return dialect_of_graph(program.graph)


def dialect_of_graph(graph: torch.fx.Graph, *, skip_dim_order: Optional[bool] = None) -> Dialect:
    """The dialect of a bare graph (a pass sees no verifier).

    Edge when any target is an Edge op; the mode is ``skip_dim_order`` when
    given, else read off the ops present (a dim-order op means dim-order mode,
    a memory-format clone or ``_to_copy`` the other), else the default mode.
    """
    targets = {node.target for node in graph.nodes if node.op == "call_function"}
    if not any(is_edge_op(t) for t in targets):
        return Dialect.ATEN
    if skip_dim_order is not None:
        return Dialect.EDGE_MEMORY_FORMAT if skip_dim_order else Dialect.EDGE_DIM_ORDER
    names = {aten_op(t).name() for t in targets if is_edge_op(t)}
    if any(name.startswith("dim_order_ops::") for name in names):
        return Dialect.EDGE_DIM_ORDER
    if names & {"aten::clone", "aten::_to_copy", "aten::empty_like"}:
        return Dialect.EDGE_MEMORY_FORMAT
    return Dialect.EDGE_DIM_ORDER


def is_edge_op(target: Any) -> bool:
    return type(target).__name__ == "EdgeOpOverload"


def aten_op(target: Any) -> Any:
    """The ATen ``OpOverload`` behind a target (Edge ops wrap one); remembered per target, as it is asked tens
    of thousands of times per pass of a few dozen targets."""
    try:
        return _remembered_aten_op(target)
    except TypeError:  # an unhashable target
        return _unwrapped(target)


def _unwrapped(target: Any) -> Any:
    return getattr(target, "_op", target) if is_edge_op(target) else target


_remembered_aten_op = lru_cache(maxsize=None)(_unwrapped)


@dataclass(frozen=True)
class GraphOps:
    """Each ``call_function`` node's op as the decisions read it, normalised once per graph rather than once
    per question: its ATen op (an Edge op unwrapped) and its view twin in its own dialect (``None`` where it
    has none). Read before the graph changes: a node added later is not in it."""

    aten: Mapping[torch.fx.Node, Any]
    twin: Mapping[torch.fx.Node, Any]
    aten_twin: Mapping[torch.fx.Node, Any]
    """Each view twin's ATen op (the twin itself in an ATen graph)."""
    views: frozenset
    """The nodes that call an ATen view op (their result shares their input's memory)."""

    def op(self, node: torch.fx.Node) -> Any:
        """``node``'s ATen op; its own target for a node that calls no function."""
        return self.aten.get(node, node.target)


def graph_ops(graph: torch.fx.Graph) -> GraphOps:
    """``graph``'s ops, normalised once (``GraphOps``); ``aten_op`` and ``view_twin`` remember each target."""
    aten, twin, aten_twin, views = {}, {}, {}, set()
    for node in graph.nodes:
        if node.op == "call_function":
            op = aten[node] = aten_op(node.target)
            is_overload = isinstance(op, torch._ops.OpOverload)
            twin[node] = view_twin(node.target) if is_overload else None
            aten_twin[node] = aten_op(twin[node]) if twin[node] is not None else None
            if is_overload and op.is_view:
                views.add(node)
    return GraphOps(aten, twin, aten_twin, frozenset(views))


def _edge_ops():
    from executorch.exir.dialects._ops import ops

    return ops.edge


def _overload(namespace_packet: Any, name: str, overload: str) -> Any:
    return getattr(getattr(namespace_packet, name), overload)


@lru_cache(maxsize=None)
def spelled_in(dialect: Dialect, op: Any) -> Any:
    """``op`` (an ATen ``OpOverload``) as ``dialect`` spells it: itself in ATen, its Edge op in either Edge mode."""
    if not dialect.is_edge:
        return op
    return _overload(getattr(_edge_ops(), op.namespace), op._schema.name.split("::")[1], op._overloadname)


@lru_cache(maxsize=None)
def view_twin(target: Any) -> Optional[Any]:
    """The view op of a ``*_copy`` op, in the same dialect; ``None`` when there is none."""
    op = aten_op(target)
    if not isinstance(op, torch._ops.OpOverload):
        return None
    base, overload = op.overloadpacket.__name__, op._overloadname
    if not base.endswith("_copy") or op.namespace != "aten":
        return None
    view_name = base[: -len("_copy")]
    if view_name == "detach":
        view_name = "alias"
    if not hasattr(torch.ops.aten, view_name):
        return None
    view_op = _overload(torch.ops.aten, view_name, overload)
    if not view_op.is_view:
        return None
    return _overload(_edge_ops().aten, view_name, overload) if is_edge_op(target) else view_op


def copy_call(dialect: Dialect, dim_order: tuple[int, ...]) -> tuple[Any, dict[str, Any]]:
    """Target and keyword arguments of the op that copies a tensor into ``dim_order``.

    The op is the one the program's own verifier accepts, and Inductor lowers it
    to a kernel writing a dense output in that order.
    """
    if dialect is Dialect.EDGE_DIM_ORDER:
        return _edge_ops().dim_order_ops._clone_dim_order.default, {"dim_order": list(dim_order)}
    memory_format = _memory_format(dim_order)
    if dialect is Dialect.EDGE_MEMORY_FORMAT:
        return _edge_ops().aten.clone.default, {"memory_format": memory_format}
    return torch.ops.aten.clone.default, {"memory_format": memory_format}


def copies_into(dialect: Dialect, dim_order: tuple[int, ...]) -> bool:
    """Whether ``copy_call`` has an op copying into ``dim_order``: one with a ``torch.memory_format``, and in
    dim-order mode one ExecuTorch's ``_clone_dim_order`` takes (asked of ExecuTorch's own
    ``get_memory_format``: contiguous, or channels-last in 4-D). ATen copies into any other order through a
    permutation (``insert_copy``); an Edge program into a memory-format order that lays out the same bytes
    (``edge_copy_order``)."""
    if dialect is Dialect.EDGE_DIM_ORDER:
        from executorch.exir.dim_order_utils import get_memory_format

        try:
            get_memory_format(list(dim_order))
        except AssertionError:
            return False
        return True
    try:
        _memory_format(dim_order)
    except ValueError:
        return False
    return True


def edge_copy_order(dialect: Dialect, shape: tuple, dim_order: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    """For an Edge program, an order its copy op takes that lays out the same bytes as ``dim_order`` (they differ
    only in size-one dimensions), preferring one whose dense strides ExecuTorch reads back as that very order;
    ``None`` where there is none.

    ExecuTorch derives an output's dim order from its strides, ties in the order of the dimensions: a
    channels-last ``[2, 1, 4, 4]`` value (strides ``(16, 1, 4, 1)``) promises ``(0, 2, 1, 3)``, whose strides
    are ``(16, 4, 4, 1)``, and no copy op of an Edge program writes those (found by ``make fuzz``). Its
    contiguous copy, ``(16, 16, 4, 1)``, holds the same bytes in the same places and promises
    ``(0, 1, 2, 3)``, which it keeps.
    """
    same_bytes = []
    for candidate in _MEMORY_FORMAT_ORDERS.get(len(dim_order), (tuple(range(len(dim_order))),)):
        if not copies_into(dialect, candidate):
            continue
        strides = density.strides_for_order(shape, candidate)
        if density.is_dense_in_order(shape, strides, dim_order) is True:
            same_bytes.append((candidate, strides))
    for candidate, strides in same_bytes:
        if density.dim_order_of(shape, strides) == candidate:
            return candidate
    return same_bytes[0][0] if same_bytes else None


def permute_call(dialect: Dialect) -> Any:
    """``permute``: a view in ATen (an Edge program has only ``permute_copy``)."""
    if dialect.is_edge:
        raise ValueError("an Edge program copies into a dim order with _clone_dim_order, not through a permutation")
    return torch.ops.aten.permute.default


def reversed_and_back_steps(dialect: Dialect, ndim: int) -> list[tuple[Any, tuple, dict]]:
    """Steps (target, arguments, keyword arguments) that copy a tensor with its dimensions reversed, laid out
    contiguously, then reverse them back: in ATen ``permute`` and a contiguous ``clone``, then ``permute`` (a view
    of that copy); in Edge ``permute_copy`` (a copy of its own) both ways."""
    dims = list(range(ndim))[::-1]
    if dialect.is_edge:
        return [(_edge_ops().aten.permute_copy.default, (dims,), {})] * 2
    permute = torch.ops.aten.permute.default
    return [(permute, (dims,), {}), (torch.ops.aten.clone.default, (), {"memory_format": torch.contiguous_format}),
            (permute, (dims,), {})]


@dataclass(frozen=True)
class CopyRecipe:
    """The calls that copy a tensor into a dim order in one dialect, in order: each a target, its arguments
    after the input and its keyword arguments."""

    steps: tuple[tuple[Any, tuple, dict], ...]
    copy: Any
    """The target of the step that writes the dense copy."""
    strides: tuple
    """The strides that step's result has (dense in the order it copies into)."""
    involution: Optional[Any]
    """The involution's target as ``dialect`` spells it, where the copy applies one twice."""
    computed_as: tuple[tuple[Any, dict], ...]
    """Each step as the ATen call (op, keyword arguments) that gives its value on fake tensors (``value_call``)."""


def copy_recipe(
    dialect: Dialect, shape: tuple, dim_order: tuple[int, ...], *, involution: Optional[Any], pinned: bool, serves: str
) -> CopyRecipe:
    """How ``dialect`` copies a tensor of ``shape`` into ``dim_order``: the verifier's own copy op, after the
    reversed-and-back detour where ``pinned``, then ``involution`` (an ATen op) twice where given; an ATen
    program copies into an order with no memory format through a permutation and back, an Edge program into
    the memory-format order laying out the same bytes (``edge_copy_order``). ``serves`` names the output in
    the error where an Edge program has no such order."""
    if dialect.is_edge and not copies_into(dialect, dim_order):
        same_bytes = edge_copy_order(dialect, shape, dim_order)
        if same_bytes is None:
            raise ValueError(
                f"strideguard: {serves} promises dim order {list(dim_order)}, and an Edge program's "
                "copy ops write only contiguous and channels-last orders"
            )
        dim_order = same_bytes
    strides = density.strides_for_order(shape, dim_order)
    detour = reversed_and_back_steps(dialect, len(shape)) if pinned else []
    spelled = spelled_in(dialect, involution) if involution is not None else None
    dense = [(spelled, (), {})] * 2 if spelled is not None else []
    if copies_into(dialect, dim_order):
        target, kwargs = copy_call(dialect, dim_order)
        steps = detour + [(target, (), kwargs)] + dense
    else:
        # ATen has no op copying into an order without a memory format: lay the permuted source out
        # contiguously, then permute back, a view of that fresh buffer with exactly the strides of ``dim_order``.
        inverse = [list(dim_order).index(dim) for dim in range(len(dim_order))]
        target, kwargs = copy_call(dialect, tuple(range(len(dim_order))))
        permute = permute_call(dialect)
        steps = [(permute, (list(dim_order),), {})] + detour + [(target, (), kwargs)] + dense + [(permute, (inverse,), {})]
        strides = tuple(strides[dim] for dim in dim_order)  # the permuted copy's, contiguous
    computed_as = tuple(value_call(step_target, step_kwargs) for step_target, _, step_kwargs in steps)
    return CopyRecipe(tuple(steps), target, strides, spelled, computed_as)


def narrow_call(dialect: Dialect) -> Any:
    """The op taking ``start:end:step`` of one dimension: a view in ATen, ``slice_copy`` in Edge (which the
    AOTI backends turn back into a view)."""
    return _edge_ops().aten.slice_copy.Tensor if dialect.is_edge else torch.ops.aten.slice.Tensor


def select_call(dialect: Dialect) -> Any:
    """The op taking one index of one dimension, in ``dialect``."""
    return _edge_ops().aten.select_copy.int if dialect.is_edge else torch.ops.aten.select.int


def value_call(target: Any, kwargs: dict) -> tuple[Any, dict]:
    """The ATen call giving the value ``target(..., **kwargs)`` has, to dispatch on fake tensors: ExecuTorch's
    ``_clone_dim_order`` is its own composite of ``clone`` in the dim order's memory format, which dispatched
    directly skips the Python dispatcher (a third of the cost of an output copy's nodes)."""
    op = aten_op(target)
    schema = getattr(op, "_schema", None)
    if schema is not None and schema.name == "dim_order_ops::_clone_dim_order" and set(kwargs) <= {"dim_order"}:
        order = kwargs.get("dim_order")
        try:
            memory_format = torch.contiguous_format if order is None else _memory_format(tuple(order))
        except ValueError:
            return op, kwargs
        return torch.ops.aten.clone.default, {"memory_format": memory_format}
    return op, kwargs


_MEMORY_FORMAT_ORDERS = {
    4: ((0, 1, 2, 3), (0, 2, 3, 1)),
    5: ((0, 1, 2, 3, 4), (0, 2, 3, 4, 1)),
}
"""The dim orders with a ``torch.memory_format`` beyond contiguous, by rank (contiguous first)."""


def _memory_format(dim_order: tuple[int, ...]) -> torch.memory_format:
    ndim = len(dim_order)
    if tuple(dim_order) == tuple(range(ndim)):
        return torch.contiguous_format
    if ndim == 4 and tuple(dim_order) == (0, 2, 3, 1):
        return torch.channels_last
    if ndim == 5 and tuple(dim_order) == (0, 2, 3, 4, 1):
        return torch.channels_last_3d
    raise ValueError(f"dim order {tuple(dim_order)} has no torch.memory_format")


def detach_retargets(ops_of_graph: GraphOps, dialect: Dialect) -> dict[torch.fx.Node, Any]:
    """``alias_copy``, spelled in ``dialect``, for each ``detach_copy`` node (``ops_of_graph``: a graph's
    ops): Inductor lowers it natively, where ``detach_copy`` has no C shim and needs the proxy executor
    ExecuTorch lacks."""
    detaches = [node for node, op in ops_of_graph.aten.items() if op is torch.ops.aten.detach_copy.default]
    if not detaches:
        return {}
    alias_copy = spelled_in(dialect, torch.ops.aten.alias_copy.default)
    return dict.fromkeys(detaches, alias_copy)



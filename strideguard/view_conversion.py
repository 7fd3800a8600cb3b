"""Which view copies become views before AOTInductor compiles a graph.

ExecuTorch's ``to_edge`` makes every view a fresh copy; an AOTI backend turns
some of them back into views inside ``preprocess`` so that Inductor treats
them as free. Which ones is the installed ExecuTorch's decision
(``backend_conversions`` asks its own ``ReplaceViewCopyWithViewPass``), and it
is taken whatever strideguard does before. strideguard's own policy converts
more, where that is safe. ``plan_view_conversion`` decides both, in one pass
over the graph, reading each candidate view's geometry from the replay
(``strideguard.replay``: stride arithmetic, no tensor dispatched for the
common views), and returns a ``ViewConversion``: the conversions, and the
replay of every node's value under them, which the analysis reads. Nothing
in the graph changes; ``passes.view_copies_to_views`` applies a plan.

Safe means: no user mutates the result; no user may depend on its layout (an
out-variant, an op outside ``aten``, a control-flow operator, a ``call_method``);
a ``view_copy`` becomes a view only where its input's replayed strides allow
one; the program's verifier takes the view op. strideguard's policy also leaves
a *returned* copy alone when turning it into a view would not save its copy: a
returned ``permute_copy`` already writes the output densely, once; and a view
that would hand compute its elements in another dimension order stays a copy.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.fx import Node

from . import inductor, layout, ops
from .dialect import aten_op, is_higher_order, is_view_op, promised_dim_order, view_twin
from .fake_values import call_on_fake_values, storage_key
from .program import output_values
from .replay import Geometry, Layout, Replay, view_geometry


@dataclass(frozen=True)
class ConversionPolicy:
    """Which ``*_copy`` ops become views before AOTInductor compiles them, and how carefully."""

    name: str
    backend: bool
    """The AOTI backend's own view pass runs in ``preprocess``: its conversions happen whatever else."""
    extra: Optional[frozenset[torch._ops.OpOverload]]
    """ATen ops strideguard converts besides; ``None`` for every ``*_copy`` op with a view twin."""
    careful: bool
    """Refuse layout-dependent users and returned copies that gain nothing, for the extra conversions."""

    def admits(self, target: Any) -> bool:
        op = aten_op(target)
        if not isinstance(op, torch._ops.OpOverload):
            return False
        if self.extra is not None:
            return op in self.extra
        return view_twin(target) is not None


NO_CONVERSION = ConversionPolicy("none", backend=False, extra=frozenset(), careful=False)
EXECUTORCH = ConversionPolicy("executorch", backend=True, extra=frozenset(), careful=False)
"""What the installed ExecuTorch's AOTI backend converts, and nothing more."""
STRIDEGUARD = ConversionPolicy("strideguard", backend=True, extra=None, careful=True)
"""ExecuTorch's conversions, and every other view copy where that is safe."""


def backend_conversions(
    graph: torch.fx.Graph, *, scope: Optional[Callable[[Node], bool]] = None
) -> dict[Node, Any]:
    """The view copies the installed ExecuTorch's AOTI ``ReplaceViewCopyWithViewPass`` turns into views, and into
    what: asked of that pass's own table and its own test for users that block a conversion, so a newer
    ExecuTorch that converts more is followed. With ``scope``, users out of scope do not block (they read a
    partition's output). An ExecuTorch whose pass no longer has them is asked by running it on a copy."""
    from executorch.backends.aoti.passes import replace_view_copy_with_view as installed

    view_pass = installed.ReplaceViewCopyWithViewPass()
    table = getattr(installed, "_VIEW_TARGETS", None)
    blocking = getattr(view_pass, "_has_blocking_user", None)
    if not isinstance(table, dict) or blocking is None:
        return _conversions_by_running(graph, view_pass, scope)
    conversions = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target in table and (scope is None or scope(node)):
            users = [user for user in node.users if scope is None or scope(user)]
            if not blocking(node, users):
                conversions[node] = table[node.target]
    return conversions


def _conversions_by_running(graph: torch.fx.Graph, view_pass: Any, scope) -> dict[Node, Any]:
    if scope is not None:
        raise NotImplementedError("this ExecuTorch's view pass exposes no table to plan one partition with")
    module = torch.fx.GraphModule(torch.nn.Module(), copy.deepcopy(graph))
    view_pass(module)
    converted = {node.name: node.target for node in module.graph.nodes}
    return {
        node: converted[node.name]
        for node in graph.nodes
        if node.op == "call_function" and converted.get(node.name, node.target) != node.target
    }


@dataclass
class ViewConversion:
    """The view conversion decided for a graph: the nodes strideguard turns into views (``targets``), those
    the backend's own pass turns into views in ``preprocess`` (``later``), and the replay of every node's
    value under both."""

    graph: torch.fx.Graph
    policy: ConversionPolicy
    targets: dict[Node, Any] = field(default_factory=dict)
    later: dict[Node, Any] = field(default_factory=dict)
    replay: Replay = field(init=False)

    def __post_init__(self):
        self.replay = Replay(self.op_of, lambda node: self.converts(node) or is_view_op(node.target))

    def op_of(self, node: Node) -> Any:
        """The op ``node`` runs once compiled."""
        return self.targets.get(node) or self.later.get(node) or node.target

    def converts(self, node: Node) -> bool:
        return node in self.targets or node in self.later

    def value(self, node: Node) -> Any:
        """The fake tensor ``node`` holds once compiled (views replayed on their bases)."""
        return self.replay.value(node)

    def geometry(self, node: Node) -> Layout:
        return self.replay.geometry(node)

    def relaid(self) -> set[Node]:
        """Compute nodes whose traced layout Inductor's trace may change, and so what reads them.

        Three things change a node's layout in the graph Inductor traces: a
        view copy made a view hands its users other strides than the copy it
        was; Inductor's own decompositions (a ``cat`` of one non-empty tensor
        becomes a ``clone`` of it, in its layout); and a channels-last input,
        whose layout Inductor carries through copies and concatenations where
        the traced metadata says contiguous (found by ``make fuzz``). An op's result follows its
        inputs' strides (an ``add`` of a transposed view is transposed too), so
        everything computed from such a node may be laid out otherwise than its
        metadata says. Found in one pass over the graph, from geometries, with
        a decomposition traced only for the few ops whose decomposition can
        lay out their result like an input (and remembered per shape).
        """
        changed = {node for node in (*self.targets, *self.later) if _relaid(self.geometry(node), node)}
        changed |= {node for node in self.graph.nodes if _decomposition_relays(node, self.op_of(node))}
        changed |= {node for node in self.graph.find_nodes(op="placeholder") if _channels_last_input(node)}
        relaid: set[Node] = set()
        if not changed:
            return relaid
        for node in self.graph.nodes:
            if node.op != "call_function" or node in changed:
                continue
            feeds = [n for n in node.all_input_nodes if n in changed or n in relaid]
            if not feeds or _lays_out_its_own_result(node, self.op_of(node)):
                continue
            if node.target is operator.getitem or (is_view_op(self.op_of(node)) and not _converts_dtype(node)):
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
    copies among them). Not view copies: Inductor lowers one as a view and a clone, and may keep the
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
    return value is not None and value is not torch.preserve_format


def plan_view_conversion(
    graph: torch.fx.Graph,
    policy: ConversionPolicy,
    *,
    scope: Optional[Callable[[Node], bool]] = None,
    accepts: Optional[Callable[[Any], bool]] = None,
) -> ViewConversion:
    """Decide, in graph order, which ``*_copy`` nodes become views under ``policy``.

    With ``scope`` (one partition of a graph that will be compiled on its own),
    only nodes in scope are converted and users out of scope count as outputs.
    With ``accepts`` (the program's verifier), a copy becomes a view only where
    the verifier takes the view op.
    """
    conversion = ViewConversion(graph, policy)
    if policy.backend:
        conversion.later.update(backend_conversions(graph, scope=scope))
    returned = set(_returned_nodes(graph))
    placeholder_storages = {
        storage_key(n.meta.get("val")) for n in graph.find_nodes(op="placeholder") if "val" in n.meta
    }
    decided_returned_storages: set = set()

    def storages(pieces: list[Node]) -> set:
        return {g.storage for g in map(conversion.geometry, pieces) if isinstance(g, Geometry)}

    for node in graph.nodes:
        if node.op != "call_function":
            continue
        pieces = [node] if node in returned else []
        pieces += [u for u in node.users if u in returned and u.target is operator.getitem]
        if node in conversion.later:
            # Converted in preprocess whatever happens here; converting it now too, where the
            # verifier takes the view, keeps the program what the backend will compile.
            view_op = conversion.later[node]
            if (
                policy.extra != frozenset()
                and (accepts is None or accepts(view_op))
                and not (policy.careful and _reorders_for_compute(node, conversion.geometry(node), conversion))
                and not _blocks_a_later_conversion(node, conversion)
            ):
                conversion.targets[node] = conversion.later.pop(node)
            decided_returned_storages |= storages(pieces)
            continue
        if (
            not policy.admits(node.target)
            or (scope is not None and not scope(node))
            or (accepts is not None and not accepts(view_twin(node.target)))
            or _has_blocking_user(node, policy, scope)
            or _blocks_a_later_conversion(node, conversion)
        ):
            decided_returned_storages |= storages(pieces)
            continue
        view_op = view_twin(node.target)
        candidate = _as_view(node, view_op, conversion)
        if candidate is None:
            continue
        if policy.careful and _reorders_for_compute(node, candidate, conversion):
            continue
        if policy.careful and pieces:
            taken = placeholder_storages | decided_returned_storages
            if not _conversion_pays(node, candidate, pieces, taken):
                continue
        conversion.targets[node] = view_op
        conversion.replay.set(node, candidate)
        decided_returned_storages |= storages(pieces)
    return conversion


def view_copies_left_out_of_layout(
    graph: torch.fx.Graph, policy: ConversionPolicy, scope: Callable[[Node], bool]
) -> list[tuple[Node, ...]]:
    """Each view copy ``policy`` converts within ``scope`` (one partition) whose view, with its
    ``getitem``s, would come back out of the layout its node promises: the node first, its chunks after."""
    conversion = plan_view_conversion(graph, policy, scope=scope)
    found = []
    for node in [*conversion.targets, *conversion.later]:
        group = (node, *[user for user in node.users if user.target is operator.getitem])
        if any(
            layout.has_layout(g.shape, g.strides, promised_dim_order(member)) is not True
            for member in group
            if isinstance(g := conversion.geometry(member), Geometry)
        ):
            found.append(group)
    return found


def _blocks_a_later_conversion(node: Node, conversion: ViewConversion) -> bool:
    """Whether making ``node`` a view would stop the backend's own view pass converting what it reads.

    That pass leaves a copy alone when one of its users is a view, and it runs
    on the graph strideguard hands over: a ``select_copy`` it would convert
    stays a copy once the ``expand_copy`` reading it is an ``expand`` (found by
    ``make fuzz``: the plan then held the select a view and the program as
    compiled held a copy). Such a node stays a copy, so that what the backend
    converts is what was planned.
    """
    return any(source in conversion.later for source in node.all_input_nodes)


def _as_view(node: Node, view_op: Any, conversion: ViewConversion) -> Optional[Layout]:
    """The geometry ``node`` would have as ``view_op``; ``None`` where it cannot be a view (a ``view_copy``
    whose input's strides allow no view)."""
    source = node.args[0] if node.args and isinstance(node.args[0], Node) else None
    base = conversion.geometry(source) if source is not None else None
    if isinstance(base, Geometry) and base.static:
        found = view_geometry(aten_op(view_op), base, node.args[1:], node.kwargs)
        if found is not None:
            return found
    try:
        value = call_on_fake_values(aten_op(view_op), node, conversion.value)
    except RuntimeError:
        return None
    return [Geometry.of(v) for v in value] if isinstance(value, (list, tuple)) else Geometry.of(value)


def _pieces_of(node: Node, candidate: Layout, pieces: list[Node]) -> list[tuple[Node, Geometry]]:
    return [(p, candidate if p is node else candidate[p.args[1]]) for p in pieces]


def _reorders_for_compute(node: Node, candidate: Layout, conversion: ViewConversion) -> bool:
    """Whether the view would hand compute its elements in another dimension order.

    An elementwise op follows its input's dimension order, so its result would
    change layout where the analysis does not look; a matmul on a transposed
    operand takes another BLAS path and may differ in the last bit, and a
    convolution of a view with gaps, in the same order, may too. Such a
    copy stays a copy: it is the one layout change the program asked for.
    """
    original = node.meta.get("val")
    new = candidate if isinstance(candidate, list) else [candidate]
    old = list(original) if isinstance(original, (list, tuple)) else [original]
    pairs = [(g, o) for g, o in zip(new, old) if isinstance(o, torch.Tensor)]
    consumers = [u for u in node.users if u.target is not operator.getitem] + [
        w for u in node.users if u.target is operator.getitem for w in u.users
    ]
    computing = [u for u in consumers if u.op == "call_function" and not is_view_op(conversion.op_of(u))]
    if any(layout.dim_order_of(g.shape, g.strides) != layout.dim_order_of(o.shape, o.stride()) for g, o in pairs):
        return bool(computing)
    restrided = any(not layout.same_sizes(g.strides, o.stride()) for g, o in pairs)
    return restrided and any(_picks_its_algorithm_by_layout(conversion.op_of(u)) for u in computing)


def _picks_its_algorithm_by_layout(op: Any) -> bool:
    """Kernels that choose their algorithm by their input's strides, so that a strided view of the same
    elements may round differently from the dense copy (found by ``make fuzz``: a convolution of a slice
    of a channels-last input differs from that of its ``slice_copy`` by one float32 ulp). GEMMs take a view
    with gaps as it is (a leading dimension), bitwise as its copy: checked by every generated program."""
    return ops.in_family(op, ops.CONVOLUTIONS)


def _conversion_pays(node: Node, candidate: Layout, pieces: list[Node], taken: set) -> bool:
    """Whether turning a returned copy into a view saves a copy.

    A returned piece that would come back out of its target layout, or sharing
    memory with an input, a weight or an earlier output, needs a copy again;
    the conversion pays only if some piece does not, or some part of the
    result is used inside the graph as a free view (a split whose other
    chunks feed compute).
    """
    def needs_copy_again(piece: Node, geometry: Geometry) -> bool:
        return (
            layout.has_layout(geometry.shape, geometry.strides, promised_dim_order(piece)) is not True
            or geometry.storage in taken
        )

    if not all(needs_copy_again(p, g) for p, g in _pieces_of(node, candidate, pieces)):
        return True
    internal_users = [u for u in node.users if u.op != "output" and u not in pieces]
    return any(u.target is operator.getitem and u.users for u in internal_users)


def _returned_nodes(graph: torch.fx.Graph) -> list[Node]:
    return [v for v in output_values(graph) if isinstance(v, Node)]


def _has_blocking_user(node: Node, policy: ConversionPolicy, scope: Optional[Callable[[Node], bool]] = None) -> bool:
    for user in node.users:
        if user.op == "output" or (scope is not None and not scope(user)):
            continue
        if user.op != "call_function":
            return True
        if user.target is operator.getitem:
            if _has_blocking_user(user, policy, scope):
                return True
            continue
        if _mutates(user, node):
            return True
        if not policy.careful:
            if is_view_op(user.target):
                return True
            continue
        if _depends_on_layout(user.target):
            return True
    return False


def _mutates(user: Node, node: Node) -> bool:
    schema = getattr(aten_op(user.target), "_schema", None)
    if schema is None:
        return False
    for position, arg in enumerate(user.args):
        if arg is node and position < len(schema.arguments):
            alias = schema.arguments[position].alias_info
            if alias is not None and alias.is_write:
                return True
    for name, arg in user.kwargs.items():
        if arg is node:
            for argument in schema.arguments:
                if argument.name == name and argument.alias_info is not None and argument.alias_info.is_write:
                    return True
    return False


def _depends_on_layout(target: Any) -> bool:
    """Users that may read their input's memory as laid out, not through strides."""
    if is_higher_order(target):
        return True
    op = aten_op(target)
    if not isinstance(op, torch._ops.OpOverload):
        return True
    if op.namespace not in ("aten", "dim_order_ops"):
        return True
    return op._overloadname == "out" or op._overloadname.endswith("_out")

"""Which view copies become views before AOTInductor compiles a graph.

ExecuTorch's ``to_edge`` makes every view a fresh copy; an AOTI backend turns
some of them back into views inside ``preprocess`` so that Inductor treats
them as free. Which ones is the installed ExecuTorch's decision
(``backend_conversions`` asks its own ``ReplaceViewCopyWithViewPass``), and it
is taken whatever strideguard does before. strideguard's own policy converts
more, where that is safe. ``plan_view_conversion`` decides both, in one pass
over the graph, reading each candidate view's geometry from the view values
(``strideguard.program.view_values``: stride arithmetic, no tensor dispatched for the
common views), and returns a ``ViewConversion``: the conversions, and the
value every node holds under them, which the analysis reads. Nothing
in the graph changes; ``fix.passes.view_copies_to_views`` applies a plan.

Safe means: no user mutates the result; no user may depend on its layout (an
out-variant, an op outside ``aten``, a control-flow operator, a ``call_method``);
a ``view_copy`` becomes a view only where its input's recomputed strides allow
one; the program's verifier takes the view op. strideguard's policy also leaves
a *returned* copy alone when turning it into a view would not save its copy: a
returned ``permute_copy`` already writes the output densely, once; and a view
that would hand compute its elements in another dimension order stays a copy.
"""

from __future__ import annotations

import copy
import functools
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.fx import Node

from ..compiler.predictor.relayout import RelaidNodes
from ..program import density, ops
from ..program.dialect import graph_ops, GraphOps
from ..program.exported import output_values
from ..program.fake_values import storage_key
from ..program.ops import is_higher_order, is_view_op
from ..program.promises import promised_dim_order
from ..program.view_values import Geometries, Geometry, ViewValues


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
    stands_in_for_backend: bool = False
    """The plan is carried out in place of the backend's own view pass (the drop-in): the conversions that pass
    makes are made as it makes them. Otherwise a careful policy converts one early only where compute would
    read the view as it read the copy, so that the program handed back computes bit for bit as before."""

    def admits(self, node: Node, ops_of_graph: GraphOps) -> bool:
        op = ops_of_graph.aten.get(node)
        if not isinstance(op, torch._ops.OpOverload):
            return False
        if self.extra is not None:
            return op in self.extra
        return ops_of_graph.twin.get(node) is not None


NO_CONVERSION = ConversionPolicy("none", backend=False, extra=frozenset(), careful=False)
EXECUTORCH = ConversionPolicy("executorch", backend=True, extra=frozenset(), careful=False)
"""What the installed ExecuTorch's AOTI backend converts, and nothing more."""
STRIDEGUARD = ConversionPolicy("strideguard", backend=True, extra=None, careful=True)
"""ExecuTorch's conversions, and every other view copy where that is safe."""
DROP_IN = ConversionPolicy("strideguard drop-in", backend=True, extra=None, careful=True, stands_in_for_backend=True)
"""``STRIDEGUARD`` as a pass that stands in for ExecuTorch's own view pass (``strideguard.executorch``)."""


def backend_conversions(
    graph: torch.fx.Graph, *, scope: Optional[Callable[[Node], bool]] = None
) -> dict[Node, Any]:
    """The view copies the installed ExecuTorch's AOTI ``ReplaceViewCopyWithViewPass`` turns into views, and into
    what: asked of that pass's own table and its own test for users that block a conversion, so a newer
    ExecuTorch that converts more is followed. With ``scope``, users out of scope do not block (they read a
    partition's output). An ExecuTorch whose pass no longer has them is asked by running it on a copy."""
    installed, view_pass = _installed_view_pass()
    table = getattr(installed, "_VIEW_TARGETS", None)
    blocking = getattr(view_pass, "_has_blocking_user", None)
    if not isinstance(table, dict) or blocking is None:
        return _conversions_by_running(graph, installed.ReplaceViewCopyWithViewPass(), scope)
    conversions = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target in table and (scope is None or scope(node)):
            users = [user for user in node.users if scope is None or scope(user)]
            if not blocking(node, users):
                conversions[node] = table[node.target]
    return conversions


@functools.lru_cache(maxsize=None)
def _installed_view_pass() -> tuple[Any, Any]:
    """The installed ExecuTorch's view pass module, and one instance of its pass, asked only for its test
    of blocking users: built once, as building an ``ExportPass`` builds a module (a fifth of a small plan)."""
    from executorch.backends.aoti.passes import replace_view_copy_with_view as installed

    return installed, installed.ReplaceViewCopyWithViewPass()


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
    the backend's own pass turns into views in ``preprocess`` (``later``), and the value every node
    holds under both."""

    graph: torch.fx.Graph
    policy: ConversionPolicy
    targets: dict[Node, Any] = field(default_factory=dict)
    later: dict[Node, Any] = field(default_factory=dict)
    view_values: ViewValues = field(init=False, repr=False, compare=False)
    """What every node holds once compiled, under ``targets`` and ``later`` as they grow: each node's op
    (``op_of``), value and geometry. Its own methods are what the compiled layouts and the relayout are
    handed, so they call down into the program stage, never back up into this plan."""

    def __post_init__(self):
        self.view_values = ViewValues(self.targets, self.later)

    def relaid(self) -> RelaidNodes:
        """Compute nodes whose traced layout Inductor's trace may change, and so what reads them
        (``strideguard.compiler.predictor.relayout``), decided as asked."""
        return RelaidNodes([*self.targets, *self.later], self.view_values.geometry, self.view_values.op_of)


def plan_view_conversion(
    graph: torch.fx.Graph,
    ops_of_graph: GraphOps,
    policy: ConversionPolicy,
    *,
    scope: Optional[Callable[[Node], bool]] = None,
    accepts: Optional[Callable[[Any], bool]] = None,
) -> ViewConversion:
    """Decide, in graph order, which ``*_copy`` nodes become views under ``policy`` (``ops_of_graph``: the
    graph's ops, normalised once, ``program.dialect.graph_ops``).

    With ``scope`` (one partition of a graph that will be compiled on its own),
    only nodes in scope are converted and users out of scope count as outputs.
    With ``accepts`` (the program's verifier), a copy becomes a view only where
    the verifier takes the view op.
    """
    conversion = ViewConversion(graph, policy)
    if policy.backend:
        conversion.later.update(backend_conversions(graph, scope=scope))
    returned = dict.fromkeys(_returned_nodes(graph))
    placeholder_storages = {
        storage_key(n.meta.get("val")) for n in graph.find_nodes(op="placeholder") if "val" in n.meta
    }
    decided_returned_storages: set = set()

    def storages(pieces: list[Node]) -> set:
        if not pieces:
            return set()
        return {g.storage for g in map(conversion.view_values.geometry, pieces) if isinstance(g, Geometry)}

    pieces_of: dict[Node, list[Node]] = {node: [node] for node in returned}
    """What each node returns: itself, and the chunks of it that are returned."""
    for piece in returned:
        if piece.target is operator.getitem and isinstance(piece.args[0], Node):
            pieces_of.setdefault(piece.args[0], []).append(piece)
    converts_more = policy.extra != frozenset()
    checks_backend_conversions = policy.careful and not policy.stands_in_for_backend

    for node in graph.nodes:
        if node.op != "call_function":
            continue
        pieces = pieces_of.get(node, [])
        if node in conversion.later:
            # Converted in preprocess whatever happens here; converting it now too, where the
            # verifier takes the view, keeps the program what the backend will compile.
            view_op = conversion.later[node]
            if (
                converts_more
                and (accepts is None or accepts(view_op))
                and not _blocks_a_later_conversion(node, conversion)
                and not (checks_backend_conversions and _reorders_for_compute(node, None, conversion))
            ):
                conversion.targets[node] = conversion.later.pop(node)
            decided_returned_storages |= storages(pieces)
            continue
        if (
            not policy.admits(node, ops_of_graph)
            or (scope is not None and not scope(node))
            or (accepts is not None and not accepts(ops_of_graph.twin[node]))
            or _has_blocking_user(node, policy, ops_of_graph, scope)
            or _blocks_a_later_conversion(node, conversion)
        ):
            decided_returned_storages |= storages(pieces)
            continue
        view_op = ops_of_graph.twin[node]
        candidate = conversion.view_values.as_view(node, ops_of_graph.aten_twin[node])
        if candidate is None:
            continue
        if policy.careful and _reorders_for_compute(node, candidate, conversion):
            continue
        if policy.careful and pieces:
            taken = placeholder_storages | decided_returned_storages
            if not _conversion_pays(node, candidate, pieces, taken):
                continue
        conversion.targets[node] = view_op
        conversion.view_values.set(node, candidate)
        decided_returned_storages |= storages(pieces)
    return conversion


def view_copies_left_out_of_layout(
    graph: torch.fx.Graph, policy: ConversionPolicy, scope: Callable[[Node], bool]
) -> list[tuple[Node, ...]]:
    """Each view copy ``policy`` converts within ``scope`` (one partition) whose view, with its
    ``getitem``s, would come back out of the layout its node promises: the node first, its chunks after."""
    conversion = plan_view_conversion(graph, graph_ops(graph), policy, scope=scope)
    found = []
    for node in [*conversion.targets, *conversion.later]:
        group = (node, *[user for user in node.users if user.target is operator.getitem])
        if any(
            density.has_layout(g.shape, g.strides, promised_dim_order(member)) is not True
            for member in group
            if isinstance(g := conversion.view_values.geometry(member), Geometry)
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


def _pieces_of(node: Node, candidate: Geometries, pieces: list[Node]) -> list[tuple[Node, Geometry]]:
    return [(p, candidate if p is node else candidate[p.args[1]]) for p in pieces]


def _reorders_for_compute(node: Node, candidate: Geometries, conversion: ViewConversion) -> bool:
    """Whether the view (``candidate``, the geometry ``node`` would take; ``None``: the one it holds, as one
    the backend converts) would hand compute its elements in another dimension order.

    An elementwise op follows its input's dimension order, so its result would
    change layout where the analysis does not look; a matmul on a transposed
    operand takes another BLAS path and may differ in the last bit, and a
    convolution of a view with gaps, in the same order, may too; so may a
    matmul of a view that starts inside its base rather than at its start,
    with the same strides as the copy (another alignment). Such a copy stays
    a copy: it is the one layout change the program asked for.
    """
    compared = conversion.view_values.against_traced(node, candidate)
    if not (compared.restrided or compared.starts_inside):  # the copy's strides, at its base's start: no reader can tell
        return False
    computing = _computing_readers(node, conversion)
    if not computing:
        return False
    if compared.reordered:
        return True
    op_of = conversion.view_values.op_of
    return any(_rounds_otherwise(op_of(u), gaps=compared.restrided, starts_inside=compared.starts_inside) for u in computing)


def _computing_readers(node: Node, conversion: ViewConversion) -> list[Node]:
    """The compute that reads ``node``, through the views (and chunks) taken of it: a view hands on its
    base's dimension order (found by ``make fuzz``: a permute made a view, split by the backend's pass, then
    an ``add`` that followed the permuted order and a ``view_copy`` Inductor could no longer take)."""
    found, pending, seen = [], list(node.users), set()
    while pending:
        user = pending.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.target is operator.getitem or (user.op == "call_function" and is_view_op(conversion.view_values.op_of(user))):
            pending += list(user.users)
        elif user.op == "call_function":
            found.append(user)
    return found


def _rounds_otherwise(op: Any, *, gaps: bool, starts_inside: bool) -> bool:
    """Whether a reader of a view, in the copy's dimension order, may round otherwise than of the dense copy.

    A convolution chooses its algorithm by its input's strides (found by ``make fuzz``: of a slice of a
    channels-last input it differs from that of its ``slice_copy`` by one float32 ulp). A GEMM takes a view
    with gaps as it is (a leading dimension), bitwise as its copy (checked by every generated program), but
    not one that starts inside its base: another alignment (found by ``make fuzz``: a ``linear`` of
    ``select(0, -2)`` of a linear's output, the copy's strides exactly, differed in the last bit).
    """
    packet = ops.packet_of(op)
    return (gaps and packet in ops.CONVOLUTIONS) or (starts_inside and packet in ops.GEMMS)


def _conversion_pays(node: Node, candidate: Geometries, pieces: list[Node], taken: set) -> bool:
    """Whether turning a returned copy into a view saves a copy.

    A returned piece that would come back out of its target layout, or sharing
    memory with an input, a weight or an earlier output, needs a copy again;
    the conversion pays only if some piece does not, or some part of the
    result is used inside the graph as a free view (a split whose other
    chunks feed compute).
    """
    def needs_copy_again(piece: Node, geometry: Geometry) -> bool:
        return (
            density.has_layout(geometry.shape, geometry.strides, promised_dim_order(piece)) is not True
            or geometry.storage in taken
        )

    if not all(needs_copy_again(p, g) for p, g in _pieces_of(node, candidate, pieces)):
        return True
    internal_users = [u for u in node.users if u.op != "output" and u not in pieces]
    return any(u.target is operator.getitem and u.users for u in internal_users)


def _returned_nodes(graph: torch.fx.Graph) -> list[Node]:
    return [v for v in output_values(graph) if isinstance(v, Node)]


def _has_blocking_user(
    node: Node, policy: ConversionPolicy, ops_of_graph: GraphOps, scope: Optional[Callable[[Node], bool]] = None
) -> bool:
    for user in node.users:
        if user.op == "output" or (scope is not None and not scope(user)):
            continue
        if user.op != "call_function":
            return True
        if user.target is operator.getitem:
            if _has_blocking_user(user, policy, ops_of_graph, scope):
                return True
            continue
        op = ops_of_graph.op(user)
        if _mutates(user, op, node):
            return True
        if not policy.careful:
            if user in ops_of_graph.views:
                return True
            continue
        if _depends_on_layout(user.target, op):
            return True
    return False


def _mutates(user: Node, op: Any, node: Node) -> bool:
    schema = getattr(op, "_schema", None)
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


def _depends_on_layout(target: Any, op: Any) -> bool:
    """Users that may read their input's memory as laid out, not through strides (``op``: ``target``'s ATen op)."""
    if is_higher_order(target):
        return True
    if not isinstance(op, torch._ops.OpOverload):
        return True
    if op.namespace not in ("aten", "dim_order_ops"):
        return True
    return op._overloadname == "out" or op._overloadname.endswith("_out")

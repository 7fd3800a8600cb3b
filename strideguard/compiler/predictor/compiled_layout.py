"""What AOTInductor hands back for one output, read from the graph: a decided layout or one left to Inductor.

Inductor itself tells the two apart: a ``FixedLayout`` is decided (an extern
kernel's output, a graph input), a ``FlexibleLayout`` is Inductor's to choose
when it realizes or fuses the buffer. The analysis mirrors that with two
records. ``Settled``: the strides the compiled method returns. ``LeftToInductor``:
the strides as traced, the other layouts Inductor may choose (or
``any_layout``), and why. Each case below was found against a real compile
(most by ``make fuzz``); ``inspect(exact=True)`` asks Inductor instead.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Optional, Union

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import inductor
from ...program import density, ops
from ...program.dialect import aten_op
from ...program.fake_values import call_on_fake_values, fresh_strided
from ...program.ops import op_name
from ...program.reports import Alias, AliasKind
from ...program.view_values import Geometries, Geometry, view_geometry
from .relayout import lays_out_its_own_result

aten = torch.ops.aten

Values = Callable[[Node], Any]
"""The fake value a node will have in the compiled program."""

Ops = Callable[[Node], Any]
"""The op a node will run in the compiled program (an Edge view copy may become a view)."""


@dataclass(frozen=True)
class Compilation:
    """What compiling does to the graph, as far as the layouts go: each node's value and op once compiled,
    the nodes the method returns, and the compute nodes whose layout the view conversions may change."""

    values: Values
    op_of: Ops
    returned: frozenset
    relaid: Container[Node]
    """Asked ``node in relaid`` of the nodes outputs view (``compiler.predictor.relayout.RelaidNodes``)."""
    inductor_values: dict = field(default_factory=dict, compare=False, repr=False)
    """Each node's value in Inductor's own graph, as far as it was asked (``_inductor_value``)."""


@dataclass(frozen=True)
class Settled:
    """The strides the compiled method returns, settled by the graph (Inductor's ``FixedLayout``)."""

    strides: tuple
    note: Optional[str] = None
    """Something worth saying about how it comes back (AOTInductor returns a copy of a weight's view)."""


@dataclass(frozen=True)
class LeftToInductor:
    """A layout Inductor chooses (its ``FlexibleLayout``): the output is copied unless every layout it may
    choose, ``strides`` and ``alternatives``, is the target layout."""

    strides: tuple
    """As traced."""
    why: str
    alternatives: tuple = ()
    """The other layouts Inductor may return it in."""
    any_layout: bool = False
    """Inductor may choose layouts not even listed: always copied."""


CompiledLayout = Union[Settled, LeftToInductor]


def _overlapping(tensor: torch.Tensor) -> bool:
    """A view reading some element twice (an expand): AOTInductor returns it as it is, not copied."""
    return any(
        statically_known_true(stride == 0) and not statically_known_true(size < 2)
        for size, stride in zip(tensor.shape, tensor.stride())
    )


def compiled_layout(
    tensor: torch.Tensor, chain: list[Node], base: Node, base_role: Optional[Alias], compilation: Compilation
) -> CompiledLayout:
    """What AOTInductor hands back for a user output: the view chain over its base, as Inductor lays the base out.

    Settled here: views of inputs; views of weights Inductor keeps as
    constant buffers (the wrapper returns a clone of them); outputs that are
    not views (the strides of their value after Inductor's decompositions);
    and views of what Inductor writes before any view is taken (an extern
    kernel's output, or a node that is itself returned). A view of other
    compute is left to Inductor, which may compute just the viewed elements
    afresh, densely, or lay the base out otherwise than traced.
    """
    sealed = _sealed_view_copy(tensor, chain, base, compilation)
    if sealed is not None and (base.op != "placeholder" or base_role is None or base_role.kind is AliasKind.INPUT
                               or inductor.weight_lowering(compilation.values(base)) is inductor.WeightLowering.CONSTANT):
        return sealed
    if base.op == "placeholder":
        return _of_an_input_or_weight(tensor, chain, base, base_role, compilation)
    if base.op != "call_function":
        return LeftToInductor(tuple(tensor.stride()), why=f"a {base.op} node")
    return _of_compute(tensor, chain, base, compilation)


def _of_an_input_or_weight(
    tensor: torch.Tensor, chain: list[Node], base: Node, base_role: Optional[Alias], compilation: Compilation
) -> CompiledLayout:
    """A user output that is a view chain over an input or a weight: the input's strides as viewed, or what
    AOTInductor's wrapper makes of a weight (a clone, a folded scalar, inlined values)."""
    values = compilation.values
    # A size-one dimension's stride is "insignificant" to Inductor: it may re-stride a view that has one
    # (found by ``make fuzz``: a ``[1, 1]`` narrow of a diagonal of an input, traced (36, 17), comes back
    # (1, 1)), or realize the view afresh.
    viewed = tuple(tensor.stride())
    restrided = chain and density.has_size_one_dim(tensor.shape)
    fresh = tuple(density.strides_for_order(tensor.shape, density.identity_order(tensor.dim())))
    if base_role is None or base_role.kind is AliasKind.INPUT:
        if not restrided or density.same_sizes(viewed, fresh):
            return Settled(viewed)
        return LeftToInductor(
            viewed,
            why="a view of an input with a size-one dimension, whose stride Inductor may re-stride",
            alternatives=(fresh,),
        )
    lowering = inductor.weight_lowering(values(base))
    if lowering is inductor.WeightLowering.CONSTANT and not _overlapping(tensor):
        # The wrapper clones a view of a constant it can see as one, unless it re-strides it first.
        copied = density.preserve_format_strides(tensor)
        if not restrided:
            return Settled(copied, note="AOTInductor returns a copy of a weight's view")
        alternatives = tuple(c for c in (viewed, fresh) if not density.same_sizes(c, copied))
        if not alternatives:
            return Settled(copied, note="AOTInductor returns a copy of a weight's view")
        return LeftToInductor(
            copied,
            why="AOTInductor returns a copy of this view of a weight, the view itself re-strided for "
            "its size-one dimensions, or the view realized afresh",
            alternatives=alternatives,
        )
    how = {
        inductor.WeightLowering.SCALAR: "folds this 0-dim weight into its code",
        inductor.WeightLowering.INLINED: "inlines this small weight as computed values",
        inductor.WeightLowering.CONSTANT: "decides how to return an expand of a weight",
    }[lowering]
    return LeftToInductor(tuple(tensor.stride()), why=f"Inductor {how}")


def _of_compute(tensor: torch.Tensor, chain: list[Node], base: Node, compilation: Compilation) -> CompiledLayout:
    """A user output that is computed, or a view chain over computed memory: the strides Inductor's
    decomposition gives the base, the chain taken over them, unless Inductor may lay the base out afresh."""
    values, op_of, returned = compilation.values, compilation.op_of, compilation.returned
    if base in compilation.relaid:
        name = op_name(op_of(base)) or getattr(base.target, "__name__", str(base.target))
        origin = getattr(compilation.relaid, "origin", lambda node: None)(base)  # RelaidNodes says which cause
        return LeftToInductor(
            tuple(tensor.stride()),
            why=f"{name} is computed from {origin or 'what Inductor lays out otherwise than traced'}, so Inductor may lay it out afresh",
            any_layout=True,
        )
    decomposition = _decomposed(base, values, op_of)
    if not chain:
        if decomposition is not None and _concatenation_chooses_size_one_strides(base, tensor, decomposition, values):
            return LeftToInductor(
                decomposition.strides,
                why="Inductor's decomposition clones its one non-empty input, which is not dense, and "
                "gives the size-one dimensions strides of its own choosing",
                any_layout=True,
            )
        if _copies_a_view_choosing_size_one_strides(base, tensor, values, op_of):
            return LeftToInductor(
                tuple(tensor.stride()),
                why="Inductor's decomposition of this view copy clones a view that is not contiguous, and "
                "keeps the view's own strides in the size-one dimensions",
                any_layout=True,
            )
    base_strides = decomposition.strides if decomposition is not None else tuple(values(base).stride())
    if base in returned:
        base_strides = _with_inductors_size_one_strides(base, base_strides, compilation)
        if base_strides is None:
            return LeftToInductor(
                tuple(tensor.stride()),
                why="Inductor gives a returned result's size-one dimensions the strides its own graph traces "
                "them with, which could not be followed back to the inputs",
                any_layout=True,
            )
    if not chain:
        return Settled(base_strides)
    return _of_a_view_of_compute(tensor, chain, base, base_strides, decomposition, compilation)


def _of_a_view_of_compute(
    tensor: torch.Tensor, chain: list[Node], base: Node, base_strides: tuple,
    decomposition: Optional[inductor.Decomposed], compilation: Compilation,
) -> CompiledLayout:
    """A view chain over computed memory laid out in ``base_strides``: settled where Inductor writes the base
    before any view is taken (an extern kernel's output, a returned node), else left to Inductor, which may
    compute the viewed elements afresh or realize the base in a layout of its own."""
    values, op_of, returned = compilation.values, compilation.op_of, compilation.returned
    strides = tuple(tensor.stride())
    if not density.same_sizes(base_strides, values(base).stride()):
        recomputed = _recomputed_over(chain, base, _restrided(values(base), base_strides), values, op_of)
        if recomputed is None:
            return LeftToInductor(
                strides,
                why="this view cannot be taken of its base as Inductor's decomposition lays it out, so "
                "Inductor copies it in a layout of its choosing",
                any_layout=True,
            )
        strides = recomputed
    producer = decomposition.producer if decomposition is not None else aten_op(op_of(base))
    if base not in returned and ops.in_family(producer, ops.CONCATENATIONS):
        return LeftToInductor(
            strides,
            why="a view of a concatenation, which Inductor may compute afresh or simplify to the view of "
            "the one input it lies in, laid out as that input is (an expand of a small weight comes back with "
            "zero strides)",
            any_layout=True,
        )
    # A factory (no tensor inputs) that Inductor computes rather than calls may be realized afresh for its own
    # output, and its views computed from the values: torch 2.14 lowers ``_efficientzerotensor`` to an expand
    # of a 0-d constant and realizes the returned one separately, so its slice comes back dense.
    computed_factory = base in returned and not base.all_input_nodes
    if (base not in returned or computed_factory) and not inductor.lowers_to_kernel_output(producer):
        name = getattr(producer, "__name__", str(producer))
        # Realized rather than fused, the producer gets Inductor's own layout, which need not be the traced
        # one (found by ``make fuzz``: ``logical_not`` of a transposed input realized contiguously).
        base_value = values(base)
        realized = _recomputed_over(chain, base, _restrided(base_value, _contiguous(base_value)), values, op_of)
        return LeftToInductor(
            strides,
            why=f"a view of {name}, which Inductor may fuse into this output and lay out afresh, or "
            "realize in a layout of its own (the copy is then fused too, at no cost)",
            alternatives=() if realized is None else (realized,),
            any_layout=realized is None,
        )
    return Settled(strides)


def _with_inductors_size_one_strides(node: Node, strides: tuple, compilation: Compilation) -> Optional[tuple]:
    """``strides`` of a returned result with its size-one dimensions' strides as Inductor returns them, or
    ``None`` where they cannot be told.

    Inductor returns a graph output with the traced strides where they are significant, and in its
    size-one dimensions with the strides its own graph traced for the node
    (``ir.try_match_insignificant_strides``). That graph runs Inductor's decompositions, whose results can
    be laid out otherwise than torch's kernels lay out theirs (found by ``make fuzz``: ``softmax`` of a
    transposed input, dense in the input's order there, contiguous as traced), and the difference travels
    down every op reading them: ``add(softmax(transpose(x)))`` of shape ``[1, 1, 4, 1]``, traced ``(4, 4, 1,
    1)``, comes back ``(4, 4, 1, 4)``.
    """
    shape = tuple(compilation.values(node).shape)
    if not density.has_size_one_dim(shape):
        return strides
    value = _inductor_value(node, compilation)
    if not isinstance(value, torch.Tensor):
        return None
    own = tuple(value.stride())
    return tuple(o if density.same_sizes((size,), (1,)) else s for size, s, o in zip(shape, strides, own))


UNKNOWN = object()
"""A value in Inductor's graph that could not be worked out."""

INDUCTOR_VALUE_BUDGET = 4_000
"""Nodes whose value in Inductor's graph one plan works out at most; past it, a returned result's size-one
strides are not followed (it is copied, unless ``exact=True`` asks Inductor)."""


def _inductor_value(node: Node, compilation: Compilation) -> Any:
    """``node``'s value in Inductor's own graph: each op over its inputs' values there, decomposed as Inductor
    decomposes it. The same object as the traced value wherever it is laid out alike, so most nodes cost one
    identity check; ``UNKNOWN`` where an op could not be run on them."""
    known = compilation.inductor_values
    if node in known:
        return known[node]
    pending = [(node, False)]
    while pending:
        current, inputs_done = pending.pop()
        if current in known:
            continue
        if inputs_done:
            known[current] = UNKNOWN if len(known) >= INDUCTOR_VALUE_BUDGET else _inductor_value_of(current, compilation)
            continue
        pending.append((current, True))
        pending += [(source, False) for source in current.all_input_nodes if source not in known]
    return known[node]


def _traced(node: Node, compilation: Compilation) -> Any:
    """``node``'s value as traced, for the op it runs once compiled: its own where that op is its target (no
    recomputation needed, which dispatches), else the compiled value (an Edge view copy that becomes a view)."""
    if node.op == "call_function" and compilation.op_of(node) is not node.target:
        return compilation.values(node)
    value = node.meta.get("val")
    return compilation.values(node) if value is None else value


def _inductor_value_of(node: Node, compilation: Compilation) -> Any:
    traced = _traced(node, compilation)
    if node.op != "call_function":
        return traced
    known = compilation.inductor_values
    inputs = node.all_input_nodes
    if any(known[source] is UNKNOWN for source in inputs):
        # a copy told its layout, as ``relayout`` judges one (strideguard's own output copies among them),
        # or a GEMM, lays its result out whatever it reads
        return traced if lays_out_its_own_result(node, compilation.op_of(node)) else UNKNOWN
    changed = any(known[source] is not _traced(source, compilation) for source in inputs)
    if node.target is operator.getitem:
        if not changed:
            return traced
        pieces = known[node.args[0]]
        return pieces[node.args[1]] if isinstance(pieces, (list, tuple)) else UNKNOWN
    op = aten_op(compilation.op_of(node))
    if isinstance(traced, torch.Tensor) and isinstance(op, torch._ops.OpOverload) and inductor.decomposes(op):
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), known.__getitem__)
        decomposition = inductor.decomposed(op, args, kwargs)
        if decomposition is None:
            return UNKNOWN if changed else traced
        if density.same_sizes(decomposition.strides, traced.stride()):
            return traced
        return fresh_strided(traced, tuple(traced.shape), decomposition.strides)
    if not changed:
        return traced
    if not isinstance(op, torch._ops.OpOverload):
        return UNKNOWN
    try:
        value = call_on_fake_values(op, node, known.__getitem__)
    except Exception:  # noqa: BLE001 - an op that will not run on these values leaves the result to Inductor
        return UNKNOWN
    # laid out as traced after all: the traced value itself, so that what reads it is not run again
    return traced if _laid_out_alike(value, traced) else value


def _laid_out_alike(value: Any, traced: Any) -> bool:
    if isinstance(value, torch.Tensor) and isinstance(traced, torch.Tensor):
        return density.same_sizes(value.shape, traced.shape) and density.same_sizes(value.stride(), traced.stride())
    if isinstance(value, (list, tuple)) and isinstance(traced, (list, tuple)) and len(value) == len(traced):
        return all(_laid_out_alike(v, t) for v, t in zip(value, traced))
    return False


def _sealed_view_copy(tensor: torch.Tensor, chain: list[Node], base: Node, compilation: Compilation) -> Optional[CompiledLayout]:
    """A view of a view that Inductor cannot unwrap to its storage, which it returns as a dense copy in the
    traced order (found by ``make fuzz``: a ``diagonal`` of a ``diagonal`` of an input, traced ``(21, 10)``,
    comes back ``(2, 1)``); ``None`` where the chain comes back as a view (``compiler.predictor.inductor.HeldView``)."""
    if not any(inductor.may_seal(aten_op(compilation.op_of(node))) for node in chain):
        return None
    held = inductor.HeldView.STORED
    last = len(chain) - 1
    for position, node in enumerate(reversed(chain)):
        if node.target is operator.getitem:
            continue
        source = node.args[0] if node.args and isinstance(node.args[0], Node) else None
        if source is None:
            return _unfollowed(tensor)
        held = inductor.held_after(held, aten_op(compilation.op_of(node)), compilation.values(source), compilation.values(node))
        if held is None:
            return _unfollowed(tensor)
        if position < last and _realized_as_a_view_on_its_own(node, compilation):
            if held is inductor.HeldView.SEALED:
                return _unfollowed(tensor)  # copied there, and the rest of the chain is a view of that copy
            if held is inductor.HeldView.WRAPPED:
                if not statically_known_true(compilation.values(node).numel() > 1):
                    return _unfollowed(tensor)
                held = inductor.HeldView.STORED  # Inductor keeps it as strides over the storage from there on
    if held is not inductor.HeldView.SEALED:
        return None
    traced = tuple(tensor.stride())
    if statically_known_true(tensor.numel() < 2):
        return Settled(traced)  # no copy: Inductor gives an output of one element the traced strides
    copied = inductor.copy_in_traced_order(tuple(tensor.shape), traced)
    if copied is None:
        return _unfollowed(tensor)
    return Settled(copied, note="Inductor returns this view of a view as a dense copy in the traced order")


def _unfollowed(tensor: torch.Tensor) -> LeftToInductor:
    return LeftToInductor(
        tuple(tensor.stride()),
        why="a view of a view that Inductor may return as a copy, in a layout this analysis does not follow",
        any_layout=True,
    )


def _realized_as_a_view_on_its_own(node: Node, compilation: Compilation) -> bool:
    """A view in the middle of a chain that Inductor realizes when it lowers it: a returned node, or the input
    of an ``as_strided``."""
    return node in compilation.returned or any(
        ops.packet_of(compilation.op_of(user)) is aten.as_strided for user in node.users
    )


def _concatenation_chooses_size_one_strides(base: Node, tensor: torch.Tensor, decomposition, values: Values) -> bool:
    """A ``cat`` or ``stack`` of one non-empty input becomes ``clone`` of it, and the clone's strides in
    size-one dimensions are Inductor's choice, not the graph's: undecided unless they are those of a
    contiguous tensor (found by ``make fuzz``: ``[5, 1]`` traced ``(1, 5)`` comes back ``(1, 1)``)."""
    if not ops.in_family(base.target, ops.CONCATENATIONS):
        return False
    if not density.has_size_one_dim(tensor.shape):
        return False
    contiguous = density.strides_for_order(tensor.shape, density.identity_order(tensor.dim()))
    if density.same_sizes(decomposition.strides, contiguous):
        return False
    inputs = [v for v in torch.utils._pytree.tree_leaves(torch.fx.node.map_arg(base.args, values)) if isinstance(v, torch.Tensor)]
    non_empty = [v for v in inputs if not any(density.same_sizes((size,), (0,)) for size in v.shape)]
    return len(non_empty) == 1 or not density.same_sizes(decomposition.strides, tensor.stride())


def _copies_a_view_choosing_size_one_strides(base: Node, tensor: torch.Tensor, values: Values, op_of: Ops) -> bool:
    """A view copy left a copy (``view_copy`` of a strided view, found by ``make fuzz``): Inductor traces it as
    a ``clone`` of the view, and where the view is not exactly contiguous Inductor's own view keeps the base's
    stride in a size-one dimension, which eager (and so the traced value) replaces."""
    op = aten_op(op_of(base))
    if not isinstance(op, torch._ops.OpOverload) or torch.Tag.view_copy not in op.tags:
        return False
    if not density.has_size_one_dim(tensor.shape) or statically_known_true(tensor.numel() < 2):
        return False
    source = base.args[0] if base.args and isinstance(base.args[0], Node) else None
    value = values(source) if source is not None else None
    if not isinstance(value, torch.Tensor):
        return False
    return density.has_layout(value.shape, value.stride(), density.identity_order(value.dim())) is not True


def _decomposed(node: Node, values: Values, op_of: Ops) -> Optional[inductor.Decomposed]:
    """``node``'s value and producing op after Inductor's decompositions, when it has any to apply."""
    op = aten_op(op_of(node))
    if not isinstance(op, torch._ops.OpOverload) or not inductor.decomposes(op):
        return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values)
    return inductor.decomposed(op, args, kwargs)


def _contiguous(value: torch.Tensor) -> tuple:
    return density.strides_for_order(value.shape, density.identity_order(value.dim()))


def _restrided(value: torch.Tensor, strides: tuple) -> torch.Tensor:
    """A fake tensor like ``value`` with other strides (the base as Inductor's decompositions lay it out)."""
    return fresh_strided(value, tuple(value.shape), tuple(strides))


def _recomputed_over(
    chain: list[Node], base: Node, base_value: torch.Tensor, values: Values, op_of: Ops
) -> Optional[tuple]:
    """The strides of the view chain recomputed over another value of its base, or None where a
    ``view`` in it cannot be a view of that value (found by ``make fuzz``).

    By stride arithmetic where every view allows it (no dispatch per view: a chain of 8,000 views is
    recomputed in milliseconds), else on fake tensors."""
    geometry: Geometries = Geometry.of(base_value)
    for node in reversed(chain):
        if isinstance(geometry, list) and node.target is operator.getitem:
            geometry = geometry[node.args[1]]
        elif isinstance(geometry, Geometry) and geometry.static and node.target is not operator.getitem:
            geometry = view_geometry(aten_op(op_of(node)), geometry, node.args[1:], node.kwargs)
        else:
            geometry = None
        if geometry is None:
            return _dispatched_over(chain, base, base_value, values, op_of)
    return tuple(geometry.strides) if isinstance(geometry, Geometry) else _dispatched_over(chain, base, base_value, values, op_of)


def _dispatched_over(
    chain: list[Node], base: Node, base_value: torch.Tensor, values: Values, op_of: Ops
) -> Optional[tuple]:
    replaced = {base: base_value}

    def value(node: Node) -> Any:
        return replaced[node] if node in replaced else values(node)

    for node in reversed(chain):
        if node.target is operator.getitem:
            replaced[node] = value(node.args[0])[node.args[1]]
        else:
            try:
                replaced[node] = call_on_fake_values(aten_op(op_of(node)), node, value)
            except (RuntimeError, ValueError):
                return None
    return tuple(replaced[chain[0]].stride())

"""Facts about each user output, computed once.

For every user output of a method this works out, from the graph alone, what
the compiled method will hand back: which view chain produces it and of what
base, the strides AOTInductor gives it, the layout it must have, what it
shares memory with, and whether (and why) it needs one copy. The passes and
the reports only read these records.

Views are told from copies by storage identity of the fake tensors in
``meta["val"]`` (a ``reshape`` that had to copy is not a view), so the analysis
agrees with the tracer rather than with op names.
"""

from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.export.graph_signature import ExportGraphSignature
from torch.fx import Node

from . import inductor, layout, ops
from .fake_values import call_on_fake_values, storage_key
from .dialect import Dialect, aten_op, is_higher_order, is_view_op, op_name
from .program import UserOutput, output_values, placeholder_roles, user_outputs
from .records import Action, Alias, AliasKind, LayoutReport, OutputKind, OutputLayout, Reason, memory_group_peer

if TYPE_CHECKING:
    from .lowering import Lowering

Values = Callable[[Node], Any]
"""The fake value a node will have in the compiled program."""

Ops = Callable[[Node], Any]
"""The op a node will run in the compiled program (an Edge view copy may become a view)."""


def own_op(node: Node) -> Any:
    return node.target


def meta_value(node: Node) -> Any:
    return node.meta.get("val")


def view_source(node: Node, values: Values, op_of: Ops = own_op) -> Optional[Node]:
    """The node ``node`` is a view of, or ``None`` when ``node`` owns its memory."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], Node):
        return None
    source = node.args[0]
    if node.target is operator.getitem:
        if source.op != "call_function" or not is_view_op(op_of(source)):
            return None
    elif not is_view_op(op_of(node)):
        return None
    key = storage_key(values(node))
    if key is None:
        return None
    return source if storage_key(values(source)) == key else None


@dataclass(frozen=True)
class OutputFacts:
    """Everything decided about one user output; ``layout`` is its public face."""

    output: UserOutput
    node: Optional[Node]
    chain: tuple[Node, ...]
    """View nodes from the output inward, ending before ``base``."""
    base: Optional[Node]
    target_order: Optional[tuple[int, ...]]
    layout: OutputLayout
    value: Any = None
    """Its fake value as compiled (views replayed on their bases, so it shares their storage)."""

    @property
    def copied(self) -> bool:
        return self.layout.action is Action.COPY

    def uncopied(self) -> "OutputFacts":
        """The same facts, with no copy inserted for it (a runtime that copies every output anyway)."""
        return replace(self, layout=replace(self.layout, action=Action.NONE))


def _describe_view(node: Node, op_of: Ops) -> str:
    """A view op in words, e.g. ``slice(dim=2, 0:14)``."""
    if node.target is operator.getitem:
        return f"chunk {node.args[1]}"
    name = op_name(op_of(node)) or str(node.target)
    args = [a.name if isinstance(a, Node) else a for a in node.args[1:]]
    if name == "slice":
        dim, start, end, step = (list(args) + [0, None, None, 1][len(args):])[:4]
        step_text = f":{step}" if step not in (1, None) else ""
        end_text = "" if end is None or (isinstance(end, int) and end >= 2**62) else end
        return f"slice(dim={dim}, {'' if start is None else start}:{end_text}{step_text})"
    if name == "select":
        return f"select(dim={args[0]}, index={args[1]})"
    if name in ("split", "split_with_sizes", "chunk"):
        return f"{name}({args[0]}, dim={args[1] if len(args) > 1 else 0})"
    if name == "unbind":
        return f"unbind(dim={args[0] if args else 0})"
    rendered = ", ".join(str(a) for a in args)
    return f"{name}({rendered})"


def _source_name(node: Node, roles: Mapping[str, Alias], op_of: Ops) -> str:
    if node.op == "placeholder":
        role = roles.get(node.name)
        return str(role) if role else node.name
    if node.op == "call_function":
        return op_name(op_of(node)) or getattr(node.target, "__name__", str(node.target))
    return node.name


def _overlapping(tensor: torch.Tensor) -> bool:
    """A view reading some element twice (an expand): AOTInductor returns it as it is, not copied."""
    return any(
        statically_known_true(stride == 0) and not statically_known_true(size < 2)
        for size, stride in zip(tensor.shape, tensor.stride())
    )


def _control_flow_base(node: Node) -> bool:
    if node.op != "call_function":
        return False
    if is_higher_order(node.target):
        return True
    return node.target is operator.getitem and isinstance(node.args[0], Node) and is_higher_order(node.args[0].target)


def analyze_outputs(
    graph: torch.fx.Graph,
    signature: ExportGraphSignature,
    *,
    values: Values = meta_value,
    op_of: Ops = own_op,
    target_orders: Optional[Mapping[int, tuple[int, ...]]] = None,
    relaid: frozenset = frozenset(),
    break_aliases: bool = False,
) -> list[OutputFacts]:
    """Facts for each user output of ``program``'s graph.

    ``values`` gives each node's fake value in the compiled program (an Edge
    program's view copies replayed as views); ``target_orders`` maps a user
    output's index to its promised dim order (contiguous when absent);
    ``relaid`` holds the compute nodes whose layout those conversions may change.
    """
    roles = placeholder_roles(signature)
    returned = output_values(graph)
    outputs = user_outputs(signature)

    memory_owners: dict[int, list[Alias]] = {}
    for node in graph.find_nodes(op="placeholder"):
        key = storage_key(values(node))
        if key is not None and node.name in roles:
            memory_owners.setdefault(key, []).append(roles[node.name])
    output_keys = {}
    for out in outputs:
        value = returned[out.position]
        if isinstance(value, Node):
            key = storage_key(values(value))
            if key is not None:
                output_keys.setdefault(key, []).append(out.index)

    returned_nodes = {v for v in returned if isinstance(v, Node)}
    facts = []
    for out in outputs:
        value = returned[out.position]
        target_order = (target_orders or {}).get(out.index)
        facts.append(
            _facts_for(
                out, value, values, op_of, roles, memory_owners, output_keys, target_order, returned_nodes, relaid
            )
        )
    if break_aliases:
        facts = break_shared_memory(facts)
    return facts


def break_shared_memory(facts: list[OutputFacts]) -> list[OutputFacts]:
    """Copy every output that, after the layout copies, still shares memory.

    Outputs copied for their layout own fresh memory; of the rest, the first
    of each group sharing memory keeps it, and any sharing an input or a
    weight is copied. An output with no elements has no memory to share,
    whatever its storage: it is neither copied nor does it claim a group.
    """
    kept: dict[Any, int] = {}
    result = []
    for fact in facts:
        record = fact.layout
        if fact.copied or not record.aliases or statically_known_true(fact.value.numel() == 0):
            result.append(fact)
            continue
        key = storage_key(fact.value)
        still_shared = [a for a in record.aliases if a.kind is not AliasKind.OUTPUT]
        if key in kept:
            still_shared.append(Alias(AliasKind.OUTPUT, str(kept[key])))
        if not still_shared:
            kept[key] = record.index
            result.append(fact)
            continue
        explanation = f"shares memory with {', '.join(map(str, still_shared))}"
        record = replace(record, action=Action.COPY, reason=Reason.SHARES_MEMORY, explanation=explanation)
        result.append(replace(fact, layout=record))
    return result


def _non_tensor_facts(out: UserOutput, value: Any, node: Optional[Node]) -> OutputFacts:
    traced = meta_value(node) if node is not None else value
    kinds = {torch.SymInt: OutputKind.SYMINT, torch.SymFloat: OutputKind.SYMFLOAT, torch.SymBool: OutputKind.SYMBOOL,
             bool: OutputKind.BOOL, int: OutputKind.INT, float: OutputKind.FLOAT, type(None): OutputKind.NONE}
    kind = next((k for t, k in kinds.items() if isinstance(traced, t)), OutputKind.OTHER)
    record = OutputLayout(index=out.index, name=node.name if node is not None else None, kind=kind)
    return OutputFacts(out, node, (), None, None, record)


@dataclass(frozen=True)
class _Compiled:
    """The strides the compiled method returns for an output, or why the analysis cannot say."""

    strides: tuple
    undecided: Optional[str] = None
    """Why Inductor, not the graph, decides this layout. The output is then copied, unless every
    layout Inductor may choose (``alternatives`` and ``strides``) is the target layout."""
    alternatives: tuple = ()
    """Other layouts Inductor may return it in, when it is undecided."""
    unknown: bool = False
    """Inductor may choose layouts not even listed here: always copy."""
    note: Optional[str] = None


def _compiled_layout(
    tensor: torch.Tensor,
    chain: list[Node],
    base: Node,
    base_role: Optional[Alias],
    values: Values,
    op_of: Ops,
    returned: set,
    relaid: set,
) -> _Compiled:
    """What AOTInductor hands back for a user output: the view chain over its base, as Inductor lays the base out.

    Decided here: views of inputs; views of weights Inductor keeps as
    constant buffers (the wrapper returns a clone of them); outputs that are
    not views (the strides of their value after Inductor's decompositions);
    and views of what Inductor writes before any view is taken (an extern
    kernel's output, or a node that is itself returned). A view of other
    compute is left to Inductor, which may compute just the viewed elements
    afresh, densely, or lay the base out otherwise than traced.
    """
    if base.op == "placeholder":
        # A size-one dimension's stride is "insignificant" to Inductor: it may re-stride a view that has one
        # (found by ``make fuzz``: a ``[1, 1]`` narrow of a diagonal of an input, traced (36, 17), comes back
        # (1, 1)), or realize the view afresh.
        viewed = tuple(tensor.stride())
        restrided = chain and layout.has_size_one_dim(tensor.shape)
        fresh = tuple(layout.strides_for_order(tensor.shape, layout.identity_order(tensor.dim())))
        if base_role is None or base_role.kind is AliasKind.INPUT:
            if not restrided or layout.same_sizes(viewed, fresh):
                return _Compiled(viewed)
            return _Compiled(
                viewed,
                undecided="a view of an input with a size-one dimension, whose stride Inductor may re-stride",
                alternatives=(fresh,),
            )
        lowering = inductor.weight_lowering(values(base))
        if lowering is inductor.WeightLowering.CONSTANT and not _overlapping(tensor):
            # The wrapper clones a view of a constant it can see as one, unless it re-strides it first.
            copied = layout.preserve_format_strides(tensor)
            if not restrided:
                return _Compiled(copied, note="AOTInductor returns a copy of a weight's view")
            alternatives = tuple(c for c in (viewed, fresh) if not layout.same_sizes(c, copied))
            if not alternatives:
                return _Compiled(copied, note="AOTInductor returns a copy of a weight's view")
            return _Compiled(
                copied,
                undecided="AOTInductor returns a copy of this view of a weight, the view itself re-strided for "
                "its size-one dimensions, or the view realized afresh",
                alternatives=alternatives,
            )
        how = {
            inductor.WeightLowering.SCALAR: "folds this 0-dim weight into its code",
            inductor.WeightLowering.INLINED: "inlines this small weight as computed values",
            inductor.WeightLowering.CONSTANT: "decides how to return an expand of a weight",
        }[lowering]
        return _Compiled(tuple(tensor.stride()), undecided=f"Inductor {how}")
    if base.op != "call_function":
        return _Compiled(tuple(tensor.stride()), undecided=f"a {base.op} node")
    if base in relaid:
        name = _source_name(base, {}, op_of)
        return _Compiled(
            tuple(tensor.stride()),
            undecided=f"{name} reads a view that now has other strides, so Inductor lays it out afresh",
            unknown=True,
        )
    decomposition = _decomposed(base, values, op_of)
    if not chain:
        if decomposition is not None and _concatenation_chooses_size_one_strides(base, tensor, decomposition, values):
            return _Compiled(
                decomposition.strides,
                undecided="Inductor's decomposition clones its one non-empty input, which is not dense, and "
                "gives the size-one dimensions strides of its own choosing",
                unknown=True,
            )
        if _copies_a_view_choosing_size_one_strides(base, tensor, values, op_of):
            return _Compiled(
                tuple(tensor.stride()),
                undecided="Inductor's decomposition of this view copy clones a view that is not contiguous, and "
                "keeps the view's own strides in the size-one dimensions",
                unknown=True,
            )
        return _Compiled(decomposition.strides if decomposition is not None else tuple(tensor.stride()))
    strides = tuple(tensor.stride())
    if decomposition is not None and not layout.same_sizes(decomposition.strides, values(base).stride()):
        replayed = _replayed_over(chain, base, _restrided(values(base), decomposition.strides), values, op_of)
        if replayed is None:
            return _Compiled(
                strides,
                undecided="this view cannot be taken of its base as Inductor's decomposition lays it out, so "
                "Inductor copies it in a layout of its choosing",
                unknown=True,
            )
        strides = replayed
    producer = decomposition.producer if decomposition is not None else aten_op(op_of(base))
    if base not in returned and ops.in_family(producer, ops.CONCATENATIONS):
        return _Compiled(
            strides,
            undecided="a view of a concatenation, which Inductor may compute afresh or simplify to the view of "
            "the one input it lies in, laid out as that input is (an expand of a small weight comes back with "
            "zero strides)",
            unknown=True,
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
        realized = _replayed_over(chain, base, _restrided(base_value, _contiguous(base_value)), values, op_of)
        return _Compiled(
            strides,
            undecided=f"a view of {name}, which Inductor may fuse into this output and lay out afresh, or "
            "realize in a layout of its own (the copy is then fused too, at no cost)",
            alternatives=() if realized is None else (realized,),
            unknown=realized is None,
        )
    return _Compiled(strides)


def _concatenation_chooses_size_one_strides(base: Node, tensor: torch.Tensor, decomposition, values: Values) -> bool:
    """A ``cat`` or ``stack`` of one non-empty input becomes ``clone`` of it, and the clone's strides in
    size-one dimensions are Inductor's choice, not the graph's: undecided unless they are those of a
    contiguous tensor (found by ``make fuzz``: ``[5, 1]`` traced ``(1, 5)`` comes back ``(1, 1)``)."""
    if not ops.in_family(base.target, ops.CONCATENATIONS):
        return False
    if not layout.has_size_one_dim(tensor.shape):
        return False
    contiguous = layout.strides_for_order(tensor.shape, layout.identity_order(tensor.dim()))
    if layout.same_sizes(decomposition.strides, contiguous):
        return False
    inputs = [v for v in torch.utils._pytree.tree_leaves(torch.fx.node.map_arg(base.args, values)) if isinstance(v, torch.Tensor)]
    non_empty = [v for v in inputs if not any(layout.same_sizes((size,), (0,)) for size in v.shape)]
    return len(non_empty) == 1 or not layout.same_sizes(decomposition.strides, tensor.stride())


def _copies_a_view_choosing_size_one_strides(base: Node, tensor: torch.Tensor, values: Values, op_of: Ops) -> bool:
    """A view copy left a copy (``view_copy`` of a strided view, found by ``make fuzz``): Inductor traces it as
    a ``clone`` of the view, and where the view is not exactly contiguous Inductor's own view keeps the base's
    stride in a size-one dimension, which eager (and so the traced value) replaces."""
    op = aten_op(op_of(base))
    if not isinstance(op, torch._ops.OpOverload) or torch.Tag.view_copy not in op.tags:
        return False
    if not layout.has_size_one_dim(tensor.shape) or statically_known_true(tensor.numel() < 2):
        return False
    source = base.args[0] if base.args and isinstance(base.args[0], Node) else None
    value = values(source) if source is not None else None
    if not isinstance(value, torch.Tensor):
        return False
    return layout.has_layout(value.shape, value.stride(), layout.identity_order(value.dim())) is not True


def _decomposed(node: Node, values: Values, op_of: Ops) -> Optional[inductor.Decomposed]:
    """``node``'s value and producing op after Inductor's decompositions, when it has any to apply."""
    op = aten_op(op_of(node))
    if not isinstance(op, torch._ops.OpOverload) or not inductor.decomposes(op):
        return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values)
    return inductor.decomposed(op, args, kwargs)


def _contiguous(value: torch.Tensor) -> tuple:
    return layout.strides_for_order(value.shape, layout.identity_order(value.dim()))


def _restrided(value: torch.Tensor, strides: tuple) -> torch.Tensor:
    """A fake tensor like ``value`` with other strides (the base as Inductor's decompositions lay it out)."""
    from torch._guards import detect_fake_mode

    with detect_fake_mode([value]) or contextlib.nullcontext():
        return torch.empty_strided(value.shape, strides, dtype=value.dtype, device=value.device)


def _replayed_over(
    chain: list[Node], base: Node, base_value: torch.Tensor, values: Values, op_of: Ops
) -> Optional[tuple]:
    """The strides of the view chain replayed over another value of its base, or None where a
    ``view`` in it cannot be a view of that value (found by ``make fuzz``)."""
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


def _facts_for(out, value, values, op_of, roles, memory_owners, output_keys, target_order, returned, relaid):
    node = value if isinstance(value, Node) else None
    tensor = values(node) if node is not None else None
    if not isinstance(tensor, torch.Tensor):
        return _non_tensor_facts(out, value, node)

    chain = []
    base = node
    while (source := view_source(base, values, op_of)) is not None:
        chain.append(base)
        base = source
    base_role = roles.get(base.name) if base.op == "placeholder" else None

    shape = tuple(tensor.shape)
    if target_order is None:
        target_order = layout.identity_order(tensor.dim())
    compiled = _compiled_layout(tensor, chain, base, base_role, values, op_of, returned, relaid)
    strides = compiled.strides

    contiguous = layout.is_contiguous(shape, strides)
    dense = layout.is_non_overlapping_and_dense(shape, strides)
    in_target = layout.has_layout(shape, strides, target_order)

    key = storage_key(tensor)
    aliases = list(memory_owners.get(key, ()))
    aliases += [Alias(AliasKind.OUTPUT, str(i)) for i in memory_group_peer(output_keys.get(key, ()), out.index)]

    cause = None
    if chain:
        cause = " of ".join(_described_chain(chain, op_of)) + f" of {_source_name(base, roles, op_of)}"
    elif in_target is not True:
        cause = f"produced with strides {list(layout.format_strides(strides))} by {_source_name(base, roles, op_of)}"

    in_target, reason, explanation = _verdict(compiled, base, chain, shape, strides, target_order, in_target)
    record = OutputLayout(
        index=out.index,
        name=node.name,
        kind=OutputKind.TENSOR,
        action=Action.NONE if reason in (Reason.IN_LAYOUT, Reason.VIEW_IN_LAYOUT) else Action.COPY,
        reason=reason,
        explanation=explanation,
        shape=layout.format_strides(shape),
        dtype=str(tensor.dtype).removeprefix("torch."),
        strides=layout.format_strides(strides),
        contiguous=contiguous,
        dense=dense,
        target_dim_order=tuple(target_order),
        in_target_layout=in_target,
        aliases=tuple(aliases),
        view_of=_source_name(base, roles, op_of) if chain else None,
        cause=cause,
    )
    return OutputFacts(out, node, tuple(chain), base, tuple(target_order), record, tensor)


def _described_chain(chain: list[Node], op_of: Ops, shown: int = 6) -> list[str]:
    """Each view of a chain in words, from the output inward; a long chain keeps its ends."""
    if len(chain) <= shown:
        return [_describe_view(n, op_of) for n in chain]
    head, tail = chain[: shown - 2], chain[-2:]
    return [_describe_view(n, op_of) for n in head] + [f"{len(chain) - shown} more views"] + [
        _describe_view(n, op_of) for n in tail
    ]


def _verdict(compiled: _Compiled, base: Node, chain, shape, strides, order, in_target) -> tuple:
    """``in_target_layout``, the reason and its explanation for one tensor output."""
    if _control_flow_base(base):
        return None, Reason.CONTROL_FLOW, "an output of control flow: its compiled layout is not decided, so it is copied"
    if in_target is None:
        return None, Reason.SYMBOLIC, "symbolic strides: cannot prove them those of its target layout, so it is copied"
    if compiled.undecided is not None and (
        compiled.unknown
        or in_target is not True
        or any(layout.has_layout(shape, other, order) is not True for other in compiled.alternatives)
    ):
        return None, Reason.INDUCTOR_DECIDES, f"{compiled.undecided}; copied, and inspect(exact=True) asks Inductor"
    if in_target is False:
        shown, target = layout.format_strides(strides), layout.format_strides(layout.strides_for_order(shape, order))
        return False, Reason.STRIDED, f"strides {list(shown)} are not the strides {list(target)} of dim order {list(order)}"
    reason = Reason.VIEW_IN_LAYOUT if chain else Reason.IN_LAYOUT
    explanation = "a view already dense in its target layout" if chain else "dense in its target layout"
    if compiled.undecided is not None:
        explanation += ", whether Inductor returns it as a view or computes it afresh in its order"
    if compiled.note is not None:
        explanation += f" ({compiled.note})"
    return True, reason, explanation


def report(facts: list[OutputFacts], dialect: Dialect, *, source: str = "analysis") -> LayoutReport:
    return LayoutReport(dialect=dialect.value, outputs=tuple(f.layout for f in facts), source=source)


def exact_facts(facts: list[OutputFacts], lowering: "Lowering") -> list[OutputFacts]:
    """``facts`` with each tensor output's strides, and so its verdict and copy, as Inductor's lowering has them."""
    if len(lowering.outputs) != len(facts):
        raise RuntimeError(
            f"strideguard: Inductor's lowering returned {len(lowering.outputs)} outputs for {len(facts)} user outputs"
        )
    exact = []
    for fact, lowered in zip(facts, lowering.outputs):
        record = fact.layout
        if record.kind != "tensor" or lowered is None or fact.target_order is None:
            exact.append(fact)
            continue
        shape, order = lowered.shape, fact.target_order
        strides = lowered.strides
        in_target = layout.has_layout(shape, strides, order)
        shown = list(layout.format_strides(strides))
        if in_target is True:
            reason = Reason.VIEW_IN_LAYOUT if fact.chain else Reason.IN_LAYOUT
            explanation = "dense in its target layout, by Inductor's lowering"
        elif in_target is False:
            target = list(layout.format_strides(layout.strides_for_order(shape, order)))
            reason = Reason.STRIDED
            explanation = f"Inductor's lowering returns strides {shown}, not the strides {target} of dim order {list(order)}"
        else:
            reason = Reason.SYMBOLIC
            explanation = f"Inductor's lowering returns symbolic strides {shown}: cannot prove them those of its target layout"
        if lowered.copied_by_wrapper:
            explanation += " (its wrapper returns a copy of a weight's view)"
        if lowered.kernel_memory and in_target is True:
            in_target, reason = None, Reason.INDUCTOR_DECIDES
            explanation = (
                f"Inductor's lowering lays it out {shown}, but it may be computed into memory an extern kernel "
                "allocated, whose strides in size-one dimensions are the kernel's own"
            )
        record = replace(
            record,
            strides=layout.format_strides(strides),
            contiguous=layout.is_contiguous(shape, strides),
            dense=layout.is_non_overlapping_and_dense(shape, strides),
            in_target_layout=in_target,
            action=Action.NONE if in_target is True else Action.COPY,
            reason=reason,
            explanation=explanation,
        )
        exact.append(replace(fact, layout=record))
    return exact


def left_to_backend(
    facts: list[OutputFacts], graph: torch.fx.Graph, rewritten: Mapping[str, str], unavailable: Optional[str]
) -> list[OutputFacts]:
    """``facts`` with each tensor output that an AOTI backend's own passes may re-lay copied.

    Without a lowering, that is every output computed from a node the
    backend's custom passes or decomposition table rewrite (``rewritten``,
    by node name, with what rewrites it); when the backend's passes cannot
    run here at all (``unavailable``), every tensor output.
    """
    if not rewritten and unavailable is None:
        return facts
    reached: dict[Node, str] = {}
    for node in graph.nodes:
        why = rewritten.get(node.name) if node.op == "call_function" else None
        if why is not None:
            reached[node] = f"{why} rewrites {node.name}"
            continue
        for source in node.all_input_nodes:
            if source in reached:
                reached[node] = reached[source]
                break
    decided = []
    for fact in facts:
        if fact.layout.kind != "tensor" or fact.node is None:
            decided.append(fact)
            continue
        why = unavailable if unavailable is not None else reached.get(fact.node)
        if why is None:
            decided.append(fact)
            continue
        record = replace(
            fact.layout,
            in_target_layout=None,
            action=Action.COPY,
            reason=Reason.BACKEND_DECIDES,
            explanation=f"{why}, after strideguard's passes: copied in a form that holds whatever layout they give it",
        )
        decided.append(replace(fact, layout=record))
    return decided

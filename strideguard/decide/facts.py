"""Facts about each user output, computed once.

For every user output of a method this works out, from the graph alone, what
the compiled method will hand back: which view chain produces it and of what
base, the strides AOTInductor gives it, the layout it must have, what it
shares memory with, and whether (and why) it needs one copy. The passes and
the reports only read these records. What AOTInductor hands back for a view
of compute is ``strideguard.compiler.predictor.compiled_layout``'s to say; what revises the facts
afterwards (Inductor's lowering, a backend's passes, ``break_aliases``) is
``strideguard.decide.revisions``'.

Views are told from copies by storage identity of the fake tensors in
``meta["val"]`` (a ``reshape`` that had to copy is not a view), so the analysis
agrees with the tracer rather than with op names.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any, Container, Mapping, Optional, TYPE_CHECKING

import torch
from torch.fx import Node

from ..compiler.predictor.compiled_layout import Compilation, compiled_layout, CompiledLayout, LeftToInductor, Ops, Values
from ..program import density, ops
from ..program.copies import copied_source
from ..program.dialect import Dialect
from ..program.exported import output_values, PUSHED_DOWN, UserOutput
from ..program.fake_values import storage_key
from ..program.ops import is_higher_order, is_view_op, op_name
from ..program.reports import (
    Action,
    Alias,
    AliasKind,
    LayoutReport,
    memory_group_peer,
    OutputKind,
    OutputLayout,
    Reason,
)
from .subject import Subject

if TYPE_CHECKING:
    from ..compiler.oracle.lowering import Lowering


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
    """Everything decided about one user output; ``reported`` is its public face, the record ``inspect`` reports."""

    output: UserOutput
    node: Optional[Node]
    chain: tuple[Node, ...]
    """View nodes from the output inward, ending before ``base``."""
    base: Optional[Node]
    target_order: Optional[tuple[int, ...]]
    reported: OutputLayout
    value: Any = None
    """Its fake value as compiled (views recomputed on their bases, so it shares their storage)."""
    memory: Any = None
    """Which memory that value lies in (``program.fake_values.storage_key``); ``None`` for a non-tensor."""

    @property
    def copied(self) -> bool:
        return self.reported.action is Action.COPY

    def uncopied(self) -> "OutputFacts":
        """The same facts, with no copy inserted for it (a runtime that copies every output anyway)."""
        return replace(self, reported=replace(self.reported, action=Action.NONE))


def _describe_view(node: Node, op_of: Ops) -> str:
    """A view op in words, e.g. ``slice(dim=2, 0:14)``."""
    if node.target is operator.getitem:
        return f"chunk {node.args[1]}"
    op = op_of(node)
    name = op_name(op) or str(node.target)
    args = [a.name if isinstance(a, Node) else a for a in node.args[1:]]
    if ops.in_family(op, ops.SLICES):
        dim, start, end, step = (list(args) + [0, None, None, 1][len(args):])[:4]
        step_text = f":{step}" if step not in (1, None) else ""
        end_text = "" if end is None or (isinstance(end, int) and end >= 2**62) else end
        return f"slice(dim={dim}, {'' if start is None else start}:{end_text}{step_text})"
    if ops.in_family(op, ops.SELECTS):
        return f"select(dim={args[0]}, index={args[1]})"
    if ops.in_family(op, ops.SPLITS):
        return f"{name}({args[0]}, dim={args[1] if len(args) > 1 else 0})"
    if ops.in_family(op, ops.UNBINDS):
        return f"unbind(dim={args[0] if args else 0})"
    rendered = ", ".join(str(a) for a in args)
    return f"{name}({rendered})"


def _control_flow_base(node: Node) -> bool:
    if node.op != "call_function":
        return False
    if is_higher_order(node.target):
        return True
    return node.target is operator.getitem and isinstance(node.args[0], Node) and is_higher_order(node.args[0].target)


def _non_tensor_facts(out: UserOutput, value: Any, node: Optional[Node], name: str, line: Optional[str]) -> OutputFacts:
    traced = meta_value(node) if node is not None else value
    kinds = {torch.SymInt: OutputKind.SYMINT, torch.SymFloat: OutputKind.SYMFLOAT, torch.SymBool: OutputKind.SYMBOOL,
             bool: OutputKind.BOOL, int: OutputKind.INT, float: OutputKind.FLOAT, type(None): OutputKind.NONE}
    kind = next((k for t, k in kinds.items() if isinstance(traced, t)), OutputKind.OTHER)
    record = OutputLayout(
        index=out.index, name=name, kind=kind, node=node.name if node is not None else None, source_line=line
    )
    return OutputFacts(out, node, (), None, None, record)


class OutputAnalysis:
    """The facts of a graph's user outputs, from the state they share: the compiled program's values and ops
    (``Compilation``), what each placeholder is, and which inputs, weights and outputs own each memory."""

    def __init__(self, graph: torch.fx.Graph, subject: Subject, compilation: Compilation, predicts: bool = True):
        self.compilation = compilation
        self.predicts = predicts
        """Whether the graph-only predictor (``compiler.predictor.compiled_layout``) runs: not where a lowering decides."""
        self.roles = subject.roles
        self.returned = output_values(graph)
        self.outputs = subject.outputs
        self.names = subject.names
        self.lines = subject.lines
        self.memory_owners: dict[Any, list[Alias]] = {}
        for node in graph.find_nodes(op="placeholder"):
            key = storage_key(compilation.values(node))
            if key is not None and node.name in self.roles:
                self.memory_owners.setdefault(key, []).append(self.roles[node.name])
        self.output_keys: dict[Any, list[int]] = {}
        for out in self.outputs:
            value = self.returned[out.position]
            if isinstance(value, Node):
                key = storage_key(compilation.values(value))
                if key is not None:
                    self.output_keys.setdefault(key, []).append(out.index)

    def facts(self, target_orders: tuple[Optional[tuple[int, ...]], ...]) -> list[OutputFacts]:
        return [self.facts_for(out, target_orders[out.index]) for out in self.outputs]

    def facts_for(self, out: UserOutput, target_order: Optional[tuple[int, ...]]) -> OutputFacts:
        """The facts of one user output (``target_order``: its promised dim order; contiguous when ``None``)."""
        value = self.returned[out.position]
        node = value if isinstance(value, Node) else None
        tensor = self.compilation.values(node) if node is not None else None
        if not isinstance(tensor, torch.Tensor):
            return _non_tensor_facts(out, value, node, self.names[out.index], self.lines[out.index])

        chain, base = self._view_chain(node)
        base_role = self.roles.get(base.name) if base.op == "placeholder" else None

        shape = tuple(tensor.shape)
        if target_order is None:
            target_order = density.identity_order(tensor.dim())
        compiled = compiled_layout(tensor, chain, base, base_role, self.compilation) if self.predicts else _unpredicted(tensor)
        strides = compiled.strides

        contiguous = density.is_contiguous(shape, strides)
        dense = density.is_non_overlapping_and_dense(shape, strides)
        in_target = density.has_layout(shape, strides, target_order)

        key = storage_key(tensor)
        aliases = list(self.memory_owners.get(key, ()))
        aliases += [Alias(AliasKind.OUTPUT, i) for i in memory_group_peer(self.output_keys.get(key, ()), out.index)]

        copied = copied_source(node)
        copy_of = self._described(*self._view_chain(copied)) if copied is not None else None
        cause = None
        pushed = node.meta.get("custom", {}).get(PUSHED_DOWN) if copy_of is None else None
        if copy_of is not None:  # strideguard's own copy, even one that ends in a permutation (a view)
            cause = f"copied: {copy_of}"
        elif isinstance(pushed, str):  # the user's own indices, not those of the narrowed piece now returned
            cause = f"pushed down: {pushed}"
        elif chain:
            cause = self._described(chain, base)
        elif in_target is not True:
            cause = f"produced with strides {list(density.format_strides(strides))} by {self._source_name(base)}"

        view_of = self._source_name(base) if chain else None
        in_target, reason, explanation = _verdict(compiled, base, chain, shape, target_order)
        record = OutputLayout(
            index=out.index,
            name=self.names[out.index],
            kind=OutputKind.TENSOR,
            action=Action.NONE if reason in (Reason.IN_LAYOUT, Reason.VIEW_IN_LAYOUT) else Action.COPY,
            reason=reason,
            explanation=explanation,
            shape=density.format_strides(shape),
            dtype=str(tensor.dtype).removeprefix("torch."),
            strides=density.format_strides(strides),
            contiguous=contiguous,
            dense=dense,
            target_dim_order=tuple(target_order),
            in_target_layout=in_target,
            aliases=tuple(aliases),
            view_of=view_of,
            cause=cause,
            node=node.name,
            source_line=self.lines[out.index],
            copy_of=copy_of,
        )
        return OutputFacts(out, node, tuple(chain), base, tuple(target_order), record, tensor, key)

    def _view_chain(self, node: Node) -> tuple[list[Node], Node]:
        """The views ``node`` is made of, from it inward, and the node they view."""
        chain = []
        base = node
        while (source := view_source(base, self.compilation.values, self.compilation.op_of)) is not None:
            chain.append(base)
            base = source
        return chain, base

    def _described(self, chain: list[Node], base: Node) -> str:
        """A view chain and its base in words, ``slice(dim=2, 0:14) of linear``; the base alone without views."""
        if not chain:
            return self._source_name(base)
        return " of ".join(_described_chain(chain, self.compilation.op_of)) + f" of {self._source_name(base)}"

    def _source_name(self, node: Node) -> str:
        if node.op == "placeholder":
            role = self.roles.get(node.name)
            return str(role) if role else node.name
        if node.op == "call_function":
            op_of = self.compilation.op_of
            return op_name(op_of(node)) or getattr(node.target, "__name__", str(node.target))
        return node.name


def analyze_outputs(
    graph: torch.fx.Graph,
    subject: Subject,
    *,
    values: Values = meta_value,
    op_of: Ops = own_op,
    relaid: Container[Node] = frozenset(),
    predicts: bool = True,
) -> list[OutputFacts]:
    """Facts for each user output of ``graph``, the subject's program's graph or one made from it: named, and
    held to their target dim orders, as the ``subject`` says.

    ``values`` gives each node's fake value in the compiled program (an Edge
    program's view copies made views); ``relaid`` holds the compute nodes whose layout those conversions may
    change. With ``predicts=False`` (a lowering will decide every layout) no prediction is made: each tensor
    output is left undecided until the lowering's strides replace it (``exact_facts``).
    """
    returned = frozenset(v for v in output_values(graph) if isinstance(v, Node))
    compilation = Compilation(values, op_of, returned, relaid)
    return OutputAnalysis(graph, subject, compilation, predicts).facts(subject.target_orders)


def _unpredicted(tensor: torch.Tensor) -> LeftToInductor:
    """What stands for a prediction where Inductor's lowering decides: undecided, and copied should the
    lowering not return the output as a tensor."""
    return LeftToInductor(tuple(tensor.stride()), why="left to Inductor's lowering, which did not lay it out", any_layout=True)


def _described_chain(chain: list[Node], op_of: Ops, shown: int = 6) -> list[str]:
    """Each view of a chain in words, from the output inward; a long chain keeps its ends."""
    if len(chain) <= shown:
        return [_describe_view(n, op_of) for n in chain]
    head, tail = chain[: shown - 2], chain[-2:]
    return [_describe_view(n, op_of) for n in head] + [f"{len(chain) - shown} more views"] + [
        _describe_view(n, op_of) for n in tail
    ]


def judged_layout(shape, strides, order, *, viewed: bool, lowered: bool) -> tuple[Optional[bool], Reason, str]:
    """``in_target_layout``, the reason and its explanation for strides known (from the graph, or from
    Inductor's lowering when ``lowered``): the one place these verdicts are put into words."""
    in_target = density.has_layout(shape, strides, order)
    shown = list(density.format_strides(strides))
    if in_target is True:
        reason = Reason.VIEW_IN_LAYOUT if viewed else Reason.IN_LAYOUT
        if lowered:
            return True, reason, "dense in its target layout, by Inductor's lowering"
        return True, reason, "a view already dense in its target layout" if viewed else "dense in its target layout"
    if in_target is False:
        target = list(density.format_strides(density.strides_for_order(shape, order)))
        said = f"Inductor's lowering returns strides {shown}, not" if lowered else f"strides {shown} are not"
        return False, Reason.STRIDED, f"{said} the strides {target} of dim order {list(order)}"
    if lowered:
        return None, Reason.SYMBOLIC, f"Inductor's lowering returns symbolic strides {shown}: cannot prove them those of its target layout"
    return None, Reason.SYMBOLIC, "symbolic strides: cannot prove them those of its target layout, so it is copied"


def _verdict(compiled: CompiledLayout, base: Node, chain, shape, order) -> tuple[Optional[bool], Reason, str]:
    """``in_target_layout``, the reason and its explanation for one tensor output, from the graph."""
    if _control_flow_base(base):
        return None, Reason.CONTROL_FLOW, "an output of control flow: its compiled layout is not decided, so it is copied"
    in_target, reason, explanation = judged_layout(shape, compiled.strides, order, viewed=bool(chain), lowered=False)
    if in_target is None:
        return in_target, reason, explanation
    if isinstance(compiled, LeftToInductor) and (
        compiled.any_layout
        or in_target is not True
        or any(density.has_layout(shape, other, order) is not True for other in compiled.alternatives)
    ):
        return None, Reason.INDUCTOR_DECIDES, f"{compiled.why}; copied, and exact=True (--exact on the command line) asks Inductor"
    if isinstance(compiled, LeftToInductor):
        explanation += ", whether Inductor returns it as a view or computes it afresh in its order"
    elif compiled.note is not None:
        explanation += f" ({compiled.note})"
    return in_target, reason, explanation


def exact_facts(facts: list[OutputFacts], lowering: "Lowering") -> list[OutputFacts]:
    """``facts`` with each tensor output's strides, and so its verdict and copy, as Inductor's lowering has them:
    the facts of a plan made with a lowering (``analyze_outputs(predicts=False)`` leaves them undecided until here)."""
    if len(lowering.outputs) != len(facts):
        raise RuntimeError(
            f"strideguard: Inductor's lowering returned {len(lowering.outputs)} outputs for {len(facts)} user outputs"
        )
    exact = []
    for fact, lowered in zip(facts, lowering.outputs):
        record = fact.reported
        if record.kind != "tensor" or lowered is None or fact.target_order is None:
            exact.append(fact)
            continue
        shape, order = lowered.shape, fact.target_order
        strides = lowered.strides
        in_target, reason, explanation = judged_layout(shape, strides, order, viewed=bool(fact.chain), lowered=True)
        shown = list(density.format_strides(strides))
        if lowered.copied_by_wrapper:
            explanation += " (its wrapper returns a copy of a weight's view)"
        if lowered.alternatives:
            # A choice the device makes when it compiles: undecided where it decides, strided where no choice holds.
            others = " or ".join(str(list(density.format_strides(alternative))) for alternative in lowered.alternatives)
            if lowered.benchmark_decides:
                who, why = Reason.BENCHMARK_DECIDES, f"by what a benchmark on the device says ({lowering.benchmark_undecided})"
            else:
                who, why = Reason.KERNEL_DECIDES, f"by the kernel the device picks ({lowering.undecided})"
            said = f"Inductor's lowering for {lowering.target} returns strides {shown} or {others} when it compiles, {why}"
            if any(density.has_layout(shape, each, order) is True for each in lowered.every_strides):
                in_target, reason, explanation = None, who, said
            else:
                explanation += f"; {said}"
        elif lowered.kernel_memory and in_target is True:
            in_target, reason = None, Reason.INDUCTOR_DECIDES
            explanation = (
                f"Inductor's lowering lays it out {shown}, but it may be computed into memory an extern kernel "
                "allocated, whose strides in size-one dimensions are the kernel's own"
            )
        record = replace(
            record,
            strides=density.format_strides(strides),
            contiguous=density.is_contiguous(shape, strides),
            dense=density.is_non_overlapping_and_dense(shape, strides),
            in_target_layout=in_target,
            action=Action.NONE if in_target is True else Action.COPY,
            reason=reason,
            explanation=explanation,
        )
        exact.append(replace(fact, reported=record))
    return exact


def report(
    facts: list[OutputFacts], dialect: Dialect, *, source: str = "analysis", device: str = "cpu",
    symbols: Optional[Mapping[str, str]] = None,
) -> LayoutReport:
    return LayoutReport(
        dialect=dialect.value, outputs=tuple(f.reported for f in facts), source=source, device=device,
        symbols=tuple((symbols or {}).items()),
    )

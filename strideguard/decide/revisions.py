"""What revises an output's facts after the graph has been read: Inductor's lowering, an AOTI backend's own
passes, and ``break_aliases``' policy on shared memory. Each takes facts and returns new ones."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping, Optional

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .facts import judged_layout, OutputFacts
from ..program import density
from ..program.fake_values import storage_key
from ..program.promises import KEEP
from ..program.reports import Action, Alias, AliasKind, Reason
from .subject import Subject

if TYPE_CHECKING:
    from ..compiler.oracle.lowering import Lowering


def exact_facts(facts: list[OutputFacts], lowering: "Lowering") -> list[OutputFacts]:
    """``facts`` with each tensor output's strides, and so its verdict and copy, as Inductor's lowering has them."""
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
        if fact.reported.kind != "tensor" or fact.node is None:
            decided.append(fact)
            continue
        why = unavailable if unavailable is not None else reached.get(fact.node)
        if why is None:
            decided.append(fact)
            continue
        record = replace(
            fact.reported,
            in_target_layout=None,
            action=Action.COPY,
            reason=Reason.BACKEND_DECIDES,
            explanation=f"{why}, after strideguard's passes: copied in a form that holds whatever layout they give it",
        )
        decided.append(replace(fact, reported=record))
    return decided


def left_to_benchmark(facts: list[OutputFacts], padded: Mapping[str, str]) -> list[OutputFacts]:
    """``facts`` with each tensor output that is a matrix product the device's benchmark may pad (``padded``, by
    node name, with why), or a view of one, copied in a form that holds padded or not. What reads a padded
    product computes a fresh buffer, laid out by Inductor as unpadded: only the product and its views are
    reached."""
    revised = []
    for fact in facts:
        source = fact.base if fact.chain else fact.node
        why = padded.get(source.name) if isinstance(source, Node) else None
        if fact.reported.kind != "tensor" or why is None or fact.reported.in_target_layout is False:
            revised.append(fact)
            continue
        revised.append(replace(fact, reported=replace(
            fact.reported, in_target_layout=None, action=Action.COPY, reason=Reason.BENCHMARK_DECIDES,
            explanation=f"{why}: copied in a form that holds either way (exact=True lowers both)",
        )))
    return revised


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
        record = fact.reported
        if fact.copied or not record.aliases or statically_known_true(fact.value.numel() == 0):
            result.append(fact)
            continue
        key = storage_key(fact.value)
        still_shared = [a for a in record.aliases if a.kind is not AliasKind.OUTPUT]
        if key in kept:
            still_shared.append(Alias(AliasKind.OUTPUT, kept[key]))
        if not still_shared:
            kept[key] = record.index
            result.append(fact)
            continue
        explanation = f"shares memory with {', '.join(map(str, still_shared))}"
        record = replace(record, action=Action.COPY, reason=Reason.SHARES_MEMORY, explanation=explanation)
        result.append(replace(fact, reported=record))
    return result


def as_asked(facts: list[OutputFacts], subject: Subject) -> list[OutputFacts]:
    """``facts`` with what was asked of the subject's outputs (``Subject.requested``, by index): an output to keep
    (``program.promises.KEEP``) is left as the compiler lays it out, never copied, and reported so; in an Edge
    program, an output asked in another dim order than the program promises is copied into it, which makes
    the program promise it (ExecuTorch's runtime holds the output to the promise)."""
    from_file, edge = subject.from_file, subject.dialect.is_edge
    revised = []
    for fact in facts:
        index = fact.reported.index
        wanted = subject.requested.get(index)
        if wanted is None or fact.reported.kind != "tensor":
            revised.append(fact)
        elif wanted == KEEP:
            asker = "as the program file asks" if fact.reported.index in from_file else "as asked"
            revised.append(replace(fact, reported=replace(
                fact.reported, action=Action.NONE, reason=Reason.KEPT_BY_FILE if fact.reported.index in from_file else Reason.KEPT,
                explanation=f"kept as the compiler lays it out, {asker} ({fact.reported.explanation})",
            )))
        elif edge and not fact.copied and fact.node is not None and subject.promised[index] != tuple(wanted):
            promised = list(subject.promised[index])
            revised.append(replace(fact, reported=replace(
                fact.reported, action=Action.COPY, reason=Reason.PROMISE_CHANGED,
                explanation=f"the program promises dim order {promised}: copied into {list(wanted)}, as asked, "
                "so that it promises that",
            )))
        else:
            revised.append(fact)
    return revised

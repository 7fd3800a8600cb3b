"""What revises an output's facts after they are decided (from the graph, or from Inductor's lowering in
``decide.facts``): an AOTI backend's own passes, the device's benchmark, ``break_aliases``' policy on shared
memory, and the layouts asked. Each takes facts and returns new ones."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Optional

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .facts import OutputFacts
from ..program.promises import KEEP
from ..program.reports import Action, Alias, AliasKind, Reason
from .subject import Subject


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
        key = fact.memory
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

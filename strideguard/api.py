"""The public entry points: inspect, densify_outputs, prepare_for_aoti."""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

from .analysis import OutputFacts, analyze_outputs, break_shared_memory, exact_facts, report
from .dialect import Dialect, dialect_of, promised_dim_order, verifier_accepts
from .passes.detach_copy_to_alias_copy import detach_copy_to_alias_copy
from .passes.insert_output_copies import insert_output_copies
from .passes.view_copies_to_views import (
    EXECUTORCH,
    NO_CONVERSION,
    STRIDEGUARD,
    ConversionPolicy,
    ViewConversion,
    plan_view_conversion,
)
from .lowering import Lowering, executorch_view_pass, lower_edge_outputs, lower_outputs
from .program import copy_graph, rebuild, require_exported_program, require_flag, user_outputs
from .records import LayoutReport


def _facts(
    graph,
    signature,
    dialect: Dialect,
    policy: Optional[ConversionPolicy],
    *,
    break_aliases: bool,
    accepts: Optional[Callable[[Any], bool]] = None,
) -> tuple[list[OutputFacts], ViewConversion]:
    if not dialect.is_edge:
        # Views are views already; replaying them also restores the storage sharing
        # that a program loaded with torch.export.load has lost.
        replay = ViewConversion(graph, NO_CONVERSION)
        return analyze_outputs(graph, signature, values=replay.value, break_aliases=break_aliases), replay
    conversion = plan_view_conversion(graph, policy, accepts=accepts)
    returned = list(graph.output_node().args[0])
    target_orders = {
        out.index: promised_dim_order(returned[out.position])
        for out in user_outputs(signature)
        if hasattr(returned[out.position], "meta") and hasattr(returned[out.position].meta.get("val"), "stride")
    }
    facts = analyze_outputs(
        graph,
        signature,
        values=conversion.value,
        target_of=conversion.target_of,
        target_orders=target_orders,
        relaid=conversion.relaid(),
        break_aliases=break_aliases,
    )
    return facts, conversion


def output_facts(program: ExportedProgram, *, policy: ConversionPolicy = EXECUTORCH, exact: bool = False) -> list[OutputFacts]:
    """The facts ``inspect`` reports, with what they were read from: each output's view chain, base and
    fake value as compiled. For tools that draw or explain outputs (the storage plot)."""
    program = require_exported_program(program, "inspect")
    require_flag(exact, "exact", "inspect")
    if not isinstance(policy, ConversionPolicy):
        raise TypeError(f"strideguard.inspect: policy must be a ConversionPolicy, got {type(policy).__name__}")
    dialect = dialect_of(program)
    accepts = verifier_accepts(program) if dialect.is_edge and policy.careful else None
    facts, _ = _facts(program.graph, program.graph_signature, dialect, policy, break_aliases=False, accepts=accepts)
    if exact:
        facts = exact_facts(facts, lower_as_compiled(program, policy=policy))
    return facts


def inspect(program: ExportedProgram, *, policy: ConversionPolicy = EXECUTORCH, exact: bool = False) -> LayoutReport:
    """What each user output of ``program`` will look like once compiled with AOTInductor.

    For an Edge program, "compiled" means after the AOTI backend has turned
    view copies into views as ``policy`` says (the installed ExecuTorch's own by
    default); each output's target is the dim order the program promised.

    By default the answer comes from the graph alone (milliseconds), and an
    output whose layout Inductor decides for itself is reported undecided and
    copied. With ``exact=True`` Inductor's own lowering is run and read
    (``strideguard.lowering``; about a second for a small program, no code
    is generated or compiled) and every output is decided by it.
    """
    facts = output_facts(program, policy=policy, exact=exact)
    return report(facts, dialect_of(program), source="lowering" if exact else "analysis")


def lower_as_compiled(program: ExportedProgram, *, policy: ConversionPolicy = EXECUTORCH) -> Lowering:
    """Inductor's lowering of ``program`` as the AOTI path compiles it: an ATen program as it is; an Edge
    program with its view copies converted under ``policy`` and then by the installed ExecuTorch's own
    pass, which its AOTI backend always runs."""
    if not dialect_of(program).is_edge:
        return lower_outputs(program)
    if policy is EXECUTORCH:
        return lower_edge_outputs(program)
    if policy is NO_CONVERSION:
        return lower_edge_outputs(program, convert_views=lambda graph_module: None)

    accepts = verifier_accepts(program) if policy.careful else None

    def convert_then_executorch(graph_module):
        plan_view_conversion(graph_module.graph, policy, accepts=accepts).apply()
        executorch_view_pass()(graph_module)

    return lower_edge_outputs(program, convert_views=convert_then_executorch)


def rewrite_graph(
    graph: torch.fx.Graph,
    signature: ExportGraphSignature,
    dialect: Dialect,
    *,
    policy: ConversionPolicy,
    convert: bool,
    break_aliases: bool = False,
    copy_outputs: bool = True,
    update_values: bool = True,
    lowering: Optional[Lowering] = None,
    accepts: Optional[Callable[[Any], bool]] = None,
) -> int:
    """Rewrite ``graph`` in place: convert views (Edge, when ``convert``), copy outputs, retarget
    ``detach_copy``. Returns how many nodes were added or retargeted.

    ``update_values=False`` keeps converted nodes' old fake values (see ``ViewConversion.apply``).
    With ``lowering`` (Inductor's lowering of the graph as converted), copies follow it rather than the analysis.
    """
    facts, conversion = _facts(
        graph, signature, dialect, policy, break_aliases=break_aliases and lowering is None, accepts=accepts
    )
    if lowering is not None:
        facts = exact_facts(facts, lowering)
        if break_aliases:
            facts = break_shared_memory(facts)
    changed = conversion.apply(update_values=update_values) if convert else 0
    if copy_outputs:
        changed += len(insert_output_copies(graph, facts, dialect, conversion.value))
    if dialect.is_edge:
        changed += detach_copy_to_alias_copy(graph)
    return changed


@contextlib.contextmanager
def without_garbage_collection():
    """Hold the cyclic garbage collector off while a graph is copied and rewritten.

    Copying a graph allocates several objects per node; on a 50,000-node graph
    the collector's full passes over them cost more than the work itself
    (28 against 12 us per node, measured). Nothing a pass creates needs
    collecting before it ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def transformed(program: ExportedProgram, **options) -> tuple[ExportedProgram, int]:
    """A rewritten copy of ``program`` (see ``rewrite_graph``) and how many nodes changed."""
    dialect = dialect_of(program)
    if dialect.is_edge and options.get("convert"):
        options.setdefault("accepts", verifier_accepts(program))
    with without_garbage_collection():
        graph = copy_graph(program)
        changed = rewrite_graph(graph, program.graph_signature, dialect, **options)
        return rebuild(program, graph), changed


def densify_outputs(program: ExportedProgram, *, break_aliases: bool = False, exact: bool = False) -> ExportedProgram:
    """A new program whose every user output comes back dense in its target layout.

    Exactly one copy is inserted per user output that would otherwise come back
    strided (for an Edge program: once its AOTI backend turns view copies into
    views, as the installed ExecuTorch does), and per output whose layout Inductor
    decides for itself (a copy fused into it where it is computed afresh);
    nothing else is added. With ``exact=True`` Inductor's lowering decides
    every output, so only those that would come back strided are copied. With
    ``break_aliases``, an output sharing memory with an input, a weight or an
    earlier output gets its own copy too. ``program`` is not modified and its
    weights are shared, not copied.
    """
    program = require_exported_program(program, "densify_outputs")
    require_flag(break_aliases, "break_aliases", "densify_outputs")
    require_flag(exact, "exact", "densify_outputs")
    dialect = dialect_of(program)
    lowering = lower_as_compiled(program) if exact else None
    return transformed(
        program, policy=EXECUTORCH, convert=False, break_aliases=break_aliases, lowering=lowering
    )[0]


def prepare_for_aoti(
    program: ExportedProgram, *, copy_outputs: bool = True, break_aliases: bool = False, exact: bool = False
) -> ExportedProgram:
    """Make an ATen or Edge program ready for AOTInductor.

    For an ATen program this is ``densify_outputs``. For an Edge program it
    turns view copies into views wherever that is safe (a wider set than
    ExecuTorch's), then inserts one copy into the promised dim order for each
    output that would now come back in another layout (skipped with
    ``copy_outputs=False``, for a runtime such as Metal's that copies every
    output anyway), and leaves no ``detach_copy`` behind. ``exact`` asks
    Inductor's lowering which outputs need the copy, as in ``densify_outputs``.
    """
    program = require_exported_program(program, "prepare_for_aoti")
    for name, value in (("copy_outputs", copy_outputs), ("break_aliases", break_aliases), ("exact", exact)):
        require_flag(value, name, "prepare_for_aoti")
    dialect = dialect_of(program)
    if not dialect.is_edge:
        return densify_outputs(program, break_aliases=break_aliases, exact=exact)
    lowering = lower_as_compiled(program, policy=STRIDEGUARD) if exact and copy_outputs else None
    return transformed(
        program,
        policy=STRIDEGUARD,
        convert=True,
        break_aliases=break_aliases,
        copy_outputs=copy_outputs,
        lowering=lowering,
    )[0]

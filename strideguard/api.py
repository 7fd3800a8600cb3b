"""The public entry points: inspect, densify_outputs, prepare_for_aoti."""

from __future__ import annotations

import contextlib
import gc
from typing import Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

from .analysis import OutputFacts, analyze_outputs, report
from .dialect import Dialect, dialect_of
from .passes.detach_copy_to_alias_copy import detach_copy_to_alias_copy
from .passes.insert_output_copies import insert_output_copies
from .passes.view_copies_to_views import (
    EXECUTORCH_1_5,
    NO_CONVERSION,
    STRIDEGUARD,
    ConversionPolicy,
    ViewConversion,
    plan_view_conversion,
    promised_dim_order,
)
from .program import copy_graph, rebuild, require_exported_program, user_outputs
from .records import LayoutReport


def _facts(
    graph, signature, dialect: Dialect, policy: Optional[ConversionPolicy], *, break_aliases: bool
) -> tuple[list[OutputFacts], ViewConversion]:
    if not dialect.is_edge:
        # Views are views already; replaying them also restores the storage sharing
        # that a program loaded with torch.export.load has lost.
        replay = ViewConversion(graph, NO_CONVERSION)
        return analyze_outputs(graph, signature, values=replay.value, break_aliases=break_aliases), replay
    conversion = plan_view_conversion(graph, policy)
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
        break_aliases=break_aliases,
    )
    return facts, conversion


def inspect(program: ExportedProgram, *, policy: ConversionPolicy = EXECUTORCH_1_5) -> LayoutReport:
    """What each user output of ``program`` will look like once compiled with AOTInductor.

    For an Edge program, "compiled" means after the AOTI backend has turned
    view copies into views as ``policy`` says (ExecuTorch 1.5.1's own by
    default); each output's target is the dim order the program promised.
    """
    program = require_exported_program(program, "inspect")
    dialect = dialect_of(program)
    facts, _ = _facts(program.graph, program.graph_signature, dialect, policy, break_aliases=False)
    return report(facts, dialect)


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
) -> int:
    """Rewrite ``graph`` in place: convert views (Edge, when ``convert``), copy outputs, retarget
    ``detach_copy``. Returns how many nodes were added or retargeted.

    ``update_values=False`` keeps converted nodes' old fake values (see ``ViewConversion.apply``).
    """
    facts, conversion = _facts(graph, signature, dialect, policy, break_aliases=break_aliases)
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
    with without_garbage_collection():
        graph = copy_graph(program)
        changed = rewrite_graph(graph, program.graph_signature, dialect_of(program), **options)
        return rebuild(program, graph), changed


def densify_outputs(program: ExportedProgram, *, break_aliases: bool = False) -> ExportedProgram:
    """A new program whose every user output comes back dense in its target layout.

    Exactly one copy is inserted per user output that would otherwise come back
    strided (for an Edge program: once its AOTI backend turns view copies into
    views, as ExecuTorch 1.5.1 does); nothing else is added. With
    ``break_aliases``, an output sharing memory with an input, a weight or an
    earlier output gets its own copy too. ``program`` is not modified and its
    weights are shared, not copied.
    """
    program = require_exported_program(program, "densify_outputs")
    return transformed(program, policy=EXECUTORCH_1_5, convert=False, break_aliases=break_aliases)[0]


def prepare_for_aoti(
    program: ExportedProgram, *, copy_outputs: bool = True, break_aliases: bool = False
) -> ExportedProgram:
    """Make an ATen or Edge program ready for AOTInductor.

    For an ATen program this is ``densify_outputs``. For an Edge program it
    turns view copies into views wherever that is safe (a wider set than
    ExecuTorch's), then inserts one copy into the promised dim order for each
    output that would now come back in another layout (skipped with
    ``copy_outputs=False``, for a runtime such as Metal's that copies every
    output anyway), and leaves no ``detach_copy`` behind.
    """
    program = require_exported_program(program, "prepare_for_aoti")
    if not dialect_of(program).is_edge:
        return densify_outputs(program, break_aliases=break_aliases)
    return transformed(
        program, policy=STRIDEGUARD, convert=True, break_aliases=break_aliases, copy_outputs=copy_outputs
    )[0]

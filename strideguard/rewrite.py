"""One plan, one apply: what strideguard decides for a graph, and carrying it out.

``make_plan`` reads a graph once: which view copies become views
(``strideguard.plan``), the replay of every value under them, and the facts
about each user output (``strideguard.analysis``), copied or not and why,
optionally corrected by Inductor's lowering. The result is a frozen ``Plan``.
``apply_plan`` carries it out with the passes, one job each. ``inspect``
reports a plan; ``densify_outputs``, ``prepare_for_aoti`` and the ExecuTorch
passes apply one.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

from .analysis import OutputFacts, analyze_outputs, break_shared_memory, exact_facts, left_to_backend
from .backends import Backend, rewritten_ops, unavailable_note
from .dialect import Dialect, dialect_of, promised_dim_order, verifier_accepts
from .lowering import Lowering, executorch_view_pass, lower_edge_outputs, lower_outputs
from .passes.detach_copy_to_alias_copy import detach_copy_to_alias_copy
from .passes.insert_output_copies import insert_output_copies
from .passes.view_copies_to_views import convert_views
from .plan import EXECUTORCH, NO_CONVERSION, ConversionPolicy, ViewConversion, plan_view_conversion
from .program import copy_graph, output_values, rebuild, user_outputs
from .passes.push_cuts_into_producers import push_cuts_into_producers
from .pushdown import Pushdown, plan_pushdowns


@dataclass(frozen=True)
class Plan:
    """Everything decided for one graph: its dialect, the view conversions, and each user output's facts
    (``action`` says whether it is copied, ``reason`` why)."""

    dialect: Dialect
    conversion: ViewConversion
    outputs: tuple[OutputFacts, ...]

    @property
    def copies(self) -> tuple[OutputFacts, ...]:
        return tuple(fact for fact in self.outputs if fact.copied)


def make_plan(
    graph: torch.fx.Graph,
    signature: ExportGraphSignature,
    dialect: Dialect,
    policy: ConversionPolicy,
    *,
    copy_outputs: bool = True,
    break_aliases: bool = False,
    accepts: Optional[Callable[[Any], bool]] = None,
    lowering: Optional[Lowering] = None,
    backend: Optional[Backend] = None,
    rewritten: Optional[dict[str, str]] = None,
) -> Plan:
    """Decide what to convert and copy in ``graph`` (nothing changes yet).

    An ATen graph has views already: replaying them only restores the storage
    sharing a program loaded with ``torch.export.load`` has lost. With
    ``lowering`` (Inductor's lowering of the graph as converted), each output
    is copied as it says rather than as the analysis does; with
    ``copy_outputs=False``, none is. Without a lowering, an output that
    ``backend``'s own passes may re-lay (``rewritten``: the nodes they rewrite,
    by name) is copied in the form that holds whatever they do; with one, only
    where that backend's passes could not run.
    """
    conversion = plan_view_conversion(graph, policy if dialect.is_edge else NO_CONVERSION, accepts=accepts)
    returned = output_values(graph)
    target_orders = {
        out.index: promised_dim_order(returned[out.position])
        for out in user_outputs(signature)
        if dialect.is_edge and isinstance(getattr(returned[out.position], "meta", {}).get("val"), torch.Tensor)
    }
    facts = analyze_outputs(
        graph,
        signature,
        values=conversion.value,
        op_of=conversion.op_of,
        target_orders=target_orders,
        relaid=conversion.relaid(),
        break_aliases=break_aliases and lowering is None,
    )
    if lowering is not None:
        facts = exact_facts(facts, lowering)
        if break_aliases:
            facts = break_shared_memory(facts)
        facts = left_to_backend(facts, graph, {}, lowering.unavailable)
    elif backend is not None:
        facts = left_to_backend(facts, graph, rewritten or {}, unavailable_note(backend))
    if not copy_outputs:
        facts = [fact.uncopied() for fact in facts]
    return Plan(dialect, conversion, tuple(facts))


def apply_plan(graph: torch.fx.Graph, plan: Plan, *, update_values: bool = True) -> int:
    """Carry ``plan`` out on ``graph`` in place: convert the views, copy the outputs, and retarget any
    ``detach_copy`` left. Returns how many nodes were added or retargeted.

    ``update_values=False`` keeps converted nodes' traced values (see ``convert_views``).
    """
    changed = convert_views(plan.conversion, update_values=update_values)
    changed += len(insert_output_copies(graph, plan.copies, plan.dialect, plan.conversion.value))
    if plan.dialect.is_edge:
        changed += detach_copy_to_alias_copy(graph)
    return changed


def lower_as_compiled(
    program: ExportedProgram,
    *,
    policy: ConversionPolicy = EXECUTORCH,
    backend: Optional[Backend] = None,
    inductor_configs: Optional[dict] = None,
) -> Lowering:
    """Inductor's lowering of ``program`` as the AOTI path compiles it: an ATen program as it is (with
    ``inductor_configs``); an Edge program with its view copies converted under ``policy``, then by the
    installed ExecuTorch's own pass, which its AOTI backend always runs, then by ``backend``'s own passes
    and decomposition table, as its ``preprocess`` runs them."""
    if not dialect_of(program).is_edge:
        return lower_outputs(program, inductor_configs=inductor_configs)
    if policy is EXECUTORCH:
        return lower_edge_outputs(program, backend=backend)
    if policy is NO_CONVERSION:
        return lower_edge_outputs(program, convert_views=lambda graph_module: None, backend=backend)

    accepts = verifier_accepts(program) if policy.careful else None

    def convert_then_executorch(graph_module):
        convert_views(plan_view_conversion(graph_module.graph, policy, accepts=accepts))
        executorch_view_pass()(graph_module)

    return lower_edge_outputs(program, convert_views=convert_then_executorch, backend=backend)


def program_plan(program: ExportedProgram, policy: ConversionPolicy, **options) -> Plan:
    """``make_plan`` for a whole program, asking its verifier before converting (Edge, careful policies)."""
    dialect = dialect_of(program)
    accepts = verifier_accepts(program) if dialect.is_edge and policy.careful else None
    options = _with_rewritten_ops(program, options)
    return make_plan(program.graph, program.graph_signature, dialect, policy, accepts=accepts, **options)


def _with_rewritten_ops(program: ExportedProgram, options: dict) -> dict:
    """``options`` with the nodes the named backend's own passes rewrite, where no lowering runs them."""
    backend = options.get("backend")
    if backend is None or options.get("lowering") is not None or not dialect_of(program).is_edge:
        return options
    return {**options, "rewritten": rewritten_ops(program, backend)}


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


def pushed_down(program: ExportedProgram) -> tuple[ExportedProgram, tuple[Pushdown, ...]]:
    """A new program in which every returned slice or select that can is computed from pieces of its
    producers' inputs (``strideguard.pushdown``), and the pushdowns applied; ``program`` itself when none
    applies. Weights are shared: a weight's piece is a slice in the graph."""
    with without_garbage_collection():
        graph = copy_graph(program)
        pushdowns = plan_pushdowns(graph)
        if not pushdowns:
            return program, ()
        push_cuts_into_producers(graph, pushdowns, dialect_of(program))
        return rebuild(program, graph), pushdowns


def transformed(program: ExportedProgram, policy: ConversionPolicy, *, update_values: bool = True, **options) -> tuple[ExportedProgram, int]:
    """A copy of ``program`` with its plan (``make_plan`` ``options``) applied, and how many nodes changed."""
    dialect = dialect_of(program)
    accepts = verifier_accepts(program) if dialect.is_edge and policy.careful else None
    options = _with_rewritten_ops(program, options)
    with without_garbage_collection():
        graph = copy_graph(program)
        plan = make_plan(graph, program.graph_signature, dialect, policy, accepts=accepts, **options)
        changed = apply_plan(graph, plan, update_values=update_values)
        return rebuild(program, graph), changed

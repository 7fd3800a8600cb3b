"""One plan, one apply: what strideguard decides for a graph, and carrying it out.

``make_plan`` reads a graph once, for one ``Subject`` (what the call was handed,
``strideguard.decide.subject``), with the caller's ``Choices`` and its
``Grounds`` (Inductor's lowering of the program ``AsCompiled``, or what the
graph alone cannot say): which returned pieces move into their
producers (``strideguard.decide.pushdown``), which view copies become views
(``strideguard.decide.view_conversion``), the value every node holds under them, and the facts
about each user output (``strideguard.decide.facts``), copied or not and why,
optionally corrected by Inductor's lowering. The result is a frozen ``Plan``.
``apply_plan`` carries it out with the passes, one job each. ``inspect``
reports a plan; ``densify_outputs``, ``prepare_for_aoti`` and the ExecuTorch
passes apply one.

Pushdowns come first and change what the rest is decided on: a pushed-down
output is a fresh, smaller computation, whose view conversions, copies and
lowering are those of the new nodes. So a plan that applies pushdowns is made
for a working copy of the graph that carries them (``Plan.graph``); the graph
handed to ``make_plan`` is never changed, and ``apply_plan`` carries out the
rest of the plan on ``Plan.graph``.

The public surface is ``__all__``: the integrations (``api``, ``executorch``,
the CLI) use nothing else of the engine (``tests/test_architecture.py``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Callable, Mapping, Optional

import torch
from torch.export import ExportedProgram

from ..compiler.oracle.attention_kernels import laid_out_by_kernel
from ..compiler.oracle.padded_matmuls import laid_out_by_benchmark
from ..compiler.backends import backend_rewrites, BackendRewrites
from ..compiler.oracle.lowering import executorch_view_pass, lower_aten_outputs, lower_edge_outputs, Lowering
from ..decide.facts import analyze_outputs, exact_facts, OutputFacts
from ..decide.pushdown import plan_pushdowns, Pushdown
from ..decide.revisions import as_asked, break_shared_memory, left_to_backend, left_to_benchmark
from ..decide.subject import Subject
from ..decide.view_conversion import ConversionPolicy, EXECUTORCH, NO_CONVERSION, plan_view_conversion, ViewConversion
from .passes.detach_copy_to_alias_copy import detach_copy_to_alias_copy
from .passes.insert_output_copies import insert_output_copies
from .passes.push_pieces_into_producers import push_pieces_into_producers
from .passes.record_requested_layouts import record_requested_layouts
from .passes.view_copies_to_views import convert_views
from ..program.copies import copied_source, copy_form_of, CopyForm, insert_copy
from ..program.dialect import detach_retargets, Dialect, graph_ops, GraphOps
from ..program.exported import copy_graph, copy_of_graph, rebuild

logger = logging.getLogger(__name__)

__all__ = [
    "Plan", "Pushdowns", "Choices", "AsCompiled", "make_plan", "apply_plan", "program_plan", "transformed",
    "fix_graph_in_place", "lower_as_compiled", "with_stronger_copies",
]


class Pushdowns(Enum):
    """What a plan does with the returned pieces that could be computed from pieces of their producers."""

    NONE = "none"
    """Not looked for."""
    DESCRIBED = "described"
    """Found, and named in each output's facts (``OutputLayout.pushdown``); the graph is planned as it is."""
    APPLIED = "applied"
    """Found and applied to a working copy of the graph, for which the rest of the plan is made."""


@dataclass(frozen=True)
class Choices:
    """What the caller chose for a fix, beside the program and what it said of it (``decide.subject.Subject``)."""

    pushdowns: Pushdowns = Pushdowns.NONE
    copy_outputs: bool = True
    """``False``: no output is copied (a runtime that copies every output anyway, as Metal's)."""
    break_aliases: bool = False
    """An output sharing memory with an input, a weight or an earlier output gets its own copy too."""
    update_values: bool = True
    """``False`` keeps converted nodes' traced values (see ``fix.passes.view_copies_to_views.convert_views``)."""


@dataclass(frozen=True)
class AsCompiled:
    """How a program is lowered to decide and prove its layouts: as its compile will run it.

    An ATen program is lowered as it is, under ``inductor_configs``; an Edge program with its view copies
    converted under ``policy``, then by the installed ExecuTorch's own view pass, then by the subject's
    backend's own passes and decomposition table, as its ``preprocess`` runs them."""

    policy: ConversionPolicy = EXECUTORCH
    inductor_configs: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class Grounds:
    """What a plan is decided from beside the graph: Inductor's lowering of the graph planned on, or, without
    one, what the graph alone cannot say (the nodes a backend's passes rewrite, the matmuls the device's
    benchmark may pad), and the verifier a careful policy asks before converting."""

    lower: Optional[Callable[[torch.fx.Graph], Lowering]] = None
    rewrites: Optional[BackendRewrites] = None
    padded_by_benchmark: Optional[Mapping[str, str]] = None
    accepts: Optional[Callable[[Any], bool]] = None
    ops: Optional[GraphOps] = None
    """The graph's ops, normalised once (``program.dialect.GraphOps``), where the caller read them already."""


@dataclass(frozen=True)
class Plan:
    """Everything decided for one graph: what it is planned for (its dialect in ``subject``) and as the caller
    chose, the pushdowns, the view conversions, and each user output's facts (``action`` says whether it is
    copied, ``reason`` why)."""

    subject: Subject
    choices: Choices
    graph: torch.fx.Graph
    """The graph the conversions and copies are planned on: the one handed to ``make_plan``, or, where
    pushdowns were applied, a working copy carrying them."""
    pushdowns: tuple[Pushdown, ...]
    """The pushdowns applied in ``graph`` (``Pushdowns.APPLIED``; those only described are in ``outputs``)."""
    conversion: ViewConversion
    outputs: tuple[OutputFacts, ...]
    retargets: Mapping[torch.fx.Node, Any]
    """The ``detach_copy`` nodes that stay copies, and the ``alias_copy`` each becomes (Edge only)."""

    @property
    def copies(self) -> tuple[OutputFacts, ...]:
        return tuple(fact for fact in self.outputs if fact.copied)


def make_plan(
    graph: torch.fx.Graph,
    subject: Subject,
    policy: ConversionPolicy,
    choices: Choices = Choices(),
    grounds: Grounds = Grounds(),
) -> Plan:
    """Decide what to push down, convert and copy in ``graph``, the subject's program's graph or a copy of it
    (``graph`` itself never changes).

    An ATen graph has views already: recomputing them only restores the storage
    sharing a program loaded with ``torch.export.load`` has lost. With a lowering
    (``grounds.lower``: Inductor's lowering of the graph planned on, after any pushdown),
    each output is copied as the lowering says rather than as the analysis does;
    with ``choices.copy_outputs=False``, none is. Without a lowering, an output that
    an AOTI backend's own passes may re-lay (``grounds.rewrites``: the nodes they
    rewrite, or why they cannot run here) is copied in the form that holds
    whatever they do; with one, only where that backend's passes could not run. Without a lowering, an
    output that is a matrix product the device's benchmark may pad (``grounds.padded_by_benchmark``, by node
    name, with why), or a view of one, is copied in a form that holds either way. Each output is held to the
    subject's target dim order (``Subject.target_orders``: the layouts asked, over those the graph records).
    """
    dialect, pushdowns = subject.dialect, choices.pushdowns
    described = plan_pushdowns(graph) if pushdowns is Pushdowns.DESCRIBED else ()
    applied: tuple[Pushdown, ...] = ()
    if pushdowns is Pushdowns.APPLIED:
        working, applied = _with_pushdowns_applied(graph, dialect)
        if applied:
            graph = working
    ops_of_graph = grounds.ops if grounds.ops is not None and not applied else graph_ops(graph)
    detaches = detach_retargets(ops_of_graph, dialect) if dialect.is_edge else {}
    converting = policy if dialect.is_edge else NO_CONVERSION
    conversion = plan_view_conversion(graph, ops_of_graph, converting, accepts=grounds.accepts)
    # a detach_copy made a view (``alias``) is no longer one
    retargets = {node: target for node, target in detaches.items() if node not in conversion.targets}
    lowering = grounds.lower(graph) if grounds.lower is not None else None
    rewrites = grounds.rewrites
    facts = analyze_outputs(
        graph,
        subject,
        values=conversion.view_values.value,
        op_of=conversion.view_values.op_of,
        relaid=conversion.relaid() if lowering is None else frozenset(),
        predicts=lowering is None,  # with a lowering, its strides decide: the predictor does not run
    )
    if lowering is not None:
        facts = exact_facts(facts, lowering)
    if choices.break_aliases:
        facts = break_shared_memory(facts)
    if lowering is not None:
        facts = left_to_backend(facts, graph, {}, lowering.unavailable)
    elif rewrites is not None:
        facts = left_to_backend(facts, graph, rewrites.rewritten, rewrites.unavailable)
    if lowering is None and grounds.padded_by_benchmark:
        facts = left_to_benchmark(facts, grounds.padded_by_benchmark)
    facts = as_asked(facts, subject)
    if not choices.copy_outputs:
        facts = [fact.uncopied() for fact in facts]
    if described:
        facts = _with_pushdowns_described(facts, described)
    _log_decisions(facts, applied, lowering, rewrites, choices.copy_outputs)
    return Plan(subject, choices, graph, applied, conversion, tuple(facts), retargets)


def _log_decisions(facts, applied, lowering, rewrites, copy_outputs: bool) -> None:
    """What was decided, on what grounds, and what was skipped and why (``logging.getLogger("strideguard")``)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    grounds = f"Inductor's lowering for {lowering.target}" if lowering is not None else "the graph alone"
    logger.info("planned %d user outputs from %s", len(facts), grounds)
    if rewrites is not None and rewrites.unavailable:
        logger.info("skipped the backend's own passes: %s", rewrites.unavailable)
    if not copy_outputs:
        logger.info("copy_outputs=False: no output is copied (the runtime copies every output)")
    for pushdown in applied:
        logger.info("pushed down: %s", pushdown.description)
    for fact in facts:
        record = fact.reported
        if record.kind != "tensor":
            continue
        logger.info("%s: %s (%s: %s)", record.name, "copy" if fact.copied else "no copy", record.reason.value, record.explanation)


def _with_pushdowns_applied(graph: torch.fx.Graph, dialect: Dialect) -> tuple[torch.fx.Graph, tuple[Pushdown, ...]]:
    """A working copy of ``graph`` with every pushdown applied, and those pushdowns (their nodes the copy's):
    found on the copy itself, so they are planned once."""
    working = copy_of_graph(graph)
    found = plan_pushdowns(working)
    if found:
        push_pieces_into_producers(working, found, dialect)
    return working, found


def _with_pushdowns_described(facts: list[OutputFacts], found: tuple[Pushdown, ...]) -> list[OutputFacts]:
    by_position = {pushdown.output: pushdown for pushdown in found}
    described = []
    for fact in facts:
        pushdown = by_position.get(fact.output.position)
        if pushdown is not None:
            fact = replace(fact, reported=replace(fact.reported, pushdown=pushdown.description, flops_saved=pushdown.saved))
        described.append(fact)
    return described


def apply_plan(plan: Plan) -> int:
    """Carry ``plan`` out on ``plan.graph`` in place: convert the views, copy the outputs, and retarget any
    ``detach_copy`` left. Returns how many nodes were added or retargeted, counting each pushdown applied
    (already, in the plan's working copy) as one.

    ``Choices.update_values=False`` keeps converted nodes' traced values (see ``convert_views``).
    """
    changed = len(plan.pushdowns) + convert_views(plan.conversion, update_values=plan.choices.update_values)
    changed += len(insert_output_copies(plan.graph, plan.copies, plan.subject.dialect, plan.conversion.view_values.value))
    # recorded in the graph, so that every later judgement of the program reads what was asked
    changed += record_requested_layouts(plan.graph, plan.subject.outputs, plan.subject.requested)
    changed += detach_copy_to_alias_copy(plan.retargets)
    return changed


def fix_graph_in_place(
    graph: torch.fx.Graph,
    subject: Subject,
    policy: ConversionPolicy,
    *,
    copy_outputs: bool = True,
    update_values: bool = True,
) -> int:
    """Plan and apply on ``graph`` itself, the subject's program's or a bare graph's (``Subject.of_graph``), with
    no pushdown, which would need a working copy: for a pass that rewrites the graph module it is handed, as
    ExecuTorch's passes do. Returns how many nodes changed."""
    choices = Choices(copy_outputs=copy_outputs, update_values=update_values)
    with without_garbage_collection():
        return apply_plan(make_plan(graph, subject, policy, choices))


def lower_as_compiled(program: ExportedProgram, subject: Subject, as_compiled: AsCompiled = AsCompiled()) -> Lowering:
    """Inductor's lowering of ``program`` (the subject's program, or one made from it) for the subject's
    target, as its compile runs it (``AsCompiled``)."""
    lowering = _lower_as_compiled(program, subject, as_compiled)
    # A lowering whose outputs cannot be the subject's (another count, a tensor of another rank or another
    # static size) is refused: its strides would be judged against other outputs' layouts.
    if len(lowering.outputs) != len(subject.outputs):
        raise RuntimeError(
            f"strideguard: Inductor's lowering returned {len(lowering.outputs)} outputs for {len(subject.outputs)} "
            "user outputs"
        )
    for index, (lowered, value) in enumerate(zip(lowering.outputs, subject.values)):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else None
        if lowered is not None and shape is not None and (len(lowered.shape) != len(shape) or any(
            type(got) is int and type(wanted) is int and got != wanted for got, wanted in zip(lowered.shape, shape)
        )):
            raise RuntimeError(
                f"strideguard: Inductor's lowering returned shape {list(lowered.shape)} for output {index} "
                f"({subject.names[index]}), whose shape is {list(shape)}: not this program's outputs"
            )
    logger.info(
        "lowered %d outputs with Inductor for %s in %.2f s%s", len(lowering.outputs), lowering.target, lowering.seconds,
        f" ({lowering.backend}'s passes: {lowering.unavailable})" if lowering.unavailable else "",
    )
    return lowering


def _lower_as_compiled(program: ExportedProgram, subject: Subject, as_compiled: AsCompiled) -> Lowering:
    backend, target, policy = subject.backend, subject.target, as_compiled.policy
    if not subject.dialect.is_edge:
        return lower_aten_outputs(program, inductor_configs=as_compiled.inductor_configs, target=target)
    if policy is EXECUTORCH:
        return lower_edge_outputs(program, backend=backend, target=target)
    if policy is NO_CONVERSION:
        return lower_edge_outputs(program, convert_views=lambda graph_module: None, backend=backend, target=target)

    accepts = subject.accepts if policy.careful else None

    def convert_then_executorch(graph_module):
        convert_views(plan_view_conversion(graph_module.graph, graph_ops(graph_module.graph), policy, accepts=accepts))
        executorch_view_pass()(graph_module)

    return lower_edge_outputs(program, convert_views=convert_then_executorch, backend=backend, target=target)


def program_plan(
    subject: Subject,
    policy: ConversionPolicy,
    *,
    as_compiled: Optional[AsCompiled] = None,
    choices: Choices = Choices(),
) -> Plan:
    """``make_plan`` for the subject's whole program (never changed), asking its verifier before converting
    (Edge, careful policies); with ``as_compiled``, decided by Inductor's lowering of the program planned on.
    Planned from the graph alone, the collector is held off as for a rewrite: a plan's fake values are all
    alive until it ends, and full collections over them made 2,000 outputs of one input cost 6 times 500's,
    against 4 (``tests/test_bounded.py``)."""
    if as_compiled is not None:
        return _plan(subject, subject.program.graph, policy, as_compiled, choices, None)
    with without_garbage_collection():
        return _plan(subject, subject.program.graph, policy, as_compiled, choices, None)


def _plan(
    subject: Subject,
    graph: torch.fx.Graph,
    policy: ConversionPolicy,
    as_compiled: Optional[AsCompiled],
    choices: Choices,
    unavailable: Optional[str],
) -> Plan:
    """``make_plan`` on ``graph`` (the subject's program's or a copy of it), lowered ``as_compiled`` where
    given; ``unavailable`` says why the target's lowering cannot run here."""
    program, dialect, target = subject.program, subject.dialect, subject.target
    accepts = subject.accepts if policy.careful else None
    ops_of_graph = graph_ops(graph)
    if unavailable is not None:
        # The target's lowering cannot run here: every tensor output is copied in a form that holds.
        grounds = Grounds(rewrites=BackendRewrites({}, unavailable), accepts=accepts, ops=ops_of_graph)
    elif as_compiled is None:
        # Without a lowering, the nodes the backend's own passes rewrite, and those whose layout the device's
        # kernel choice decides, are copied in a form that holds.
        known = backend_rewrites(program, subject.backend, ops_of_graph) if dialect.is_edge else None
        by_kernel = laid_out_by_kernel(ops_of_graph, target)
        if by_kernel:
            known = known or BackendRewrites({}, None)
            known = BackendRewrites({**by_kernel, **known.rewritten}, known.unavailable)
        padded = laid_out_by_benchmark(ops_of_graph, target)
        grounds = Grounds(rewrites=known, padded_by_benchmark=padded, accepts=accepts, ops=ops_of_graph)
    else:
        def lower_planned(planned: torch.fx.Graph) -> Lowering:
            # Planned on the graph as handed: the program itself is what will be compiled.
            return lower_as_compiled(program if planned is graph else rebuild(program, planned), subject, as_compiled)

        grounds = Grounds(lower=lower_planned, accepts=accepts, ops=ops_of_graph)
    return make_plan(graph, subject, policy, choices, grounds)


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


def transformed(
    subject: Subject,
    policy: ConversionPolicy,
    *,
    as_compiled: Optional[AsCompiled] = None,
    choices: Choices = Choices(),
    unavailable: Optional[str] = None,
) -> tuple[ExportedProgram, int]:
    """A new program with its plan applied, and how many nodes changed; the subject's program, untouched, is
    never changed. Weights are shared, not copied: a weight's piece in a pushdown is a slice in the graph.
    ``unavailable``: why the target's lowering cannot run here (every tensor output is then copied)."""
    program = subject.program
    with without_garbage_collection():
        plan = _plan(subject, copy_graph(program), policy, as_compiled, choices, unavailable)
        changed = apply_plan(plan)
        return rebuild(program, plan.graph), changed


def with_stronger_copies(program: ExportedProgram, subject: Subject, forms: Mapping[int, CopyForm]) -> ExportedProgram:
    """A new program (``program``: the subject's, fixed) whose listed user outputs (``forms``: by index, the
    form each gets) are copied in that form, replacing any weaker copy."""
    dialect = subject.dialect
    with without_garbage_collection():
        graph = copy_graph(program)
        orders = subject.target_orders
        output_node = graph.output_node()
        returned = list(output_node.args[0])
        for index, form in forms.items():
            position = subject.outputs[index].position
            node = returned[position]
            source = copied_source(node) or node
            returned[position] = insert_copy(
                graph, source, dialect, orders[index], lambda n: n.meta.get("val"), form, serves=subject.names[index]
            )
        output_node.args = (type(output_node.args[0])(returned),)
        record_requested_layouts(graph, subject.outputs, subject.requested)
        graph.eliminate_dead_code(is_impure_node=_only_copies_are_pure)
        return rebuild(program, graph)


def _only_copies_are_pure(node: torch.fx.Node) -> bool:
    """Dead-code elimination removes only the weaker copies replaced here, never anything of the user's."""
    return copy_form_of(node) is None

"""The public entry points: inspect, densify_outputs, prepare_for_aoti. The engine is ``rewrite``."""

from __future__ import annotations

from dataclasses import replace

from torch.export import ExportedProgram

from .analysis import OutputFacts, report
from .dialect import dialect_of
from .plan import EXECUTORCH, STRIDEGUARD, ConversionPolicy
from .program import require_exported_program, require_flag
from .records import LayoutReport
from .pushdown import plan_pushdowns
from .rewrite import lower_as_compiled, program_plan, pushed_down, transformed


def output_facts(program: ExportedProgram, *, policy: ConversionPolicy = EXECUTORCH, exact: bool = False) -> list[OutputFacts]:
    """The facts ``inspect`` reports, with what they were read from: each output's view chain, base and
    fake value as compiled. For tools that draw or explain outputs (the storage plot)."""
    program = require_exported_program(program, "inspect")
    require_flag(exact, "exact", "inspect")
    if not isinstance(policy, ConversionPolicy):
        raise TypeError(f"strideguard.inspect: policy must be a ConversionPolicy, got {type(policy).__name__}")
    lowering = lower_as_compiled(program, policy=policy) if exact else None
    facts = list(program_plan(program, policy, lowering=lowering).outputs)
    pushdowns = {pushdown.output: pushdown for pushdown in plan_pushdowns(program.graph)}
    for number, fact in enumerate(facts):
        pushdown = pushdowns.get(fact.output.position)
        if pushdown is not None:
            record = replace(fact.layout, pushdown=pushdown.description, flops_saved=pushdown.saved)
            facts[number] = replace(fact, layout=record)
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


def densify_outputs(
    program: ExportedProgram, *, break_aliases: bool = False, exact: bool = False, pushdown: bool = False
) -> ExportedProgram:
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

    With ``pushdown``, a returned slice, select, narrow or split piece is
    first computed from pieces of its producers' inputs wherever that is
    exact (``strideguard.pushdown``): dense by construction, with less
    compute. Values may then differ from the original's by rounding (a
    smaller GEMM); ``verify(..., reference=program)`` measures by how much.
    """
    program = require_exported_program(program, "densify_outputs")
    require_flag(break_aliases, "break_aliases", "densify_outputs")
    require_flag(exact, "exact", "densify_outputs")
    if require_flag(pushdown, "pushdown", "densify_outputs"):
        program = pushed_down(program)[0]
    lowering = lower_as_compiled(program) if exact else None
    return transformed(program, EXECUTORCH, break_aliases=break_aliases, lowering=lowering)[0]


def prepare_for_aoti(
    program: ExportedProgram,
    *,
    copy_outputs: bool = True,
    break_aliases: bool = False,
    exact: bool = False,
    pushdown: bool = False,
) -> ExportedProgram:
    """Make an ATen or Edge program ready for AOTInductor.

    For an ATen program this is ``densify_outputs``. For an Edge program it
    turns view copies into views wherever that is safe (a wider set than
    ExecuTorch's), then inserts one copy into the promised dim order for each
    output that would now come back in another layout (skipped with
    ``copy_outputs=False``, for a runtime such as Metal's that copies every
    output anyway), and leaves no ``detach_copy`` behind. ``exact`` asks
    Inductor's lowering which outputs need the copy, and ``pushdown`` moves
    returned pieces into their producers first, as in ``densify_outputs``.
    """
    program = require_exported_program(program, "prepare_for_aoti")
    flags = (("copy_outputs", copy_outputs), ("break_aliases", break_aliases), ("exact", exact), ("pushdown", pushdown))
    for name, value in flags:
        require_flag(value, name, "prepare_for_aoti")
    dialect = dialect_of(program)
    if not dialect.is_edge:
        return densify_outputs(program, break_aliases=break_aliases, exact=exact, pushdown=pushdown)
    if pushdown:
        program = pushed_down(program)[0]
    lowering = lower_as_compiled(program, policy=STRIDEGUARD) if exact and copy_outputs else None
    return transformed(
        program, STRIDEGUARD, break_aliases=break_aliases, copy_outputs=copy_outputs, lowering=lowering, update_values=False
    )[0]

"""What a call was handed, read once at its entry: the one record every stage takes.

A public entry point (``inspect``, ``densify_outputs``, ``prepare_for_aoti``,
``compile_proven``, ``DenseOutputsPass``) is handed a program and some words
about it: the device it ships to, the AOTI backend, the layouts asked. Each of
those is checked against the program and resolved here, once, into a frozen
``Subject``; the dialect, the user outputs and their names are read here too.
So are what each placeholder is, the layout each output is held to (asked
now, or recorded in the program by an earlier fix) and the ops its verifier
admits. The stages after it read the record and never ask the program again
for what it holds, so a question about the program has one answer for the
whole call (the tree once asked ``dialect_of`` at 12 sites and
``output_names`` at 3). A program made from the subject's (its fix, a
pushdown's working copy) is held to the subject's layouts, not to what its own
metadata would promise.

An ExecuTorch pass handed a bare graph module has no program around it:
``Subject.of_graph`` reads what a graph can say (its dialect, positional
names, the layouts it records) and answers for the CPU, with no backend and
no layout asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

from ..compiler.backends import Backend, resolve_backend
from ..compiler.targets import CPU, Target, target_for
from ..program.dialect import Dialect, dialect_of
from ..program.exported import (
    output_values, placeholder_roles, require_exported_program, user_outputs, UserOutput, verifier_accepts,
)
from ..program.naming import output_names, positional_names, source_line
from ..program.promises import held_to
from ..program.reports import Alias
from .user_layouts import resolve_layouts


@dataclass(frozen=True)
class Subject:
    """One program as a call was handed it, with everything the call said about it, resolved."""

    program: Optional[ExportedProgram]
    """The program as handed (never changed); ``None`` for a bare graph (``of_graph``)."""
    function: str
    """The entry point's name, as errors say it (``densify_outputs``, ``executorch.DenseOutputsPass``)."""
    dialect: Dialect
    target: Target
    """The device the program is compiled for."""
    backend: Optional[Backend]
    """The ExecuTorch AOTI backend an Edge program is delegated to, if named."""
    outputs: tuple[UserOutput, ...]
    values: tuple[Any, ...]
    """Each user output's traced value, by index: its fake tensor, or what the program returns in its place."""
    names: tuple[str, ...]
    """Each user output's name, by index (``program.naming.output_names``)."""
    lines: tuple[Optional[str], ...]
    """Each user output's line in the user's code, by index (``program.naming.source_line``)."""
    roles: Mapping[str, Alias]
    """What each placeholder is, by name: a user input, a parameter, a buffer or a constant."""
    layouts: Mapping[int, Any]
    """The layouts the user asked of this call, by user output index: a dim order or ``program.promises.KEEP``."""
    # What the outputs are held to, by index, as ``program.promises.HeldTo`` says: every layout requested (the
    # program's records under ``layouts``), those only the program records, the dim orders the program promises
    # whatever is asked, and each output's target dim order (``None``: not a tensor).
    requested: Mapping[int, Any]
    from_file: frozenset[int]
    promised: tuple[Optional[tuple[int, ...]], ...]
    target_orders: tuple[Optional[tuple[int, ...]], ...]
    accepts: Optional[Callable[[Any], bool]] = None
    """Whether the program's verifier admits an op (``program.exported.verifier_accepts``): Edge programs only,
    whose verifier may refuse a view; ``None`` where nothing is refused."""

    @classmethod
    def of_graph(
        cls, graph: torch.fx.Graph, signature: ExportGraphSignature, dialect: Dialect, function: str
    ) -> "Subject":
        """A bare graph's subject (``signature``: the one it implies): positional names, the CPU, no backend, no
        layout asked beyond those the graph records."""
        outputs, all_returned = tuple(user_outputs(signature)), output_values(graph)
        returned = [all_returned[out.position] for out in outputs]
        held = held_to(graph, outputs, dialect)
        return cls(
            None, function, dialect, CPU, None, outputs, tuple(map(_value, returned)), tuple(positional_names(len(outputs))),
            tuple(map(source_line, returned)), placeholder_roles(signature), {}, held.requested, held.from_file,
            held.promised, held.target_orders,
        )


def subject_of(
    program: Any,
    function: str,
    *,
    device: Any = None,
    backend: Any = None,
    layouts: Optional[Mapping[Any, Any]] = None,
) -> Subject:
    """``program`` and what the call ``function`` said of it, each checked and resolved once.

    ``backend`` as ``compiler.backends.resolve_backend`` takes it, or already resolved (a ``Backend``); ``device`` as ``compiler.targets.resolve_target``; ``layouts`` as
    ``decide.user_layouts.resolve_layouts``. Raises the entry point's own ``TypeError`` or ``ValueError``,
    naming ``function``, for anything it cannot use."""
    program = require_exported_program(program, function)
    signature = program.graph_signature
    outputs, roles, accepts = tuple(user_outputs(signature)), placeholder_roles(signature), verifier_accepts(program)
    all_returned = output_values(program.graph)
    returned = [all_returned[out.position] for out in outputs]
    values = tuple(map(_value, returned))
    dialect = dialect_of(program)
    names, lines = tuple(output_names(program, len(outputs))), tuple(map(source_line, returned))
    resolved = backend if isinstance(backend, Backend) else resolve_backend(backend, function=function)
    if resolved is not None and not dialect.is_edge:
        raise ValueError(
            f"strideguard.{function}: backend names an ExecuTorch AOTI backend, which compiles Edge programs; "
            "this is an ATen program"
        )
    asked = resolve_layouts(layouts, function, names=names, values=values, dialect=dialect)
    target = target_for(program, device, resolved, function)
    held = held_to(program.graph, outputs, dialect, asked)
    return Subject(
        program, function, dialect, target, resolved, outputs, values, names, lines, roles, asked, held.requested,
        held.from_file, held.promised, held.target_orders, accepts if dialect.is_edge else None,
    )


def _value(returned: Any) -> Any:
    """What a user output is traced as: a node's fake value, or the constant returned in its place."""
    return returned.meta.get("val") if isinstance(returned, torch.fx.Node) else returned

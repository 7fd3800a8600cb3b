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

from dataclasses import dataclass, field
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
from ..program.naming import output_names, positional_names
from ..program.promises import requested_layouts, target_orders_of
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
    roles: Mapping[str, Alias] = field(default_factory=dict)
    """What each placeholder is, by name: a user input, a parameter, a buffer or a constant."""
    layouts: Mapping[int, Any] = field(default_factory=dict)
    """The layouts the user asked of this call, by user output index: a dim order or ``program.promises.KEEP``."""
    requested: Mapping[int, Any] = field(default_factory=dict)
    """Every layout asked of an output: those the program records (``program.promises.LAYOUT_TAG``), under
    ``layouts``."""
    from_file: frozenset[int] = frozenset()
    """The outputs whose request only the program records (none asked of this call)."""
    target_orders: tuple[Optional[tuple[int, ...]], ...] = ()
    """Each user output's target dim order (``None``: not a tensor): ``requested``, else contiguous (ATen) or
    the dim order the program promises (Edge)."""
    accepts: Optional[Callable[[Any], bool]] = None
    """Whether the program's verifier admits an op (``program.exported.verifier_accepts``): Edge programs only,
    whose verifier may refuse a view; ``None`` where nothing is refused."""

    @classmethod
    def of_graph(
        cls, graph: torch.fx.Graph, signature: ExportGraphSignature, dialect: Dialect, function: str
    ) -> "Subject":
        """A bare graph's subject (``signature``: the one it implies): positional names, the CPU, no backend, no
        layout asked beyond those the graph records."""
        outputs = tuple(user_outputs(signature))
        return cls(
            None, function, dialect, CPU, None, outputs, _values(graph, outputs), tuple(positional_names(len(outputs))),
            **_held_to(graph, outputs, dialect, {}), roles=placeholder_roles(signature),
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
    outputs, roles = tuple(user_outputs(program.graph_signature)), placeholder_roles(program.graph_signature)
    values = _values(program.graph, outputs)
    accepts = verifier_accepts(program)
    dialect = dialect_of(program)
    names = tuple(output_names(program, len(outputs)))
    resolved = backend if isinstance(backend, Backend) else resolve_backend(backend, function=function)
    if resolved is not None and not dialect.is_edge:
        raise ValueError(
            f"strideguard.{function}: backend names an ExecuTorch AOTI backend, which compiles Edge programs; "
            "this is an ATen program"
        )
    asked = resolve_layouts(layouts, function, names=names, values=values, dialect=dialect)
    return Subject(
        program, function, dialect, target_for(program, device, resolved, function), resolved, outputs, values, names,
        roles=roles, layouts=asked, **_held_to(program.graph, outputs, dialect, asked),
        accepts=accepts if dialect.is_edge else None,
    )


def _values(graph: torch.fx.Graph, outputs: tuple[UserOutput, ...]) -> tuple[Any, ...]:
    returned = output_values(graph)
    return tuple(
        returned[out.position].meta.get("val") if isinstance(returned[out.position], torch.fx.Node) else returned[out.position]
        for out in outputs
    )


def _held_to(graph: torch.fx.Graph, outputs: tuple[UserOutput, ...], dialect: Dialect, asked: Mapping[int, Any]) -> dict:
    """What each output is held to: the layouts ``graph`` records under those ``asked``, and the dim orders they
    make."""
    recorded = requested_layouts(graph, outputs)
    requested = {**recorded, **asked}
    return {
        "requested": requested,
        "from_file": frozenset(index for index in recorded if index not in asked),
        "target_orders": target_orders_of(graph, outputs, dialect, requested),
    }

"""What a call was handed, read once at its entry: the one record every stage takes.

A public entry point (``inspect``, ``densify_outputs``, ``prepare_for_aoti``,
``compile_proven``, ``DenseOutputsPass``) is handed a program and some words
about it: the device it ships to, the AOTI backend, the layouts asked. Each of
those is checked against the program and resolved here, once, into a frozen
``Subject``; the dialect, the user outputs and their names are read here too.
The stages after it read the record and never ask the program again for what
it holds, so a question about the program has one answer for the whole call
(the tree once asked ``dialect_of`` at 12 sites and ``output_names`` at 3).

An ExecuTorch pass handed a bare graph module has no program around it:
``Subject.of_graph`` reads what a graph can say (its dialect, positional
names) and answers for the CPU, with no backend and no layout asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

from ..compiler.backends import Backend, resolve_backend
from ..compiler.targets import CPU, Target, target_for
from ..program.dialect import Dialect, dialect_of
from ..program.exported import output_values, require_exported_program, user_outputs, UserOutput
from ..program.naming import output_names, positional_names
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
    names: tuple[str, ...]
    """Each user output's name, by index (``program.naming.output_names``)."""
    layouts: Mapping[int, Any] = field(default_factory=dict)
    """The layouts the user asked, by user output index: a dim order or ``program.promises.KEEP``."""

    @classmethod
    def of_graph(cls, signature: ExportGraphSignature, dialect: Dialect, function: str) -> "Subject":
        """A bare graph's subject (``signature``: the one it implies): positional names, the CPU, no backend, no
        layout asked."""
        outputs = tuple(user_outputs(signature))
        return cls(None, function, dialect, CPU, None, outputs, tuple(positional_names(len(outputs))))


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
    outputs = tuple(user_outputs(program.graph_signature))
    returned = output_values(program.graph)
    values = [getattr(returned[out.position], "meta", {}).get("val") for out in outputs]
    dialect = dialect_of(program)
    names = tuple(output_names(program, len(outputs)))
    resolved = backend if isinstance(backend, Backend) else resolve_backend(backend, function=function)
    if resolved is not None and not dialect.is_edge:
        raise ValueError(
            f"strideguard.{function}: backend names an ExecuTorch AOTI backend, which compiles Edge programs; "
            "this is an ATen program"
        )
    return Subject(
        program, function, dialect, target_for(program, device, resolved, function), resolved, outputs, names,
        resolve_layouts(layouts, function, names=names, values=values, dialect=dialect),
    )

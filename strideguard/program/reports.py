"""What strideguard knows about each output, as plain typed records.

The analysis computes these once; the passes, the reports, the command line
and the JSON output all read them. Field names here are the public, stable
names (the command line's ``--json`` writes them as they are).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Optional, Sequence


def listed(sizes: Sequence[Any]) -> str:
    """Sizes or strides as a report prints them: ``[s40, 10, 7]`` (a symbol without quotes)."""
    return "[" + ", ".join(str(size) for size in sizes) + "]"


def labelled(index: int, name: Optional[str]) -> str:
    """An output as a report's line starts: ``[2] actions``; ``[0]`` alone where its name is its index
    (the first of a tuple), not ``[0] [0]``."""
    return f"[{index}]" if not name or name == f"[{index}]" else f"[{index}] {name}"


SHOWN_THROUGH = 4
"""Ops a printed pushdown names on its way (the rest counted; the record and the JSON keep them all)."""


def shortened_pushdown(description: str) -> str:
    """A pushdown's description as a report prints it: a long list of ops it moves through cut to the first
    ``SHOWN_THROUGH``, with a count of the rest."""
    head, through, tail = description.partition(" pushed through ")
    ops, into, last = tail.rpartition(" into ")
    names = ops.split(", ") if through and into else []
    if len(names) <= SHOWN_THROUGH:
        return description
    return f"{head} pushed through {', '.join(names[:SHOWN_THROUGH])} and {len(names) - SHOWN_THROUGH} more ops into {last}"


def counted(count: int, noun: str) -> str:
    """``1 user output``, ``3 user outputs``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


DEFAULT_WIDTH = 80
"""The width ``str()`` of a report fits where neither ``COLUMNS`` nor a terminal says one."""


def terminal_width() -> int:
    """The width a report printed from Python fits: ``COLUMNS``, else the terminal's, else ``DEFAULT_WIDTH``
    (as the command line's tables)."""
    return max(20, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def fitted_lines(lines: Sequence[str], width: Optional[int] = None) -> str:
    """``lines`` wrapped at word boundaries to ``width`` (``terminal_width()``), each continuation indented
    under its line; a word longer than the width (a path in a stack trace) is broken."""
    width = width or terminal_width()
    wrapped = []
    for line in lines:
        if len(line) <= width:
            wrapped.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        wrapped += textwrap.wrap(
            line, width=width, subsequent_indent=indent + "    ", break_on_hyphens=False, drop_whitespace=True,
        ) or [line[:width]]
    return "\n".join(wrapped)


class AliasKind(StrEnum):
    INPUT = "input"
    PARAMETER = "parameter"
    BUFFER = "buffer"
    CONSTANT = "constant"
    OUTPUT = "output"


@dataclass(frozen=True)
class Alias:
    """Something an output shares memory with: an input, a weight or another output."""

    kind: AliasKind
    name: str | int
    """An input's or a weight's name, or another output's index."""

    def __str__(self) -> str:
        return f"{self.kind.value} {self.name}"

    def said(self, output_names: Sequence[str] = ()) -> str:
        """As a report shows it: another output by its name (``output first_action``) where ``output_names``
        has it; the JSON keeps ``str(alias)``, by index."""
        if self.kind is AliasKind.OUTPUT and isinstance(self.name, int) and 0 <= self.name < len(output_names):
            return f"output {output_names[self.name]}"
        return str(self)


def memory_group_peer(group: Sequence[int], index: int) -> list[int]:
    """The one other output an output's ``aliases`` names among those sharing its memory (``group``, in
    order): the first of them, or for the first, the second. Naming every other member would make a
    report of n outputs sharing one memory n-squared long."""
    others = [i for i in group[:2] if i != index]
    return others[:1]


class Action(StrEnum):
    NONE = "none"
    COPY = "copy"


class OutputKind(StrEnum):
    """What a user output is. A ``StrEnum``, as every enum of the records: ``kind == "tensor"`` holds and it
    prints as ``tensor``, not ``OutputKind.TENSOR``."""

    TENSOR = "tensor"
    NONE = "none"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    SYMINT = "symint"
    SYMFLOAT = "symfloat"
    SYMBOOL = "symbool"
    OTHER = "other"


class Reason(StrEnum):
    """Why an output gets a copy or not; ``OutputLayout.explanation`` says it with the output's numbers."""

    IN_LAYOUT = "in-layout"
    """Dense in its target layout, as returned."""
    VIEW_IN_LAYOUT = "view-in-layout"
    """A view, already in its target layout (whichever way Inductor returns it)."""
    STRIDED = "strided"
    """Returned with other strides than its target layout's."""
    INDUCTOR_DECIDES = "inductor-decides"
    """Inductor lays it out by a choice the graph does not show; copied (``inspect(exact=True)`` asks it)."""
    KERNEL_DECIDES = "kernel-decides"
    """The device picks the kernel that lays it out when the program is compiled (CUDA's attention kernel,
    where torch's rules depend on what is not known here: the cuDNN version, a symbolic size); copied in a
    form that holds whichever it picks, and the closed loop lowers every candidate."""
    BENCHMARK_DECIDES = "benchmark-decides"
    """A benchmark on the device decides its layout when the program is compiled (Inductor's ``pad_mm`` pads the
    matmul that produces it where the padded kernel times faster, and returns a slice of the padded result);
    copied in a form that holds either way, and the closed loop lowers both."""
    SYMBOLIC = "symbolic"
    """Its strides are symbolic and cannot be proven those of its target layout; copied."""
    BACKEND_DECIDES = "backend-decides"
    """An AOTI backend's own passes rewrite what produces it, or cannot run here to say; copied in a form
    that holds whatever they do (``exact=True`` runs them)."""
    CONTROL_FLOW = "control-flow"
    """An output of control flow, whose compiled layout is not decided; copied."""
    SHARES_MEMORY = "shares-memory"
    """With ``break_aliases``: shares memory with an input, a weight or an earlier output; copied."""
    KEPT = "kept"
    """The user asked for it as the compiler lays it out (``layouts={name: "keep"}``); never copied."""
    KEPT_BY_FILE = "kept-by-file"
    """The program records a request to keep it as the compiler lays it out (a program fixed with
    ``layouts={name: "keep"}`` and saved, or any file that writes the request); never copied, and said to be
    the file's, not the user's."""
    PROMISE_CHANGED = "promise-changed"
    """An Edge program promised another dim order than the one the user asked for: copied into the one asked,
    so that the program promises it."""
    NOT_A_TENSOR = "not-a-tensor"


KEPT_REASONS = frozenset({Reason.KEPT, Reason.KEPT_BY_FILE})
"""The reasons of an output left as the compiler lays it out because it was asked, now or in the file."""

UNDECIDED_BY = {
    Reason.INDUCTOR_DECIDES: "Inductor decides",
    Reason.KERNEL_DECIDES: "the device's kernel choice decides",
    Reason.BENCHMARK_DECIDES: "the device's benchmark decides (pad_mm)",
    Reason.SYMBOLIC: "a symbolic size decides",
    Reason.BACKEND_DECIDES: "the backend's passes decide",
    Reason.CONTROL_FLOW: "control flow decides",
}
"""The verdict of an output whose layout is not decided here: who decides it."""

DECIDED_BY_EXACT = frozenset({Reason.INDUCTOR_DECIDES, Reason.BACKEND_DECIDES})
"""Undecided from the graph alone, decided by Inductor's lowering (``exact=True``); what the device decides
(its kernel choice, its benchmark) stays undecided until it compiles."""


def layout_verdict(
    kind: Any, in_target: Optional[bool], reason: Optional[Reason], shape, strides, order
) -> str:
    """Whether an output is in its target layout and, if not, why, in one short phrase: the one verdict the
    table, the JSON and ``str(report)`` show (``in layout``; ``stride 6144 for dim 0 of size 1 where 512 is
    promised``; ``Inductor decides``). Never says an output is out of layout where it is not."""
    from . import density

    if kind != OutputKind.TENSOR:
        return "not a tensor"
    if reason is Reason.KEPT:
        return "kept as compiled"
    if reason is Reason.KEPT_BY_FILE:
        return "kept as compiled, as the file asks"
    if in_target is True:
        return "in layout"
    if in_target is None:
        return UNDECIDED_BY.get(reason, "undecided")
    if all(isinstance(v, int) for v in (*shape, *strides)):
        wrong = density.first_wrong_stride(shape, strides, order)
        if wrong is not None:
            return wrong
    return f"strides {list(strides)} are not those of dim order {list(order)}"


@dataclass(frozen=True, kw_only=True)
class OutputRecord:
    """What every record of one user output holds, before the fix (``OutputLayout``) or measured after a compile
    (``OutputCheck``): which output it is, what it is, and how it is laid out.

    ``strides`` are those the compiled method returns (predicted, lowered or
    measured); ``target_dim_order`` is the layout it must come back in; ``in_target_layout`` whether it does
    (``None``: not decided). Fields after ``kind`` are ``None`` for an output that is not a tensor.
    """

    index: int
    name: Optional[str]
    kind: OutputKind
    shape: Optional[tuple] = None
    dtype: Optional[str] = None
    strides: Optional[tuple] = None
    contiguous: Optional[bool] = None
    dense: Optional[bool] = None
    target_dim_order: Optional[tuple] = None
    in_target_layout: Optional[bool] = None
    aliases: tuple[Alias, ...] = ()
    node: Optional[str] = None
    """The graph node returned there (``name`` is the user's: its path in what the method returns)."""
    source_line: Optional[str] = None
    """The user's source line that made it, ``policy.py:17  joints[:, :6]`` (from the node's stack trace)."""

    @property
    def is_tensor(self) -> bool:
        return self.kind == OutputKind.TENSOR

    def _verdict(self, reason: Optional["Reason"]) -> str:
        return layout_verdict(self.kind, self.in_target_layout, reason, self.shape, self.strides, self.target_dim_order)

    def _as_dict(self, tuples: Sequence[str] = ()) -> dict[str, Any]:
        """The fields as JSON takes them: tuples as lists, enums as their values, aliases in words."""
        data = asdict(self)
        for key in ("shape", "strides", "target_dim_order", *tuples):
            data[key] = list(data[key]) if data[key] is not None else None
        data["kind"] = OutputKind(self.kind).value
        data["aliases"] = [str(a) for a in self.aliases]
        return data


@dataclass(frozen=True, kw_only=True)
class OutputLayout(OutputRecord):
    """One user output of a method, as the compiled method will return it.

    ``strides`` are those AOTInductor returns for this output (for an Edge
    program: after its AOTI backend turns view copies into views);
    ``target_dim_order`` is the layout it must come back in (contiguous for an
    ATen program, the promised dim order for an Edge program);
    ``in_target_layout`` whether it does (``None``: not decided, and copied).
    ``action`` is what ``densify_outputs``/``prepare_for_aoti`` insert for it,
    ``reason`` why, and ``explanation`` the same in words, with its numbers.
    """

    action: Action = Action.NONE
    reason: Reason = Reason.NOT_A_TENSOR
    explanation: str = "not a tensor"
    view_of: Optional[str] = None
    cause: Optional[str] = None
    pushdown: Optional[str] = None
    """How far ``pushdown=True`` moves this returned piece into its producers (``None``: it does not)."""
    flops_saved: Optional[float] = None
    """The fraction of those producers' FLOPs the pushdown saves."""
    copy_of: Optional[str] = None
    """In a fixed program, what strideguard's copy returned here copies (``slice(dim=2, 0:14) of linear``);
    ``None`` where it returns no copy of strideguard's."""

    @property
    def ok(self) -> bool:
        """Comes back dense in its target layout (non-tensor outputs always do), or as the user asked
        (``"keep"``)."""
        return not self.is_tensor or self.in_target_layout is True or self.reason in KEPT_REASONS

    @property
    def verdict(self) -> str:
        """In its target layout, or why not, in one phrase (``layout_verdict``)."""
        return self._verdict(self.reason)

    def to_dict(self) -> dict[str, Any]:
        data = self._as_dict()
        data["action"] = self.action.value
        data["reason"] = self.reason.value
        data["ok"] = self.ok
        data["verdict"] = self.verdict
        return data

    def cells(self, output_names: Sequence[str] = ()) -> dict[str, str]:
        """The output as the command line, the demo and ``str(report)`` show it: one rendering, by column
        (``CELLS``); ``output_names``, the report's, name the other outputs it shares memory with."""
        tensor = self.is_tensor
        return {
            "#": str(self.index),
            "name": self.name or "-",
            "shape": listed(self.shape) if tensor else "-",
            "dtype": (self.dtype or "-") if tensor else self.kind.value,
            "strides": listed(self.strides) if tensor else "-",
            "layout": self.verdict,
            "fix": "copy" if self.action is Action.COPY else "-",
            "aliases": ", ".join(alias.said(output_names) for alias in self.aliases) or "-",
            "cause": self.cause or "-",
            "source": shortened(self.source_line) if self.source_line else "-",
        }


SOURCE_SHOWN = 40
"""Characters of a source line's code a table cell shows (the record and the JSON keep it whole)."""


def shortened(source: str) -> str:
    """A source line with its code cut to ``SOURCE_SHOWN`` characters, for a table cell."""
    where, _, code = source.partition("  ")
    return f"{where}  {code[:SOURCE_SHOWN - 1]}…" if len(code) > SOURCE_SHOWN else source


CELLS = ("#", "name", "shape", "dtype", "strides", "layout", "fix", "aliases", "cause", "source")
"""The columns of an output's row, in order (``OutputLayout.cells``)."""


def _saving(fraction: Optional[float]) -> str:
    return "" if fraction is None else f", {fraction:.0%} of those ops' FLOPs saved"


@dataclass(frozen=True)
class LayoutReport:
    """Every user output of one method, in return order."""

    dialect: str
    outputs: tuple[OutputLayout, ...]
    source: str = "analysis"
    """``analysis`` (the graph alone) or ``lowering`` (Inductor's own lowering, ``inspect(exact=True)``)."""
    device: str = "cpu"
    """The device the layouts are for (``strideguard.compiler.targets.Target`` in words: kind, compute capability
    assumed, and whether the device was here or the lowering ran on fake tensors)."""
    symbols: tuple[tuple[str, str], ...] = ()
    """What each symbolic size in the shapes and strides stands for, ``("s77", "x.size(0), 2 to 64")``
    (``program.naming.symbol_meanings``)."""

    @property
    def ok(self) -> bool:
        """Every user output comes back dense in its target layout, or as asked: decided, not undecided."""
        return all(o.ok for o in self.outputs)

    @property
    def out_of_layout(self) -> tuple[OutputLayout, ...]:
        """The outputs that come back out of their target layout: decided so, not left undecided."""
        return tuple(o for o in self.outputs if not o.ok and o.in_target_layout is False)

    @property
    def undecided(self) -> tuple[OutputLayout, ...]:
        """The outputs whose layout is decided elsewhere (``UNDECIDED_BY`` names who): neither in nor out."""
        return tuple(o for o in self.outputs if not o.ok and o.in_target_layout is not False)

    @property
    def verdict(self) -> str:
        """``in layout``, ``out of layout`` (some output is), or ``undecided`` (none is, some is undecided): the
        three answers the command line's exit codes tell apart (0, 1, 3)."""
        return "out of layout" if self.out_of_layout else "undecided" if self.undecided else "in layout"

    @property
    def summary(self) -> str:
        """The counts of the three answers in one line, with who decides the undecided and what fix does."""
        total = counted(len(self.outputs), "user output")
        if self.ok:
            return f"all {total} come back dense in their target layout, or as asked" if len(self.outputs) != 1 else \
                "the 1 user output comes back dense in its target layout, or as asked"
        parts = [f"{len(self.outputs) - len(self.out_of_layout) - len(self.undecided)} in layout"]
        if self.out_of_layout:
            parts.append(f"{len(self.out_of_layout)} out of layout")
        if self.undecided:
            deciders = list(dict.fromkeys(o.verdict for o in self.undecided))
            asked = any(o.reason in DECIDED_BY_EXACT for o in self.undecided) and self.source == "analysis"
            parts.append(
                f"{len(self.undecided)} undecided ({'; '.join(deciders)}"
                f"{': exact=True (--exact) asks Inductor' if asked else ''})"
            )
        copies = len(self.copies_needed)
        fix = f"; fix copies {'it' if copies == 1 else f'these {copies}'}" if copies else ""
        return f"{total}: {', '.join(parts)}{fix}"

    @property
    def copies_needed(self) -> tuple[OutputLayout, ...]:
        return tuple(o for o in self.outputs if o.action is Action.COPY)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "out_of_layout": [o.index for o in self.out_of_layout],
            "undecided": [o.index for o in self.undecided],
            "dialect": self.dialect,
            "source": self.source,
            "device": self.device,
            "symbols": dict(self.symbols),
            "outputs": [o.to_dict() for o in self.outputs],
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        """The report, fitted to the terminal's width (``terminal_width``)."""
        lines = [f"{self.verdict}: {counted(len(self.outputs), 'user output')} ({self.dialect}, for {self.device})"]
        names = [o.name or str(o.index) for o in self.outputs]
        for o in self.outputs:
            c = o.cells(names)
            if o.kind is not OutputKind.TENSOR:
                lines.append(f"  {labelled(o.index, o.name)}: {c['dtype']}")
                continue
            alias = f", aliases {c['aliases']}" if o.aliases else ""
            cause = f", {c['cause']}" if o.cause else ""
            lines.append(
                f"  {labelled(o.index, o.name)}: {c['shape']} {c['dtype']} strides {c['strides']}: {c['layout']}{cause}{alias} "
                f"-> {o.action.value} ({o.reason.value})"
            )
            if o.source_line:
                lines.append(f"      at {o.source_line}")
            if o.pushdown:
                lines.append(f"      with pushdown: {shortened_pushdown(o.pushdown)}{_saving(o.flops_saved)}")
        lines += [f"  {symbol}: {meaning}" for symbol, meaning in self.symbols]
        lines.append(self.summary)
        return fitted_lines(lines)


@dataclass(frozen=True, kw_only=True)
class OutputCheck(OutputRecord):
    """One output of a compiled and run method, measured.

    ``in_target_layout`` is the one judgement strideguard uses everywhere
    (``program.density.has_layout``): exactly the strides of ``target_dim_order``,
    size-one dimensions included. ``predicted_strides`` (what ``inspect``
    predicted; ``None`` where it left the layout to Inductor) and
    ``lowered_strides`` (what Inductor's lowering gave) are for the run's sizes.
    """

    match: bool
    storage_offset: Optional[int] = None
    max_abs_error: Optional[float] = None
    predicted_strides: Optional[tuple] = None
    lowered_strides: Optional[tuple] = None
    reference_error: Optional[float] = None
    """With ``verify(..., reference=...)``: the largest difference from the reference program's output
    (0.0 when bitwise equal)."""
    eager_tolerance: Optional[tuple[float, float]] = None
    """The ``(rtol, atol)`` within which the output had to equal eager's (``verify.EAGER_TOLERANCES``, or
    ``verify``'s ``tolerances``); ``None`` when compared exactly (integers, ``bool``) or not a tensor."""
    kept: bool = False
    """The user asked for it as the compiler lays it out (``layouts={name: "keep"}``): any layout is right."""

    @property
    def ok(self) -> bool:
        return self.match and (not self.is_tensor or bool(self.in_target_layout) or self.kept)

    @property
    def verdict(self) -> str:
        """In its target layout as measured, or why not, in one phrase (``layout_verdict``)."""
        return self._verdict(Reason.KEPT if self.kept else None)

    @property
    def as_predicted(self) -> Optional[bool]:
        """Whether the strides returned are those ``inspect`` predicted and Inductor's lowering gave
        (``None`` when there was neither; an empty tensor has no layout to predict)."""
        if not self.is_tensor or (self.predicted_strides is None and self.lowered_strides is None):
            return None
        if self.shape is not None and 0 in self.shape:
            return True
        return all(s is None or tuple(s) == tuple(self.strides) for s in (self.predicted_strides, self.lowered_strides))

    def to_dict(self) -> dict[str, Any]:
        data = self._as_dict(("predicted_strides", "lowered_strides", "eager_tolerance"))
        data["ok"] = self.ok
        data["verdict"] = self.verdict
        data["as_predicted"] = self.as_predicted
        return data


@dataclass(frozen=True)
class VerifyReport:
    """A method compiled with AOTInductor, run, and compared with eager."""

    device: str
    compile_seconds: float
    outputs: tuple[OutputCheck, ...]
    runs: tuple[tuple[str, tuple[OutputCheck, ...]], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs) and all(o.ok for _, checks in self.runs for o in checks)

    @property
    def all_checks(self) -> tuple[OutputCheck, ...]:
        return self.outputs + tuple(o for _, checks in self.runs for o in checks)

    @property
    def summary(self) -> str:
        """What was measured, in one closing line: dense (or as asked, naming what was kept strided), equal to
        eager, and the largest error against the reference where one was run."""
        checks = self.all_checks
        kept = list(dict.fromkeys(c.name or str(c.index) for c in checks if c.kept and c.kind == "tensor" and not c.in_target_layout))
        errors = [c.reference_error for c in checks if c.reference_error is not None]
        against = f"; largest |err| vs the reference {max(errors):g}" if errors else ""
        if self.ok:
            asked = f", or as asked ({', '.join(kept)} kept as compiled)" if kept else ""
            return f"every user output came back dense{asked} and equal to the eager program's{against}"
        strided = [c.name or str(c.index) for c in checks if c.kind == "tensor" and not c.in_target_layout and not c.kept]
        differ = [c.name or str(c.index) for c in checks if not c.match]
        parts = ([f"strided: {', '.join(dict.fromkeys(strided))}"] if strided else []) + (
            [f"values differ from the eager program's: {', '.join(dict.fromkeys(differ))}"] if differ else []
        )
        return f"NOT OK: {'; '.join(parts)}{against}"

    @property
    def mispredicted(self) -> tuple[OutputCheck, ...]:
        """Outputs whose returned strides differ from strideguard's prediction or Inductor's lowering."""
        return tuple(o for o in self.all_checks if o.as_predicted is False)

    def to_dict(self) -> dict[str, Any]:
        """The report as ``verify --json`` prints it (``docs/command-line.md`` documents each field)."""
        return {
            "ok": self.ok,
            "device": self.device,
            "compile_seconds": round(self.compile_seconds, 3),
            "mispredicted": [o.index for o in self.mispredicted],
            "outputs": [o.to_dict() for o in self.outputs],
            "runs": [{"inputs": label, "outputs": [o.to_dict() for o in checks]} for label, checks in self.runs],
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        lines = [f"{'ok' if self.ok else 'NOT OK'}: compiled in {self.compile_seconds:.1f} s on {self.device}"]
        names = [o.name or str(o.index) for o in self.outputs]
        lines += _check_lines(self.outputs, names)
        for label, checks in self.runs:
            failed = [o.name or str(o.index) for o in checks if not o.ok]
            lines.append(f"  on {label}: " + (f"NOT OK: {', '.join(failed)}" if failed else f"all {len(checks)} ok"))
            lines += ["  " + line for line in _check_lines(checks, names) if failed]
        lines.append(self.summary)
        return fitted_lines(lines)


def _check_lines(checks: Sequence[OutputCheck], names: Sequence[str] = ()) -> list[str]:
    lines = []
    for o in checks:
        if o.kind != "tensor":
            lines.append(f"  {labelled(o.index, o.name)}: {o.kind}, {'match' if o.match else 'MISMATCH'}")
            continue
        alias = f", aliases {', '.join(a.said(names) for a in o.aliases)}" if o.aliases else ""
        predicted = "" if o.as_predicted is not False else (
            f", PREDICTED {listed(o.predicted_strides or ())} LOWERED {listed(o.lowered_strides or ())}"
        )
        within = "" if o.match or o.eager_tolerance is None else (
            f" (rtol {o.eager_tolerance[0]:g}, atol {o.eager_tolerance[1]:g})"
        )
        reference = "" if o.reference_error is None else f", |err| vs reference {o.reference_error:g}"
        lines.append(
            f"  {labelled(o.index, o.name)}: strides {listed(o.strides)}: {o.verdict}{alias}, max|err| {o.max_abs_error:g}, "
            f"{'match' if o.match else 'MISMATCH'}{within}{reference}{predicted}"
        )
    return lines

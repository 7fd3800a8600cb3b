"""Reports laid out for a terminal of any width: the whole table where it fits, fewer columns where they do,
and one block per output where not even those fit.

A table squeezed into 80 columns breaks words mid-way ("float3/2") and turns
a cause into a column of fragments. So each report is offered to the console
in three shapes, widest first, and the first whose natural width fits is
printed; ``wide=True`` prints the whole table whatever the width. The cells
are the records' own (``OutputLayout.cells``); colour and escaping are added
here, and every text that came from a file is escaped (``literal``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .files.errors import one_line
from .program.reports import CELLS, LayoutReport, listed, OutputCheck, OutputLayout, SOURCE_SHOWN, VerifyReport

LAYOUT_NARROW = ("#", "name", "shape", "dtype", "strides", "layout", "fix")
"""The columns of ``inspect``'s table that a narrower terminal still gets (``CELLS`` is the whole row)."""

VERIFY_COLUMNS = (
    "#", "name", "shape", "strides returned", "offset", "layout", "max |err|", "equal", "as predicted", "aliases", "source",
)
VERIFY_NARROW = ("#", "name", "strides returned", "layout", "equal")


def plain_console(**options: Any) -> Console:
    """A console that prints text from a file as it is and in time linear in its length: no ``:name:`` emoji
    codes, and no highlighting. rich's default highlighter colours what looks like numbers, paths and
    identifiers by regular expressions, one of which (its hexadecimal run) backtracks quadratically over a
    long word: 16,000 ``f``s of a stack trace's file name took 3.9 s to print, a 1 MiB one hours. The tables
    colour what they mean to with markup."""
    return Console(emoji=False, highlight=False, **options)


def literal(text: object) -> str:
    """Text from a file or an argument (a path, a name, a message), for rich: its markup escaped and every
    control, format or bidirectional character shown as an escape (``\\x1b``, ``\\u202e``), so that
    it prints as itself and leaves the terminal as it was."""
    return escape(one_line(str(text)))


SOURCE_WHERE_SHOWN = 256
"""Characters of a source line's file name and line number a report prints (a file name is at most 255
bytes on the file systems Python runs on); the record and the JSON keep it whole."""
SOURCE_LINE_SHOWN = 200
"""Characters of a source line's code printed on a line of its own (a table cell shows ``SOURCE_SHOWN``)."""


def shown_source(source: str, code_shown: int = SOURCE_SHOWN) -> str:
    """A source line as a report prints it: its file name and line number cut to ``SOURCE_WHERE_SHOWN``
    characters and its code to ``code_shown``, each ending in ``…`` where cut.

    A stack trace a file carries may hold a megabyte in one frame's file name or code, and rich's markup
    escape and parser, which every printed line goes through, each cost the square of a run of backslashes
    (16,000 took 2 s, a megabyte would take hours); cut, a source line costs rich a constant."""
    where, separator, code = source.partition("  ")
    where = where if len(where) <= SOURCE_WHERE_SHOWN else where[: SOURCE_WHERE_SHOWN - 1] + "…"
    code = code if len(code) <= code_shown else code[: code_shown - 1] + "…"
    return f"{where}{separator}{code}"


_COLOURED = {"copy": "[yellow]copy[/]", "no": "[red]no[/]", "unknown": "[yellow]unknown[/]"}


def _layout_cells(output: OutputLayout, names: Sequence[str]) -> dict[str, str]:
    texts = output.cells(names)
    if output.source_line:  # cut before it is escaped: rich's escape, too, is quadratic in a run of backslashes
        texts["source"] = shown_source(output.source_line)
    cells = {column: _COLOURED.get(value, literal(value)) for column, value in texts.items()}
    colour = "green" if output.ok else "yellow" if output.in_target_layout is None else "red"
    cells["#"] = f"[{'green' if output.ok else 'red'}]{cells['#']}[/]"
    cells["layout"] = f"[{colour}]{cells['layout']}[/]"
    return cells


def _check_cells(check: OutputCheck, referenced: bool, names: Sequence[str]) -> dict[str, str]:
    tensor = check.kind == "tensor"
    cells = {
        "#": f"[{'green' if check.ok else 'red'}]{check.index}[/]",
        "name": literal(check.name or "-"),
        "shape": literal(listed(check.shape)) if tensor else literal(check.kind),
        "strides returned": literal(listed(check.strides)) if tensor else "-",
        "offset": literal(check.storage_offset) if tensor else "-",
        "layout": f"[{'green' if check.ok or not tensor else 'red'}]{literal(check.verdict)}[/]",
        "max |err|": f"{check.max_abs_error:g}" if check.max_abs_error is not None else "-",
        "equal": "yes" if check.match else "[red]no[/]",
        "as predicted": _as_predicted(check),
        "aliases": literal(", ".join(alias.said(names) for alias in check.aliases)) if check.aliases else "-",
        "source": literal(shown_source(check.source_line)) if check.source_line else "-",
    }
    if referenced:
        cells["|err| vs reference"] = f"{check.reference_error:g}" if check.reference_error is not None else "-"
    return cells


def _as_predicted(check: OutputCheck) -> str:
    """Whether the strides returned are those inspect predicted and Inductor's lowering gave."""
    if check.as_predicted is None:
        return "-" if check.lowered_strides is None else "[yellow]Inductor decided[/]"
    if check.as_predicted:
        return "yes" if check.predicted_strides is not None else "yes (lowering)"
    return f"[red]no[/]: {literal(f'predicted {listed(check.predicted_strides or ())}, lowered {listed(check.lowered_strides or ())}')}"


def _table(title: str, caption: Optional[str], columns: Sequence[str], rows: list[dict[str, str]]) -> Table:
    table = Table(title=title, caption=caption, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(row[column] for column in columns))
    return table


def _blocks(title: str, caption: Optional[str], rows: list[dict[str, str]], head: Callable[[dict], str], fields: Sequence[str]) -> Group:
    """One block per output: a head line, then a label and a value per line, wrapped at word boundaries."""
    parts: list[RenderableType] = [Text.from_markup(title)]
    for row in rows:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=1)
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        for field in fields:
            if row.get(field, "-") != "-":
                grid.add_row("", field, row[field])
        parts += [Text.from_markup(head(row)), grid]
    if caption:
        parts.append(Text.from_markup(f"[dim]{caption}[/]"))
    return Group(*parts)


_UNBOUNDED = 1 << 16


def natural_width(console: Console, shape: RenderableType) -> int:
    """The width ``shape`` takes when nothing wraps (rich clamps a measurement to the console's width)."""
    return console.measure(shape, options=console.options.update_width(_UNBOUNDED)).maximum


def fitted(console: Console, shapes: Sequence[RenderableType], wide: bool) -> RenderableType:
    """The first of ``shapes`` (widest first) whose natural width fits ``console``; with ``wide``, the first."""
    if wide:
        return shapes[0]
    for shape in shapes[:-1]:
        if natural_width(console, shape) <= console.width:
            return shape
    return shapes[-1]


WHOLE, NARROW, BLOCKS = range(3)
"""The shapes a report is offered in, widest first (``print_fitted`` returns which it printed)."""


def print_fitted(console: Console, shapes: Sequence[RenderableType], wide: bool) -> int:
    """Print the shape ``fitted`` chooses; returns which (``WHOLE``, ``NARROW`` or ``BLOCKS``)."""
    chosen = fitted(console, shapes, wide)
    width = natural_width(console, chosen)
    if wide and width > console.width:
        # The whole table with each cell on one line however narrow the terminal: --wide asked for it.
        wider = plain_console(
            file=console.file, width=width, color_system=console.color_system, force_terminal=console.is_terminal,
        )
        wider.print(chosen)
    else:
        console.print(chosen)
    return list(shapes).index(chosen)


def layout_shapes(title: str, report: LayoutReport) -> list[RenderableType]:
    """``inspect``'s report as the whole table, the narrower one, and blocks."""
    caption = (
        "strides from Inductor's lowering"
        if report.source == "lowering"
        else "strides read off the graph; where Inductor decides, fix copies and --exact asks Inductor"
    )
    names = [output.name or str(output.index) for output in report.outputs]
    rows = [
        {**_layout_cells(output, names), "why": literal(output.explanation) if output.action.value == "copy" else "-"}
        for output in report.outputs
    ]
    head = lambda row: f"{row['#']} [bold]{row['name']}[/]  {row['shape']} {row['dtype']}  strides {row['strides']}"
    return [
        _table(literal(title), caption, CELLS, rows),
        _table(literal(title), caption, LAYOUT_NARROW, rows),
        _blocks(literal(title), caption, rows, head, ("layout", "fix", "why", "cause", "aliases", "source")),
    ]


def verify_shapes(title: str, measured: VerifyReport) -> list[RenderableType]:
    """``verify``'s measurements as the whole table, the narrower one, and blocks."""
    referenced = any(check.reference_error is not None for check in measured.all_checks)
    columns = VERIFY_COLUMNS + (("|err| vs reference",) if referenced else ())
    names = [check.name or str(check.index) for check in measured.outputs]
    rows = [_check_cells(check, referenced, names) for check in measured.outputs]
    head = lambda row: f"{row['#']} [bold]{row['name']}[/]  {row['shape']}  strides {row['strides returned']}"
    return [
        _table(literal(title), None, columns, rows),
        _table(literal(title), None, VERIFY_NARROW + (("|err| vs reference",) if referenced else ()), rows),
        _blocks(literal(title), None, rows, head, columns[4:]),
    ]

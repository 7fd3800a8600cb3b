"""Pictures of the memory an output comes back in, and of the dense layout ``fix`` gives it.

A stride tuple says little at a glance; a grid does. For every output that
needs a copy, the left panel draws the storage AOTInductor hands back (one
cell per element, rows as long as the output's row pitch) with the cells the
output covers highlighted and numbered in the output's element order; the
gaps between them are why the output is not dense. The right panel draws
the same elements after ``strideguard fix``: one dense block.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import BinaryIO, Optional, Sequence

import matplotlib
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from torch.export import ExportedProgram

from . import layout
from .api import output_facts
from .loading.errors import one_line
from .records import Action, LayoutReport, OutputLayout

MAX_COLUMNS = 64
MAX_ROWS = 32
MAX_OUTPUTS = 6
LABELLED_CELLS = 256
LABELLED_ROWS = 16
"""Cells are numbered only in panels this small, so the numbers stay legible."""
MAX_ENUMERATED = 1_000_000
"""Elements enumerated to find covered cells; past it (only overlapping, hand-made strides get there)
the storage is drawn without the output's elements rather than exhausting memory."""

_OUTSIDE, _GAP, _COVERED, _OVERLAP, _DENSE = range(5)
_COLOURS = ListedColormap(["white", "#d9d9d9", "#f28e2b", "#c0392b", "#59a14f"])
_LEGEND = (
    Patch(color="#f28e2b", label="element of the output (numbered in the output's element order)"),
    Patch(color="#c0392b", label="element shared by several output elements"),
    Patch(color="#d9d9d9", label="in the storage but not in the output"),
    Patch(color="#59a14f", label="after fix: the output's own dense memory"),
)


@dataclass(frozen=True)
class _Storage:
    """What backs one returned output: its geometry, and the storage around it."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    size: int
    """Elements in the storage."""
    row_width: int
    """Cells per drawn row: the output's row pitch, so rows of the output line up."""


def plot_copies(program: ExportedProgram, report: LayoutReport, path: os.PathLike | str | BinaryIO, *, title: str) -> int:
    """Draw each output of ``report`` that ``fix`` copies into the PNG file ``path``; returns how many were drawn.

    ``path`` may be an open binary file (how the command line writes it
    safely); the image is PNG whatever the name, so no extension is added.

    ``report`` is ``inspect(program)``. The storage is the one the program's
    metadata gives the returned value (for a view, its source's), which is
    what AOTInductor returns for an ATen program; where the report's strides
    are not the metadata's (a weight's view, returned as a copy), the drawn
    storage is just the returned one.
    """
    with matplotlib.rc_context({"text.parse_math": False}):  # a name with "$...$" in it is text, not math
        return _plot_copies(program, report, path, one_line(title))


def _plot_copies(program: ExportedProgram, report: LayoutReport, path: os.PathLike | str | BinaryIO, title: str) -> int:
    copied = [output for output in report.outputs if output.action is Action.COPY]
    drawn = copied[:MAX_OUTPUTS]
    storages = _storages(program, drawn)
    rows = max(len(drawn), 1)
    figure = Figure(figsize=(15, 3.2 * rows + 0.8))
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 2, squeeze=False)
    if not drawn:
        for axis in axes[0]:
            axis.set_axis_off()
        axes[0][0].text(0, 0.5, "every output comes back dense: fix copies nothing", fontsize=13)
    for (before, after), output in zip(axes, drawn):
        storage = storages[output.index]
        if storage is None:
            for axis in (before, after):
                axis.set_axis_off()
            before.text(0, 0.5, f"output {output.index} ({output.name}): symbolic sizes or strides, not drawn\n{output.explanation}")
            continue
        _draw_returned(before, output, storage)
        _draw_dense(after, output, storage)
    heading = title
    if len(copied) > len(drawn):
        heading += f"  (first {len(drawn)} of {len(copied)} copied outputs drawn)"
    figure.suptitle(heading, fontsize=13)
    if drawn:
        figure.legend(handles=_LEGEND, loc="lower center", ncol=len(_LEGEND), fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.04 if drawn else 0, 1, 1))
    figure.savefig(path, dpi=110, format="png")
    return len(drawn)


def _storages(program: ExportedProgram, outputs: Sequence[OutputLayout]) -> dict[int, Optional[_Storage]]:
    wanted = {output.index: output for output in outputs}
    storages = {}
    for fact in output_facts(program):
        output = wanted.get(fact.output.index)
        if output is not None and isinstance(fact.value, torch.Tensor):
            storages[fact.output.index] = _storage(output, fact.value, fact.chain)
    return storages


def _storage(output: OutputLayout, value: torch.Tensor, chain: Sequence[torch.fx.Node]) -> Optional[_Storage]:
    if not all(isinstance(n, int) for n in (*output.shape, *output.strides)):
        return None
    shape, strides = tuple(output.shape), tuple(output.strides)
    extent = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides)) if all(shape) else 0
    if tuple(layout.format_strides(value.stride())) == strides and isinstance(value.storage_offset(), int):
        offset = value.storage_offset()
        size = max(value.untyped_storage().nbytes() // value.element_size(), offset + extent)
    else:
        offset, size = 0, extent
    return _Storage(shape, strides, offset, max(size, 1), _row_width(shape, strides, chain, size))


def _row_width(shape, strides, chain: Sequence[torch.fx.Node], size: int) -> int:
    """The row pitch: the source's innermost size for a view, else the output's smallest stride above one."""
    for view in chain:
        source = view.args[0].meta.get("val")
        if isinstance(source, torch.Tensor) and source.dim() and isinstance(source.shape[-1], int):
            return max(source.shape[-1], 1)
    pitches = [stride for extent, stride in zip(shape, strides) if extent > 1 and stride > 1]
    return min(pitches) if pitches else max(1, min(size, MAX_COLUMNS))


def _coverage(shape, strides, offset: int, start: int, row_width: int, rows: int, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """For the drawn cells (``rows`` rows of ``row_width`` storage cells from ``start``, their first
    ``columns``): how many output elements lie in each, and the first one's index.

    Only indices that can land before the window's end are enumerated
    (strides are never negative), and only the drawn cells are counted, so a
    huge output, or a row pitch a file declares in the millions, costs what
    the drawn grid costs.
    """
    counts = np.zeros((rows, columns), dtype=np.int64)
    first = np.full((rows, columns), np.iinfo(np.int64).max, dtype=np.int64)
    stop = start + rows * row_width
    reachable = [
        min(extent, 2) if stride == 0 else min(extent, max(0, (stop - 1 - offset) // stride + 1))
        for extent, stride in zip(shape, strides)
    ]
    if 0 in reachable or math.prod(reachable) > MAX_ENUMERATED:
        return counts, first
    cell = np.full([1] * len(shape), offset, dtype=np.int64)
    element = np.zeros([1] * len(shape), dtype=np.int64)
    for dim, (count, stride, element_stride) in enumerate(zip(reachable, strides, layout.strides_for_order(shape, range(len(shape))))):
        steps = np.arange(count, dtype=np.int64).reshape([count if d == dim else 1 for d in range(len(shape))])
        cell = cell + steps * stride
        element = element + steps * element_stride
    cell, element = np.broadcast_arrays(cell, element)
    inside = (cell >= start) & (cell < stop)
    row, column = np.divmod(cell[inside] - start, row_width)
    shown = column < columns
    where = (row[shown], column[shown])
    np.add.at(counts, where, 1)
    np.minimum.at(first, where, element[inside][shown])
    return counts, first


def _cells(start: int, row_width: int, rows: int, columns: int) -> np.ndarray:
    """The storage index of each drawn cell."""
    return start + np.arange(rows, dtype=np.int64)[:, None] * row_width + np.arange(columns, dtype=np.int64)[None, :]


def _window(storage_size: int, row_width: int, first_cell: int) -> tuple[int, int, int, int]:
    """Rows and columns to draw: from the row before the first covered cell, capped."""
    rows_total = math.ceil(storage_size / row_width)
    first_row = max(0, min(first_cell // row_width - 1, rows_total - MAX_ROWS)) if first_cell else 0
    return first_row, min(rows_total - first_row, MAX_ROWS), min(row_width, MAX_COLUMNS), rows_total


def _draw_grid(axis, kinds: np.ndarray, labels: np.ndarray, first_row: int) -> None:
    rows, columns = kinds.shape
    axis.imshow(kinds, cmap=_COLOURS, vmin=0, vmax=len(_COLOURS.colors) - 1, aspect="equal", interpolation="nearest")
    axis.set_xticks(np.arange(-0.5, columns, 1), minor=True)
    axis.set_yticks(np.arange(-0.5, rows, 1), minor=True)
    axis.grid(which="minor", color="white", linewidth=0.8)
    axis.tick_params(which="both", length=0, labelsize=7)
    axis.set_yticks([0, rows - 1], [f"row {first_row}", f"row {first_row + rows - 1}"])
    axis.set_xticks([0, columns - 1], ["0", str(columns - 1)])
    if kinds.size <= LABELLED_CELLS and rows <= LABELLED_ROWS:
        for (row, column), label in np.ndenumerate(labels):
            if label >= 0:
                axis.text(column, row, str(label), ha="center", va="center", fontsize=6)


def _truncation(first_row: int, rows: int, rows_total: int, columns: int, row_width: int) -> str:
    shown = []
    if rows < rows_total:
        shown.append(f"rows {first_row}-{first_row + rows - 1} of {rows_total}")
    if columns < row_width:
        shown.append(f"columns 0-{columns - 1} of {row_width}")
    return f"\n(showing {', '.join(shown)})" if shown else ""


def _draw_returned(axis, output: OutputLayout, storage: _Storage) -> None:
    first_row, rows, columns, rows_total = _window(storage.size, storage.row_width, storage.offset)
    start = first_row * storage.row_width
    counts, first = _coverage(storage.shape, storage.strides, storage.offset, start, storage.row_width, rows, columns)
    kinds = np.where(counts > 1, _OVERLAP, np.where(counts == 1, _COVERED, _GAP))
    kinds[_cells(start, storage.row_width, rows, columns) >= storage.size] = _OUTSIDE
    labels = np.where(counts > 0, first, -1)
    _draw_grid(axis, kinds, labels, first_row)
    gaps = ""
    if rows == rows_total and columns == storage.row_width:
        unused = storage.size - int(np.count_nonzero(counts))
        gaps = f", {unused} of them not in the output" if unused else ", every one in the output, in another order"
    axis.set_title(
        f"output {output.index} ({output.name}) as compiled: shape {list(storage.shape)}, strides {list(storage.strides)}\n"
        f"storage of {storage.size} elements, offset {storage.offset}{gaps}"
        f"{_truncation(first_row, rows, rows_total, columns, storage.row_width)}",
        fontsize=9,
    )


def _draw_dense(axis, output: OutputLayout, storage: _Storage) -> None:
    order = tuple(output.target_dim_order)
    dense = tuple(layout.strides_for_order(storage.shape, order))
    numel = math.prod(storage.shape)
    row_width = max(storage.shape[order[-1]], 1) if order else 1
    first_row, rows, columns, rows_total = _window(numel, row_width, 0)
    counts, first = _coverage(storage.shape, dense, 0, 0, row_width, rows, columns)
    kinds = np.where(counts > 0, _DENSE, _OUTSIDE)
    labels = np.where(counts > 0, first, -1)
    _draw_grid(axis, kinds, labels, 0)
    axis.set_title(
        f"after strideguard fix: one copy, dense in dim order {list(order)}\n"
        f"strides {list(dense)}, {numel} elements with no gaps"
        f"{_truncation(first_row, rows, rows_total, columns, row_width)}",
        fontsize=9,
    )

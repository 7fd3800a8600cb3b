"""Pictures of the memory an output comes back in, and of the dense layout ``fix`` gives it.

A stride tuple says little at a glance; a grid does. For every output that
needs a copy, the left panel draws the storage AOTInductor hands back, one
cell per element, in rows as long as the output's own row stride (its
smallest stride above one), so that rows of the output line up whatever it is
a view of; the cells the output covers are shaded from light to dark in the
output's element order and numbered where the numbers fit. The gaps between
them are why an output is not dense, and a shading that does not run row by
row is why a dense but permuted output is not in its layout. The right panel
draws the same elements after ``strideguard fix`` at the same scale and in
the same orientation (rows of the same width): one dense block, shaded in the
same element order. ``draw_copies`` returns the figure, whose panels' pixel
arrays, numbers and titles are what the tests read back.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Optional, Sequence

import matplotlib
import numpy as np
import sympy
import torch
import torch.utils._pytree as pytree
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from torch.export import ExportedProgram

from .api import output_facts
from .program import density
from .files.errors import one_line
from .program.reports import Action, LayoutReport, OutputLayout

MAX_COLUMNS = 64
MAX_ROWS = 32
MAX_OUTPUTS = 6
LABELLED_CELLS = 256
LABELLED_ROWS = 16
LABELLED_COLUMNS = 24
"""Cells are numbered only where both panels of an output are this small, so the numbers stay legible."""
MAX_ENUMERATED = 1_000_000
"""Elements enumerated to find covered cells; past it (only overlapping, hand-made strides get there)
the storage is drawn without the output's elements rather than exhausting memory."""

OUTSIDE, GAP, OVERLAP = (to_rgb(c) for c in ("white", "#d9d9d9", "#c0392b"))
"""Colours of a cell beyond the storage, of one the output does not cover, and of one it covers twice."""
COVERED_RAMP = (to_rgb("#fdd9a0"), to_rgb("#a0410d"))
DENSE_RAMP = (to_rgb("#c7e9c0"), to_rgb("#1b6b2f"))
"""Light to dark: an element's shade is its position in the output's element order (before, and after fix)."""


def _legend(numbered: bool) -> tuple[Patch, ...]:
    order = "numbered and shaded light to dark" if numbered else "shaded light to dark (too many cells to number)"
    return (
        Patch(color=COVERED_RAMP[1], label=f"element of the output, {order} in its element order"),
        Patch(color=OVERLAP, label="element shared by several output elements"),
        Patch(color=GAP, label="in the storage but not in the output"),
        Patch(color=DENSE_RAMP[1], label="after fix: the output's own dense memory, same order"),
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
    """Cells per drawn row, before and after fix: the output's row stride, so rows of the output line up."""


def plot_copies(program: ExportedProgram, report: LayoutReport, path: os.PathLike | str | BinaryIO, *, title: str) -> list[str]:
    """Draw each output of ``report`` that ``fix`` copies into the PNG file ``path``; returns the names of those it
    could not draw (symbolic sizes its example inputs do not fix), for the terminal to say as the picture does.

    ``path`` may be an open binary file (how the command line writes it
    safely); the image is PNG whatever the name, so no extension is added.
    """
    with matplotlib.rc_context({"text.parse_math": False}):  # a name with "$...$" in it is text, not math
        figure, not_drawn = _draw_copies(program, report, one_line(title))
        figure.savefig(path, dpi=110, format="png")
    return not_drawn


def draw_copies(program: ExportedProgram, report: LayoutReport, *, title: str) -> Figure:
    """The figure ``plot_copies`` writes: one row of two panels per output ``fix`` copies (before, after).

    ``report`` is ``inspect(program)``. The storage is the one the program's
    metadata gives the returned value (for a view, its source's), which is
    what AOTInductor returns for an ATen program; where the report's strides
    are not the metadata's (a weight's view, returned as a copy), the drawn
    storage is just the returned one.
    """
    with matplotlib.rc_context({"text.parse_math": False}):
        return _draw_copies(program, report, one_line(title))[0]


def example_sizes(program: ExportedProgram) -> dict[str, int]:
    """Each symbolic size of ``program``'s inputs at the example inputs the program stores (``s77`` -> 4): a
    dynamic program is drawn at those sizes. Empty where the program stores none."""
    examples = getattr(program, "example_inputs", None)
    if not examples:
        return {}
    args, kwargs = examples
    leaves = pytree.tree_leaves((args, kwargs))
    placeholders = [node for node in program.graph.nodes if node.op == "placeholder" and node.name in set(program.graph_signature.user_inputs)]
    sizes = {}
    for node, example in zip(placeholders, leaves):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(example, torch.Tensor) or value.dim() != example.dim():
            continue
        for size, concrete in zip(value.shape, example.shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                sizes.setdefault(str(size.node.expr), int(concrete))
    return sizes


def _at_examples(values: Sequence[Any], sizes: dict[str, int]) -> Optional[tuple[int, ...]]:
    """Sizes or strides, symbolic ones evaluated at ``sizes``; ``None`` where a symbol has no example size."""
    concrete = []
    for value in values:
        if isinstance(value, int):
            concrete.append(value)
            continue
        try:
            evaluated = sympy.sympify(str(value)).subs({sympy.Symbol(name): size for name, size in sizes.items()})
        except (sympy.SympifyError, TypeError, ValueError):
            return None
        if not evaluated.is_Integer:
            return None
        concrete.append(int(evaluated))
    return tuple(concrete)


def _draw_copies(program: ExportedProgram, report: LayoutReport, title: str) -> tuple[Figure, list[str]]:
    copied = [output for output in report.outputs if output.action is Action.COPY]
    drawn = copied[:MAX_OUTPUTS]
    sizes = example_sizes(program)
    symbolic = any(not isinstance(n, int) for output in drawn for n in (*output.shape, *output.strides))
    storages = _storages(program, drawn, sizes)
    rows = max(len(drawn), 1)
    figure = Figure(figsize=(15, 3.2 * rows + 0.8))
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 2, squeeze=False)
    if not drawn:
        for axis in axes[0]:
            axis.set_axis_off()
        axes[0][0].text(0, 0.5, "every output comes back dense: fix copies nothing", fontsize=13)
    numbered = False
    for (before, after), output in zip(axes, drawn):
        storage = storages.get(output.index)
        if storage is None:
            for axis in (before, after):
                axis.set_axis_off()
            before.text(0, 0.5, f"output {output.index} ({output.name}): {NOT_DRAWN}\n{output.explanation}")
            continue
        number = _numberable(storage)
        _draw_returned(before, output, storage, number)
        _draw_dense(after, output, storage, number)
        numbered |= number
        # One scale: both panels span as many rows as the taller one, so a cell is the same size in each.
        bottom = max(axis.get_ylim()[0] for axis in (before, after))
        for axis in (before, after):
            axis.set_ylim(bottom, -0.5)
    heading = title
    if symbolic and sizes:
        heading += "  (at the stored example sizes: " + ", ".join(f"{name} = {size}" for name, size in sizes.items()) + ")"
    if len(copied) > len(drawn):
        heading += f"  (first {len(drawn)} of {len(copied)} copied outputs drawn)"
    figure.suptitle(heading, fontsize=13)
    if drawn:
        legend = _legend(numbered)
        figure.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8, frameon=False)
    height = figure.get_figheight()
    figure.tight_layout(rect=(0, 0.45 / height if drawn else 0, 1, 1))
    return figure, [output.name or str(output.index) for output in drawn if storages.get(output.index) is None]


NOT_DRAWN = "symbolic sizes or strides the stored example inputs do not fix, not drawn"


def _storages(program: ExportedProgram, outputs: Sequence[OutputLayout], sizes: dict[str, int]) -> dict[int, Optional[_Storage]]:
    wanted = {output.index: output for output in outputs}
    storages = {}
    for fact in output_facts(program):
        output = wanted.get(fact.output.index)
        if output is not None and isinstance(fact.value, torch.Tensor):
            storages[fact.output.index] = _storage(output, fact.value, sizes)
    return storages


def _storage(output: OutputLayout, value: torch.Tensor, sizes: dict[str, int]) -> Optional[_Storage]:
    shape, strides = _at_examples(output.shape, sizes), _at_examples(output.strides, sizes)
    if shape is None or strides is None:
        return None
    symbolic = shape != tuple(output.shape) or strides != tuple(output.strides)
    extent = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides)) if all(shape) else 0
    if not symbolic and tuple(density.format_strides(value.stride())) == strides and isinstance(value.storage_offset(), int):
        offset = value.storage_offset()
        size = max(value.untyped_storage().nbytes() // value.element_size(), offset + extent)
    else:
        offset, size = 0, extent
    return _Storage(shape, strides, offset, max(size, 1), row_width(shape, strides, size))


def row_width(shape: Sequence[int], strides: Sequence[int], size: int) -> int:
    """Cells per drawn row: the output's smallest stride above one among its dimensions of more than one
    element (strides ``[90, 9, 1]``: 9, whatever the output is a view of), so that each of its rows starts a
    drawn row; a dense row-major output is drawn as rows of its innermost size."""
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
    for dim, (count, stride, element_stride) in enumerate(zip(reachable, strides, density.strides_for_order(shape, range(len(shape))))):
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


def _shaded(counts: np.ndarray, first: np.ndarray, numel: int, ramp, background: np.ndarray) -> np.ndarray:
    """An RGB image: each covered cell shaded along ``ramp`` by its element's place in the element order, a cell
    covered twice in the overlap colour, the rest as ``background`` says."""
    light, dark = (np.array(colour) for colour in ramp)
    where = np.clip(first, 0, max(numel - 1, 0)) / max(numel - 1, 1)
    shaded = light + where[..., None] * (dark - light)
    image = np.where((counts == 1)[..., None], shaded, background)
    return np.where((counts > 1)[..., None], np.array(OVERLAP), image)


def _numberable(storage: _Storage) -> bool:
    """Whether both panels of an output are small enough to number every cell legibly."""
    numel = math.prod(storage.shape)
    for size, first in ((storage.size, storage.offset), (numel, 0)):
        _, rows, columns, _ = _window(size, storage.row_width, first)
        if rows * columns > LABELLED_CELLS or rows > LABELLED_ROWS or columns > LABELLED_COLUMNS:
            return False
    return True


def _draw_grid(axis, image: np.ndarray, labels: np.ndarray, first_row: int, number: bool) -> None:
    """Draw the cells, each covered one with its element's number when ``number``."""
    rows, columns = image.shape[:2]
    axis.imshow(image, aspect="equal", interpolation="nearest")
    axis.set_xticks(np.arange(-0.5, columns, 1), minor=True)
    axis.set_yticks(np.arange(-0.5, rows, 1), minor=True)
    axis.grid(which="minor", color="white", linewidth=0.8)
    axis.tick_params(which="both", length=0, labelsize=7)
    axis.set_yticks([0, rows - 1], [f"row {first_row}", f"row {first_row + rows - 1}"])
    axis.set_xticks([0, columns - 1], ["0", str(columns - 1)])
    if not number:
        return
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


def _background(cells: np.ndarray, size: int) -> np.ndarray:
    return np.where((cells >= size)[..., None], np.array(OUTSIDE), np.array(GAP))


def _draw_returned(axis, output: OutputLayout, storage: _Storage, number: bool) -> None:
    first_row, rows, columns, rows_total = _window(storage.size, storage.row_width, storage.offset)
    start = first_row * storage.row_width
    counts, first = _coverage(storage.shape, storage.strides, storage.offset, start, storage.row_width, rows, columns)
    numel = math.prod(storage.shape)
    image = _shaded(counts, first, numel, COVERED_RAMP, _background(_cells(start, storage.row_width, rows, columns), storage.size))
    _draw_grid(axis, image, np.where(counts > 0, first, -1), first_row, number)
    gaps = ""
    if rows == rows_total and columns == storage.row_width:
        unused = storage.size - int(np.count_nonzero(counts))
        gaps = f", {unused} of them not in the output" if unused else ", every one in the output, in another order"
    axis.set_title(
        f"{output.name} as compiled: shape {list(storage.shape)}, strides {list(storage.strides)}\n"
        f"storage of {storage.size} elements in rows of {storage.row_width}, offset {storage.offset}{gaps}"
        f"{_truncation(first_row, rows, rows_total, columns, storage.row_width)}",
        fontsize=9,
    )


def _draw_dense(axis, output: OutputLayout, storage: _Storage, number: bool) -> None:
    """The same elements after fix, in rows as wide as the returned storage's (one scale, one orientation)."""
    order = tuple(output.target_dim_order)
    dense = tuple(density.strides_for_order(storage.shape, order))
    numel = math.prod(storage.shape)
    width = storage.row_width
    first_row, rows, columns, rows_total = _window(numel, width, 0)
    counts, first = _coverage(storage.shape, dense, 0, 0, width, rows, columns)
    image = _shaded(counts, first, numel, DENSE_RAMP, _background(_cells(0, width, rows, columns), numel))
    _draw_grid(axis, image, np.where(counts > 0, first, -1), 0, number)
    axis.set_title(
        f"{output.name} after strideguard fix: one copy, dense in dim order {list(order)}\n"
        f"strides {list(dense)}, {numel} elements with no gaps, in rows of {width}"
        f"{_truncation(first_row, rows, rows_total, columns, width)}",
        fontsize=9,
    )

"""The layout a user asks of an output, checked and resolved to what the engine plans with.

By default an output's target is row-major (ATen) or the dim order the
program promises (Edge). A user whose next kernel wants channels-last, or who
wants an output left exactly as the compiler lays it out, says so per output:
``layouts={"image": torch.channels_last, "cache": "keep", 2: (0, 2, 1)}``,
keyed by the output's name (``program.naming.output_names``) or index, with a
``torch.memory_format``, its name, a dim order (outermost first), or
``"keep"``. Each request is checked against the output it names (a 4-d format
on a 3-d output is refused, naming it) and becomes a dim order or ``KEEP``,
by user output index: what ``fix.engine.make_plan`` takes as ``layouts``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch

from ..program.dialect import copies_into, Dialect
from ..program.promises import dim_order_problem, KEEP
from ..program.reports import counted

FORMATS = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
}
"""Memory formats by the names the command line takes (``--layout image=channels_last``)."""

_FORMAT_ORDERS = {
    torch.channels_last: (4, (0, 2, 3, 1)),
    torch.channels_last_3d: (5, (0, 2, 3, 4, 1)),
}


def parse_layout(text: str) -> Any:
    """A layout as the command line spells it: a format's name, ``keep``, or a dim order ``0,2,3,1``."""
    text = text.strip()
    if text == KEEP:
        return KEEP
    if text in FORMATS:
        return FORMATS[text]
    parts = [part.strip() for part in text.split(",")]
    if all(part.isdigit() for part in parts) and parts != [""]:
        return tuple(int(part) for part in parts)
    raise ValueError(
        f"{text!r} is not a layout: give {', '.join(FORMATS)}, {KEEP}, or a dim order such as 0,2,3,1"
    )


def resolve_layouts(
    layouts: Optional[Mapping[Any, Any]], function: str, *, names: Sequence[str], values: Sequence[Any], dialect: Dialect
) -> dict[int, Any]:
    """``layouts`` checked against a program's user outputs (their ``names`` and fake ``values``, by index, in
    ``dialect``): user output index -> dim order or ``KEEP``."""
    if layouts is None:
        return {}
    if not isinstance(layouts, Mapping):
        raise TypeError(
            f"strideguard.{function}: layouts must be a dict from an output's name or index to a layout, "
            f"got {type(layouts).__name__}"
        )
    resolved: dict[int, Any] = {}
    for key, wanted in layouts.items():
        try:
            resolved.update(_resolved(key, wanted, names, values, dialect, function, resolved))
        except (TypeError, ValueError) as refused:
            # The same problem in the command line's words, for a user who typed --layout NAME=LAYOUT.
            refused.command_line = str(refused).replace(_asked(function, key), f"--layout {key}", 1)
            raise
    return resolved


def _resolved(key, wanted, names, values, dialect, function: str, resolved: dict) -> dict[int, Any]:
    """One request of ``layouts`` checked: ``{index: dim order or KEEP}``."""
    index = _output_index(key, names, function)
    where = _asked(function, key)
    if index in resolved:
        raise ValueError(f"{where}: output {names[index]} is given a layout twice")
    value = values[index]
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{where}: output {names[index]} is not a tensor and has no layout")
    order = _dim_order(wanted, value.dim(), f"{where} (output {names[index]}, {value.dim()}-d)")
    if order != KEEP and dialect.is_edge and not copies_into(dialect, order):
        raise ValueError(
            f"{where}: dim order {list(order)} is not one an Edge program's copy ops write (contiguous, or "
            "channels-last" + (" in 4-D" if dialect is Dialect.EDGE_DIM_ORDER else "") + ")"
        )
    return {index: order}


def _asked(function: str, key: Any) -> str:
    """How every problem with one request of ``layouts`` begins (an int key's ``repr`` is its ``str``)."""
    return f"strideguard.{function}: layouts[{key!r}]"


def _output_index(key: Any, names: Sequence[str], function: str) -> int:
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise TypeError(f"strideguard.{function}: layouts keys are output names or indices, got {key!r}")
    if isinstance(key, int):
        if not 0 <= key < len(names):
            raise ValueError(f"{_asked(function, key)}: the program has {counted(len(names), 'user output')}")
        return key
    if key not in names:
        raise ValueError(
            f"{_asked(function, key)}: no output is named {key!r}; the outputs are "
            + ", ".join(names)
        )
    return names.index(key)


def _dim_order(wanted: Any, ndim: int, where: str) -> Any:
    if isinstance(wanted, str):
        try:
            wanted = parse_layout(wanted)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    if wanted == KEEP:
        return KEEP
    if isinstance(wanted, torch.memory_format):
        if wanted is torch.contiguous_format:
            return tuple(range(ndim))
        if wanted not in _FORMAT_ORDERS:
            raise ValueError(f"{where}: {wanted} is not a layout; give {KEEP!r} to leave it as the compiler lays it out")
        rank, order = _FORMAT_ORDERS[wanted]
        if rank != ndim:
            raise ValueError(f"{where}: {wanted} is a {rank}-d layout")
        return order
    if isinstance(wanted, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool) for d in wanted):
        problem = dim_order_problem([int(d) for d in wanted], ndim)
        if problem is not None:
            raise ValueError(f"{where}: dim order {list(wanted)} {problem}")
        return tuple(int(d) for d in wanted)
    raise TypeError(
        f"{where}: a layout is a torch.memory_format, one of {', '.join(FORMATS)}, {KEEP!r}, or a dim order "
        f"(a tuple of ints), got {wanted!r}"
    )

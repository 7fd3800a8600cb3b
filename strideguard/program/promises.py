"""What a program promises for each output: the layout its dialect promises, or the one the user asked.

An ATen program promises contiguous outputs; an Edge program the dim order of
each output's metadata before any conversion (``promised_dim_order``). A
layout the user asks for (``densify_outputs(layouts=...)``) is recorded on the
returned node (``LAYOUT_TAG``) and goes over either; ``KEEP`` asks strideguard
to leave an output as the compiler lays it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch
from torch.export import ExportedProgram

from . import density
from .dialect import Dialect, dialect_of
from .exported import output_values, user_outputs, UserOutput

LAYOUT_TAG = "strideguard_layout"
"""Key in a returned node's ``meta["custom"]`` (kept by ``torch.export.save`` and ExecuTorch): the layout the
user asked for each user output it is returned as, ``{"<index>": [dim order] | "keep"}``; every later
judgement of the program (``inspect``, the closed loop, ``verify``) reads its target from there."""


KEEP = "keep"
"""A requested layout: leave the output as the compiler lays it out (reported, never copied)."""


class RecordedLayoutRefused(ValueError):
    """A program records a layout request (``LAYOUT_TAG``) that ``layouts=`` and ``--layout`` would refuse: a
    file can write any value there, and a request that is not a permutation of the output's dimensions would
    make every judgement call a strided output in layout."""


def dim_order_problem(order: Any, ndim: int) -> Optional[str]:
    """Why ``order`` is not a dim order of ``ndim`` dimensions (``None`` when it is): real ints, each dimension
    once. The one check of a request, whether the user gives it or a program records it."""
    if not isinstance(order, (list, tuple)) or not all(type(d) is int for d in order):
        return "is not a dim order (a list of ints)"
    if sorted(order) != list(range(ndim)):
        return f"is not a permutation of {list(range(ndim))}"
    return None


def requested_layouts(graph: torch.fx.Graph, outputs: Sequence[UserOutput]) -> dict[int, Any]:
    """The layouts recorded in ``graph`` (``LAYOUT_TAG``) for its user ``outputs``, by user output index: a dim
    order or ``KEEP``.
    A recorded request is checked as one the user gives: anything but ``KEEP`` or a permutation of the
    output's dimensions raises ``RecordedLayoutRefused``, naming the output and the request."""
    returned = output_values(graph)
    found: dict[int, Any] = {}
    for out in outputs:
        node = returned[out.position] if out.position < len(returned) else None
        custom = node.meta.get("custom") if isinstance(node, torch.fx.Node) else None
        tags = custom.get(LAYOUT_TAG) if isinstance(custom, dict) else None
        if tags is not None and not isinstance(tags, dict):
            raise RecordedLayoutRefused(
                f"strideguard: node {node.name} records {LAYOUT_TAG} {_shown(tags)}, which is not a map from output "
                "index to layout: refused"
            )
        value = tags.get(str(out.index)) if isinstance(tags, dict) else None
        if value is None:
            continue
        if value == KEEP:
            found[out.index] = KEEP
            continue
        value_of = node.meta.get("val")
        ndim = value_of.dim() if isinstance(value_of, torch.Tensor) else None
        problem = "is asked of an output that is not a tensor" if ndim is None else dim_order_problem(value, ndim)
        if problem is not None:
            raise RecordedLayoutRefused(
                f"strideguard: user output {out.index} (node {node.name}) records the layout request {_shown(value)}, "
                f"which {problem}: refused, as layouts= and --layout refuse it"
            )
        found[out.index] = tuple(value)
    return found


def _shown(value: Any) -> str:
    """A recorded value in a message, cut to a line."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def promised_dim_order(node: torch.fx.Node) -> tuple[int, ...]:
    """The dim order an Edge program promises for ``node``: that of its metadata before any conversion.

    ``to_edge`` records each output's dim order from these strides, and the
    runtime builds the output's ETensor from it.
    """
    value = node.meta["val"]
    order = density.dim_order_of(value.shape, value.stride())
    return order if order is not None else density.identity_order(value.dim())


def target_dim_orders(program: ExportedProgram) -> tuple[Optional[tuple[int, ...]], ...]:
    """Each user output's target layout: the one the user asked for and the program records
    (``LAYOUT_TAG``), else contiguous in an ATen program and the promised dim order in an Edge one;
    ``None`` for an output that is not a tensor. An output the user asked to keep has its default target
    here (``requested_layouts`` says which those are)."""
    return held_to(program.graph, user_outputs(program.graph_signature), dialect_of(program)).target_orders


@dataclass(frozen=True)
class HeldTo:
    """What a graph's user outputs are held to, by user output index."""

    requested: Mapping[int, Any]
    """Every layout asked of an output (a dim order or ``KEEP``): those the graph records, under those asked now."""
    from_file: frozenset[int]
    """The outputs whose request only the graph records."""
    promised: tuple[Optional[tuple[int, ...]], ...]
    """The dim order the program promises for each (``None``: not a tensor), whatever is asked: contiguous in
    an ATen program, that of its metadata in an Edge one (``promised_dim_order``)."""
    target_orders: tuple[Optional[tuple[int, ...]], ...]
    """Each one's target dim order: the one requested, else the one promised."""


def held_to(
    graph: torch.fx.Graph, outputs: Sequence[UserOutput], dialect: Dialect, asked: Optional[Mapping[int, Any]] = None
) -> HeldTo:
    """What ``graph``'s user ``outputs`` are held to in ``dialect``, with the layouts ``asked`` now (by index: a dim
    order or ``KEEP``) over those the graph records (``requested_layouts``)."""
    asked = asked or {}
    recorded = requested_layouts(graph, outputs)
    requested = {**recorded, **asked}
    returned = output_values(graph)
    promised = []
    for out in outputs:
        node = returned[out.position]
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            promised.append(None)
        else:
            promised.append(promised_dim_order(node) if dialect.is_edge else tuple(range(value.dim())))
    targets = tuple(
        requested[index] if order is not None and isinstance(requested.get(index), tuple) and len(requested[index]) == len(order)
        else order
        for index, order in enumerate(promised)
    )
    return HeldTo(requested, frozenset(i for i in recorded if i not in asked), tuple(promised), targets)

"""What a pushdown saves, in FLOPs: torch's own counter for the ops it knows, one per element for the rest.

``torch.utils.flop_counter``'s registry counts GEMMs, convolutions and the
fused attention kernels from their operands' shapes (``2·M·N·K`` for a GEMM). A ``linear``
or ``matmul`` in an exported graph is counted as the ``mm``/``bmm`` it lowers
to, a ``conv2d`` as the ``convolution`` it lowers to. Any other op that computes costs one per output element, and a view (or an
Edge view copy, which the AOTI backends turn back into one) costs nothing. A
region's cost after a pushdown is the same count on the narrowed shapes:
every input narrowed as the region reads it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import torch
from torch.fx import Node
from torch.utils.flop_counter import flop_registry

from .nodes import computes, value_of
from .pieces import FULL, Narrowing
from ...program import ops
from ...program.dialect import aten_op

aten = torch.ops.aten

_TRANSPOSED_CONVOLUTIONS = frozenset({aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d})

Shape = Optional[list[int]]
"""A value's sizes as ints (a symbolic size by its hint), or ``None`` where one has none."""


def full_shape(node: Any) -> Shape:
    value = value_of(node)
    if isinstance(value, (list, tuple)):
        value = value[0] if value and isinstance(value[0], torch.Tensor) else None
    if not isinstance(value, torch.Tensor):
        return None
    sizes = [_int(size) for size in value.shape]
    return None if any(size is None for size in sizes) else sizes


def flops(node: Node, shape_of: Callable[[Any], Shape] = full_shape) -> Optional[int]:
    """``node``'s cost with every value it reads and writes at ``shape_of`` (its own shapes by default);
    ``None`` where a size is symbolic with no hint."""
    value = value_of(node)
    if isinstance(value, (list, tuple)):
        value = value[0] if value and isinstance(value[0], torch.Tensor) else None
    if not isinstance(value, torch.Tensor) or not computes(node):
        return 0
    out = shape_of(node)
    if out is None:
        return None
    op = aten_op(node.target)
    packet = getattr(op, "overloadpacket", None)
    if packet in (aten.linear, aten.matmul):
        first, second = (shape_of(argument) for argument in node.args[:2])
        if not first or not second or (packet is aten.linear and len(second) != 2):
            return None if first is None or second is None else math.prod(out)
        if packet is aten.matmul:
            return 2 * math.prod(out) * first[-1]
        rows, (columns, contracted) = math.prod(first[:-1]), second
        return flop_registry[aten.mm]([rows, contracted], [contracted, columns], out_val=out)
    if packet in ops.CONVOLUTIONS and packet not in flop_registry:
        # conv1d/2d/3d and conv_transpose*d, as the ``convolution`` they lower to
        image, weight = (shape_of(argument) for argument in node.args[:2])
        if image is None or weight is None:
            return None
        transposed = packet in _TRANSPOSED_CONVOLUTIONS
        return int(flop_registry[aten.convolution](image, weight, None, None, None, None, transposed, out_val=out))
    if packet in flop_registry:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), shape_of)
        try:
            return int(flop_registry[packet](*args, **kwargs, out_val=out))
        except (AssertionError, TypeError, ValueError):
            pass  # shapes torch's counter does not take (grouped-query attention): counted per element
    return math.prod(out)


def graph_flops(graph: torch.fx.Graph) -> Optional[int]:
    """The cost of every op in ``graph``, counted as ``flops`` does; ``None`` where a size is symbolic."""
    total = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        cost = flops(node)
        if cost is None:
            return None
        total += cost
    return total


def region_flops(
    region: Sequence[Node],
    narrowings: dict[Node, Narrowing],
    edges: dict[Node, list[tuple[Node, Optional[Narrowing]]]],
) -> tuple[Optional[int], Optional[int]]:
    """The region's cost as the graph computes it, and once each node computes only its narrowed piece
    from the narrowed inputs ``edges`` give it."""
    before = after = 0
    for node in region:
        narrowed = {source: narrowing for source, narrowing in edges[node]}
        narrowed[node] = narrowings[node]
        full, cut = flops(node), flops(node, _narrowed_shapes(narrowed))
        if full is None or cut is None:
            return None, None
        before, after = before + full, after + cut
    return before, after


def _narrowed_shapes(narrowed: dict[Node, Optional[Narrowing]]) -> Callable[[Any], Shape]:
    def shape_of(node: Any) -> Shape:
        shape = full_shape(node)
        narrowing = narrowed.get(node, FULL) if isinstance(node, Node) else FULL
        if shape is None or narrowing is FULL:
            return shape
        shape[narrowing.dim] = narrowing.length
        return shape

    return shape_of


def _int(size: Any) -> Optional[int]:
    if type(size) is int:
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return int(hint) if hint is not None else None

"""The region walk: from a returned piece, how far its narrowing moves into the producers.

A demand (a ``Narrowing`` of a value's output) moves from each node to its inputs through the ops the
rules know, latest node first. A node joins the region only when every one of its users is in the
region and wants the same narrowing of it: a value that also feeds something else is computed in full
anyway. The result is a ``Pushdown`` record; ``strideguard.fix.passes.push_pieces_into_producers`` applies it."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch.fx import Node

from .flops import region_flops
from .nodes import checks_only_its_type, computes, op_label, static_size, tensor_of
from .pieces import FULL, Narrowing, returned_piece, ReturnedPiece
from .rules import returns_a_tuple, rule_for


@dataclass(frozen=True)
class Pushdown:
    """One returned piece moved upstream: the producers recomputed on narrowed inputs, and where it stopped."""

    output: int
    """Position of the returned value in the graph's output node."""
    piece: ReturnedPiece
    region: tuple[Node, ...]
    """Producers recomputed narrowed, in graph order."""
    narrowings: tuple[tuple[Node, Narrowing], ...]
    """The narrowing of each region node's output."""
    inputs: tuple[tuple[Node, Node, Optional[Narrowing]], ...]
    """(region node, input node, narrowing of the input or ``FULL``) for every input edge of the region."""
    flops_before: Optional[int]
    flops_after: Optional[int]

    @property
    def saved(self) -> Optional[float]:
        """The fraction of the region's FLOPs the pushdown saves."""
        if not self.flops_before or self.flops_after is None:
            return None
        return 1.0 - self.flops_after / self.flops_before

    @property
    def description(self) -> str:
        names = [op_label(node) for node in reversed(self.region)]
        if len(names) == 1:
            return f"{self.piece.text} pushed into {names[0]}"
        return f"{self.piece.text} pushed through {', '.join(names[:-1])} into {names[-1]}"


def plan_pushdown(position: int, piece: ReturnedPiece, order: dict[Node, int]) -> Optional[Pushdown]:
    """How far ``piece`` moves upstream; ``None`` when no producer can be recomputed on a smaller piece.

    ``order`` is each node's position in the graph: nodes are visited latest first, so every user of a node
    has been decided before the node itself."""
    whole = Narrowing(piece.narrowing.dim, 0, static_size(tensor_of(piece.source), piece.narrowing.dim) or -1)
    if piece.narrowing == whole:
        return None
    consumers = {piece.returned, *piece.consumes}
    reader = piece.consumes[0] if piece.consumes else piece.returned
    wanted: dict[Node, list[tuple[Node, Optional[Narrowing]]]] = {piece.source: [(reader, piece.narrowing)]}
    region: list[Node] = []
    narrowings: dict[Node, Narrowing] = {}
    edges: dict[Node, list[tuple[Node, Optional[Narrowing]]]] = {}
    frontier, queued = [(-order[piece.source], piece.source)], {piece.source}
    while frontier:
        node = heapq.heappop(frontier)[1]
        wants = wanted[node]
        narrowing = wants[0][1]
        users_in_region = all(u in consumers or u in narrowings or checks_only_its_type(u) for u in node.users)
        if narrowing is FULL or not users_in_region or any(n != narrowing for _, n in wants):
            continue
        rule = rule_for(node)
        if rule is None or tensor_of(node) is None and not returns_a_tuple(node):
            continue
        if tensor_of(node) is not None and static_size(tensor_of(node), narrowing.dim) is None:
            continue
        try:
            inputs = rule(node, narrowing)
        except (IndexError, KeyError, TypeError, ValueError):
            inputs = None
        if inputs is None or _reads_one_value_two_ways(inputs):
            continue
        region.append(node)
        narrowings[node] = narrowing
        edges[node] = inputs
        for source, wanted_narrowing in inputs:
            wanted.setdefault(source, []).append((node, wanted_narrowing))
            if source not in queued:
                queued.add(source)
                heapq.heappush(frontier, (-order[source], source))
    if not any(computes(node) for node in region):
        return None
    region.sort(key=order.__getitem__)
    before, after = region_flops(region, narrowings, edges)
    if before is not None and after is not None and after >= before:
        return None
    return Pushdown(
        output=position,
        piece=piece,
        region=tuple(region),
        narrowings=tuple((node, narrowings[node]) for node in region),
        inputs=tuple((node, source, n) for node in region for source, n in edges[node]),
        flops_before=before,
        flops_after=after,
    )


def _reads_one_value_two_ways(inputs: Sequence[tuple[Node, Optional[Narrowing]]]) -> bool:
    """``mm(a, a)`` narrowed by rows reads ``a`` narrowed and whole: not rewritten."""
    seen: dict[Node, Optional[Narrowing]] = {}
    for source, narrowing in inputs:
        if seen.setdefault(source, narrowing) != narrowing:
            return True
    return False


def plan_pushdowns(graph: torch.fx.Graph) -> tuple[Pushdown, ...]:
    """A pushdown for every returned piece that can move into at least one producer."""
    found = []
    seen = set()
    order: Optional[dict[Node, int]] = None
    for position, value in enumerate(graph.output_node().args[0]):
        piece = returned_piece(value)
        if piece is None or value in seen or len(value.users) != 1:
            continue
        seen.add(value)
        if order is None:
            order = {node: index for index, node in enumerate(graph.nodes)}
        pushdown = plan_pushdown(position, piece, order)
        if pushdown is not None:
            found.append(pushdown)
    return tuple(found)

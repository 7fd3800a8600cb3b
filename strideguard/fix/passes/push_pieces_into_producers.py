"""Recompute each returned piece from pieces of its producers' inputs (``strideguard.decide.pushdown``'s plan).

For every ``Pushdown``, the region's producers are called again on narrowed
inputs, in graph order, just before the returned slice: a region input is
narrowed by the dialect's slice op (a view of a weight, never a new
parameter), a ``cat`` whose piece lies in one input stands aside for it, and a
reshape keeps its shape but for the narrowed dimension. The returned node is
rewired to the narrowed result (a select takes index 0 of its size-one
dimension), and the full-size producers, which nothing reads any more, are
removed. Each new node gets its fake value by running its op on its inputs'
values, and its original's stack trace and module stack.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import torch
from torch.fx import Node
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ...decide.pushdown import checks_only_its_type, FULL, is_identity_dropout, Narrowing, passes_through, Pushdown
from ...program import ops
from ...program.dialect import aten_op, Dialect, narrow_call, select_call
from ...program.exported import PUSHED_DOWN
from ...program.copies import COPY_TAG
from ...program.fake_values import call_on_fake_values
from ...program.promises import LAYOUT_TAG

_INHERITED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "from_node", "custom")


def push_pieces_into_producers(graph: torch.fx.Graph, pushdowns: Sequence[Pushdown], dialect: Dialect) -> list[Node]:
    """Apply every pushdown to ``graph`` in place; returns the nodes added."""
    added: list[Node] = []
    for pushdown in pushdowns:
        added += _push(graph, pushdown, dialect)
    return added


def _value(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else node


def _new_node(graph: torch.fx.Graph, target: Any, args: tuple, kwargs: dict, like: Node, why: str) -> Node:
    node = graph.call_function(target, args, kwargs)
    node.meta.update({key: like.meta[key] for key in _INHERITED_META if key in like.meta})
    # A dict of its own: the original node's ``custom`` belongs to the input program. What was asked of the
    # producer's output, or said of its copy, is not the piece's: the engine records requests on what it returns.
    inherited = {key: item for key, item in like.meta.get("custom", {}).items() if key not in (LAYOUT_TAG, COPY_TAG)}
    node.meta["custom"] = {**inherited, PUSHED_DOWN: why}
    if target is operator.getitem:
        node.meta["val"] = _value(args[0])[args[1]]
    else:
        node.meta["val"] = call_on_fake_values(aten_op(target), node, _value)
    if "tensor_meta" in like.meta and isinstance(node.meta["val"], torch.Tensor):
        node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])
    return node


def _push(graph: torch.fx.Graph, pushdown: Pushdown, dialect: Dialect) -> list[Node]:
    piece = pushdown.piece
    why = pushdown.description
    narrowings = dict(pushdown.narrowings)
    edges: dict[Node, dict[Node, Optional[Narrowing]]] = {}
    for node, source, narrowing in pushdown.inputs:
        edges.setdefault(node, {})[source] = narrowing
    new: dict[Node, Node] = {}
    slices: dict[tuple[Node, Narrowing], Node] = {}
    added: list[Node] = []

    def narrowed(source: Node, narrowing: Optional[Narrowing]) -> Node:
        if narrowing is FULL:
            return source
        if source in new:
            return new[source]
        key = (source, narrowing)
        if key not in slices:
            args = (source, narrowing.dim, narrowing.start, narrowing.end, narrowing.step)
            slices[key] = _new_node(graph, narrow_call(dialect), args, {}, piece.returned, why)
            added.append(slices[key])
        return slices[key]

    with graph.inserting_before(piece.returned):
        for node in pushdown.region:
            mapping = {source: narrowed(source, n) for source, n in edges[node].items()}
            narrowing = narrowings[node]
            if passes_through(node, narrowing):
                (new[node],) = mapping.values()
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: mapping.get(n, n))
            if ops.in_family(node.target, ops.RESHAPES):
                # Each size spelled out: a -1 is ambiguous once the piece has no elements (found by make fuzz).
                shape = list(_value(node).shape)
                shape[narrowing.dim] = narrowing.length
                args = (args[0], shape, *args[2:])
            new[node] = _new_node(graph, node.target, args, kwargs, node, why)
            added.append(new[node])
            for check in [user for user in node.users if checks_only_its_type(user)]:
                added.append(_new_node(graph, check.target, (new[node], *check.args[1:]), check.kwargs, check, why))
                graph.erase_node(check)
        result = new[piece.source]
        if piece.drops_dim:
            result = _new_node(graph, select_call(dialect), (result, piece.narrowing.dim, 0), {}, piece.returned, why)
            added.append(result)
    piece.returned.replace_all_uses_with(result)
    _remove_unread([piece.returned, *piece.consumes, *reversed(pushdown.region)], graph)
    return added


def _remove_unread(candidates: list[Node], graph: torch.fx.Graph) -> None:
    """Erase the replaced nodes, and whatever only they read, once nothing reads them. A check of a
    node's type (``_assert_tensor_metadata``) computes nothing: a node only checks read is unread, and
    its checks go with it (else a full-size ``cat`` a piece stood aside from stays, read by its check). A
    dropout outside training draws nothing: FX calls it impure, but it goes too (else a decoder's full-size
    logits stay, read by the ``dropout(p=0.0, train=False)`` a Hugging Face export keeps)."""
    pending, erased = list(candidates), set()
    while pending:
        node = pending.pop(0)
        if node in erased or node.op != "call_function":
            continue
        checks = list(node.users)
        if checks and all(checks_only_its_type(user) for user in checks):
            for check in checks:
                graph.erase_node(check)
                erased.add(check)
        if node.users or (node.is_impure() and not is_identity_dropout(node)):
            continue
        inputs = node.all_input_nodes
        graph.erase_node(node)
        erased.add(node)
        pending += inputs

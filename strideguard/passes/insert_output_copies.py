"""Insert exactly one copy for each user output that would not come back dense.

The copy goes right after the node it copies, with the op the program's
dialect accepts (``dialect.copy_call``), and the output node is rewired to it.
Each new node gets a fake value computed by running the copy op on its input's
value, the ``tensor_meta`` derived from it where the graph carries those, and
the stack trace and module stack of the output it serves, so errors and
profiles point at the user's code.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.fx import Node
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ..analysis import OutputFacts
from ..dialect import Dialect, aten_op, copy_call
from ..fake_values import call_on_fake_values

_INHERITED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "from_node", "custom")


def insert_copy(
    graph: torch.fx.Graph,
    source: Node,
    dialect: Dialect,
    dim_order: tuple[int, ...],
    value: Callable[[Node], Any],
) -> Node:
    """A new node right after ``source`` copying it into ``dim_order``, with its metadata."""
    target, kwargs = copy_call(dialect, dim_order)
    with graph.inserting_after(source):
        copy = graph.call_function(target, (source,), kwargs)
    copy.meta.update({key: source.meta[key] for key in _INHERITED_META if key in source.meta})
    copy.meta["val"] = call_on_fake_values(aten_op(target), copy, value)
    if "tensor_meta" in source.meta:
        copy.meta["tensor_meta"] = _extract_tensor_metadata(copy.meta["val"])
    return copy


def insert_output_copies(
    graph: torch.fx.Graph,
    facts: Sequence[OutputFacts],
    dialect: Dialect,
    value: Callable[[Node], Any],
) -> list[Node]:
    """Copy each output whose facts say ``Action.COPY`` and return the copy instead; returns the new nodes."""
    output_node = graph.output_node()
    returned = list(output_node.args[0])
    inserted = []
    for fact in facts:
        if fact.copied:
            copy = insert_copy(graph, returned[fact.output.position], dialect, fact.target_order, value)
            returned[fact.output.position] = copy
            inserted.append(copy)
    if inserted:
        output_node.args = (type(output_node.args[0])(returned),)
    return inserted

"""Insert exactly one copy for each user output that would not come back dense.

The copy goes right after the node it copies and the output node is rewired
to it. Its form is one Inductor keeps (``CopyForm``): Inductor's
``remove_noop_ops`` drops a ``clone`` whose traced layout equals its
source's, even where it then lays the source out otherwise, so the clone is
followed by a pair of bit-exact involutions, which Inductor computes into a
fresh buffer in the traced (target) layout; fused, it is still one kernel.
Every op is one the program's dialect accepts (``dialect.copy_call``,
``dialect.involution_call``). Each new node gets a fake value computed by
running its op on its input's value, the ``tensor_meta`` derived from it
where the graph carries those, and the stack trace and module stack of the
output it serves, so errors and profiles point at the user's code. Each new
node is tagged with its form (``program.COPY_TAG``), so the closed loop
(``strideguard.proof``) can find and strengthen it.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Optional, Sequence

import torch
from torch.fx import Node
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ..analysis import OutputFacts
from ..dialect import Dialect, copies_into, copy_call, edge_copy_order, involution_call, permute_call, value_call
from ..fake_values import call_on_fake_values, fresh_like, fresh_strided
from ..layout import strides_for_order
from ..naming import node_stem
from ..program import COPY_TAG, LAYOUT_TAG

_INHERITED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "from_node", "custom")


class CopyForm(str, Enum):
    """How an output is copied; either form is one kernel once Inductor fuses it.

    ``KEPT``, the default: a ``clone``/``_clone_dim_order`` into the target
    order, then an involution applied twice (``neg`` for floating and complex
    values, ``bitwise_not`` for integers and ``bool``: bit-exact). Inductor
    keeps it whatever layout its own trace gives the source: a clone of a
    source it traces in another layout is kept and dense; a clone of a
    source traced in the target layout is dropped as a no-op by
    ``remove_noop_ops`` (even where Inductor then realizes the source
    otherwise), and the involutions, traced in the target layout, are
    computed into a fresh dense buffer. ``CLONE`` alone is what a dtype with no
    involution gets (float8), and what the closed loop replaces when it
    does not hold.
    """

    CLONE = "clone"
    KEPT = "kept"


def copy_form_for(source_value: Any, dialect: Dialect) -> CopyForm:
    """The form Inductor keeps for a source traced as ``source_value`` (``KEPT`` wherever its dtype has an
    involution)."""
    if isinstance(source_value, torch.Tensor) and involution_call(dialect, source_value.dtype) is not None:
        return CopyForm.KEPT
    return CopyForm.CLONE


def _new_node(
    graph, after: Node, target: Any, args: tuple, kwargs: dict, origin: Node, value, form: CopyForm, name: Optional[str],
    elementwise: bool = False, dense_strides: Optional[tuple] = None,
) -> Node:
    with graph.inserting_after(after):
        # named as created: renamed after, the graph's namespace is asked twice (a tenth of a copy's cost)
        node = graph.create_node("call_function", target, args, kwargs, name=name)
    node.meta.update({key: origin.meta[key] for key in _INHERITED_META if key in origin.meta})
    if elementwise:
        node.meta["val"] = fresh_like(after.meta["val"])
        if "tensor_meta" in after.meta and "tensor_meta" in origin.meta:  # the same shape, strides and dtype
            node.meta["tensor_meta"] = after.meta["tensor_meta"]
    elif dense_strides is not None:
        node.meta["val"] = fresh_strided(after.meta["val"], tuple(after.meta["val"].shape), dense_strides)
    else:
        op, op_kwargs = value_call(target, kwargs)
        node.meta["val"] = call_on_fake_values(op, node, value, op_kwargs)
    if "tensor_meta" in origin.meta and "tensor_meta" not in node.meta:
        node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])
    # A new dict (the original's is shared with the caller's program); what the user asked of the output the
    # origin is returned as is said again on the copy that now serves it (``record_requested_layouts``).
    inherited = {key: item for key, item in origin.meta.get("custom", {}).items() if key != LAYOUT_TAG}
    node.meta["custom"] = {**inherited, COPY_TAG: form.value}
    return node


def _has_elements(shape: tuple) -> bool:
    """Every size static and non-zero: the copy's strides are then ``strides_for_order``'s (torch gives an
    empty tensor other strides in its empty dimensions)."""
    return all(type(size) is int and size > 0 for size in shape)


def insert_copy(
    graph: torch.fx.Graph,
    source: Node,
    dialect: Dialect,
    dim_order: tuple[int, ...],
    value: Callable[[Node], Any],
    form: Optional[CopyForm] = None,
    serves: Optional[str] = None,
) -> Node:
    """New nodes right after ``source`` copying it into ``dim_order`` in ``form`` (by default the form
    Inductor keeps, ``copy_form_for``); returns the last, with its metadata. ``serves``, the name of the
    output the copy is returned as, names the nodes after it (``actions_copy``, ..., ``actions_dense``),
    never after their ops."""
    form = form or copy_form_for(source.meta.get("val"), dialect)  # a view has its copy's dtype: no replay
    involution = involution_call(dialect, source.meta["val"].dtype) if form is CopyForm.KEPT else None
    dense = [(involution, (), {})] * (2 if involution is not None else 0)
    shape = tuple(source.meta["val"].shape)
    if dialect.is_edge and not copies_into(dialect, dim_order):
        same_bytes = edge_copy_order(dialect, shape, dim_order)
        if same_bytes is None:
            raise ValueError(
                f"strideguard: {serves or source.name} promises dim order {list(dim_order)}, and an Edge program's "
                "copy ops write only contiguous and channels-last orders"
            )
        dim_order = same_bytes
    if copies_into(dialect, dim_order):
        target, kwargs = copy_call(dialect, dim_order)
        copied_strides = strides_for_order(shape, dim_order)
        steps = [(target, (), kwargs)] + dense
    else:
        # An ATen program has no op copying into an order without a memory format: lay the permuted source out
        # contiguously, then permute back, a view of that fresh buffer with exactly the strides of ``dim_order``.
        inverse = [list(dim_order).index(dim) for dim in range(len(dim_order))]
        target, kwargs = copy_call(dialect, tuple(range(len(dim_order))))
        permute = permute_call(dialect)
        steps = [(permute, (list(dim_order),), {}), (target, (), kwargs)] + dense + [(permute, (inverse,), {})]
        permuted = tuple(shape[dim] for dim in dim_order)
        copied_strides = strides_for_order(permuted, tuple(range(len(dim_order))))
    stem = node_stem(serves) if serves is not None else None
    last = source
    for step, (op, args, op_kwargs) in enumerate(steps):
        name = None if stem is None else f"{stem}_dense" if step == len(steps) - 1 else f"{stem}_copy"
        # the copy's and the involutions' values are fresh dense tensors whose strides are known: no dispatch
        last = _new_node(
            graph, last, op, (last, *args), op_kwargs, source, value, form, name, elementwise=op is involution,
            dense_strides=copied_strides if op is target and _has_elements(shape) else None,
        )
    return last


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
            copy = insert_copy(
                graph, returned[fact.output.position], dialect, fact.target_order, value, serves=fact.layout.name
            )
            returned[fact.output.position] = copy
            inserted.append(copy)
    if inserted:
        output_node.args = (type(output_node.args[0])(returned),)
    return inserted

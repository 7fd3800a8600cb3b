"""The copy strideguard inserts for an output, built and recognised here and nowhere else.

Its form is one Inductor keeps (``CopyForm``). A ``clone`` alone is not
enough: Inductor's ``remove_noop_ops`` drops a ``clone`` (or ``_to_copy``,
``copy``) whose traced layout equals its source's, even where Inductor then
lays the source out otherwise. So the copy is a ``clone`` into the target
dim order (``_clone_dim_order`` in an Edge program in dim-order mode:
``dialect.copy_call``), then an elementwise op that is its own inverse bit
for bit, applied twice: ``neg`` for floating and complex values,
``bitwise_not`` for integers and ``bool``. Nothing removes the pair;
Inductor fuses clone and pair into one kernel that reads the source once and
writes a fresh buffer in the traced (target) strides; where Inductor drops the
clone as a no-op, the pair alone writes that buffer. A dtype with no
involution (float8) gets the ``clone`` alone (``CopyForm.CLONE``); where an
ATen program has no op copying into the order, the source is permuted, copied
contiguously and permuted back.

That form holds wherever the source's layout is known when Inductor removes
no-ops. Where a pass after that re-lays the source (Inductor's ``fuse_attention``
puts an attention kernel with its own layout in place of matmuls; torch 2.13 then
propagates layouts afresh and records the output's from them), the ``clone``
was already dropped and the pair follows the new layout (a conversion to a
wider dtype and back is no better: Inductor folds the pair). ``CopyForm.PINNED``
holds there too: the source's dimensions reversed, copied contiguously,
reversed back and copied into the target order. Neither copy's traced layout
is its source's, so neither is a no-op, and the last one's layout is its own
whatever its source's. It costs a second copy, so the closed loop uses it only
where the first form did not hold (``stronger_form``).

Every node of a copy carries ``COPY_TAG`` with its form, the stack trace and
module stack of the output it serves, and a name after that output
(``actions_copy``, ..., ``actions_dense``), so that a loaded program's copies
are recognised (``copy_form_of``, ``copied_source``, ``output_copies``) and the
closed loop (``strideguard.prove.proof``) can strengthen one.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Optional

import torch
from torch.fx import Node
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from .dialect import aten_op, copy_recipe, Dialect
from .fake_values import call_on_fake_values, fresh_like, fresh_strided
from .naming import node_stem
from .promises import LAYOUT_TAG

COPY_TAG = "strideguard_copy"
"""Key in ``node.meta["custom"]`` (which ``torch.export.save`` and ExecuTorch keep) on every node strideguard
inserts to copy an output; its value names the copy's form (``program.copies.CopyForm``)."""


_COPY_OPS = frozenset({"clone", "_clone_dim_order", "neg", "bitwise_not", "permute", "permute_copy"})
"""The ops a copy of any form is made of (by schema name): a tag on any other node is not strideguard's copy."""


def copy_form_of(node: Any) -> Optional[str]:
    """The form of the output copy ``node`` is part of, or ``None`` when strideguard did not insert it: the tag
    names a form, on a node that runs one of a copy's ops (a file can write the tag on any node)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    custom = node.meta.get("custom")
    form = custom.get(COPY_TAG) if isinstance(custom, dict) else None
    if form not in _FORMS:
        return None
    schema = getattr(node.target, "_schema", None)  # an Edge op carries its ATen op's schema
    return form if schema is not None and schema.name.split("::")[-1] in _COPY_OPS else None


def copied_source(node: Any) -> Optional[Any]:
    """The node an inserted copy (``COPY_TAG``) copies, walking back over all of its nodes; ``None`` when
    ``node`` is not one."""
    if copy_form_of(node) is None:
        return None
    while copy_form_of(node) is not None:
        node = node.args[0]
    return node


def output_copies(graph: torch.fx.Graph) -> list[Any]:
    """The last node of each copy strideguard inserted into ``graph`` (the node that is returned)."""
    return [
        node for node in graph.nodes
        if copy_form_of(node) is not None and not any(copy_form_of(user) is not None for user in node.users)
    ]


def _involution(dtype: torch.dtype) -> Optional[Any]:
    """An elementwise ATen op that is its own inverse, bit for bit, on ``dtype`` (``neg`` for floating and
    complex types, ``bitwise_not`` for integers and bool): applied twice, the part of the copy Inductor keeps
    (why: the module's docstring; ``dialect.copy_recipe`` spells it in the program's dialect). ``None`` for a
    dtype neither op takes.
    """
    if dtype.is_floating_point or dtype.is_complex:
        if dtype.itemsize == 1:  # float8 types have no neg kernel
            return None
        return torch.ops.aten.neg.default
    return torch.ops.aten.bitwise_not.default


def is_involution(target: Any) -> bool:
    return aten_op(target) in (torch.ops.aten.neg.default, torch.ops.aten.bitwise_not.default)


_INHERITED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "from_node", "custom")


class CopyForm(str, Enum):
    """How an output is copied; either form is one kernel once Inductor fuses it (the module's docstring
    says why).

    ``KEPT``, the default: a ``clone``/``_clone_dim_order`` into the target order, then an involution applied
    twice. ``CLONE`` alone: what a dtype with no involution gets (float8), and what the closed loop replaces
    when it does not hold.
    """

    CLONE = "clone"
    KEPT = "kept"
    PINNED = "pinned"


_FORMS = frozenset(form.value for form in CopyForm)

def stronger_form(current: Optional[str], value: torch.Tensor) -> Optional[CopyForm]:
    """The form the closed loop tries where a copy in ``current`` (a ``CopyForm`` value, ``None``: no copy) of an
    output traced as ``value`` did not hold: ``KEPT``, then ``PINNED`` where it has two dimensions to reverse;
    ``None`` when nothing stronger exists."""
    order = ([CopyForm.KEPT] if _involution(value.dtype) is not None else []) + (
        [CopyForm.PINNED] if value.dim() >= 2 else []
    )
    if current in (None, CopyForm.CLONE.value):
        return order[0] if order else None
    if current == CopyForm.KEPT.value and CopyForm.PINNED in order:
        return CopyForm.PINNED
    return None


def copy_form_for(source_value: Any, dialect: Dialect) -> CopyForm:
    """The form Inductor keeps for a source traced as ``source_value`` (``KEPT`` wherever its dtype has an
    involution)."""
    if isinstance(source_value, torch.Tensor) and _involution(source_value.dtype) is not None:
        return CopyForm.KEPT
    return CopyForm.CLONE


def _new_node(graph, after: Node, call: tuple[Any, tuple, dict], origin: Node, form: CopyForm, name: Optional[str]) -> Node:
    """One node of a copy right after ``after``, running ``call`` (target, arguments, keyword arguments), with
    the stack trace, module stack and custom metadata of ``origin`` (the node the copy serves) and its form."""
    target, args, kwargs = call
    with graph.inserting_after(after):
        # named as created: renamed after, the graph's namespace is asked twice (a tenth of a copy's cost)
        node = graph.create_node("call_function", target, args, kwargs, name=name)
    node.meta.update({key: origin.meta[key] for key in _INHERITED_META if key in origin.meta})
    # A new dict (the original's is shared with the caller's program); what the user asked of the output the
    # origin is returned as is said again on the copy that now serves it (``record_requested_layouts``).
    inherited = {key: item for key, item in origin.meta.get("custom", {}).items() if key != LAYOUT_TAG}
    node.meta["custom"] = {**inherited, COPY_TAG: form.value}
    return node


def _give_value(
    node: Node, origin: Node, value: Callable[[Node], Any], dense_strides: Optional[tuple], elementwise: bool,
    computed_as: tuple[Any, dict],
) -> None:
    """The copy node's fake value (and ``tensor_meta`` where the graph carries those): an involution's is a
    fresh tensor like its input's, a copy's with known dense strides a fresh one with those, any other the
    ATen call the recipe computes it as (``computed_as``) run on its input's value."""
    after = node.args[0]
    if elementwise:
        node.meta["val"] = fresh_like(after.meta["val"])
        if "tensor_meta" in after.meta and "tensor_meta" in origin.meta:  # the same shape, strides and dtype
            node.meta["tensor_meta"] = after.meta["tensor_meta"]
    elif dense_strides is not None:
        node.meta["val"] = fresh_strided(after.meta["val"], tuple(after.meta["val"].shape), dense_strides)
    else:
        op, op_kwargs = computed_as
        node.meta["val"] = call_on_fake_values(op, node, value, op_kwargs)
    if "tensor_meta" in origin.meta and "tensor_meta" not in node.meta:
        node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])


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
    form = form or copy_form_for(source.meta.get("val"), dialect)  # a view has its copy's dtype: no recomputation
    shape = tuple(source.meta["val"].shape)
    involution = _involution(source.meta["val"].dtype) if form is CopyForm.KEPT else None
    recipe = copy_recipe(
        dialect, shape, dim_order, involution=involution, pinned=form is CopyForm.PINNED, serves=serves or source.name
    )
    stem = node_stem(serves) if serves is not None else None
    last = source
    for step, (op, args, op_kwargs) in enumerate(recipe.steps):
        name = None if stem is None else f"{stem}_dense" if step == len(recipe.steps) - 1 else f"{stem}_copy"
        # the copy's and the involutions' values are fresh dense tensors whose strides are known: no dispatch
        last = _new_node(graph, last, (op, (last, *args), op_kwargs), source, form, name)
        dense_strides = recipe.strides if op is recipe.copy and _has_elements(shape) else None
        _give_value(last, source, value, dense_strides, op is recipe.involution, recipe.computed_as[step])
    return last

"""What AOTInductor does to an output's layout that the exported graph does not show.

Inductor traces the program again with its own decompositions, lowers it, and
its wrapper copies outputs that are views of constants. Three of those
decisions are cheap to ask of Inductor's own code, and the fast analysis
does, rather than modelling them:

* the value a node has after Inductor's decompositions (``decomposed``): a
  ``cat`` of one non-empty input becomes a ``clone`` of it in its own
  layout, an ``mm`` with a size-one dimension becomes a pointwise product,
  ``linear`` becomes ``mm`` and views;
* whether the op that finally produces it is an extern kernel, whose output
  Inductor allocates in the traced layout before any view of it is taken
  (``lowers_to_kernel_output``), or compute that Inductor may fuse into the
  output and lay out afresh;
* how a weight is lowered (``weight_lowering``): a 0-dim weight becomes a
  scalar, a small 1-D weight is inlined as computed values
  (``GraphLowering.can_inline_constant``), any other stays a constant buffer
  that the wrapper returns as ``aoti_torch_clone`` of a view.

Everything else the analysis cannot be sure of is left undecided and
copied; ``strideguard.compiler.oracle.lowering`` answers it exactly.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any, Optional

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from ...program import ops

aten = torch.ops.aten

# The default overloads only: the others (``mm.dtype``) are asked of Inductor's lowerings, as any op.
_KERNEL_OUTPUT_OPS = frozenset(packet.default for packet in ops.GEMM_KERNELS)
"""Ops Inductor lowers to an extern kernel or GEMM template writing a fixed, traced layout. Not
convolution: Inductor picks its output's layout itself (channels-last for a channels-last input), so
a view of it is laid out by Inductor's choice (found by ``make fuzz``)."""


_CHOOSES_ITS_LAYOUT = frozenset({aten.convolution.default, aten._convolution.default})


class WeightLowering(str, Enum):
    SCALAR = "scalar"
    """A 0-dim weight: Inductor folds it into the code as a number."""
    INLINED = "inlined"
    """A small 1-D weight: Inductor computes its values inline rather than reading a buffer."""
    CONSTANT = "constant"
    """A constant buffer; the wrapper returns a clone of any output that is a view of it."""


def weight_lowering(value: torch.Tensor) -> WeightLowering:
    from torch._inductor.graph import GraphLowering

    if value.dim() == 0:
        return WeightLowering.SCALAR
    if GraphLowering.can_inline_constant(value):
        return WeightLowering.INLINED
    return WeightLowering.CONSTANT


@lru_cache(maxsize=1)
def _decomposition_table() -> dict:
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


@dataclass(frozen=True)
class Decomposed:
    """A node's strides after Inductor's decompositions, and the op that finally produces it."""

    strides: tuple
    producer: Any
    """The op writing the memory the value lives in (views stripped); ``None`` for an input."""


def decomposes(op: torch._ops.OpOverload) -> bool:
    """Whether Inductor's trace replaces ``op`` by others: its own table, or a composite op's definition."""
    return op in _decomposition_table() or op._can_decompose()


def decomposed(op: Any, args: tuple, kwargs: dict) -> Optional[Decomposed]:
    """Run ``op`` on fake ``args`` through Inductor's decomposition table; ``None`` if it cannot be traced.

    The trace follows Inductor's own table recursively, so the result has
    the strides Inductor's graph gives the node. A trace depends only on the
    op, the arguments' shapes, strides and dtypes and the other arguments, so
    for static shapes it is traced once and remembered (a model repeats its
    blocks).
    """
    key = _list_call_key(op, args, kwargs)
    if key is not None and key in _TRACES:
        return _TRACES[key]
    flat, spec = pytree.tree_flatten((args, kwargs))
    key = key or _trace_key(op, flat, spec)
    if key is not None and key in _TRACES:
        return _TRACES[key]
    found = _decomposed(op, flat, spec)
    if key is not None and found is not None:
        _TRACES[key] = found
    return found


_TRACES: dict = {}


def _list_call_key(op: Any, args: tuple, kwargs: dict) -> Optional[tuple]:
    """The key of a call shaped ``op([tensors], *scalars)`` (a concatenation, as a graph spells it), built
    without flattening: one per ``cat`` of a model, so it is most of what a plan spends on them."""
    if kwargs or not args or not isinstance(args[0], (list, tuple)):
        return None
    items = _described(list(args[0]) + list(args[1:]))
    return None if items is None else (op, ("list", len(args[0]), len(args) - 1), items)


def _trace_key(op: Any, flat: list, spec: Any) -> Optional[tuple]:
    items = _described(flat)
    return None if items is None else (op, str(spec), items)


def _described(flat: list) -> Optional[tuple]:
    items = []
    for item in flat:
        if isinstance(item, torch.Tensor):
            shape, strides, offset = tuple(item.shape), item.stride(), item.storage_offset()
            if type(offset) is not int or not all(type(v) is int for v in shape) or not all(type(v) is int for v in strides):
                return None
            items.append((shape, strides, offset, item.dtype, item.device.type))
        elif isinstance(item, (int, float, bool, str, type(None), torch.dtype, torch.memory_format, torch.device)):
            items.append((type(item), item))
        else:
            return None
    return tuple(items)


def _decomposed(op: Any, flat: list, spec: Any) -> Optional[Decomposed]:
    positions = [i for i, item in enumerate(flat) if isinstance(item, torch.Tensor)]

    def call(*tensors):
        items = list(flat)
        for position, tensor in zip(positions, tensors):
            items[position] = tensor
        call_args, call_kwargs = pytree.tree_unflatten(items, spec)
        return op(*call_args, **call_kwargs)

    try:
        traced = make_fx(call, decomposition_table=_decomposition_table(), tracing_mode="real")(
            *[flat[i] for i in positions]
        )
    except Exception:  # noqa: BLE001 - an op make_fx cannot trace is simply not decided here
        return None
    returned = pytree.tree_leaves(traced.graph.output_node().args)
    if not returned or not isinstance(returned[0], torch.fx.Node):
        return None
    node = returned[0]
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    return Decomposed(tuple(value.stride()), _producer(node))


def _producer(node: torch.fx.Node) -> Any:
    while node.op == "call_function":
        target = node.target
        if target is operator.getitem or (isinstance(target, torch._ops.OpOverload) and target.is_view):
            node = node.args[0]
            continue
        return target
    return None


def concat_may_go_channels_last(inputs: list[torch.Tensor]) -> bool:
    """Whether Inductor's concatenation kernel may lay its result out channels-last: it does when an input
    is channels-last contiguous (``ConcatKernel.create``, asked through Inductor's own
    ``Layout.is_channels_last_contiguous``). The result's significant strides are then matched to the
    traced ones, its size-one dimensions' are not."""
    from torch._inductor.ir import Layout

    for value in inputs:
        if value.dim() in (4, 5) and all(type(v) is int for v in (*value.shape, *value.stride())):
            try:
                if Layout.is_channels_last_contiguous(list(value.shape), list(value.stride())):
                    return True
            except Exception:  # noqa: BLE001 - an odd shape Inductor's helper rejects is not channels-last
                continue
    return False


def lowers_to_kernel_output(op: Any) -> bool:
    """Whether Inductor writes ``op``'s result into a buffer laid out as traced, never fused away.

    True for GEMM kernels and for ops Inductor runs as a fallback (an ATen
    kernel called from the compiled code). False for convolution: Inductor
    picks its output's layout itself (channels-last for a channels-last input).
    """
    from torch._inductor import lowering

    if not isinstance(op, torch._ops.OpOverload):
        return False
    if op in _KERNEL_OUTPUT_OPS:
        return True
    if op in _CHOOSES_ITS_LAYOUT:
        return False
    registered = lowering.lowerings.get(op)
    if registered is not None:
        # Not ``op in lowering.fallbacks``: a lowering may add its own op to that set when it falls back for
        # one input (``cat`` of uint8 tensors on the CPU does), and the set then outlives that compile.
        return bool(getattr(registered, "_is_fallback_handler", False))
    return op not in _decomposition_table()


class HeldView(str, Enum):
    """How Inductor's lowering holds a view of a buffer while it lowers the graph (``torch._inductor.ir``).

    Most view lowerings take the view of what their input holds (``x.data``); ``diagonal``, ``unfold`` and a
    same-width ``view(dtype)`` wrap their input whole. A view wrapped around a view that is not plain strides
    over a buffer can no longer be unwrapped to its storage, so Inductor returns it as a copy
    (``require_stride_order`` on an output: dense, in the order of the traced strides).
    """

    STORED = "stored"
    """A buffer, or plain strides over one (``ReinterpretView``)."""
    WRAPPED = "wrapped"
    """A view whose index is composed over a stored value (``GenericView`` of a buffer)."""
    SEALED = "sealed"
    """A view wrapped around a wrapped view: returned, it is copied."""


_WRAP_ANY_INPUT = frozenset({aten.diagonal, aten.unfold})
"""Lowered as ``GenericView.create(input, ...)`` whatever the input holds."""

_VIEW_OF_WHAT_IT_HOLDS = frozenset(
    {
        aten.slice, aten.select, aten.narrow, aten.permute, aten.transpose, aten.t, aten.expand,
        aten.unsqueeze, aten.squeeze, aten.split, aten.split_with_sizes, aten.unbind, aten.view,
        aten._unsafe_view, aten.reshape, aten.alias, aten.detach, aten.movedim,
    }
)
"""Lowered as a view of ``x.data`` (or decomposed into such views): the input's hold is kept."""


def may_seal(op: Any) -> bool:
    """Whether ``op`` is one that wraps its input whole, so that a chain without one is never sealed."""
    return isinstance(op, torch._ops.OpOverload) and (op.overloadpacket in _WRAP_ANY_INPUT or op is aten.view.dtype)


def held_after(held: HeldView, op: Any, source: torch.Tensor, result: torch.Tensor) -> Optional[HeldView]:
    """How Inductor holds ``op``'s view of a value held as ``held``; ``None`` where this is not known."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    packet = op.overloadpacket
    if packet in _WRAP_ANY_INPUT:
        return HeldView.WRAPPED if held is HeldView.STORED else HeldView.SEALED
    if op is aten.view.dtype:
        if source.dtype.itemsize != result.dtype.itemsize:
            return None  # a fallback kernel's contiguous copy
        return HeldView.STORED if held is HeldView.STORED else HeldView.SEALED
    if packet is aten.as_strided:
        # Taken over the storage the input's views unwrap to, unless that is itself sealed away.
        return None if held is HeldView.SEALED else HeldView.STORED
    if packet in _VIEW_OF_WHAT_IT_HOLDS:
        return held
    return None


def copy_in_traced_order(shape: tuple, strides: tuple) -> Optional[tuple]:
    """The strides of Inductor's copy of a sealed view (``require_stride_order`` of the traced strides), by
    Inductor's own ``get_stride_order`` and ``FlexibleLayout.stride_ordered``; ``None`` where a size or a
    stride is symbolic."""
    from torch._inductor import ir

    if not all(type(value) is int for value in (*shape, *strides)):
        return None
    order = ir.get_stride_order(list(strides))
    return tuple(int(stride) for stride in ir.FlexibleLayout.stride_ordered(list(shape), order))

"""The families of ops strideguard decides by, each named once.

Several analyses ask the same question of a node ("is this a concatenation?",
"a GEMM?"). Spelled as strings at each place, the answers drifted apart, and a
misspelled key matched nothing without a word. Here a family is a set of
``OpOverloadPacket`` objects: a misspelling fails on import, every overload of
an op and its Edge form answer alike, and each site reads its family by name.
A site that depends on one overload (``to.dtype`` but not ``to.other``) keys
on that ``OpOverload`` object itself.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

import torch

from .dialect import aten_op

aten = torch.ops.aten


def packet_of(target: Any) -> Optional[torch._ops.OpOverloadPacket]:
    """The op behind a node's target, all overloads together; the same for an Edge op and the ATen op it
    wraps. ``None`` for a target that is not an op overload (``getitem``, a higher-order operator)."""
    try:
        return _remembered_packet(target)
    except TypeError:  # an unhashable target
        return _packet(target)


def _packet(target: Any) -> Optional[torch._ops.OpOverloadPacket]:
    op = aten_op(target)
    return op.overloadpacket if isinstance(op, torch._ops.OpOverload) else None


_remembered_packet = lru_cache(maxsize=None)(_packet)


def in_family(target: Any, family: frozenset) -> bool:
    return packet_of(target) in family


CONCATENATIONS = frozenset({aten.cat, aten.concat, aten.concatenate, aten.stack})
"""Ops joining tensors along a dimension; Inductor decomposes each to ``cat``, or to a ``clone`` of the one
non-empty input."""

GEMMS = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.linear, aten.matmul})
"""Matrix products as a graph spells them, before Inductor decomposes ``linear`` and ``matmul``."""

GEMM_KERNELS = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._int_mm})
"""Matrix products Inductor lowers to an extern kernel or a GEMM template (``linear`` and ``matmul`` are
decomposed into these first)."""

CONVOLUTIONS = frozenset({
    aten.convolution, aten._convolution, aten.conv1d, aten.conv2d, aten.conv3d,
    aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d,
})

RESHAPES = frozenset({aten.view, aten.view_copy, aten.reshape, aten._unsafe_view})

PERMUTES = frozenset({aten.permute, aten.permute_copy})
TRANSPOSES = frozenset({aten.transpose, aten.transpose_copy})
MATRIX_TRANSPOSES = frozenset({aten.t, aten.t_copy})
"""``t``: the first and last dimensions swapped, whatever the rank."""
UNSQUEEZES = frozenset({aten.unsqueeze, aten.unsqueeze_copy})

SLICES = frozenset({aten.slice, aten.slice_copy})
SELECTS = frozenset({aten.select, aten.select_copy})
NARROWS = frozenset({aten.narrow, aten.narrow_copy})
SPLITS = frozenset({aten.split, aten.split_copy, aten.split_with_sizes, aten.split_with_sizes_copy, aten.chunk})
UNBINDS = frozenset({aten.unbind, aten.unbind_copy})

ALIASES = frozenset({aten.alias, aten.alias_copy, aten.detach, aten.detach_copy})
"""The input itself (or its copy in Edge), under another name."""

DROPOUTS = frozenset({aten.dropout, aten.native_dropout})
"""Seeded: FX counts them impure, yet outside training (``train=False``) each is the identity."""

MEMORY_FORMAT_COPIES = frozenset({aten.clone, aten._to_copy})
"""Copies told their layout by a ``memory_format`` argument."""

_DIM_ORDER_COPY_NAMES = ("_clone_dim_order", "_to_dim_order_copy")
_dim_order_copies: Optional[frozenset] = None


def dim_order_copies() -> frozenset:
    """ExecuTorch's copies told their layout by a ``dim_order`` argument.

    ExecuTorch registers them when it is imported, which this module never
    does: empty until then, and a graph holding one means they are there.
    """
    global _dim_order_copies
    # Remembered only once found: ExecuTorch may be imported after the first question.
    if _dim_order_copies is None:
        namespace = torch.ops.dim_order_ops
        try:
            found = frozenset(getattr(namespace, name) for name in _DIM_ORDER_COPY_NAMES)
        except AttributeError:
            return frozenset()
        _dim_order_copies = found
    return _dim_order_copies


def op_name(target: Any) -> Optional[str]:
    """The op's name without namespace or overload, for messages (``slice_copy`` for ``aten.slice_copy.Tensor``);
    decisions ask the families above."""
    op = aten_op(target)
    schema = getattr(op, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else None


@lru_cache(maxsize=None)
def is_view_op(target: Any) -> bool:
    op = aten_op(target)
    return isinstance(op, torch._ops.OpOverload) and op.is_view


def is_higher_order(target: Any) -> bool:
    return isinstance(target, torch._ops.HigherOrderOperator)

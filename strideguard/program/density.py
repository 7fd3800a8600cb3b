"""Whether strides are dense in a dim order, answered honestly for symbolic shapes.

Every predicate answers ``True``, ``False`` or ``None``: ``None`` when the sizes
or strides are symbolic and the answer depends on values export did not fix.
They never add guards: they ask ``statically_known_true`` and nothing else, so
a dynamic batch dimension is judged for every size it may take.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Optional

import torch
from torch._prims_common import make_contiguous_strides_for
from torch.fx.experimental.symbolic_shapes import statically_known_true

Known = Optional[bool]
"""``True``/``False`` when known for every size the program admits, ``None`` where symbolic sizes leave it open."""

Size = int | torch.SymInt


def _known(condition) -> bool:
    return condition if type(condition) is bool else statically_known_true(condition)


def _all(answers) -> Known:
    answers = list(answers)
    if any(d is False for d in answers):
        return False
    if any(d is None for d in answers):
        return None
    return True


def identity_order(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim))


def has_layout(shape: Sequence[Size], strides: Sequence[Size], dim_order: Sequence[int]) -> Known:
    """Whether ``strides`` are exactly the strides a runtime derives from ``dim_order``.

    ExecuTorch builds each output's ETensor strides from its dim order and its
    CUDA runtime compares a delegate's output strides with them literally, size-one
    dimensions included: ``[1, 512]`` with strides ``(4096, 1)`` is contiguous
    to torch but not laid out like its ETensor ``(512, 1)``. Only a tensor with
    no elements, which has no bytes to lay out, is exempt.
    """
    return _dense_in_order(shape, strides, dim_order, literal=True)


def is_dense_in_order(shape: Sequence[Size], strides: Sequence[Size], dim_order: Sequence[int]) -> Known:
    """Whether the elements are dense in ``dim_order``, as torch judges it.

    Size-one dimensions may carry any stride and a tensor of fewer than two
    elements is dense in every order, as in ``TensorImpl::compute_contiguous``.
    """
    return _dense_in_order(shape, strides, dim_order, literal=False)


def _dense_in_order(shape, strides, dim_order, *, literal: bool) -> Known:
    if any(_known(size == 0) for size in shape) or (not literal and _known(_numel(shape) < 2)):
        return True
    expected: Size = 1
    verdicts: list[Known] = []
    for dim in reversed(tuple(dim_order)):
        size, stride = shape[dim], strides[dim]
        if not literal and _known(size == 1):
            continue
        if _known(stride == expected):
            verdicts.append(True)
        elif _known(stride != expected) and (literal or _known(size != 1)):
            verdicts.append(False)
        else:
            verdicts.append(None)
        expected = expected * size
    return _all(verdicts)


def same_sizes(first: Sequence[Size], second: Sequence[Size]) -> bool:
    """Whether two size or stride tuples are provably equal, without adding a guard."""
    if len(first) != len(second):
        return False
    for a, b in zip(first, second):  # a loop, not all() of a generator: asked tens of thousands of times a plan
        if type(a) is int and type(b) is int:
            if a != b:
                return False
        elif not _known(a == b):
            return False
    return True


def has_size_one_dim(shape: Sequence[Size]) -> bool:
    """Whether some dimension provably has size one (whose stride Inductor and ExecuTorch treat differently)."""
    return any(same_sizes((size,), (1,)) for size in shape)


def same_order(shape: Sequence[Size], first: Sequence[Size], second: Sequence[Size]) -> bool:
    """Whether two stride tuples of one shape order every pair of dimensions alike (greater, equal or
    smaller), provably; the layout an elementwise op gives its result depends on nothing else."""
    if len(first) != len(second) or len(first) != len(shape):
        return False
    try:
        return _pairwise_order(tuple(first)) == _pairwise_order(tuple(second))
    except (_Symbolic, TypeError):  # a symbolic stride: unhashable, or not static
        pass

    def relation(strides, i, j) -> Optional[int]:
        a, b = strides[i], strides[j]
        for sign, holds in ((1, a > b), (0, a == b), (-1, a < b)):
            if _known(holds):
                return sign
        return None

    for i in range(len(shape)):
        for j in range(i + 1, len(shape)):
            r = relation(first, i, j)
            if r is None or r != relation(second, i, j):
                return False
    return True


def is_contiguous(shape: Sequence[Size], strides: Sequence[Size]) -> Known:
    return is_dense_in_order(shape, strides, identity_order(len(shape)))


def is_non_overlapping_and_dense(shape: Sequence[Size], strides: Sequence[Size]) -> Known:
    """Whether some order of the dimensions makes the strides dense.

    The candidate order sorts dimensions by decreasing stride; when strides are
    symbolic and cannot be ordered, the answer is ``None``.
    """
    order = dim_order_of(shape, strides)
    if order is None:
        return None
    return is_dense_in_order(shape, strides, order)


def dim_order_of(shape: Sequence[Size], strides: Sequence[Size]) -> Optional[tuple[int, ...]]:
    """The dim order (outermost first) implied by strides, ties kept in dimension order.

    This is the order ExecuTorch writes for a tensor: stable sort by decreasing
    stride. ``None`` when symbolic strides cannot be compared.
    """
    if len(strides) == len(shape):
        try:
            return _order_of_static_strides(tuple(strides))
        except (_Symbolic, TypeError):  # a symbolic stride: unhashable, or not static
            pass
    dims = list(range(len(shape)))
    try:
        concrete = [_concrete(s) for s in strides]
    except _Symbolic:
        if all(_known(a >= b) for a, b in zip(strides, strides[1:])):
            return tuple(dims)
        return None
    return tuple(sorted(dims, key=lambda d: -concrete[d]))


@lru_cache(maxsize=4096)
def _pairwise_order(strides: tuple[int, ...]) -> tuple[int, ...]:
    """How each pair of static strides compares (1 greater, 0 equal, -1 smaller), remembered."""
    if not all(type(s) is int for s in strides):
        raise _Symbolic
    return tuple(
        (a > b) - (a < b) for i, a in enumerate(strides) for b in strides[i + 1:]
    )


@lru_cache(maxsize=4096)
def _order_of_static_strides(strides: tuple[int, ...]) -> tuple[int, ...]:
    """Remembered: a model asks it of the same few stride tuples thousands of times per plan."""
    if not all(type(s) is int for s in strides):
        raise _Symbolic
    return tuple(sorted(range(len(strides)), key=lambda d: -strides[d]))


class _Symbolic(Exception):
    pass


def _concrete(value: Size) -> int:
    if isinstance(value, int):
        return value
    as_int = value.node.maybe_as_int()
    if as_int is None:
        raise _Symbolic
    return as_int


def _numel(shape: Sequence[Size]) -> Size:
    numel: Size = 1
    for size in shape:
        numel = numel * size
    return numel


def strides_for_order(shape: Sequence[Size], dim_order: Sequence[int]) -> tuple[Size, ...]:
    """Dense strides for ``shape`` laid out in ``dim_order`` (outermost first)."""
    permuted = [shape[d] for d in dim_order]
    permuted_strides = make_contiguous_strides_for(permuted) if permuted else ()
    strides: list[Size] = [1] * len(shape)
    for position, dim in enumerate(dim_order):
        strides[dim] = permuted_strides[position]
    return tuple(strides)


def preserve_format_strides(value: torch.Tensor) -> tuple[Size, ...]:
    """Strides of ``clone()`` (``preserve_format``) of ``value``, as torch's own clone gives them.

    AOTInductor's wrapper returns a view of a constant as ``aoti_torch_clone``
    of it: ``at::clone``, which keeps a dense view's strides and lays out
    another in an order it infers.
    """
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode([value])
    if fake_mode is None:
        value = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return tuple(value.clone().stride())
    with fake_mode:
        return tuple(value.clone().stride())


def format_strides(strides: Sequence[Size]) -> tuple:
    """Strides as JSON-friendly values: ints where known, expressions as strings."""
    out = []
    for s in strides:
        try:
            out.append(_concrete(s))
        except _Symbolic:
            out.append(str(s))
    return tuple(out)


def first_wrong_stride(shape: Sequence[Size], strides: Sequence[Size], dim_order: Sequence[int]) -> Optional[str]:
    """Why ``strides`` are provably not those of ``dim_order``, in one phrase: ``stride 6144 for dim 0 of size 1
    where 512 is promised`` (the outermost such dimension, and how many more there are); ``None`` when
    ``has_layout`` is not ``False``."""
    if has_layout(shape, strides, dim_order) is not False:
        return None
    expected = strides_for_order(shape, dim_order)
    wrong = [dim for dim in dim_order if _known(strides[dim] != expected[dim])]
    if not wrong:
        return None
    dim = wrong[0]
    shown = format_strides((strides[dim], expected[dim], shape[dim]))
    more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
    return f"stride {shown[0]} for dim {dim} of size {shown[2]} where {shown[1]} is promised{more}"

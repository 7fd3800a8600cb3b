"""Running ops on the fake tensors of a graph, and telling their memories apart."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx import Node
from torch.utils import _pytree as pytree

from .dialect import view_twin


def call_on_fake_values(op: Any, node: Node, value: Callable[[Node], Any], kwargs: Optional[dict] = None) -> Any:
    """Run ``op`` on the fake values of ``node``'s arguments (its keyword arguments, or ``kwargs``): the value
    ``node`` would have.

    A view copy (``slice_copy``) runs as its view and a contiguous clone: its own kernel asks for a storage
    offset, which a fake tensor with symbolic sizes has not.
    """
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs if kwargs is None else kwargs), value)
    fake_mode = detect_fake_mode([a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)])
    view = view_twin(op) if isinstance(op, torch._ops.OpOverload) and torch.Tag.view_copy in op.tags else None
    with fake_mode or contextlib.nullcontext():
        if view is not None:
            viewed = view(*args, **kwargs)
            if isinstance(viewed, (list, tuple)):  # unbind_copy, split_copy: each piece its own contiguous copy
                return [piece.clone(memory_format=torch.contiguous_format) for piece in viewed]
            return viewed.clone(memory_format=torch.contiguous_format)
        result = op(*args, **kwargs)
        if isinstance(op, torch._ops.OpOverload) and op.is_view and args and isinstance(args[0], torch.Tensor):
            return _on_base_storage(_rerooted(result, args[0]), args[0])
        return result


def _rerooted(result: Any, base: torch.Tensor) -> Any:
    """A view of a view as one view of their memory's first tensor (``_base``), with the same geometry.

    A fake tensor (a tensor subclass) keeps with each view the chain of every
    view function back to that tensor, so a chain of n views held n**2 of them:
    4,000 chained slices took 1.65 GB in torch alone. Re-rooted, each view holds
    one (``tests/test_bounded.py`` inspects 8,000).
    """
    if isinstance(result, (list, tuple)):
        return type(result)(_rerooted(piece, base) for piece in result)
    if not isinstance(result, torch.Tensor) or base._base is None or result._base is None:
        return result
    root = memory_root(result)
    if root is result:
        return result
    try:
        return torch.ops.aten.as_strided.default(root, result.shape, result.stride(), result.storage_offset())
    except (RuntimeError, ValueError, TypeError):
        return result


def memory_root(view: torch.Tensor) -> torch.Tensor:
    """The tensor a view's geometry can be laid on again with ``as_strided``: the first tensor of its memory
    (``_base``) where that reads the memory as the view's own dtype, else the view itself.

    A view's strides and offset count its own elements. A view that reads its memory as another dtype
    (``view_as_real``, ``view_as_complex``, ``view(dtype)``) laid on its base would get the base's dtype and
    element size: ``view_as_real(z).transpose(0, 1)`` rebuilt over complex ``z`` asked for twice the memory
    there is ("setStorage ... out of bounds"), and a ``view_as_complex`` came back as float32."""
    base = view._base
    return base if base is not None and base.dtype == view.dtype else view


def _on_base_storage(result: Any, base: torch.Tensor) -> Any:
    """A view op's result as a view of ``base``'s memory, as eager gives it, where the fake kernel gave an
    empty view a memory of its own: found by ``make fuzz``, a ``view`` of a zero-element fake tensor got a
    fresh storage on FakeTensorMode's first dispatch and the base's on a cached one, so two analyses of one
    program disagreed on what the output is a view of."""
    if not isinstance(result, torch.Tensor) or result.dtype != base.dtype or not statically_known_true(result.numel() == 0):
        return result
    if not statically_known_true(base.untyped_storage().nbytes() == 0) or storage_key(result) == storage_key(base):
        return result
    return base.as_strided(result.shape, result.stride(), result.storage_offset())


def fresh_like(value: torch.Tensor) -> torch.Tensor:
    """A new fake tensor with ``value``'s shape, strides, offset, dtype and device, in memory of its own: what
    an elementwise op on a dense tensor gives, without a dispatch (a third of a copy's cost when three were
    dispatched). Static sizes only build it directly; anything else is dispatched."""
    return fresh_strided(value, tuple(value.shape), tuple(value.stride()))


def fresh_strided(like: torch.Tensor, shape: tuple, strides: tuple) -> torch.Tensor:
    """A new fake tensor of ``shape`` and ``strides`` with ``like``'s dtype and device, in memory of its own:
    what a copy into a dense layout gives, without a dispatch where every size is static."""
    fake_mode = like.fake_mode if isinstance(like, FakeTensor) else detect_fake_mode([like])
    if fake_mode is None or not all(type(v) is int for v in (*shape, *strides)):
        with fake_mode or contextlib.nullcontext():
            return torch.empty_strided(shape, strides, dtype=like.dtype, device=like.device)
    meta = torch.empty_strided(shape, strides, dtype=like.dtype, device="meta")
    return FakeTensor(fake_mode, meta, like.device)  # as ``view_of_memory``: no converter bookkeeping


def view_of_memory(memory: torch.Tensor, shape: tuple, strides: tuple, offset: Any) -> torch.Tensor:
    """A view of ``memory``'s storage with this geometry: what ``as_strided`` gives.

    For a fake tensor of static layout and a static geometry, its meta kernel's result made a fake tensor
    by ``FakeTensor``'s own constructor: no fake dispatch, and none of the converter's bookkeeping for
    tensors it was handed from outside (a fresh meta tensor is never looked up again). 24 against 110 us
    a view; linear in the views of one memory while the collector is held off, as a plan holds it
    (``fix.engine.program_plan``, ``tests/test_bounded.py``). Anything else is dispatched."""
    if isinstance(memory, FakeTensor) and _static(shape, strides, offset) and _static_memory(memory):
        with torch._C._DisableTorchDispatch():
            meta = torch.ops.aten.as_strided.default(memory, shape, strides, offset)
        return FakeTensor(memory.fake_mode, meta, memory.device)
    with detect_fake_mode([memory]) or contextlib.nullcontext():
        return torch.ops.aten.as_strided.default(memory, shape, strides, offset)


def _static(*groups: Any) -> bool:
    return all(type(v) is int for group in groups for v in (group if isinstance(group, (tuple, list, torch.Size)) else (group,)))


def _static_memory(memory: torch.Tensor) -> bool:
    """Whether the meta kernel reads only plain integers of ``memory``: its sizes, strides, offset and its
    storage's size. Anything symbolic it would guard on, specializing the program (found by the tests: a
    view of a batch-``s77`` input made ``s77`` 2), or refuse."""
    # the sizes policy first: a tensor whose layout torch keeps symbolic may still show plain integers here
    # (found by ``make fuzz``: a batch-dynamic channels-last input with an empty dimension)
    if memory._has_symbolic_sizes_strides or not _static(memory.shape, memory.stride()):
        return False
    try:
        return _static(memory.storage_offset(), memory.untyped_storage().nbytes())
    except RuntimeError:  # a tensor whose layout policy is symbolic refuses to give its offset
        return False


def storage_key(value: Any) -> Optional[int]:
    """Identity of the memory behind a fake or real tensor (of the first, for a list of views).

    The address of its ``StorageImpl``, as ``StorageWeakRef`` uses; the program
    holds every one of these tensors alive while the analysis runs.
    """
    if isinstance(value, (list, tuple)):
        value = next((v for v in value if isinstance(v, torch.Tensor)), None)
    if isinstance(value, torch.Tensor):
        return value.untyped_storage()._cdata
    return None

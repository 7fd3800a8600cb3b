"""Inductor's lowering for a device this machine lacks: every private torch entry point it touches, in one place.

Inductor's CUDA lowering needs no GPU up to the point where every output's
layout is fixed (``GraphLowering.output``): it traces fake tensors. What it
does need is answers a CUDA runtime would give, asked in a few private
places. This module gives them, for the duration of one lowering, in the
thread that lowers only (every other thread sees torch as it was: each
patched name answers by the calling thread), one lowering at a time (a lock:
the others wait), undone whatever interrupts them (``patched``); nowhere else
in strideguard is a private torch entry point of the CUDA lowering touched:

* ``torch.cuda.get_device_properties``/``get_device_capability``/
  ``is_bf16_supported``/``device_count``/``current_device`` and the same on
  Dynamo's ``CudaInterface``, which captured them at import: a device of the
  target's compute capability (``torch.cuda.is_available`` stays ``False``,
  or AOTAutograd would save CUDA random-number state);
* ``torch._inductor.runtime.hints.DeviceProperties.create``, asked afresh
  (past its cache) in the lowering thread, so no other compile sees the
  assumed device nor the lowering another's;
* ``fx_passes.misc_patterns._misc_patterns_init``, which traces example
  patterns with real tensors on the input's device: traced on the CPU (the
  patterns do not depend on it);
* ``scheduler.has_triton``: the scheduler refuses a GPU without a working
  Triton before it reaches the pre-fusion hook where the layouts are read;
* ``graph.is_same_tensor``: Inductor dedupes constants by data pointer, which
  is 0 for every fake tensor; compared by storage instead;
* ``torch._C._get_sdp_priority_order``: the SDPA kernel priority a user's
  ``sdpa_kernel(..., set_priority=True)`` sets, for the kernel choice
  (``strideguard.compiler.oracle.attention_kernels``);
* ``FakeTensor.item``/``tolist``: Inductor inlines small constants by their
  values; the fake device tensor answers with its real CPU values (zeros for
  a constant made while tracing: values never reach a layout);
* ``FakeTensor.__getitem__``: Python indexing takes a device guard of the
  tensor's device in C++, which a CPU build of torch has none of for CUDA;
  Inductor's replacements index (``pad_mm`` slices its padded result back:
  ``res[:, :-n]``), so a fake device tensor indexed by ints, slices, ``None``
  and ``...`` is answered by the same ``select``/``slice``/``unsqueeze`` ops
  the C++ path records (any other index goes to torch as before);
* ``pad_mm``'s on-device benchmark and what its compute-bound test reads of
  the device (``benchmark_answers``; why: ``strideguard.compiler.oracle.padded_matmuls``);
* ``fuse_attention._scaled_dot_product_attention``, the SDPA Inductor's own
  patterns insert (``inserted_attention``);
* ``torch._C._conv_determine_backend_memory_format``, on a build of torch
  without cuDNN, whose fake CUDA convolution would answer for its slow
  fallback kernel (``convolution_formats``).

Three options change how it is compiled, each per call: the uniform-value
constant folder builds real tensors on the device, so it is off
(``joint_graph_constant_folding``; it only turns a constant-valued
computation into a ``full``); the FX graph cache is off, as for the CPU; one
compile thread (``compile_threads``), since ``compile_fx`` wakes its pool of
compile workers for any CUDA input, and a lowering compiles nothing (the pool
cost 4.5 s and 430 MB a call, and outlived it).

Where a GPU of the target's capability is present, nothing is patched: the
same fake tensors are lowered with the real device's answers.

``CHECKED_ON`` lists the torch versions these patches were checked on; any
other raises ``LoweringUnavailable`` naming the version, and the fix falls
back to copying, reported.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
from torch.fx import GraphModule

from ..targets import LoweringUnavailable, Target

CHECKED_ON = ("2.13", "2.14", "2.15")
"""torch versions (major.minor) whose CUDA lowering ran here with these patches (torch 2.13.0 CPU build with
Triton 3.7.1; torch 2.14.1 and 2.15.0 CUDA builds, no GPU, with Triton 3.8.0 and 3.9.0): every private entry
point above exists in each, with the same signature (read in their sources; the suite runs on each)."""

OPTIONS = {"joint_graph_constant_folding": False, "compile_threads": 1}
"""Inductor options for a lowering on fake device tensors (see the module's docstring)."""

_LOCK = threading.RLock()
"""One lowering at a time in the process (``one_lowering``): the patches below, and the program's fake mode that
a lowering enters, are process-wide state; a second caller waits."""


@contextlib.contextmanager
def one_lowering() -> Iterator[None]:
    """Hold the process's one lowering slot for a whole lowering, whatever its target."""
    with _LOCK:
        yield


def require_supported(target: Target) -> None:
    """Raise ``LoweringUnavailable`` where the lowering for ``target`` cannot run here."""
    if target.is_cpu:
        return
    if target.kind == "mps":
        raise LoweringUnavailable(
            "strideguard: Inductor's MPS lowering is not run without an Apple GPU (its Metal kernels' "
            "layouts are not modelled); outputs are copied"
        )
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if not target.present and version not in CHECKED_ON:
        raise LoweringUnavailable(
            f"strideguard: the CUDA lowering without a GPU was checked on torch {', '.join(CHECKED_ON)}, "
            f"not {torch.__version__}; outputs are copied"
        )


class _Properties:
    """What ``torch.cuda.get_device_properties`` says of an H100-class device, with the target's capability."""

    def __init__(self, capability: tuple[int, int]):
        self.major, self.minor = capability
        self.name = f"strideguard's assumed sm{self.major}{self.minor} device"
        self.multi_processor_count = 132 if capability >= (9, 0) else 16 if capability == (8, 7) else 108
        self.total_memory = 80 * 2**30
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048
        self.max_threads_per_block = 1024
        self.regs_per_multiprocessor = 65536
        self.shared_memory_per_block = 48 * 1024
        self.shared_memory_per_block_optin = 227 * 1024 if capability >= (9, 0) else 163 * 1024
        self.shared_memory_per_multiprocessor = 228 * 1024 if capability >= (9, 0) else 164 * 1024
        self.L2_cache_size = 50 * 2**20
        self.gcnArchName = self.name
        self.uuid = "00000000-0000-0000-0000-000000000000"
        self.is_integrated = capability == (8, 7)


@contextlib.contextmanager
def lowering_for(target: Target) -> Iterator[None]:
    """Patch what Inductor's lowering for ``target`` asks of a device that is not here, for one lowering, in
    the calling thread only (``_for_this_thread``); one lowering at a time (the others wait)."""
    require_supported(target)
    if target.is_cpu or target.present:
        yield
        return
    with _LOCK, patched(_patches(target)):
        yield


class _Patch:
    """``obj.name`` answered by ``replacement`` in the thread that applies it, as before in every other."""

    def __init__(self, obj: Any, name: str, replacement: Any):
        self.obj, self.name, self.replacement = obj, name, replacement


_THIS_THREAD = threading.local()


def _owned(patch: _Patch) -> bool:
    return patch in getattr(_THIS_THREAD, "patches", ())


def _dispatcher(patch: _Patch, original: Any) -> Any:
    """What ``obj.name`` is while patched: the replacement in the thread that patched, the original elsewhere
    (a static or class method stays one)."""
    kind = type(original) if isinstance(original, (staticmethod, classmethod)) else None
    before = original.__func__ if kind is not None else original
    after = patch.replacement.__func__ if isinstance(patch.replacement, (staticmethod, classmethod)) else patch.replacement

    def answer(*args, **kwargs):
        return (after if _owned(patch) else before)(*args, **kwargs)

    return kind(answer) if kind is not None else answer


@contextlib.contextmanager
def patched(patches: list) -> Iterator[None]:
    """Apply ``patches`` (``_Patch``) for the calling thread, and undo them whatever interrupts: each original is
    recorded before it is replaced and put back in a ``finally`` of this frame, not by a context manager that
    may not have registered its exit; no dispatch mode entered meanwhile is left on this thread's stack."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    depth = len(_get_current_dispatch_mode_stack())
    applied: list = []
    mine = getattr(_THIS_THREAD, "patches", None)
    if mine is None:
        mine = _THIS_THREAD.patches = set()
    try:
        for patch in patches:
            original = inspect.getattr_static(patch.obj, patch.name)
            applied.append((patch, original))
            mine.add(patch)
            setattr(patch.obj, patch.name, _dispatcher(patch, original))
        yield
    finally:
        try:
            _undo(applied, mine, depth)
        finally:  # an interrupt during the first undo: undone again (each step is idempotent)
            _undo(applied, mine, depth)


def _undo(applied: list, mine: set, depth: int) -> None:
    """Every original put back, in C (``setattr`` mapped over the list: no Python line runs between two, where
    an interrupt could land), then this thread's claim on the patches dropped and its dispatch modes left."""
    restored = list(reversed(applied))
    collections.deque(map(setattr, [p.obj for p, _ in restored], [p.name for p, _ in restored],
                          [original for _, original in restored]), maxlen=0)
    mine.difference_update(patch for patch, _ in restored)
    _leave_dispatch_modes(depth)


def _leave_dispatch_modes(depth: int) -> None:
    """Exit the dispatch modes above ``depth`` on this thread's stack (an interrupt between a mode's entry and
    the ``with`` that would exit it leaves one there, and every later op in the thread would be faked)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode

    while len(_get_current_dispatch_mode_stack()) > depth:
        mode = _get_current_dispatch_mode_stack()[-1]
        try:
            mode.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - a mode that cannot exit cleanly is popped as it is
            _pop_mode(getattr(mode, "_mode_key", None))
        if _get_current_dispatch_mode_stack()[-1:] == [mode]:
            _pop_mode(getattr(mode, "_mode_key", None))


def _patches(target: Target) -> list:
    from torch._dynamo.device_interface import CudaInterface
    from torch._inductor import graph as inductor_graph
    from torch._inductor import scheduler
    from torch._inductor.fx_passes import misc_patterns
    from torch._subclasses.fake_tensor import FakeTensor

    properties = _Properties(target.capability)
    capability = target.capability
    answers = {
        "get_device_properties": lambda *args, **kwargs: properties,
        "get_device_capability": lambda *args, **kwargs: capability,
        "is_bf16_supported": lambda *args, **kwargs: capability >= (8, 0),
        "device_count": lambda *args, **kwargs: 1,
        "current_device": lambda *args, **kwargs: 0,
    }
    interface = {
        **{name: answers[name] for name in ("get_device_properties", "is_bf16_supported", "device_count", "current_device")},
        "get_compute_capability": lambda *args, **kwargs: capability[0] * 10 + capability[1],
        "is_triton_capable": lambda *args, **kwargs: True,
    }
    patterns_init = misc_patterns._misc_patterns_init
    from torch._inductor.runtime.hints import DeviceProperties

    uncached = inspect.getattr_static(DeviceProperties, "create").__func__
    uncached = getattr(uncached, "__wrapped__", uncached)
    return [
        *(_Patch(torch.cuda, name, answer) for name, answer in answers.items()),
        *(_Patch(CudaInterface, name, staticmethod(answer)) for name, answer in interface.items()),
        # Inductor remembers a device's properties; in this thread they are the assumed device's, asked afresh.
        _Patch(DeviceProperties, "create", classmethod(uncached)),
        _Patch(misc_patterns, "_misc_patterns_init", lambda input_device=None: patterns_init(torch.device("cpu"))),
        _Patch(scheduler, "has_triton", lambda *args, **kwargs: True),
        _Patch(inductor_graph, "is_same_tensor", _same_fake_tensor),
        _Patch(FakeTensor, "tolist", _real_values("tolist", FakeTensor.tolist)),
        _Patch(FakeTensor, "item", _real_values("item", FakeTensor.item)),
        _Patch(FakeTensor, "__getitem__", _basic_indexing(FakeTensor.__getitem__)),
    ]


def sdp_priority_order() -> list[int]:
    """The order in which torch tries SDPA kernels (``SDPBackend`` numbers), as ``sdpa_kernel(...,
    set_priority=True)`` leaves it: read by ``strideguard.compiler.oracle.attention_kernels``."""
    return list(torch._C._get_sdp_priority_order())


def _same_fake_tensor(data: torch.Tensor, value: torch.Tensor) -> bool:
    from torch.multiprocessing.reductions import StorageWeakRef

    return (
        data.size() == value.size()
        and data.stride() == value.stride()
        and data.dtype == value.dtype
        and data.device == value.device
        and data.storage_offset() == value.storage_offset()
        and StorageWeakRef(data.untyped_storage()) == StorageWeakRef(value.untyped_storage())
    )


_REAL_VALUES_KEY = "_strideguard_real_values"


def _real_values(method: str, original):
    """``item``/``tolist`` of a fake device tensor: its real values where it was made from a weight, and
    zeros of its dtype for a constant made while tracing (Inductor inlines it into code, which is never
    generated here: the values do not reach any layout)."""

    def answer(self, *args, **kwargs):
        real = getattr(self, _REAL_VALUES_KEY, None)
        if real is not None:
            return getattr(real, method)(*args, **kwargs)
        if self.device.type == "cpu" or self.dim() > 1 or self.numel() > 8:
            return original(self, *args, **kwargs)
        return getattr(torch.zeros(self.shape, dtype=self.dtype), method)(*args, **kwargs)

    return answer


LEAST_BALANCED = {
    (9, 0): ("H200", 989.0, 67.0, 494.0, 4900.0),
    (10, 0): ("B200", 2250.0, 80.0, 1100.0, 8000.0),
}
"""Per compute capability, the device whose matmuls are compute-bound soonest (the lowest peak throughput per
byte of memory bandwidth, NVIDIA's data sheets, dense): its name, dense 16-bit, float32 and TF32 tensor TFLOPS,
and DRAM GB/s (GH200's 4.9 TB/s for sm90)."""

MARGIN = 2.0
"""The machine balance assumed is the least balanced device's divided by this: Inductor reads a device's figures
through Triton's estimates, which need not match its data sheet."""


@contextlib.contextmanager
def benchmark_answers(target: Target, pad: bool, found: list) -> Iterator[None]:
    """For one lowering for ``target``: ``pad_mm``'s on-device benchmark answers ``pad`` for every matmul that
    reaches it, each appended to ``found`` as a ``PadDecision``. Everything before the benchmark is Inductor's
    own; nothing is read from or written to its on-disk caches. The CPU gets nothing (``pad_mm`` never pads
    there)."""
    if target.is_cpu:
        yield
        return
    from torch._inductor import utils as inductor_utils
    from torch._inductor.fx_passes import pad_mm

    from . import padded_matmuls

    should_pad = getattr(pad_mm._should_pad, "__wrapped__", pad_mm._should_pad)  # past its persistent memoizer
    asked: list[bool] = []

    def benchmark_answer(key):
        asked.append(True)
        return pad

    def answered_should_pad(match, mat1, mat2, op, input=None):
        before = len(asked)
        result = should_pad(match, mat1, mat2, op, input)
        if len(asked) > before:
            shapes = tuple(tuple(t.shape) for t in (input, mat1, mat2) if t is not None)
            found.append(padded_matmuls.PadDecision(getattr(op, "__name__", str(op)), shapes, mat1.dtype))
        return result

    patches = [
        _Patch(pad_mm, "_should_pad", answered_should_pad),
        _Patch(pad_mm, "get_cached_should_pad", benchmark_answer),
    ]
    if not target.present:
        # A device of the target's kind has Triton; without the device, the figures its test reads are assumed.
        patches.append(_Patch(pad_mm, "has_triton", lambda *args, **kwargs: True))
        figures = _Figures(target.capability)
        patches += [
            _Patch(inductor_utils, "get_device_tflops", figures.tflops),
            _Patch(inductor_utils, "get_gpu_dram_gbps", figures.dram_gbps),
        ]
    with patched(patches):
        yield


class _UnknownFigures(RuntimeError):
    """Raised where Inductor asks a figure of a device whose figures strideguard does not know: Inductor's
    compute-bound test then answers "compute-bound", as it does when it cannot read them itself."""


@dataclass(frozen=True)
class _Figures:
    capability: Optional[tuple[int, int]]

    def tflops(self, dtype: torch.dtype) -> float:
        known = LEAST_BALANCED.get(self.capability)
        if known is None:
            raise _UnknownFigures(f"no figures for sm{self.capability}")
        _, half, single, tf32, _ = known
        if dtype in (torch.float16, torch.bfloat16):
            return half
        precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
        uses_tf32 = precision == "tf32" if precision is not None else torch.backends.cuda.matmul.allow_tf32
        return tf32 if uses_tf32 else single

    def dram_gbps(self) -> float:
        known = LEAST_BALANCED.get(self.capability)
        if known is None:
            raise _UnknownFigures(f"no figures for sm{self.capability}")
        return known[-1] * MARGIN


@contextlib.contextmanager
def convolution_formats(target: Target, channels_last: bool, found: list) -> Iterator[None]:
    """For one lowering for ``target`` on a build of torch without cuDNN: a CUDA convolution whose input or
    weight is laid out channels-last gets the memory format ``channels_last`` says (each appended to
    ``found``). The fake convolution asks ``_conv_determine_backend_memory_format``, which a build without
    cuDNN answers for its slow fallback kernel (contiguous), where a CUDA build asks cuDNN (channels-last, for
    every cuDNN torch supports). Both are lowered where it matters, as every undecided choice is; a build
    with cuDNN, or a device present, answers itself."""
    if target.kind != "cuda" or target.present or torch.backends.cudnn.is_available():
        yield
        return
    from torch._prims_common import suggest_memory_format

    original = torch._C._conv_determine_backend_memory_format

    def determine(input_, weight, backend):
        laid_out = {suggest_memory_format(t) for t in (input_, weight) if t.dim() in (4, 5)}
        relaid = laid_out & {torch.channels_last, torch.channels_last_3d}
        if input_.device.type != "cuda" or not relaid:
            return original(input_, weight, backend)
        found.append(tuple(input_.shape))
        return next(iter(relaid)) if channels_last else original(input_, weight, backend)

    from torch._subclasses.fake_tensor import FakeTensorMode

    # Fake tensors remember an op's result by its inputs' metadata, across modes: a convolution answered
    # otherwise before must be asked again, and what is answered here must not be remembered after.
    FakeTensorMode.cache_clear()
    try:
        with patched([_Patch(torch._C, "_conv_determine_backend_memory_format", determine)]):
            yield
    finally:
        FakeTensorMode.cache_clear()


@contextlib.contextmanager
def inserted_attention(target: Target, attention: Any) -> Iterator[None]:
    """For one lowering for ``target`` without its device: the SDPA Inductor's ``fuse_attention`` patterns put
    in place of an attention written out as matmuls and a softmax runs ``attention`` (the kernel CUDA would
    choose, ``compiler.oracle.attention_kernels.inserted_kernels``), where the composite on a build without CUDA
    kernels takes the math path whatever the device. A device present chooses itself."""
    if target.kind != "cuda" or target.present:
        yield
        return
    from torch._inductor.fx_passes import fuse_attention

    with patched([_Patch(fuse_attention, "_scaled_dot_product_attention", attention)]):
        yield


def is_mm_compute_bound(m: int, k: int, n: int, dtype: torch.dtype, target: Target) -> bool:
    """Inductor's ``pad_mm.is_mm_compute_bound`` for ``target``, with the figures ``benchmark_answers`` assumes."""
    from torch._inductor.fx_passes import pad_mm

    with lowering_for(target), benchmark_answers(target, False, []):
        return bool(pad_mm.is_mm_compute_bound(m, k, n, dtype))


def pad_alignment(dtype: torch.dtype) -> int:
    """The multiple ``pad_mm`` pads a matmul's sizes of ``dtype`` to (0: never)."""
    from torch._inductor.fx_passes import pad_mm

    return pad_mm.get_alignment_size_dtype(dtype)


def _basic_indexing(original):
    """``tensor[index]`` of a fake tensor on a device this build of torch has no guard for, spelled with the ops
    torch's own indexing records for ints, slices, ``None`` and ``...``; any other index goes to ``original``."""
    aten = torch.ops.aten

    def getitem(self, index):
        items = index if isinstance(index, tuple) else (index,)
        basic = all(item is None or item is Ellipsis or isinstance(item, slice) or (type(item) is int) for item in items)
        if self.device.type == "cpu" or not basic or sum(item is Ellipsis for item in items) > 1:
            return original(self, index)
        indexing = sum(item is not None and item is not Ellipsis for item in items)
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items = items[:at] + (slice(None),) * (self.dim() - indexing) + items[at + 1:]
        result, dim = self, 0
        for item in items:
            if item is None:
                result = aten.unsqueeze.default(result, dim)
                dim += 1
            elif isinstance(item, slice):
                if item != slice(None):
                    result = aten.slice.Tensor(result, dim, item.start, item.stop, 1 if item.step is None else item.step)
                dim += 1
            else:
                result = aten.select.int(result, dim, item)
        return result

    return getitem


def on_target(module: GraphModule, target: Target, fake_mode: Optional[Any]) -> tuple[GraphModule, tuple]:
    """``module`` (a private copy: changed in place) with every tensor on ``target``'s device as a fake tensor
    of ``fake_mode``: its placeholders' values, its weights, buffers and constants, and every ``device=``
    argument in its graph (a CPU device named there means the program's one device). Returns it and its fake inputs. No weight is copied: a weight becomes metadata."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = fake_mode or FakeTensorMode(shape_env=ShapeEnv())
    device = target.torch_device
    bases: dict = {}

    def fake_input(value: torch.Tensor) -> torch.Tensor:
        with fake_mode:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)

    def fake_weight(value: torch.Tensor) -> torch.Tensor:
        # Weights sharing storage (tied, or views of one another) share a fake storage, as Inductor dedupes them.
        from torch.multiprocessing.reductions import StorageWeakRef

        key = StorageWeakRef(value.untyped_storage()) if not isinstance(value, torch._subclasses.FakeTensor) else id(value)
        base = bases.get(key)
        if base is None or base.dtype != value.dtype:
            storage_numel = max(value.untyped_storage().nbytes() // max(value.element_size(), 1), 1)
            with fake_mode:
                base = torch.empty(storage_numel, dtype=value.dtype, device=device)
            bases[key] = base
        with fake_mode:
            result = base.as_strided(value.shape, value.stride(), value.storage_offset())
        if value.dim() <= 1 and value.numel() <= 8:
            setattr(result, _REAL_VALUES_KEY, value.detach())
        return result

    for node in module.graph.find_nodes(op="get_attr"):
        owner, _, leaf = node.target.rpartition(".")
        holder = module.get_submodule(owner) if owner else module
        value = getattr(holder, leaf, None)
        if isinstance(value, torch.Tensor):
            replaced = fake_weight(value)
            if isinstance(value, torch.nn.Parameter):
                replaced = torch.nn.Parameter(replaced, requires_grad=False)
            if leaf in holder._parameters:
                holder._parameters[leaf] = replaced
            elif leaf in holder._buffers:
                holder._buffers[leaf] = replaced
            else:
                setattr(holder, leaf, replaced)
    inputs = []
    for node in module.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            node.meta["val"] = fake_input(value)
        inputs.append(node.meta.get("val"))
    def on_device(argument):
        return device if isinstance(argument, torch.device) and argument.type == "cpu" else argument

    for node in module.graph.nodes:
        if node.op == "call_function":
            node.args = torch.fx.node.map_aggregate(node.args, on_device)
            node.kwargs = torch.fx.node.map_aggregate(node.kwargs, on_device)
    module.recompile()
    return module, tuple(inputs)

"""Which attention kernel CUDA runs for each ``scaled_dot_product_attention``, by torch's own rules.

``scaled_dot_product_attention`` is a composite: on CUDA it asks
``select_sdp_backend`` (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``)
for flash, efficient (memory-efficient) or cuDNN attention, or the math
fallback, and the kernel it gets decides the output's layout: efficient
attention returns ``(B, M, H, K)``-ordered memory, flash and cuDNN the query's
layout, math a contiguous tensor, and flash pads a head dimension that is not
a multiple of 8 and slices the result back (a strided view). The choice is
made in C++ from the dtype, head dimensions, mask, GQA, causality and the
device's compute capability; a torch without CUDA kernels (a CPU build)
always takes math for a fake CUDA tensor, and a CUDA build without a GPU
cannot ask. So where no GPU is present, strideguard follows those rules here
(torch 2.13's, checked against its headers; ``docs/how-it-works.md``) and
rewrites each SDPA node, on a private copy, into the composite's calls for
the kernel chosen; Inductor then lays the output out from that kernel's own
meta function, as for a real compile.

A rule this machine cannot decide is not guessed: cuDNN goes first on sm90
and sm100 only with a runtime cuDNN of 9.15.1 or newer, its head-dimension
limit depends on the cuDNN version too, and a symbolic size may or may not
meet a condition. Each such node keeps every kernel it could get
(``KernelChoice.candidates``); the lowering runs once per candidate
(``scenarios``) and an output whose layout differs between them is undecided
and copied in the form that holds whichever CUDA picks.

The backends a user enables or prioritises with
``torch.nn.attention.sdpa_kernel`` (or ``torch.backends.cuda.enable_*_sdp``)
while strideguard lowers are followed, as torch follows them when it compiles.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.symbolic_shapes import guard_or_true, statically_known_true

from ...program.dialect import GraphOps
from .fake_device import sdp_priority_order
from ..targets import Target

FLASH, EFFICIENT, MATH, CUDNN = "flash", "efficient", "math", "cudnn"
_BY_ENUM = {1: FLASH, 2: EFFICIENT, 0: MATH, 3: CUDNN}
"""``SDPBackend``'s numbers, as ``compiler.oracle.fake_device.sdp_priority_order`` gives them."""

aten = torch.ops.aten

_TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
"""The rules here are torch 2.13's (``sdp_utils.cpp`` read at its branch cut, checked against its headers).
torch 2.14's headers add two things, followed where it is installed: efficient attention takes grouped and
multi-query attention (``check_batch_size_and_num_heads_dense<..., supports_mqa>``), and unbatched 3-D inputs
get a batch dimension before a fused kernel (``normalize_unbatched_input``; which kernels do is not in its
headers, so such inputs are undecided between math and the fused kernels)."""


@dataclass(frozen=True)
class KernelChoice:
    """The kernels CUDA may run for one SDPA node: one where the rules decide, several where they do not."""

    node: str
    candidates: tuple[str, ...]
    undecided: Optional[str] = None
    """Why there is more than one candidate."""

    def __str__(self) -> str:
        return f"{self.node}: {' or '.join(self.candidates)}" + (f" ({self.undecided})" if self.undecided else "")


def _sdpa_nodes(ops_of_graph: GraphOps) -> list[Node]:
    return [node for node, op in ops_of_graph.aten.items() if op is aten.scaled_dot_product_attention.default]


def choices(ops_of_graph: GraphOps, target: Target) -> list[KernelChoice]:
    """The kernel choice for each SDPA node of a graph (``ops_of_graph``: its ops), lowered for ``target``
    (none for a device present: torch asks it itself)."""
    if target.kind != "cuda" or target.present:
        return []
    return [_choice(node, target) for node in _sdpa_nodes(ops_of_graph)]


def laid_out_by_kernel(ops_of_graph: GraphOps, target: Target) -> dict[str, str]:
    """SDPA nodes whose output layout the device's kernel choice decides, by name, with what decides it:
    for the graph alone (no lowering; ``ops_of_graph``, its ops), every one on CUDA."""
    if target.kind != "cuda":
        return {}
    return {node.name: f"the attention kernel CUDA picks ({target.sm})" for node in _sdpa_nodes(ops_of_graph)}


def scenarios(found: list[KernelChoice]) -> list[dict[str, str]]:
    """Assignments of a kernel to every SDPA node such that each candidate of each node is lowered at least
    once: the first assignment takes each node's first candidate."""
    if not found:
        return [{}]
    width = max(len(choice.candidates) for choice in found)
    return [
        {choice.node: choice.candidates[min(index, len(choice.candidates) - 1)] for choice in found}
        for index in range(width)
    ]


def with_kernels(module: GraphModule, scenario: dict[str, str], device: torch.device) -> GraphModule:
    """A new module over ``module``'s weights whose SDPA nodes call the kernels ``scenario`` names, as
    torch's composite calls them on CUDA."""
    if not scenario:
        return module
    import copy

    graph = copy.deepcopy(module.graph)
    for node in list(graph.nodes):
        if node.name in scenario:  # the SDPA nodes' names (``choices``), the same in the copy
            _rewrite(graph, node, scenario[node.name], device)
    rewritten = GraphModule(module, graph)
    for attribute in ("_in_spec", "_out_spec"):
        if hasattr(module, attribute):
            setattr(rewritten, attribute, getattr(module, attribute))
    rewritten.meta.update(module.meta)
    return rewritten


@dataclass(frozen=True)
class _Call:
    query: Any
    key: Any
    value: Any
    mask: Any
    dropout: float
    is_causal: bool
    scale: Optional[float]
    enable_gqa: bool


def _call_of(node: Node) -> _Call:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    defaults = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False}
    bound = {**defaults, **dict(zip(names, node.args)), **{k: v for k, v in node.kwargs.items() if k in names}}
    return _Call(
        bound["query"], bound["key"], bound["value"], bound["attn_mask"], float(bound["dropout_p"]),
        bool(bound["is_causal"]), node.kwargs.get("scale"), bool(node.kwargs.get("enable_gqa", False)),
    )


def _val(argument: Any) -> Any:
    return argument.meta.get("val") if isinstance(argument, Node) else argument


def _known(condition) -> Optional[bool]:
    """A size condition as True, False, or None where symbolic sizes leave it open."""
    if isinstance(condition, bool):
        return condition
    if statically_known_true(condition):
        return True
    if not guard_or_true(condition):
        return False
    return None


def _all(*conditions: Optional[bool]) -> Optional[bool]:
    if any(c is False for c in conditions):
        return False
    return None if any(c is None for c in conditions) else True


def _choice(node: Node, target: Target) -> KernelChoice:
    return _choice_of_call(node.name, _call_of(node), target)


def _choice_of_call(name: str, call: _Call, target: Target) -> KernelChoice:
    q, k, v, mask = (_val(call.query), _val(call.key), _val(call.value), _val(call.mask))
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return KernelChoice(name, (MATH,))
    why = []
    unbatched = _TORCH >= (2, 14) and q.dim() == k.dim() == v.dim() == 3
    if unbatched:
        q, k, v, mask = (_batched(t) for t in (q, k, v, mask))
        why.append(f"torch {torch.__version__} may give unbatched inputs a batch dimension for a fused kernel")
    checks = _Checks(q, k, v, mask, call, target)
    enabled = {
        FLASH: torch.backends.cuda.flash_sdp_enabled(),
        EFFICIENT: torch.backends.cuda.mem_efficient_sdp_enabled(),
        MATH: torch.backends.cuda.math_sdp_enabled(),
        CUDNN: torch.backends.cuda.cudnn_sdp_enabled(),
    }
    order = [_BY_ENUM[number] for number in sdp_priority_order() if number in _BY_ENUM]
    orders = [order]
    preference = _cudnn_preferred(target.capability)
    if preference is None and order[:4] == [FLASH, EFFICIENT, MATH, CUDNN]:
        # torch puts cuDNN first, once per process, on sm90/sm100 with a runtime cuDNN of 9.15.1 or newer.
        orders.append([CUDNN, FLASH, EFFICIENT, MATH])
        why.append(f"cuDNN attention goes first on {target.sm} only with cuDNN 9.15.1 or newer at compile time")
    candidates: list[str] = []
    for priority in orders:
        for backend in priority:
            if not enabled[backend]:
                continue
            usable = True if backend == MATH else checks.usable(backend)
            if usable is False:
                continue
            if backend not in candidates:
                candidates.append(backend)
            if usable is True:
                break
            why.append(checks.open_reason(backend))
    if unbatched and enabled[MATH] and MATH not in candidates:
        candidates.append(MATH)
    if not candidates:
        refusals = [checks.refusal(backend) for backend in enabled if enabled[backend]]
        raise RuntimeError(
            f"strideguard: no SDPA kernel CUDA could run for {name} with the backends enabled "
            f"({', '.join(backend for backend in enabled if enabled[backend]) or 'none'}): " + "; ".join(refusals)
        )
    return KernelChoice(name, tuple(candidates), "; ".join(dict.fromkeys(w for w in why if w)) if len(candidates) > 1 else None)


def _cudnn_preferred(capability: tuple[int, int]) -> Optional[bool]:
    """Whether torch moves cuDNN attention first (``check_prefer_cudnn_attention``): ``None`` where it
    depends on the cuDNN installed where the program is compiled."""
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").lower() in ("1", "true", "on", "yes"):
        return False
    if capability[0] not in (9, 10):
        return False
    return None


class _Checks:
    """``can_use_flash_attention``, ``can_use_mem_efficient_attention``, ``can_use_cudnn_attention`` for
    dense inputs at inference, each answering True, False, or None where it cannot be decided here."""

    def __init__(self, q, k, v, mask, call: _Call, target: Target):
        self.q, self.k, self.v, self.mask, self.call = q, k, v, mask, call
        self.capability, self.sm = target.capability, target.sm
        self.open: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        """Why a backend cannot run, where a check said so for one reason: what the error says when none can."""

    def usable(self, backend: str) -> Optional[bool]:
        return {FLASH: self.flash, EFFICIENT: self.efficient, CUDNN: self.cudnn}[backend]()

    def open_reason(self, backend: str) -> str:
        return self.open.get(backend, "")

    def refusal(self, backend: str) -> str:
        return self.refused.get(backend, f"{backend} attention's conditions on these sizes and strides do not hold")

    def _refuse(self, backend: str, why: str) -> bool:
        self.refused[backend] = why
        return False

    def _sm(self, low: tuple[int, int], high: tuple[int, int]) -> bool:
        return low <= self.capability <= high

    def _common(self, *, ignore_singleton_head: bool) -> Optional[bool]:
        q, k, v, mask = self.q, self.k, self.v, self.mask
        if not (q.dim() == k.dim() == v.dim() == 4) or any(t.is_nested for t in (q, k, v)):
            return False
        if not (q.dtype == k.dtype == v.dtype):
            return False
        last_stride_one = _all(*(_known(t.stride(-1) == 1) for t in (q, k, v)))
        if ignore_singleton_head and _known(q.size(-1) == 1) is True:
            last_stride_one = True
        mask_stride = True if mask is None else _known(mask.stride(-1) == 1)
        return _all(
            _known(q.size(2) != 0), _known(k.size(2) != 0), last_stride_one, mask_stride,
            _known(q.size(0) == k.size(0)), _known(k.size(0) == v.size(0)),
        )

    def _heads(self, *, gqa: bool, same_kv_heads: bool = True, mqa: bool = False) -> Optional[bool]:
        q, k, v = self.q, self.k, self.v
        if self.call.enable_gqa and gqa:
            return _all(
                _known(k.size(1) == v.size(1)) if same_kv_heads else True,
                _known(q.size(1) % k.size(1) == 0),
                _known(q.size(1) % v.size(1) == 0),
            )
        same = _all(_known(q.size(1) == k.size(1)), _known(k.size(1) == v.size(1)))
        if mqa and same is not True:
            # One key and value head broadcast to every query head, without enable_gqa.
            single = _all(_known(k.size(1) == 1), _known(v.size(1) == 1))
            return True if single is True else None if None in (same, single) else False
        return same

    def flash(self) -> Optional[bool]:
        q, k, v = self.q, self.k, self.v
        if self.mask is not None:
            return self._refuse(FLASH, "flash attention takes no attention mask")
        if not self._sm((8, 0), (12, 1)):
            return self._refuse(FLASH, f"flash attention needs sm80 to sm121, not {self.sm}")
        if q.dtype not in (torch.float16, torch.bfloat16):
            return self._refuse(FLASH, f"flash attention takes float16 or bfloat16, not {str(q.dtype).removeprefix('torch.')}")
        causal = _known(q.size(2) == k.size(2)) if self.call.is_causal else True
        head = _all(_known(q.size(-1) == k.size(-1)), _known(k.size(-1) == v.size(-1)), _known(q.size(-1) <= 256))
        result = _all(self._common(ignore_singleton_head=True), self._heads(gqa=True), causal, head)
        if result is None:
            self.open[FLASH] = "symbolic sizes leave flash attention's conditions open"
        return result

    def efficient(self) -> Optional[bool]:
        q, k, v = self.q, self.k, self.v
        if not self._sm((5, 0), (12, 1)):
            return self._refuse(EFFICIENT, f"memory-efficient attention needs sm50 to sm121, not {self.sm}")
        allowed = (torch.float16, torch.float32) + ((torch.bfloat16,) if self.capability >= (8, 0) else ())
        if q.dtype not in allowed:
            return self._refuse(EFFICIENT, f"memory-efficient attention takes {', '.join(str(d).removeprefix('torch.') for d in allowed)} here")
        alignment = _gemm_alignment(q.dtype, self.capability)
        head = _all(
            _known(q.size(-1) == k.size(-1)), _known(q.size(-1) % alignment == 0), _known(v.size(-1) % alignment == 0),
            _known(q.size(-1) > 0), _known(v.size(-1) > 0),
        )
        offsets = True
        if self.capability >= (8, 0):
            offsets = _all(*(_known(t.storage_offset() % alignment == 0) for t in (q, k, v) if isinstance(t.storage_offset(), int)))
        result = _all(self._common(ignore_singleton_head=False), self._heads(gqa=_TORCH >= (2, 14), mqa=_TORCH >= (2, 14)), head, offsets)
        if result is None:
            self.open[EFFICIENT] = "symbolic sizes leave efficient attention's conditions open"
        return result

    def cudnn(self) -> Optional[bool]:
        q, k, v, mask = self.q, self.k, self.v, self.mask
        if not self._sm((8, 0), (12, 1)):
            return self._refuse(CUDNN, f"cuDNN attention needs sm80 to sm121, not {self.sm}")
        if q.dtype not in (torch.float16, torch.bfloat16):
            return self._refuse(CUDNN, f"cuDNN attention takes float16 or bfloat16, not {str(q.dtype).removeprefix('torch.')}")
        if torch.are_deterministic_algorithms_enabled():
            return False
        if self.call.dropout and (self.call.dropout * 16) % 1:
            return False
        mask_shape = True
        if mask is not None:
            if mask.dim() not in (2, 4):
                return False
            sizes = [(mask.size(-2), q.size(2)), (mask.size(-1), k.size(2))]
            if mask.dim() == 4:
                sizes += [(mask.size(0), q.size(0)), (mask.size(1), q.size(1))]
            mask_shape = _all(*(True if _known(got == 1) is True else _known(got == want) for got, want in sizes))
        head_multiple = _all(_known(q.size(-1) % 8 == 0), _known(v.size(-1) % 8 == 0))
        within_128 = _all(_known(q.size(-1) <= 128), _known(v.size(-1) <= 128))
        within_256 = _all(_known(q.size(-1) <= 256), _known(v.size(-1) <= 256))
        head_limit = within_128 if within_128 is not False else (None if within_256 is not False and self.capability[0] in (9, 10) else False)
        conditions = _all(
            self._common(ignore_singleton_head=False), self._heads(gqa=True, same_kv_heads=False), mask_shape,
            head_multiple, head_limit, _known(k.size(2) != 1), _known(q.size(0) <= 65535), _known(q.size(1) <= 65535),
        )
        if conditions is False:
            return False
        # Where every condition here may hold, whether the cuDNN installed where the program is compiled
        # takes it (9 or newer, and its own limits) is never decided here.
        self.open[CUDNN] = "whether cuDNN attention runs depends on the cuDNN version at compile time"
        return None


def _gemm_alignment(dtype: torch.dtype, capability: tuple[int, int]) -> int:
    """``minimum_gemm_alignment``: the head-dimension multiple efficient attention needs."""
    half = dtype in (torch.float16, torch.bfloat16)
    tensor_cores = capability[0] >= 8 or (capability[0] >= 7 and half)
    alignment = 4 if capability[0] >= 8 else 1
    return max(alignment, 128 // (torch.finfo(dtype).bits)) if tensor_cores else alignment


def _batched(value: Any) -> Any:
    """A fake value with leading dimensions of one up to 4-D (``None`` stays ``None``)."""
    if value is None:
        return None
    with getattr(value, "fake_mode", None) or contextlib.nullcontext():
        while value.dim() < 4:
            value = value.unsqueeze(0)
    return value


def _rewrite(graph: torch.fx.Graph, node: Node, kernel: str, device: torch.device) -> None:
    """Replace ``node`` by what the CUDA composite calls for ``kernel`` (``attention.cpp``)."""

    def op(target, *args, **kwargs) -> Node:
        return graph.call_function(target, args, kwargs)

    with graph.inserting_before(node):
        out = _kernel_call(op, _call_of(node), kernel, device)
    out.meta.update({key: node.meta[key] for key in ("stack_trace", "nn_module_stack") if key in node.meta})
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _kernel_call(op, call: _Call, kernel: str, device: torch.device):
    """What the CUDA composite calls for ``kernel``, built by ``op(target, *args, **kwargs)``: graph nodes for a
    rewrite, or the ops run on fake tensors inside Inductor (``with_chosen_kernels``)."""
    import operator

    q_val, mask_val = _val(call.query), _val(call.mask)
    head = q_val.size(-1)
    scale = call.scale

    def first(result):
        return op(operator.getitem, result, 0)

    unbatched = kernel != MATH and q_val.dim() == 3
    if unbatched:
        # torch 2.14's normalize_unbatched_input: a batch dimension in front, taken off the result.
        mask = call.mask
        if mask is not None:
            for _ in range(4 - mask_val.dim()):
                mask = op(aten.unsqueeze.default, mask, 0)
            mask_val = _batched(mask_val)
        call = replace(
            call, query=op(aten.unsqueeze.default, call.query, 0), key=op(aten.unsqueeze.default, call.key, 0),
            value=op(aten.unsqueeze.default, call.value, 0), mask=mask,
        )
    if kernel == MATH:
        out = first(op(
            aten._scaled_dot_product_attention_math.default, call.query, call.key, call.value, call.mask,
            call.dropout, call.is_causal, None, scale=scale, enable_gqa=call.enable_gqa,
        ))
    elif kernel == FLASH:
        padded = isinstance(head, int) and head % 8 != 0
        q, k, v = call.query, call.key, call.value
        if padded:
            pad = [0, 8 - head % 8]
            q, k, v = (op(aten.constant_pad_nd.default, t, pad, 0.0) for t in (q, k, v))
        # ``calculate_scale``'s 1 / sqrt(head) in C++ floats: an empty head dimension scales by infinity
        og_scale = scale if scale is not None else (1.0 / math.sqrt(head) if head else math.inf) if isinstance(head, int) else None
        out = first(op(
            aten._scaled_dot_product_flash_attention.default, q, k, v, call.dropout, call.is_causal, False,
            scale=og_scale,
        ))
        if padded:
            out = op(aten.slice.Tensor, out, -1, 0, head)
    elif kernel == EFFICIENT:
        mask = _mask_for(op, call, mask_val, q_val.dtype, device, pad_bias=True)
        out = first(op(
            aten._scaled_dot_product_efficient_attention.default, call.query, call.key, call.value, mask,
            False, call.dropout, call.is_causal, scale=scale,
        ))
    else:
        mask = _mask_for(op, call, mask_val, q_val.dtype, device, pad_bias=False)
        out = first(op(
            aten._scaled_dot_product_cudnn_attention.default, call.query, call.key, call.value, mask,
            False, call.dropout, call.is_causal, False, scale=scale,
        ))
    if unbatched:
        out = op(aten.squeeze.dim, out, 0)
    return out


def inserted_kernels(target: Target, index: int, found: list):
    """``aten.scaled_dot_product_attention`` as CUDA runs it, for an SDPA Inductor inserts itself (its
    ``fuse_attention`` patterns replace an attention written out as matmuls and a softmax): the candidates
    torch's rules leave for the call are appended to ``found`` (a ``KernelChoice``), and the one at ``index``
    (the last where there are fewer) is run on the fake tensors, as the composite runs it on the device."""

    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        call = _Call(query, key, value, attn_mask, float(dropout_p), bool(is_causal), scale, bool(enable_gqa))
        choice = _choice_of_call(f"attention Inductor inserts for {list(query.shape)}", call, target)
        found.append(choice)
        kernel = choice.candidates[min(index, len(choice.candidates) - 1)]
        return _kernel_call(lambda target_op, *args, **kwargs: target_op(*args, **kwargs), call, kernel, target.torch_device)

    return attention


def _mask_for(op, call: _Call, mask_val: Any, dtype: torch.dtype, device: torch.device, *, pad_bias: bool):
    """The mask as the composite hands it to efficient or cuDNN attention: a boolean mask made additive,
    and for efficient attention padded to aligned strides and expanded to ``[B, H, M, N]``."""
    mask = call.mask
    if mask is None:
        return None
    if mask_val.dtype == torch.bool:
        fill = float("-inf") if pad_bias else -65504.0
        inverted = op(aten.logical_not.default, mask)
        zero = op(aten.scalar_tensor.default, 0.0, dtype=dtype, device=device)
        mask = op(aten.where.ScalarSelf, inverted, fill, zero)
    if not pad_bias:
        return mask
    aligned = all(_known(s % 8 == 0) is True for s in mask_val.stride()[:-1]) and _known(mask_val.stride(-1) == 1) is True
    if not aligned:
        length = mask_val.size(-1)
        if isinstance(length, int):
            mask = op(aten.constant_pad_nd.default, mask, [0, 8 - length % 8], 0.0)
            mask = op(aten.slice.Tensor, mask, -1, 0, length)
    sizes = [op(aten.sym_size.int, call.query, 0), op(aten.sym_size.int, call.query, 1),
             op(aten.sym_size.int, call.query, 2), op(aten.sym_size.int, call.key, 2)]
    return op(aten.expand.default, mask, sizes)

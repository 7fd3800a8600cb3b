"""Matmuls the device may pad: output layouts decided by timing kernels on the GPU (Inductor's ``pad_mm``).

Inductor's joint-graph pass ``pad_mm`` (``torch/_inductor/fx_passes/pad_mm.py``)
rewrites an ``mm``, ``addmm`` or ``bmm`` whose M, K or N is not a multiple of
the alignment (8 for 16-bit floats, 4 for float32) into the matmul of
zero-padded operands, sliced back: ``mm(pad(a), pad(b))[:, :N]``, a view with
the padded row stride. It pads where ``can_pad`` holds (a CUDA floating matmul
with a static dimension, Triton present, not deterministic) and ``_should_pad``
says so: ``force_shape_pad``; else the matmul is compute-bound
(``is_mm_compute_bound``: bfloat16 with K > M and K > N below sm90, or its
arithmetic intensity above half the device's machine balance) and a benchmark
of both kernels *on the device* says the padded one is faster (cached on the
compiling machine's disk). torch 2.13 records the strides Inductor must return
after that pass, so a returned padded matmul comes back with the padded row
stride; a CUDA-proven fix that cannot see the pass leaves it strided.

No lowering without the device can know what its benchmark says, and a padded
and an unpadded kernel can time within noise of each other, so one program
can come back either way from one compile to the next. strideguard therefore
lowers with Inductor's own ``pad_mm``, every condition asked as Inductor asks
it, and gives only the benchmark's answer (``compiler.oracle.fake_device.benchmark_answers``,
with every other private entry point of the lowering): "not
faster" first, recording each matmul that reached the benchmark
(``PadDecision``); where one did, it lowers again with "faster". An output
whose layout differs between the two is decided by the device's benchmark,
and is copied in the form that holds under both, which the closed loop proves
by lowering both. A device present here is asked the same way: its benchmark
may answer otherwise at the next compile.

The compute-bound test reads the device's peak throughput and memory bandwidth
(through Triton's driver, or Inductor's data sheet for a few device names),
which a lowering for a missing device cannot measure. For a capability whose
fastest-memory devices are known (``compiler.oracle.fake_device.LEAST_BALANCED``) the test is asked with
their figures, divided by a margin: a matmul that is not compute-bound even
there is not compute-bound on any device of that capability. For any other
capability the figures are unknown, and Inductor's own answer when it cannot
read them is "compute-bound": the benchmark may then decide every unaligned
matmul, as it may on such a device.

Torch 2.14 and later record the strides a returned output must have before
the joint-graph passes, and with ``strict_output_strides`` on hold every
returned output, views included, to them exactly: a padded product is then
copied back to its unpadded strides by Inductor itself, and no benchmark
reaches a returned output (``outputs_held_to_traced_strides``). On 2.13 the
option does not exist, and the padded strides are the ones recorded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from ...program.dialect import GraphOps
from ...program.ops import GEMMS
from ..targets import Target

@dataclass(frozen=True)
class PadDecision:
    """One matmul ``pad_mm`` would pad where the device's benchmark says the padded kernel is faster."""

    op: str
    shapes: tuple[tuple, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"{self.op} of {' and '.join(str(list(shape)) for shape in self.shapes)} ({str(self.dtype)[6:]})"


def described(decisions: list[PadDecision]) -> str:
    """What the device's benchmark decides, in words, each matmul once."""
    unique = list(dict.fromkeys(str(decision) for decision in decisions))
    shown = ", ".join(unique[:3]) + (f" and {len(unique) - 3} more" if len(unique) > 3 else "")
    return f"pad_mm pads {shown} where the device's benchmark says the padded kernel is faster"


def laid_out_by_benchmark(ops_of_graph: GraphOps, target: Target) -> dict[str, str]:
    """Matrix products of ``graph`` whose output layout the device's benchmark may decide when it compiles for
    ``target``, by node name, with why: for the graph alone (no lowering). A product may be padded where its N
    (or a batched product's M: the dimensions whose padding leaves a slice with other strides) is static and
    not a multiple of the alignment, and Inductor's own compute-bound test, asked with the figures a lowering
    assumes (``benchmark_answers``), does not rule it out. ``ops_of_graph``: the graph's ops, normalised."""
    if target.kind != "cuda":
        return {}
    from torch._inductor import config

    from .fake_device import pad_alignment

    if not config.shape_padding or outputs_held_to_traced_strides():
        return {}
    decided = {}
    for node, op in ops_of_graph.aten.items():
        if getattr(op, "overloadpacket", None) not in GEMMS:  # ATen ops already: their packet is their own
            continue
        sizes = _product_sizes(node)
        if sizes is None:
            continue
        batched, m, k, n, dtype = sizes
        alignment = pad_alignment(dtype)
        relaid = [length for length in ((m, n) if batched else (n,)) if _unaligned(length, alignment)]
        if not relaid:
            continue
        if not config.force_shape_pad and not _may_be_compute_bound(m, k, n, dtype, target):
            continue
        shape = [m, n] if not batched else ["B", m, n]
        decided[node.name] = (
            f"pad_mm may pad the {list(shape)} matrix product to aligned sizes where a benchmark on the device ({target.sm}) "
            "says the padded kernel is faster, and return a slice of it"
        )
    return decided


CONFIGS_READ = ("shape_padding", "force_shape_pad", "strict_output_strides")
"""The Inductor options ``laid_out_by_benchmark`` reads: the graph-only analysis asks them of the options a
program is to be compiled with (``densify_outputs(inductor_configs=...)``)."""


def outputs_held_to_traced_strides() -> bool:
    """Whether Inductor returns every output in the strides recorded before its joint-graph passes, views
    included (torch 2.14 and later, ``strict_output_strides``), so that nothing those passes do, padding
    included, reaches a returned output's layout."""
    from torch._inductor import config

    return bool(getattr(config, "strict_output_strides", False))


@contextlib.contextmanager
def options_of_the_compile(inductor_configs: Optional[dict]) -> Iterator[None]:
    """Inductor's options, for the graph-only analysis inside, as a compile with ``inductor_configs`` reads them
    (only those it reads: ``CONFIGS_READ``)."""
    from torch._inductor import config

    asked = {key: value for key, value in (inductor_configs or {}).items() if key in CONFIGS_READ and hasattr(config, key)}
    with config.patch(asked):
        yield


def _unaligned(length, alignment: int) -> bool:
    return type(length) is int and alignment and length > 1 and length % alignment != 0


def _product_sizes(node: torch.fx.Node):
    """``(batched, M, K, N, dtype)`` of a matrix product as Inductor will see it (``linear`` and ``matmul`` of
    several dimensions as one ``mm`` over the leading ones, or a ``bmm``); ``None`` where not a floating product."""
    from ...program import ops

    def value(argument):
        return argument.meta.get("val") if isinstance(argument, torch.fx.Node) else None

    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or out.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    if ops.in_family(node.target, ops.GEMM_KERNELS):
        first = value(node.args[1] if ops.in_family(node.target, frozenset({torch.ops.aten.addmm, torch.ops.aten.baddbmm})) else node.args[0])
        if not isinstance(first, torch.Tensor) or out.dim() < 2:
            return None
        return out.dim() == 3, out.shape[-2], first.shape[-1], out.shape[-1], out.dtype
    first = value(node.args[0])
    if not isinstance(first, torch.Tensor) or out.dim() < 1 or first.dim() < 1:
        return None
    k = first.shape[-1]
    n = out.shape[-1]
    batched = ops.in_family(node.target, frozenset({torch.ops.aten.matmul})) and first.dim() >= 3 and _second_batched(node)
    m = out.shape[-2] if out.dim() >= 2 else 1
    if not batched:
        for size in out.shape[:-2]:
            m = m * size
    return batched, m, k, n, out.dtype


def _second_batched(node: torch.fx.Node) -> bool:
    second = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
    return isinstance(second, torch.Tensor) and second.dim() >= 3


def _may_be_compute_bound(m, k, n, dtype: torch.dtype, target: Target) -> bool:
    """Inductor's own ``is_mm_compute_bound``, with the device's figures a lowering for ``target`` assumes; a
    symbolic size may take any value."""
    if not all(type(size) is int for size in (m, k, n)):
        return True
    from .fake_device import is_mm_compute_bound

    return is_mm_compute_bound(m, k, n, dtype, target)

"""Proven for the device it ships to: Inductor's CUDA lowering as the oracle, on a machine without a GPU.

The SDPA modules follow ExecuTorch's own CUDA output-layout tests
(``backends/cuda/tests/test_output_stride_rearrange.py`` in its wheel: a query
``[1, 4, 4, 64]`` against keys and values ``[1, 4, 200, 64]``, without a mask,
with a boolean mask and a sparse one), in float32 and bfloat16, and then every
variant CUDA's kernel choice turns on (float masks, padded head dimensions,
GQA, causal, a transposed query), under each kernel CUDA can be made to pick.
Every lowering here runs on fake ``cuda:0`` tensors (``strideguard.compiler.oracle.fake_device``).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import strideguard
from strideguard.program import density
from strideguard.compiler.oracle.attention_kernels import CUDNN, EFFICIENT, FLASH, MATH
from strideguard.compiler.backends import Backend
from strideguard.program.promises import target_dim_orders
from strideguard.compiler.oracle.lowering import lower_edge_outputs, lower_outputs
from strideguard.prove.proof import PROOF_KEY
from strideguard.compiler.targets import CPU, LoweringUnavailable, Target, resolve_target

from .conftest import HAS_EXECUTORCH, needs_executorch

CUDA = resolve_target("cuda", function="test")
EFFICIENT_STRIDES = (1024, 64, 256, 1)
"""Efficient attention's ``(B, M, H, K)`` memory for ExecuTorch's test query ``[1, 4, 4, 64]``."""
PROMISED = (1024, 256, 64, 1)


class ExecuTorchSdpaCases(nn.Module):
    """ExecuTorch's three SDPA test modules in one method (no mask, a boolean mask, a sparse boolean mask),
    and a pointwise op after one, which takes its layout."""

    def forward(self, q, k, v, mask):
        plain = F.scaled_dot_product_attention(q, k, v)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        length = k.shape[2]
        sparse = (torch.arange(length, device=q.device) < length // 2).view(1, 1, 1, length).expand(1, 1, q.shape[2], -1)
        sparse_masked = F.scaled_dot_product_attention(q, k, v, attn_mask=sparse)
        return plain, masked, sparse_masked, plain * 2.0


def executorch_inputs(dtype: torch.dtype) -> tuple:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(1, 4, 4, 64, generator=generator).to(dtype),
        torch.randn(1, 4, 200, 64, generator=generator).to(dtype),
        torch.randn(1, 4, 200, 64, generator=generator).to(dtype),
        torch.rand(1, 1, 4, 200, generator=generator) > 0.3,
    )


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def executorch_cases(request):
    return request.param, torch.export.export(ExecuTorchSdpaCases().eval(), executorch_inputs(request.param))


def _in_layout(lowering, orders) -> list:
    """Outputs out of their layout under any kernel choice: (index, strides)."""
    return [
        (index, strides)
        for index, (out, order) in enumerate(zip(lowering.outputs, orders))
        if out is not None and order is not None
        for strides in out.every_strides
        if density.has_layout(out.shape, strides, order) is not True
    ]


@pytest.mark.lowers
def test_cpu_and_cuda_predictions_side_by_side_and_the_fix_holds_on_cuda(executorch_cases):
    dtype, program = executorch_cases
    cpu = strideguard.inspect(program, exact=True)
    cuda = strideguard.inspect(program, exact=True, device="cuda")
    assert cpu.device == "cpu" and "cuda sm90" in cuda.device and "fake tensors" in cuda.device
    assert all(o.strides == PROMISED for o in cpu.outputs), [o.strides for o in cpu.outputs]
    if dtype == torch.float32:
        # Efficient attention (float32 has no flash kernel): the failure ExecuTorch's runtime copies through the host.
        assert [o.strides for o in cuda.outputs] == [EFFICIENT_STRIDES] * 4
        assert [o.reason.value for o in cuda.outputs] == ["strided"] * 4
    else:
        # Flash or cuDNN without a mask (both the query's layout); with a mask, efficient or cuDNN: undecided here.
        assert cuda.outputs[0].ok and cuda.outputs[3].ok
        assert [o.reason.value for o in cuda.outputs[1:3]] == ["kernel-decides"] * 2
        assert "cuDNN" in cuda.outputs[1].explanation and str(list(EFFICIENT_STRIDES)) in cuda.outputs[1].explanation
    # The CPU-proven fix leaves CUDA's outputs out of layout where they differ; the CUDA-proven fix does not.
    cpu_fixed = strideguard.densify_outputs(program, exact=True)
    wrong_on_cuda = _in_layout(lower_outputs(cpu_fixed, target=CUDA), target_dim_orders(cpu_fixed))
    assert {index for index, _ in wrong_on_cuda} == {o.index for o in cuda.outputs if not o.ok}
    fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
    proof = fixed.graph_module.meta[PROOF_KEY]
    assert proof.target == str(CUDA) and proof.unproven == () and proof.rounds == 1
    assert _in_layout(lower_outputs(fixed, target=CUDA), target_dim_orders(fixed)) == []
    with torch.no_grad():
        for got, want in zip(fixed.module()(*executorch_inputs(dtype)), program.module()(*executorch_inputs(dtype))):
            assert torch.equal(got, want)


class SdpaVariants(nn.Module):
    """One SDPA per variant CUDA's kernel choice reads; ``kernel`` keeps those that kernel can run."""

    VARIANTS = {
        "plain": {FLASH, EFFICIENT, CUDNN, MATH},
        "float_mask": {EFFICIENT, CUDNN, MATH},
        "bool_mask": {EFFICIENT, CUDNN, MATH},
        "causal": {FLASH, EFFICIENT, CUDNN, MATH},
        "head_60": {FLASH, MATH},  # flash pads it to 64 and slices back: a strided view
        "head_96": {FLASH, EFFICIENT, CUDNN, MATH},
        "gqa": {FLASH, CUDNN, MATH},
        "transposed_query": {FLASH, EFFICIENT, CUDNN, MATH},
    }

    def __init__(self, kernel: str):
        super().__init__()
        self.names = [name for name, kernels in self.VARIANTS.items() if kernel in kernels]

    def forward(self, q, k, v, mask, q60, k60, v60, q96, k96, v96, q8, k2, v2, x):
        calls = {
            "plain": lambda: F.scaled_dot_product_attention(q, k, v),
            "float_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            "bool_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask > 0),
            "causal": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
            "head_60": lambda: F.scaled_dot_product_attention(q60, k60, v60),
            "head_96": lambda: F.scaled_dot_product_attention(q96, k96, v96),
            "gqa": lambda: F.scaled_dot_product_attention(q8, k2, v2, enable_gqa=True),
            "transposed_query": lambda: F.scaled_dot_product_attention(x.transpose(1, 2), k[:, :, :16], v[:, :, :16]),
        }
        return tuple(calls[name]() for name in self.names)


def variant_inputs() -> tuple:
    generator = torch.Generator().manual_seed(2)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.bfloat16)

    return (
        randn(1, 4, 4, 64), randn(1, 4, 200, 64), randn(1, 4, 200, 64), randn(1, 1, 4, 200),
        randn(1, 4, 4, 60), randn(1, 4, 32, 60), randn(1, 4, 32, 60),
        randn(1, 4, 4, 96), randn(1, 4, 32, 96), randn(1, 4, 32, 96),
        randn(1, 8, 4, 64), randn(1, 2, 32, 64), randn(1, 2, 32, 64),
        randn(1, 16, 4, 64),
    )


_FORCED = {FLASH: SDPBackend.FLASH_ATTENTION, EFFICIENT: SDPBackend.EFFICIENT_ATTENTION,
           CUDNN: SDPBackend.CUDNN_ATTENTION, MATH: SDPBackend.MATH}


@pytest.mark.lowers
@pytest.mark.parametrize("kernel", [FLASH, EFFICIENT, CUDNN, MATH])
def test_every_sdpa_variant_in_layout_after_the_cuda_fix_under_each_kernel(kernel):
    """``sdpa_kernel`` names the kernel, as a user does: the choice, the fix and its proof follow it."""
    module = SdpaVariants(kernel)
    program = torch.export.export(module.eval(), variant_inputs())
    with sdpa_kernel([_FORCED[kernel]]):
        before = lower_outputs(program, target=CUDA)
        fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
        after = lower_outputs(fixed, target=CUDA)
    assert {choice.candidates for choice in before.kernel_choices} == {(kernel,)}, before.kernel_choices
    strided = {module.names[index] for index, _ in _in_layout(before, target_dim_orders(program))}
    # Flash pads head 60 to 64 and slices back; flash and cuDNN keep a transposed query's layout; efficient
    # attention returns (B, M, H, K) memory for every query; math a contiguous tensor.
    expected = {FLASH: {"head_60", "transposed_query"}, EFFICIENT: set(module.names), CUDNN: {"transposed_query"},
                MATH: set()}[kernel]
    assert strided == expected, (kernel, strided)
    assert _in_layout(after, target_dim_orders(fixed)) == []
    copies = sum(1 for node in fixed.graph.nodes if node.target is torch.ops.aten.clone.default)
    assert copies == len(expected), "one copy per output out of layout, none elsewhere"
    with torch.no_grad():
        for got, want in zip(fixed.module()(*variant_inputs()), program.module()(*variant_inputs())):
            assert torch.equal(got, want)


@pytest.mark.lowers
def test_undecided_kernels_are_each_lowered_and_copied_where_they_differ():
    """bfloat16 at sm90 by default: flash or cuDNN without a mask (one layout), efficient or cuDNN with one
    (two layouts: undecided, copied, and the copy proven under both); at sm87 (Jetson Orin) cuDNN never goes
    first, so every choice is decided."""
    program = torch.export.export(SdpaVariants(CUDNN).eval(), variant_inputs())
    names = SdpaVariants(CUDNN).names
    at_sm90 = lower_outputs(program, target=CUDA)
    undecided = {names[index] for index, out in enumerate(at_sm90.outputs) if out.alternatives}
    assert undecided == {"float_mask", "bool_mask"}, undecided
    assert all(len(choice.candidates) == 2 for choice in at_sm90.kernel_choices)
    orin = resolve_target("cuda:sm87", function="test")
    assert orin.capability == (8, 7) and "sm87" in str(orin)
    at_sm87 = lower_outputs(program, target=orin)
    assert all(len(choice.candidates) == 1 for choice in at_sm87.kernel_choices), at_sm87.kernel_choices
    fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
    assert _in_layout(lower_outputs(fixed, target=CUDA), target_dim_orders(fixed)) == []
    report = strideguard.inspect(program, exact=True, device="cuda")
    assert {names[o.index] for o in report.outputs if o.reason.value == "kernel-decides"} == undecided
    assert "the device's kernel choice decides" in " ".join(str(report).split())
    assert all("STRIDED" not in line for line in str(report).splitlines()[1:] if "kernel-decides" in line)


def test_the_private_entry_points_of_the_cuda_lowering_live_in_one_module():
    """``strideguard.compiler.oracle.fake_device`` is the one place the CUDA lowering's private torch entry points are touched,
    so that a new torch breaks one module, which says which versions it was checked on."""
    private = re.compile(
        r"get_device_properties|get_device_capability|is_bf16_supported|CudaInterface|_misc_patterns_init|"
        r"has_triton|is_same_tensor|_get_sdp_priority_order|DeviceProperties|FakeTensor\.(item|tolist)"
    )
    package = Path(strideguard.__file__).parent
    touching = sorted(
        str(path.relative_to(package)) for path in package.rglob("*.py")
        if private.search(path.read_text()) and path.name != "fake_device.py"
    )
    assert touching == ["compiler/targets.py"], touching  # targets.py asks a GPU that is present for its capability
    assert "get_device_capability(0)" in (package / "compiler" / "targets.py").read_text()


def test_targets_are_named_as_users_write_them():
    assert resolve_target(None, function="t") is CPU and resolve_target("cpu", function="t") is CPU
    assert resolve_target("cuda", function="t").capability == (9, 0)
    assert resolve_target("cuda:sm87", function="t").capability == (8, 7)
    assert resolve_target("CUDA:SM_90", function="t").capability == (9, 0)
    # Blackwell's two-digit majors (found from outside: "sm100" once read as (1, 0), and every SDPA fell to math)
    assert resolve_target("cuda:sm100", function="t").capability == (10, 0)
    assert resolve_target("cuda:sm121", function="t").capability == (12, 1)
    assert resolve_target(torch.device("cuda", 0), function="t").kind == "cuda"
    assert resolve_target(Target("cuda", (8, 0), False), function="t").sm == "sm80"
    with pytest.raises(ValueError, match="device must be one of"):
        resolve_target("tpu", function="inspect")
    with pytest.raises(ValueError, match="names no device index nor compute capability"):
        resolve_target("cuda:ampere", function="inspect")
    with pytest.raises(TypeError, match="device must be"):
        resolve_target(3, function="inspect")
    if HAS_EXECUTORCH:  # a pass's device is checked when the pass is made, not when ExecuTorch runs it
        from strideguard.executorch import DenseOutputsPass

        with pytest.raises(ValueError, match="executorch.DenseOutputsPass: device must be one of"):
            DenseOutputsPass(device="gpu")


def _two_views():
    class TwoViews(nn.Module):
        def forward(self, x):
            y = x * 2
            return y[:, :3], y.t()

    return torch.export.export(TwoViews(), (torch.randn(4, 5),))


@pytest.mark.lowers
def test_an_unchecked_torch_is_said_and_the_fix_copies_every_output_unproven(monkeypatch, caplog):
    monkeypatch.setattr("strideguard.compiler.oracle.fake_device.CHECKED_ON", ("1.0",))
    program = _two_views()
    with pytest.raises(LoweringUnavailable, match="checked on torch 1.0"):
        lower_outputs(program, target=CUDA)
    with caplog.at_level(logging.WARNING, logger="strideguard"):
        fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
    proof = fixed.graph_module.meta[PROOF_KEY]
    assert proof.rounds == 0 and proof.unproven == (0, 1) and "checked on torch 1.0" in proof.unproven_reason
    assert "not proven" in caplog.text
    assert sum(1 for node in fixed.graph.nodes if node.target is torch.ops.aten.clone.default) == 2
    with pytest.raises(LoweringUnavailable, match="MPS"):
        lower_outputs(program, target=Target("mps", None, False))


def test_a_program_on_cuda_tensors_is_lowered_for_cuda():
    """A program exported on a GPU carries CUDA fake values: its target follows them, and a backend's wins."""
    from types import SimpleNamespace

    from torch._subclasses.fake_tensor import FakeTensorMode

    from strideguard.compiler.targets import target_for

    graph = torch.fx.Graph()
    with FakeTensorMode():
        graph.placeholder("x").meta["val"] = torch.empty(2, 3, device="cuda")
    on_gpu = SimpleNamespace(graph=graph)
    assert target_for(on_gpu, None, None, "t") == CUDA
    assert target_for(on_gpu, "cuda:sm87", None, "t").sm == "sm87"
    assert target_for(_two_views(), None, None, "t") is CPU
    assert target_for(_two_views(), None, Backend("CudaBackend", None, "not here"), "t") == CUDA


@pytest.mark.lowers
def test_a_lowering_for_an_absent_device_leaves_torch_as_it_found_it():
    """The patches hold for one lowering only: torch's CUDA answers and Inductor's device cache are back after."""
    from torch._inductor.runtime.hints import DeviceProperties

    from strideguard.compiler.oracle.fake_device import lowering_for

    capability = torch.cuda.get_device_capability
    cached_before = DeviceProperties.create.cache_info().currsize  # a CPU compile earlier in this worker may have filled it
    lower_outputs(_two_views(), target=resolve_target("cuda:sm87", function="t"))
    assert torch.cuda.get_device_capability is capability
    assert DeviceProperties.create.cache_info().currsize == cached_before
    with lowering_for(Target("cuda", (9, 0), True)):  # a GPU present: nothing is patched
        assert torch.cuda.get_device_capability is capability


@pytest.mark.lowers
def test_device_names_the_lowering_target(monkeypatch):
    program = _two_views()
    seen = []
    import strideguard.fix.engine as engine
    import strideguard.prove.proof as proof

    real = engine.lower_as_compiled

    def spy(candidate, subject, *how):
        seen.append(subject.target)
        return real(candidate, subject, *how)

    # the plan's lowering (the engine's) and the closed loop's (the proof's)
    monkeypatch.setattr(engine, "lower_as_compiled", spy)
    monkeypatch.setattr(proof, "lower_as_compiled", spy)
    fixed = strideguard.densify_outputs(program, exact=True, device=torch.device("cuda"))
    # every lowering (the plan's and the closed loop's) for the one device asked, sm90 assumed without a GPU
    assert len(seen) >= 2 and all(target == seen[0] for target in seen)
    assert (seen[0].kind, seen[0].capability) == ("cuda", (9, 0))
    assert "cuda sm90" in str(fixed.graph_module.meta[PROOF_KEY].target)
    seen.clear()
    fixed = strideguard.densify_outputs(program, exact=True, device="cuda:sm87")
    assert seen and all((target.kind, target.capability) == ("cuda", (8, 7)) for target in seen)
    assert "cuda sm87" in str(fixed.graph_module.meta[PROOF_KEY].target)
    assert "cuda sm87" in strideguard.inspect(program, exact=True, device="cuda:sm87").device


@needs_executorch
@pytest.mark.lowers
@pytest.mark.parametrize("triton_kernel_mode", ["ON", "OFF"])
def test_executorch_sdpa_modules_through_the_cuda_backend_come_back_in_layout(executorch_cases, triton_kernel_mode):
    """``DenseOutputsPass(exact=True, backend="CudaBackend")``: the backend's own passes (its Triton SDPA, which
    takes bfloat16 and boolean masks only, as ExecuTorch's own tests use it), its compile context (SDPA left
    to the math kernel) and options, lowered for CUDA."""
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from strideguard.compiler.backends import resolve_backend
    from strideguard.executorch import DenseOutputsPass
    from strideguard.testing.executorch_cpu import aoti_edge_program

    dtype, program = executorch_cases
    if triton_kernel_mode == "ON" and dtype != torch.bfloat16:
        pytest.skip("ExecuTorch's Triton SDPA takes bfloat16 only (its own tests run it so)")
    specs = [CudaBackend.generate_method_name_compile_spec("forward"),
             CompileSpec(key="triton_kernel_mode", value=triton_kernel_mode.encode())]
    edge = aoti_edge_program(program)
    before = strideguard.inspect(edge, exact=True, device="cuda")
    if dtype == torch.float32:
        assert [o.strides for o in before.outputs][:3] == [EFFICIENT_STRIDES] * 3  # no backend: torch's own choice
    environment = dict(os.environ)
    dense = DenseOutputsPass(exact=True, backend="CudaBackend", compile_specs=specs)
    fixed = dense.call(edge).exported_program
    assert dict(os.environ) == environment, "CudaBackend's compile options set CUDA variables; they are put back"
    assert dense.proof is not None and dense.proof.target == str(CUDA) and dense.proof.unproven == ()
    backend = resolve_backend("CudaBackend", specs, function="test")
    lowering = lower_edge_outputs(fixed, backend=backend, target=CUDA)
    assert "max_autotune" in lowering.options_not_applied
    assert _in_layout(lowering, target_dim_orders(fixed)) == []
    fixed.validate()


@needs_executorch
@pytest.mark.lowers
def test_a_backend_whose_passes_cannot_run_is_said_and_nothing_is_claimed(executorch_cases, monkeypatch, caplog):
    from strideguard import executorch as integration
    from strideguard.testing.executorch_cpu import aoti_edge_program

    _, program = executorch_cases
    edge = aoti_edge_program(program)
    missing = Backend("CudaBackend", None, "executorch.backends.cuda.cuda_backend cannot be imported here (no triton)")
    monkeypatch.setattr(integration, "resolve_backend", lambda *args, **kwargs: missing)
    with caplog.at_level(logging.WARNING, logger="strideguard"):
        dense = integration.DenseOutputsPass(exact=True, backend="CudaBackend")
        fixed = dense.call(edge).exported_program
    assert "cannot be imported here (no triton)" in caplog.text
    assert dense.proof.unproven == (0, 1, 2, 3) and "no triton" in dense.proof.unproven_reason
    assert dense.proof.target == str(CUDA)
    report = strideguard.inspect(edge, backend=missing)
    assert all(o.reason.value == "backend-decides" for o in report.outputs)
    assert "STRIDED" not in str(report) and "the backend's passes decide" in str(report)
    assert _in_layout(lower_edge_outputs(fixed, target=CUDA), target_dim_orders(fixed)) == []


class VersionedRules(nn.Module):
    """Where torch 2.14's rules differ from 2.13's: unbatched (3-D) inputs, and grouped-query attention in
    float32 (efficient attention takes it from 2.14 on)."""

    def forward(self, q3, k3, v3, q8, k2, v2):
        return (
            F.scaled_dot_product_attention(q3, k3, v3),
            F.scaled_dot_product_attention(q8, k2, v2, enable_gqa=True),
        )


@pytest.mark.lowers
def test_the_installed_torchs_rules_are_followed_and_the_fix_holds_under_each():
    from strideguard.compiler.oracle.attention_kernels import _TORCH

    generator = torch.Generator().manual_seed(3)
    inputs = tuple(torch.randn(*shape, generator=generator) for shape in
                   ((4, 8, 64), (4, 32, 64), (4, 32, 64), (1, 8, 8, 64), (1, 2, 32, 64), (1, 2, 32, 64)))
    program = torch.export.export(VersionedRules().eval(), inputs)
    before = lower_outputs(program, target=CUDA)
    unbatched, grouped = (choice.candidates for choice in before.kernel_choices)
    if _TORCH >= (2, 14):
        assert unbatched == (EFFICIENT, MATH) and grouped == (EFFICIENT,)
        # Efficient attention's (B, M, H, K) memory, its batch of one taken off: strided either way it is run.
        assert before.outputs[0].alternatives and before.outputs[1].strides == (4096, 64, 512, 1)
    else:
        assert unbatched == (MATH,) and grouped == (MATH,)
        assert not before.outputs[0].alternatives
    fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
    assert _in_layout(lower_outputs(fixed, target=CUDA), target_dim_orders(fixed)) == []
    with torch.no_grad():
        for got, want in zip(fixed.module()(*inputs), program.module()(*inputs)):
            assert torch.equal(got, want)

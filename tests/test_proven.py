"""Proven at fix time: the fixed program lowered through the backend's own pipeline, and the loop closed.

The modules are written here after the shapes of ExecuTorch's own output-layout
tests (the CUDA stride-rearrange tests and the Metal module tests shipped in its
wheel): SDPA without a mask, with a bool mask and a sparse one, strided and
broadcast SDPA, ``narrow`` of the last dimension, split then cat, conv1d and
linear at batch 1. Unlike those tests, each one here also returns the views
this project exists for. One module holds them all, so each path compiles once.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import strideguard
from strideguard import LayoutNotReached
from strideguard.program import density
from strideguard.program.promises import target_dim_orders
from strideguard.compiler.oracle.lowering import LoweringUnavailable, lower_edge_outputs, lower_outputs
from strideguard.program import copies
from strideguard.program.copies import CopyForm, copy_form_of
from strideguard.program.exported import output_values
from strideguard.prove.proof import PROOF_KEY

from strideguard.compiler.backends import resolve_backend

from . import tiers
from .conftest import HAS_EXECUTORCH, needs_executorch

if HAS_EXECUTORCH:
    from strideguard.executorch import DenseOutputsPass
    from strideguard.testing.executorch_cpu import StrideguardCpuAotiBackend, aoti_edge_program, lower_and_run

    CPU_TWIN = StrideguardCpuAotiBackend


class OutputLayoutCases(nn.Module):
    """ExecuTorch's output-layout test shapes in one method, with the views they stop short of."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.query = nn.Parameter(torch.randn(1, 4, 1, 16, generator=generator))
        self.key = nn.Parameter(torch.randn(1, 4, 50, 16, generator=generator))
        self.value = nn.Parameter(torch.randn(1, 4, 50, 16, generator=generator))
        self.conv = nn.Conv1d(8, 6, kernel_size=3, padding=1, bias=False)
        self.linear = nn.Linear(7, 101)

    def forward(self, q, k, v, mask, x, chans, signal, row):
        plain = F.scaled_dot_product_attention(q, k, v, is_causal=False)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        length = k.shape[2]
        sparse = (torch.arange(length) < length // 2).view(1, 1, 1, length).expand(1, 1, q.shape[2], -1)
        sparse_masked = F.scaled_dot_product_attention(q, k, v, attn_mask=sparse, is_causal=False)
        query = torch.as_strided(self.query, size=(1, 4, 1, 16), stride=(64, 16, 64, 1))
        key = torch.as_strided(self.key, size=(1, 4, 50, 16), stride=(3200, 16, 64, 1))
        value = torch.as_strided(self.value, size=(1, 4, 50, 16), stride=(3200, 16, 64, 1))
        broadcast = F.scaled_dot_product_attention(query, key, value, scale=1.0) + q[:, :, :1, :16]
        half = x.shape[-1] // 2
        first, second = x.narrow(-1, 0, half), x.narrow(-1, half, half)
        a, b, c = torch.split(chans, 2, dim=1)
        conv = self.conv(signal)
        linear = self.linear(row)
        return (
            plain, masked, sparse_masked, plain * 2.0, broadcast,
            first * 2.0 + second, second,
            torch.cat([a * 2.0, b + 1.0, c], dim=1), b,
            conv, conv[..., :5],
            linear, linear[:, :14],
        )


def case_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (
        torch.randn(1, 4, 4, 64, generator=generator),
        torch.randn(1, 4, 200, 64, generator=generator),
        torch.randn(1, 4, 200, 64, generator=generator),
        torch.ones(1, 1, 4, 200, dtype=torch.bool),
        torch.randn(2, 4, 16, generator=generator),
        torch.randn(1, 6, 4, generator=generator),
        torch.randn(1, 8, 10, generator=generator),
        torch.randn(1, 7, generator=generator),
    )


@pytest.fixture(scope="module")
def cases():
    return torch.export.export(OutputLayoutCases().eval(), case_inputs())


@pytest.fixture(scope="module")
def cases_edge(cases):
    return aoti_edge_program(cases)


@pytest.fixture(scope="module")
@tiers.needs("compiles", "lowers")
def twin_unfixed(cases, tmp_path_factory):
    return lower_and_run(cases, case_inputs(), workdir=str(tmp_path_factory.mktemp("unfixed")))


@pytest.fixture(scope="module")
@tiers.needs("compiles", "lowers")
def twin_fixed(cases, tmp_path_factory):
    dense = DenseOutputsPass(exact=True, backend=CPU_TWIN)
    run = lower_and_run(cases, case_inputs(), transform_passes=[dense], workdir=str(tmp_path_factory.mktemp("fixed")))
    return dense, run


def _strides(values) -> list:
    return [tuple(v.stride()) for v in values]


@needs_executorch
@pytest.mark.compiles
@pytest.mark.lowers
def test_unfixed_delegate_breaks_the_promise_where_exact_inspect_says(cases_edge, twin_unfixed):
    """The failure is real (SDPA comes back transposed through the backend's decomposition), and
    ``inspect(exact=True, backend=...)`` predicts every stride the delegate returns."""
    report = strideguard.inspect(cases_edge, exact=True, backend=CPU_TWIN)
    assert [o.strides for o in report.outputs] == _strides(twin_unfixed.outputs)
    orders = target_dim_orders(cases_edge)
    broken = [i for i, (v, order) in enumerate(zip(twin_unfixed.outputs, orders)) if density.has_layout(v.shape, v.stride(), order) is not True]
    assert {0, 1, 2, 3} <= set(broken), broken  # the three SDPAs and a pointwise op after one
    assert {6, 8, 10, 12} <= set(broken), broken  # the views: narrow, split chunk, conv and linear slices
    assert sorted(o.index for o in report.outputs if not o.ok) == broken
    # Without the backend named, the oracle lowers only ExecuTorch's view pass and misses the SDPA re-layout.
    assert strideguard.inspect(cases_edge, exact=True).outputs[0].ok


@needs_executorch
@pytest.mark.compiles
@pytest.mark.lowers
def test_dense_outputs_pass_exact_proves_and_delivers_every_layout(cases, cases_edge, twin_unfixed, twin_fixed):
    dense, fixed = twin_fixed
    orders = target_dim_orders(cases_edge)
    for index, (value, order) in enumerate(zip(fixed.outputs, orders)):
        assert density.has_layout(value.shape, value.stride(), order) is True, (index, value.stride(), order)
    for index, (got, want) in enumerate(zip(fixed.outputs, twin_unfixed.outputs)):
        assert torch.equal(got, want), f"output {index} differs from the unfixed delegate's"
    with torch.no_grad():
        eager = cases.module()(*case_inputs())
    for got, want in zip(fixed.outputs, eager):
        torch.testing.assert_close(got, want)
    assert dense.proof is not None and dense.proof.backend == CPU_TWIN.__name__
    # The SDPA outputs are traced in layout and re-laid by the backend's decomposition; the first fix, decided
    # through the backend's pipeline, copied them in a form that holds, and one lowering proved it.
    assert dense.proof.rounds == 1 and dense.proof.strengthened == ()


@pytest.mark.compiles
@pytest.mark.lowers
def test_plain_aoti_compile_and_package_returns_every_output_contiguous(cases, tmp_path):
    package = strideguard.aoti_compile_and_package(cases, package_path=str(tmp_path / "fixed.pt2"))
    assert package == str(tmp_path / "fixed.pt2") and os.path.getsize(package) > 0
    unfixed = torch._inductor.aoti_load_package(
        torch._inductor.aoti_compile_and_package(cases, package_path=str(tmp_path / "unfixed.pt2"))
    )
    fixed = torch._inductor.aoti_load_package(package)
    with torch.no_grad():
        got, want = fixed(*case_inputs()), unfixed(*case_inputs())
    assert any(not v.is_contiguous() for v in want), "the unfixed compile must show the failure"
    for index, (g, w) in enumerate(zip(got, want)):
        assert density.has_layout(g.shape, g.stride(), tuple(range(g.dim()))) is True, (index, g.stride())
        assert torch.equal(g, w), f"output {index} differs from the unfixed compile's"
    assert cases.module()(*case_inputs())[0].shape == got[0].shape  # the program handed in still runs
    # Output 4 is computed in place into CPU flash attention's own output, whose size-one dimension has the
    # kernel's stride (64), not Inductor's model of it (16): unfixed it comes back so.
    assert want[4].stride() == (64, 16, 64, 1) and got[4].stride() == (64, 16, 16, 1)


@pytest.mark.lowers
def test_exact_fix_without_strideguards_compile_leaves_kernel_memory_unproven(cases):
    fixed = strideguard.densify_outputs(cases, exact=True)
    proof = fixed.graph_module.meta[PROOF_KEY]
    assert proof.unproven == (4,) and proof.rounds == 1


@needs_executorch
@pytest.mark.lowers
def test_prepare_for_aoti_exact_is_proven_through_the_backend(cases_edge):
    prepared = strideguard.prepare_for_aoti(cases_edge, exact=True, backend=CPU_TWIN)
    proof = prepared.graph_module.meta[PROOF_KEY]
    assert proof.rounds >= 1 and proof.backend == CPU_TWIN.__name__
    lowering = lower_edge_outputs(prepared, backend=resolve_backend(CPU_TWIN, function="test"))
    for lowered, order in zip(lowering.outputs, target_dim_orders(prepared)):
        assert density.has_layout(lowered.shape, lowered.strides, order) is True
    prepared.validate()


@needs_executorch
def test_copy_outputs_false_converts_views_but_copies_nothing(cases_edge):
    prepared = strideguard.prepare_for_aoti(cases_edge, copy_outputs=False)
    assert not any(copy_form_of(node) for node in prepared.graph.nodes)
    assert not strideguard.inspect(prepared).ok, "the views are now strided outputs, left for a runtime that copies"
    copied = strideguard.prepare_for_aoti(cases_edge)
    assert any(copy_form_of(node) for node in copied.graph.nodes)


class LogicalNotSelect(nn.Module):
    """Found by ``make fuzz``: Inductor realizes ``logical_not`` of a transposed input contiguously where it
    was traced transposed, so the select of it comes back with stride 2, and a ``clone`` of it, traced like
    its source, is dropped by Inductor's ``remove_noop_ops``."""

    def forward(self, x, flags):
        picked = torch.logical_not(flags.transpose(0, -1)).select(-1, -2)
        return picked, x * 2.0


def _logical_not_program():
    return torch.export.export(LogicalNotSelect(), (torch.randn(3, 4), torch.rand(2, 2) > 0.5))


@pytest.mark.lowers
def test_the_default_copy_is_a_form_inductor_keeps():
    """The select of ``logical_not(x.T)`` is traced contiguous, Inductor realizes it otherwise and drops a
    clone of it as a no-op; strideguard leaves its layout to Inductor and copies it in the form that holds
    either way. A copy of a source whose compiled layout is known and traced in the target (an input, with
    ``break_aliases``) is the involution pair alone."""
    program = _logical_not_program()
    assert lower_outputs(program).outputs[0].strides == (2,)
    fixed = strideguard.densify_outputs(program)
    assert copy_form_of(output_values(fixed.graph)[0]) == CopyForm.KEPT.value
    assert lower_outputs(fixed).outputs[0].strides == (1,)
    values = program.module()(*program.example_inputs[0])
    assert all(torch.equal(a, b) for a, b in zip(fixed.module()(*program.example_inputs[0]), values))
    returns_input = torch.export.export(ReturnsItsInput(), (torch.randn(3, 4),))
    unaliased = strideguard.densify_outputs(returns_input, break_aliases=True)
    copy = output_values(unaliased.graph)[0]
    assert copy_form_of(copy) == CopyForm.KEPT.value
    assert [n.target for n in (copy, copy.args[0])] == [torch.ops.aten.neg.default] * 2
    [lowered, _] = lower_outputs(unaliased).outputs
    assert lowered.strides == (4, 1)
    x = torch.randn(3, 4)
    got = unaliased.module()(x)[0]
    assert torch.equal(got, x) and got.data_ptr() != x.data_ptr()


class ReturnsItsInput(nn.Module):
    def forward(self, x):
        return x, x * 2.0


@pytest.mark.compiles
@pytest.mark.lowers
def test_closed_loop_repairs_a_copy_inductor_dropped(monkeypatch):
    """Force the plain clone (which Inductor drops here): the loop sees the output still strided, replaces
    the copy with the form that holds, lowers again and proves it; the compiled program agrees."""
    program = _logical_not_program()
    monkeypatch.setattr(copies, "copy_form_for", lambda *args, **kwargs: CopyForm.CLONE)
    fixed = strideguard.densify_outputs(program, exact=True)
    proof = fixed.graph_module.meta[PROOF_KEY]
    assert proof.rounds == 2 and proof.strengthened == (0,)
    assert copy_form_of(output_values(fixed.graph)[0]) == CopyForm.KEPT.value
    assert not any(n.target is torch.ops.aten.clone.default and not n.users for n in fixed.graph.nodes)
    report = strideguard.verify(fixed, reference=program)
    assert report.ok, str(report)
    assert report.outputs[0].strides == (1,)


class RelayOutputsTransposed:
    """A backend pass that re-lays every 2-d output transposed after strideguard's copies: nothing
    strideguard inserts before it can hold, and the loop must say so rather than return the program."""

    def __call__(self, graph_module):
        graph = graph_module.graph
        output = graph.output_node()
        returned = list(output.args[0])
        ops = __import__("executorch.exir.dialects._ops", fromlist=["ops"]).ops.edge.aten
        for position, node in enumerate(returned):
            value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor) or value.dim() != 2:
                continue
            with graph.inserting_before(output):
                flipped = graph.call_function(ops.permute.default, (node, [1, 0]))
                copied = graph.call_function(ops.clone.default, (flipped,), {"memory_format": torch.contiguous_format})
                back = graph.call_function(ops.permute.default, (copied, [1, 0]))
                # Computed afresh, in the transposed strides its trace has: a layout Inductor must keep.
                kept = graph.call_function(ops.neg.default, (graph.call_function(ops.neg.default, (back,)),))
            returned[position] = kept
        output.args = (tuple(returned),)
        graph_module.recompile()


@needs_executorch
@pytest.mark.lowers
def test_closed_loop_raises_where_no_copy_can_hold(monkeypatch):
    program = aoti_edge_program(torch.export.export(nn.Linear(7, 5), (torch.randn(3, 7),)))
    monkeypatch.setattr(StrideguardCpuAotiBackend, "custom_passes", [RelayOutputsTransposed()])
    with pytest.raises(LayoutNotReached, match=r"output 0 .*strides \[1, 3\].*dim order \[0, 1\]") as raised:
        DenseOutputsPass(exact=True, backend=CPU_TWIN).call(program)
    assert raised.value.outputs[0].index == 0 and "re-lay it after strideguard's strongest copy" in str(raised.value)


def test_lowering_unavailable_is_said(monkeypatch):
    """A torch whose Inductor lacks the hook the oracle stops at: said, never a silent full compile."""
    monkeypatch.setattr("strideguard.compiler.oracle.lowering._HOOK", "_hook_this_torch_lacks")
    with pytest.raises(LoweringUnavailable, match="no _hook_this_torch_lacks hook"):
        strideguard.inspect(_logical_not_program(), exact=True)
    with pytest.raises(LoweringUnavailable):
        strideguard.aoti_compile_and_package(_logical_not_program())


@needs_executorch
def test_backends_are_followed_from_their_installed_classes(cases_edge):
    metal = resolve_backend("MetalBackend", function="test")
    if metal.available:  # Metal's own DecomposeLinearPass rewrites linear: its outputs are left to the backend
        report = strideguard.inspect(cases_edge, backend="MetalBackend")
        reasons = {o.index: o.reason.value for o in report.outputs}
        assert reasons[11] == reasons[12] == "backend-decides" and reasons[6] != "backend-decides"
        assert "DecomposeLinearPass" in report.outputs[11].explanation
    cuda = resolve_backend("CudaBackend", function="test")
    report = strideguard.inspect(cases_edge, backend="CudaBackend")
    if not cuda.available:  # a CPU machine without Triton cannot run CudaBackend's passes: copy every output
        assert all(o.action.value == "copy" and o.reason.value == "backend-decides" for o in report.outputs)
        assert "cannot run here" in report.outputs[0].explanation and cuda.unavailable in report.outputs[0].explanation
    with pytest.raises(ValueError, match="backend names an ExecuTorch AOTI backend"):
        strideguard.densify_outputs(_logical_not_program(), backend="CudaBackend")
    with pytest.raises(TypeError, match="backend must be"):
        strideguard.inspect(cases_edge, backend=3)
    with pytest.raises(TypeError, match="not an ExecuTorch AotiBackend"):
        strideguard.inspect(cases_edge, backend=int)

"""Decided on the device: layouts a GPU chooses for itself, lowered every way it may choose.

Matmuls Inductor's ``pad_mm`` pads where a benchmark on the GPU says so: the
fake-device lowering cannot run the benchmark, so strideguard lowers both
branches (``strideguard.compiler.oracle.padded_matmuls``). A convolution's memory
format is cuDNN's, which a build of torch without cuDNN cannot ask: both
formats are lowered there. The ground truth is an
AOTInductor compile on the CPU with ``pad_mm`` forced (``tests.padding``), which
takes the padded branch, and a plain one, which does not: every output of a
program fixed for the device must come back dense, to the letter, under both,
with the unfixed program's values.
"""

from __future__ import annotations

import contextlib
import logging
import os

import pytest
import torch
from torch import nn

import strideguard
from strideguard.compiler.oracle.lowering import lower_outputs
from strideguard.compiler.oracle.padded_matmuls import laid_out_by_benchmark
from strideguard.program.dialect import graph_ops
from strideguard.compiler.targets import resolve_target
from strideguard.program import density
from strideguard.program.copies import output_copies
from strideguard.program.promises import target_dim_orders
from strideguard.prove.proof import PROOF_KEY
from strideguard.prove.verification import compile_program

from . import tiers
from .conftest import needs_executorch
from .padding import ACTIONS, BATCH, TOKENS, VOCAB, export_heads, forced_pad_mm, heads_inputs

RECORDS_OUTPUT_STRIDES_AFTER_JOINT_PASSES = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14)
"""torch 2.13 records the strides an output must come back in after Inductor's joint-graph passes (``pad_mm``,
``fuse_attention``); 2.14 and later before them (``compile_fx_forward``), keeping only a view's stride order."""
SM87 = resolve_target("cuda:sm87", function="test")
SM90 = resolve_target("cuda", function="test")
NAMES = ["logits", "actions", "last"]
ROW_MAJOR = {
    "logits": (TOKENS * VOCAB, VOCAB, 1),
    "actions": (ACTIONS, 1),
    "last": (VOCAB, 1),
}


@pytest.fixture(scope="module")
def heads():
    return export_heads()


@pytest.fixture(scope="module")
def fixed(heads):
    """The heads fixed for Jetson Orin (both matmuls may be padded) and for an H100-class GPU."""
    return {
        "sm87": strideguard.densify_outputs(heads, exact=True, device="cuda:sm87"),
        "sm90": strideguard.densify_outputs(heads, exact=True, device="cuda"),
    }


@pytest.fixture(scope="module")
@tiers.needs("compiles", "lowers")
def compiled(heads, fixed, tmp_path_factory):
    """Each program compiled with AOTInductor on the CPU, with pad_mm forced and without, and run."""
    inputs = heads_inputs()
    results = {}
    for name, program in (("unfixed", heads), ("sm87", fixed["sm87"]), ("sm90", fixed["sm90"])):
        for forced in (True, False):
            directory = str(tmp_path_factory.mktemp(f"{name}-{'forced' if forced else 'plain'}"))
            with forced_pad_mm() if forced else contextlib.nullcontext():
                run = compile_program(program, directory)
            results[name, forced] = dict(zip(NAMES, (run(*inputs)[key] for key in NAMES)))
    return results


def _strides(outputs: dict) -> dict:
    return {name: (tuple(t.stride()), t.storage_offset()) for name, t in outputs.items()}


@pytest.mark.compiles
@pytest.mark.lowers
def test_forced_padding_is_the_failure_and_the_fix_for_the_device_holds_under_both_branches(compiled):
    unfixed = _strides(compiled["unfixed", True])
    # the failure, as a GPU whose benchmark says "pad" compiles it: the padded row strides come back
    assert unfixed["logits"] == ((TOKENS * 50264, 50264, 1), 0)
    assert unfixed["actions"] == ((16, 1), 0)
    assert _strides(compiled["unfixed", False])["logits"] == ((TOKENS * VOCAB, VOCAB, 1), 0)
    reference = compiled["unfixed", False]
    for forced in (True, False):
        for name in NAMES:
            got = compiled["sm87", forced][name]
            assert (tuple(got.stride()), got.storage_offset()) == (ROW_MAJOR[name], 0), (name, forced)
            assert torch.equal(got, reference[name]), (name, forced)
        # fixed for sm90, the logits hold under both branches; the action head is not compute-bound on any
        # sm90 device (the benchmark is never asked), so forcing pads it where no H100 would
        got = compiled["sm90", forced]["logits"]
        assert (tuple(got.stride()), got.storage_offset()) == (ROW_MAJOR["logits"], 0), forced
        assert torch.equal(got, reference["logits"])
    assert _strides(compiled["sm90", False])["actions"] == (ROW_MAJOR["actions"], 0)


@pytest.mark.lowers
def test_the_report_before_the_fix_names_pad_mm_as_the_decider(heads, caplog):
    with caplog.at_level(logging.INFO, logger="strideguard"):
        report = strideguard.inspect(heads, exact=True, device="cuda:sm87")
    by_name = {output.name: output for output in report.outputs}
    for name in ("logits", "actions"):
        output = by_name[name]
        assert output.in_target_layout is None and output.verdict == "the device's benchmark decides (pad_mm)"
        assert output.to_dict()["reason"] == "benchmark-decides"
        assert "[16, 1]" in output.explanation or "50264" in output.explanation
    # a row of the logits is strided under either branch: out of layout, not undecided
    assert by_name["last"].in_target_layout is False and by_name["last"].reason.value == "strided"
    assert "the device's benchmark decides (pad_mm)" in " ".join(str(report).split())
    assert "pad_mm pads" in caplog.text and "benchmark-decides" in caplog.text


@pytest.mark.lowers
def test_both_branches_are_lowered_only_where_the_benchmark_is_asked(heads):
    at_sm87 = lower_outputs(heads, target=SM87)
    decided = {str(decision.dtype) for decision in at_sm87.pad_decisions}
    assert len(at_sm87.pad_decisions) == 2 and decided == {"torch.bfloat16"}, at_sm87.pad_decisions
    logits, actions, last = at_sm87.outputs
    assert logits.benchmark_decides and set(logits.every_strides) == {ROW_MAJOR["logits"], (TOKENS * 50264, 50264, 1)}
    assert actions.benchmark_decides and set(actions.every_strides) == {(ACTIONS, 1), (16, 1)}
    # on sm90 only the compute-bound prefill reaches the benchmark; the action head is decided: never padded
    at_sm90 = lower_outputs(heads, target=SM90)
    assert [decision.shapes for decision in at_sm90.pad_decisions] == [((TOKENS, 256), (256, VOCAB))]
    assert not at_sm90.outputs[1].benchmark_decides and at_sm90.outputs[1].alternatives == ()
    # the CPU never pads, and is lowered once
    assert lower_outputs(heads).pad_decisions == ()


@pytest.mark.lowers
def test_the_fixed_program_is_proven_under_both_branches(fixed):
    for key, target in (("sm87", SM87), ("sm90", SM90)):
        program = fixed[key]
        proof = program.graph_module.meta[PROOF_KEY]
        assert proof.unproven == () and "lowered on fake tensors" in proof.target
        lowering = lower_outputs(program, target=target)
        assert lowering.pad_decisions, key  # both branches were lowered again
        for lowered, order in zip(lowering.outputs, target_dim_orders(program)):
            assert all(density.has_layout(lowered.shape, strides, order) is True for strides in lowered.every_strides)
    assert set(fixed["sm87"].graph_module.meta[PROOF_KEY].named(fixed["sm87"].graph_module.meta[PROOF_KEY].copied)) == set(NAMES)
    assert set(fixed["sm90"].graph_module.meta[PROOF_KEY].named(fixed["sm90"].graph_module.meta[PROOF_KEY].copied)) == {"logits", "last"}


@pytest.mark.lowers
def test_a_users_forced_padding_is_decided_not_undecided(heads):
    """``force_shape_pad`` in the options a program is compiled with pads before any benchmark: decided."""
    lowering = lower_outputs(heads, target=SM87, inductor_configs={"force_shape_pad": True})
    assert lowering.pad_decisions == ()
    assert lowering.outputs[1].strides == (16, 1) and lowering.outputs[1].alternatives == ()


HOLDS_OUTPUTS_TO_TRACED_STRIDES = hasattr(torch._inductor.config, "strict_output_strides")


@pytest.mark.skipif(not HOLDS_OUTPUTS_TO_TRACED_STRIDES, reason=(
    f"torch {torch.__version__} has no strict_output_strides (2.14 and later: lanes 2 and 2b run this)"))
@pytest.mark.compiles
@pytest.mark.lowers
def test_with_strict_output_strides_no_benchmark_reaches_a_returned_output(heads, tmp_path):
    """Torch 2.14+ with ``strict_output_strides`` returns every output, views included, in the strides recorded
    before ``pad_mm``: the padded products come back unpadded, from the graph alone, the lowering and a compile
    with padding forced; only the row of the logits, strided in any branch, is copied."""
    strict = {"strict_output_strides": True}
    with torch._inductor.config.patch(strict):
        for exact in (False, True):
            by_name = {output.name: output for output in strideguard.inspect(heads, exact=exact, device="cuda:sm87").outputs}
            assert [by_name[name].reason.value for name in NAMES] == ["in-layout", "in-layout", "strided"], exact
        with forced_pad_mm():
            run = compile_program(heads, str(tmp_path))
        got = run(*heads_inputs())
        for name in ("logits", "actions"):
            assert (tuple(got[name].stride()), got[name].storage_offset()) == (ROW_MAJOR[name], 0), name
    for fixed in (
        strideguard.densify_outputs(heads, device="cuda:sm87", inductor_configs=strict),
        strideguard.densify_outputs(heads, device="cuda:sm87", inductor_configs=strict, exact=True),
    ):
        returned = [node for node in fixed.graph.output_node().args[0]]
        copied = {NAMES[returned.index(node)] for node in output_copies(fixed.graph)}
        assert copied == {"last"}


def test_from_the_graph_alone_a_product_the_benchmark_may_pad_is_copied_and_what_reads_it_is_not(heads):
    class Consumed(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(256, ACTIONS)

        def forward(self, x):
            y = self.head(x)
            return y, torch.tanh(y), y[:, :7]

    program = torch.export.export(Consumed().to(torch.bfloat16), (torch.randn(BATCH, 256, dtype=torch.bfloat16),))
    assert set(laid_out_by_benchmark(graph_ops(program.graph), SM87)) == {"linear"}
    assert laid_out_by_benchmark(graph_ops(program.graph), SM90) == {}  # not compute-bound on any sm90 device
    assert laid_out_by_benchmark(graph_ops(program.graph), resolve_target("cpu", function="t")) == {}
    report = strideguard.inspect(program, device="cuda:sm87")
    reasons = [output.reason.value for output in report.outputs]
    assert reasons[0] == "benchmark-decides" and reasons[1] == "in-layout", reasons
    assert reasons[2] == "strided"  # out of layout whatever the device decides


@pytest.mark.lowers
def test_inductors_pad_cache_is_neither_read_nor_written(heads, monkeypatch, tmp_path):
    """The benchmark's answer is given, never looked up or recorded in the cache a real compile reads."""
    from torch._inductor.fx_passes import pad_mm

    touched = []
    monkeypatch.setattr(pad_mm, "set_cached_should_pad", lambda *args, **kwargs: touched.append(args))
    monkeypatch.setattr(pad_mm, "get_pad_cache", lambda: touched.append("cache") or pytest.fail("cache read"))
    lower_outputs(heads, target=SM87)
    assert touched == []
    assert os.environ.get("TORCHINDUCTOR_FORCE_SHAPE_PAD") is None


class ChannelsLastConvolutions(nn.Module):
    def __init__(self):
        super().__init__()
        self.plain = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.biased = nn.Conv2d(8, 16, 3, padding=1)

    def forward(self, x):
        return self.plain(x), self.biased(x), self.plain(x).mean((2, 3))


@pytest.mark.lowers
def test_a_convolutions_memory_format_is_cudnns_and_the_fix_holds_under_either():
    x = torch.randn(2, 8, 8, 8).to(memory_format=torch.channels_last)
    program = torch.export.export(ChannelsLastConvolutions().eval(), (x,))
    lowering = lower_outputs(program, target=SM90)
    contiguous, channels_last = (1024, 64, 8, 1), (1024, 1, 128, 16)
    if torch.backends.cudnn.is_available():  # a CUDA build asks cuDNN itself: channels-last, one lowering
        assert lowering.relaid_convolutions == () and lowering.outputs[0].strides == channels_last
    else:  # a build without cuDNN lowers its own answer and cuDNN's
        assert lowering.relaid_convolutions == ((2, 8, 8, 8),)
        assert set(lowering.outputs[0].every_strides) == {contiguous, channels_last}
        assert "cuDNN picks the memory format" in lowering.undecided
    report = strideguard.inspect(program, exact=True, device="cuda")
    assert [output.in_target_layout for output in report.outputs][0] is not True
    assert report.outputs[2].in_target_layout is True  # a mean of it is a fresh buffer either way
    fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
    for lowered, order in zip(lower_outputs(fixed, target=SM90).outputs, target_dim_orders(fixed)):
        assert all(density.has_layout(lowered.shape, strides, order) is True for strides in lowered.every_strides)


class WrittenOutAttention(nn.Module):
    """Attention as matmuls and a softmax with an additive mask: Inductor's ``fuse_attention`` puts an SDPA in
    its place, whose kernel on CUDA (efficient attention, for a mask in float16) lays its result out in
    ``(B, M, H, K)`` order, after strideguard's copy was traced."""

    def forward(self, q, k, v, mask):
        scores = (q @ k.transpose(-2, -1)) / 8.0 + mask
        return scores.softmax(dim=-1) @ v


@pytest.fixture(scope="module")
def written_out_attention():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 200, 64, generator=generator).half() for _ in range(3))
    mask = torch.randn(1, 1, 200, 200, generator=generator).half()
    return torch.export.export(WrittenOutAttention(), (q, k, v, mask)), (q, k, v, mask)


@pytest.mark.lowers
@pytest.mark.compiles
def test_an_attention_inductor_inserts_is_lowered_under_each_kernel_and_the_fix_holds(written_out_attention, tmp_path):
    from strideguard.program.copies import copy_form_of, CopyForm
    from strideguard.program.exported import output_values

    program, inputs = written_out_attention
    at_sm87 = lower_outputs(program, target=SM87)
    assert [choice.candidates for choice in at_sm87.kernel_choices] == [("efficient",)]
    contiguous = (51200, 12800, 64, 1)
    fixed = strideguard.densify_outputs(program, exact=True, device="cuda:sm87")
    proof = fixed.graph_module.meta[PROOF_KEY]
    if RECORDS_OUTPUT_STRIDES_AFTER_JOINT_PASSES:
        # torch 2.13 takes the inserted kernel's (B, M, H, K) memory as the output's own layout
        assert at_sm87.outputs[0].strides == (51200, 64, 256, 1)
        assert strideguard.inspect(program, exact=True, device="cuda:sm87").outputs[0].in_target_layout is False
        # the first copy's clone is dropped as a no-op before the attention is inserted; the pinned copy holds
        assert proof.strengthened == (0,) and copy_form_of(output_values(fixed.graph)[0]) == CopyForm.PINNED.value
    else:
        # torch 2.14 and later record the strides before the joint passes and copy into them themselves
        assert at_sm87.outputs[0].strides == contiguous and proof.copied == ()
    assert lower_outputs(fixed, target=SM87).outputs[0].every_strides == (contiguous,)
    run = compile_program(fixed, str(tmp_path / "fixed"))
    reference = compile_program(program, str(tmp_path / "unfixed"))(*inputs)
    got = run(*inputs)
    assert got.stride() == contiguous and torch.equal(got, reference)


def test_the_closed_loop_strengthens_a_copy_one_form_at_a_time():
    from strideguard.program.copies import CopyForm, stronger_form

    matrix, vector = torch.empty(2, 3), torch.empty(3)
    assert stronger_form(None, matrix) is CopyForm.KEPT
    assert stronger_form(CopyForm.CLONE.value, matrix) is CopyForm.KEPT
    assert stronger_form(CopyForm.KEPT.value, matrix) is CopyForm.PINNED
    assert stronger_form(CopyForm.PINNED.value, matrix) is None
    assert stronger_form(CopyForm.KEPT.value, vector) is None  # one dimension: nothing to reverse
    assert stronger_form(None, torch.empty(2, 3, dtype=torch.float8_e4m3fn)) is CopyForm.PINNED


@needs_executorch
@pytest.mark.lowers
def test_the_pinned_copy_passes_the_edge_verifier_and_lays_out_each_mode():
    """The pinned form in every dialect: the program's verifier accepts it and Inductor returns the target."""
    from strideguard.compiler.oracle.lowering import lower_edge_outputs
    from strideguard.decide.subject import subject_of
    from strideguard.fix.engine import with_stronger_copies
    from strideguard.program.copies import copy_form_of, CopyForm
    from strideguard.program.exported import output_values
    from strideguard.testing.executorch_cpu import aoti_edge_program

    class Sliced(nn.Module):
        def forward(self, x):
            return (x * 2)[:, :5].transpose(0, 1)

    exported = torch.export.export(Sliced(), (torch.randn(4, 8),))
    for program in (exported, aoti_edge_program(exported), aoti_edge_program(exported, skip_dim_order=True)):
        pinned = with_stronger_copies(program, subject_of(program, "test"), {0: CopyForm.PINNED})
        pinned.validate()
        assert copy_form_of(output_values(pinned.graph)[0]) == CopyForm.PINNED.value
        lowering = lower_edge_outputs(pinned, convert_views=lambda gm: None) if pinned.dialect == "EDGE" else lower_outputs(pinned)
        assert lowering.outputs[0].strides == (4, 1)
        assert torch.equal(pinned.module()(torch.ones(4, 8)), exported.module()(torch.ones(4, 8)))

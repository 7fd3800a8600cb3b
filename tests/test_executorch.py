"""ExecuTorch's real AOTI lowering path on the CPU, with and without strideguard.

``to_edge_transform_and_lower`` and ``AotiBackend.preprocess`` (ExecuTorch's own
``ReplaceViewCopyWithViewPass`` inside) run for real through a CPU twin of the
CUDA backend; each compiled delegate is loaded with torch's AOTI runner and run.
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch

pytest.importorskip("executorch", reason="needs ExecuTorch: pip install '.[executorch]'")

from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from executorch.exir.dialects._ops import ops
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

import strideguard
from strideguard import Action
from strideguard.program.dialect import aten_op
from strideguard.program.ops import is_view_op
from strideguard.executorch import DenseOutputsPass, ReplaceViewCopyWithViewPass, protect_partitioner
from strideguard.program.density import dim_order_of, has_layout
from strideguard.program.copies import copied_source, copy_form_of, CopyForm
from strideguard.program.copies import output_copies
from strideguard.testing.executorch_cpu import StrideguardCpuAotiBackend, lower_and_run

from bench.synthetic import export_view_heavy

from . import programs, tiers

ATTENTION_INPUT = (torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1)),)
NAMES = ["slice", "select_middle", "select_first", "split_chunk", "attention", "scores", "detach"]


class RecordProgram(ExportedProgramPassBase):
    """A transform pass that keeps the Edge program it is handed, as partitioning will see it."""

    def call(self, exported_program):
        self.program = exported_program
        return ExportedProgramPassResult(exported_program, False)


def promised_orders(edge_program) -> list[tuple[int, ...]]:
    returned = edge_program.graph.output_node().args[0]
    return [dim_order_of(n.meta["val"].shape, n.meta["val"].stride()) for n in returned]


def eager(program):
    with torch.no_grad():
        return program.module()(*ATTENTION_INPUT)


@pytest.fixture(scope="session")
@tiers.needs("compiles")
def without_strideguard(tmp_path_factory):
    record = RecordProgram()
    program = programs.export_attention_head(with_detach=False)
    run = lower_and_run(program, ATTENTION_INPUT, transform_passes=[record], workdir=str(tmp_path_factory.mktemp("plain")))
    return record.program, run


@pytest.fixture(scope="session")
@tiers.needs("compiles")
def with_dense_outputs_pass(tmp_path_factory):
    record = RecordProgram()
    program = programs.export_attention_head()
    run = lower_and_run(
        program, ATTENTION_INPUT, transform_passes=[DenseOutputsPass(), record], workdir=str(tmp_path_factory.mktemp("dense"))
    )
    return program, record.program, run


@pytest.mark.compiles
def test_without_strideguard_the_delegate_returns_views_with_their_base_strides(without_strideguard):
    edge_program, run = without_strideguard
    strides = [o.stride() for o in run.outputs]
    assert strides[0] == (192, 48, 1)  # qkv[..., :14]
    assert strides[1] == (192, 1)  # qkv[:, 1]
    assert strides[3] == (192, 48, 1) and run.outputs[3].storage_offset() == 32  # third split chunk
    out_of_layout = [
        i for i, (o, order) in enumerate(zip(run.outputs, promised_orders(edge_program)))
        if not has_layout(o.shape, o.stride(), order)
    ]
    assert out_of_layout == [0, 1, 3]


def test_inspect_of_the_edge_program_predicts_what_the_delegate_returns(without_strideguard):
    edge_program, run = without_strideguard
    report = strideguard.inspect(edge_program)
    assert [o.strides for o in report.outputs] == [o.stride() for o in run.outputs]
    assert [o.index for o in report.outputs if o.action is Action.COPY] == [0, 1, 3]
    assert report.outputs[3].cause == "chunk 2 of split(16, dim=-1) of linear"


@pytest.mark.compiles
def test_dense_outputs_pass_makes_every_delegate_output_dense_in_its_promised_order(with_dense_outputs_pass, without_strideguard):
    program, edge_program, run = with_dense_outputs_pass
    for i, (value, order) in enumerate(zip(run.outputs, promised_orders(edge_program))):
        assert has_layout(value.shape, value.stride(), order), NAMES[i]
    for i, (value, reference) in enumerate(zip(run.outputs, eager(program))):
        assert torch.allclose(value, reference, atol=1e-5), NAMES[i]
    plain_outputs = without_strideguard[1].outputs
    for i, (fixed, plain) in enumerate(zip(run.outputs, plain_outputs)):
        assert torch.equal(fixed, plain), NAMES[i]


def test_dense_outputs_pass_inserts_one_copy_per_output_out_of_layout_and_nothing_else(with_dense_outputs_pass):
    _, edge_program, _ = with_dense_outputs_pass
    returned = list(edge_program.graph.output_node().args[0])
    copies = output_copies(edge_program.graph)
    assert sorted(returned.index(c) for c in copies) == [0, 1, 3]
    # each in the form Inductor keeps (what it is made of is program/copies.py's to know), in the promised order
    assert all(copy_form_of(c) == CopyForm.KEPT.value for c in copies)
    assert all(c.meta["val"].is_contiguous() for c in copies)
    # The returned detach is a copy already (alias_copy, which Inductor lowers natively): not copied twice.
    detach = returned[6]
    assert detach.target == ops.edge.aten.alias_copy.default
    assert not any(n.target == ops.edge.aten.detach_copy.default for n in edge_program.graph.nodes)
    edge_program.validate()


@pytest.mark.compiles
def test_without_strideguard_a_returned_detach_cannot_be_lowered(tmp_path):
    with pytest.raises(Exception, match="detach_copy"):
        lower_and_run(programs.export_attention_head(), ATTENTION_INPUT, workdir=str(tmp_path))


@pytest.mark.compiles
def test_drop_in_view_pass_inside_preprocess_fixes_the_outputs(tmp_path, monkeypatch, with_dense_outputs_pass):
    monkeypatch.setattr(StrideguardCpuAotiBackend, "custom_passes", [ReplaceViewCopyWithViewPass()])
    program = programs.export_attention_head()
    record = RecordProgram()
    run = lower_and_run(program, ATTENTION_INPUT, transform_passes=[record], workdir=str(tmp_path))
    for i, (value, order) in enumerate(zip(run.outputs, promised_orders(record.program))):
        assert has_layout(value.shape, value.stride(), order), NAMES[i]
    for i, (value, reference) in enumerate(zip(run.outputs, with_dense_outputs_pass[2].outputs)):
        assert torch.equal(value, reference), NAMES[i]


class SplitAtFirstMul(Partitioner):
    """Test partitioner: ExecuTorch's AOTI partition cut in two at the first multiplication."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def partition(self, exported_program):
        result = self.inner.partition(exported_program)
        spec = next(iter(result.partition_tags.values()))
        second = False
        for node in exported_program.graph.nodes:
            if node.op == "call_function":
                second = second or "mul" in str(node.target)
                if second:
                    node.meta["delegation_tag"] = "second"
        return PartitionResult(result.tagged_exported_program, {**result.partition_tags, "second": spec})

    def ops_to_not_decompose(self, ep):
        return self.inner.ops_to_not_decompose(ep)


@pytest.mark.compiles
def test_a_view_crossing_delegates_corrupts_values_unless_the_partitioner_is_protected(tmp_path):
    program = programs.export_two_stages()
    x = torch.randn(2, 3, 16)
    expected = program.module()(x)
    plain = lower_and_run(program, (x,), partitioner_wrapper=SplitAtFirstMul, workdir=str(tmp_path / "plain"))
    delegates = [n for n in plain.edge_program.graph.nodes if n.op == "get_attr"]
    assert len(delegates) == 2
    assert not torch.allclose(plain.outputs[0], expected)

    protected_partitioner = []

    def protect(partitioner):
        protected_partitioner.append(protect_partitioner(SplitAtFirstMul(partitioner)))
        return protected_partitioner[0]

    protected = lower_and_run(program, (x,), partitioner_wrapper=protect, workdir=str(tmp_path / "protected"))
    assert len([n for n in protected.edge_program.graph.nodes if n.op == "get_attr"]) == 2
    assert protected_partitioner[0].moved == ["aten_slice_copy_tensor"]
    assert torch.allclose(protected.outputs[0], expected)


@pytest.mark.parametrize("skip_dim_order", [False, True])
def test_prepare_for_aoti_converts_views_copies_what_needs_it_and_validates(skip_dim_order):
    program = programs.export_attention_head()
    edge = to_edge(program, compile_config=EdgeCompileConfig(_skip_dim_order=skip_dim_order)).exported_program()
    prepared = strideguard.prepare_for_aoti(edge)
    prepared.validate()
    returned = list(prepared.graph.output_node().args[0])
    new = [n for n in prepared.graph.nodes if n.name not in {m.name for m in edge.graph.nodes}]
    # only copies were added, each whole, in ops this mode's verifier accepts (prepared.validate() above)
    assert new and all(copy_form_of(n) is not None for n in new)
    copied = sorted(returned.index(n) for n in output_copies(prepared.graph))
    # The slice and select, which ExecuTorch turns into views anyway, are copied; the split
    # chunk is copied only if its split became a view, else the split copy already writes it dense.
    chunk = returned[3]
    split_kept_a_copy = chunk.target is operator.getitem and "_copy" in str(chunk.args[0].target)
    assert copied == ([0, 1] if split_kept_a_copy else [0, 1, 3])
    # The slices feeding the score matmul became views and were not copied.
    slices = [n for n in prepared.graph.nodes if n.op == "call_function" and aten_op(n.target) is torch.ops.aten.slice.Tensor]
    copied_slices = [n for n in slices if any(copy_form_of(u) is not None for u in n.users)]
    assert len(slices) == 3 and copied_slices == [copied_source(returned[0])]
    # The transposed attention output keeps its promised (contiguous) order: it stays the one
    # copy that writes it, and gets no second one.
    attention = returned[4]
    assert aten_op(attention.target) in (torch.ops.aten.permute_copy.default, torch.ops.aten.transpose_copy.int)
    assert not any(n.op == "call_function" and n.target == ops.edge.aten.detach_copy.default for n in prepared.graph.nodes)
    with torch.no_grad():
        got = prepared.module()(*ATTENTION_INPUT)
        want = edge.module()(*ATTENTION_INPUT)
    for i, (value, reference, order) in enumerate(zip(got, want, promised_orders(edge))):
        assert has_layout(value.shape, value.stride(), order), NAMES[i]
        assert torch.equal(value, reference), NAMES[i]
    assert strideguard.inspect(prepared).ok


class OneChannelTwice(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        return y, y


@pytest.mark.parametrize("skip_dim_order", [False, True], ids=["dim-order", "memory-format"])
def test_an_output_promising_an_order_no_edge_copy_writes_is_copied_into_the_same_bytes(skip_dim_order):
    """ExecuTorch reads a channels-last value with one channel as dim order ``(0, 2, 1, 3)`` (ties in
    dimension order), which no copy op of an Edge program writes (``_clone_dim_order`` raised in the verifier,
    found by ``make fuzz``): the copy is contiguous, the same bytes in the same places, and promises its own
    order."""
    x = torch.randn(2, 1, 4, 4).to(memory_format=torch.channels_last)
    program = torch.export.export(OneChannelTwice(), (x,))
    edge = to_edge(program, compile_config=EdgeCompileConfig(_skip_dim_order=skip_dim_order)).exported_program()
    assert promised_orders(edge) == [(0, 2, 1, 3), (0, 2, 1, 3)]
    prepared = strideguard.prepare_for_aoti(edge)
    prepared.validate()
    copies = output_copies(prepared.graph)
    assert copies, "the second output shares the first one's memory: it needs a copy"
    for inserted in copies:
        assert copied_source(inserted) is not None
    orders = promised_orders(prepared)
    assert all(order == (0, 1, 2, 3) for order, node in zip(orders, prepared.graph.output_node().args[0]) if node in copies)
    with torch.no_grad():
        got = prepared.module()(x)
    for value, order in zip(got, orders):
        assert has_layout(value.shape, value.stride(), order), (value.stride(), order)
        assert torch.equal(value, x + 1)
    assert got[0].data_ptr() != got[1].data_ptr()


@pytest.mark.parametrize("channels", [1, 3])
def test_a_5d_channels_last_output_in_dim_order_mode_is_copied_into_the_same_bytes_or_refused(channels):
    """``_clone_dim_order`` takes no 5-D channels-last order: with one channel the copy is contiguous (the same
    bytes); with three there is no such order, and the copy is refused in one line naming the output (it was an
    ExecuTorch ``InternalError`` from the verifier before)."""
    x = torch.randn(2, channels, 3, 4, 4).to(memory_format=torch.channels_last_3d)
    edge = to_edge(torch.export.export(OneChannelTwice(), (x,))).exported_program()
    if channels == 3:
        with pytest.raises(ValueError, match=r"\[0\] promises dim order \[0, 2, 3, 4, 1\], and an Edge program's copy ops"):
            strideguard.prepare_for_aoti(edge)
        return
    prepared = strideguard.prepare_for_aoti(edge)
    prepared.validate()
    with torch.no_grad():
        got = prepared.module()(x)
    for value, order in zip(got, promised_orders(prepared)):
        assert has_layout(value.shape, value.stride(), order), (value.stride(), order)
    assert got[0].data_ptr() != got[1].data_ptr()


@pytest.mark.parametrize("skip_dim_order", [False, True], ids=["dim-order", "memory-format"])
def test_an_order_no_edge_copy_writes_is_refused_when_asked_for(skip_dim_order):
    x = torch.randn(2, 3, 4, 4)
    program = torch.export.export(OneChannelTwice(), (x,))
    edge = to_edge(program, compile_config=EdgeCompileConfig(_skip_dim_order=skip_dim_order)).exported_program()
    with pytest.raises(ValueError, match=r"layouts\[0\]: dim order \[0, 2, 1, 3\] is not one an Edge program's copy ops write"):
        strideguard.prepare_for_aoti(edge, layouts={0: (0, 2, 1, 3)})


@pytest.mark.compiles
@pytest.mark.lowers
def test_prepare_for_aoti_converts_more_than_executorch_and_compiles_dense():
    program = programs.export_attention_head()
    edge = to_edge(program).exported_program()
    prepared = strideguard.prepare_for_aoti(edge)
    views = {aten_op(n.target)._schema.name.split("::")[1] for n in prepared.graph.nodes if n.op == "call_function" and is_view_op(n.target)}
    assert {"slice", "select", "split_with_sizes", "view", "expand"} <= views
    report = strideguard.verify(prepared, ATTENTION_INPUT)
    assert report.ok, str(report)


class ReturnsTranspose(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).transpose(0, 1)


@pytest.mark.lowers
def test_the_installed_executorch_view_table_is_followed(monkeypatch):
    """strideguard asks the installed ExecuTorch which view copies its AOTI pass converts: a newer table that
    also converts ``transpose_copy`` makes the returned transpose a strided view, and strideguard follows."""
    from executorch.backends.aoti.passes import replace_view_copy_with_view as installed
    from executorch.exir.dialects._ops import ops as exir_ops

    from strideguard.compiler.oracle.lowering import lower_edge_outputs
    from strideguard.testing.executorch_cpu import aoti_edge_program

    torch.manual_seed(0)
    edge = aoti_edge_program(torch.export.export(ReturnsTranspose().eval(), (torch.randn(4, 8),)))
    [as_shipped] = strideguard.inspect(edge).outputs
    assert as_shipped.action is Action.NONE and as_shipped.strides == (4, 1)

    table = dict(installed._VIEW_TARGETS)
    table[exir_ops.edge.aten.transpose_copy.int] = exir_ops.edge.aten.transpose.int
    monkeypatch.setattr(installed, "_VIEW_TARGETS", table)
    [newer] = strideguard.inspect(edge).outputs
    assert newer.action is Action.COPY and newer.strides == (1, 8)
    [lowered] = lower_edge_outputs(edge).outputs
    assert lowered.strides == (1, 8), "Inductor, given the newer table, agrees"
    dense = DenseOutputsPass().call(edge).exported_program
    [fixed] = lower_edge_outputs(dense).outputs
    assert fixed.strides == (4, 1)


class ReshapedIntegerOfChannelsLast(torch.nn.Module):
    def forward(self, x):
        return (x + 1.5).to(torch.int32).reshape(-1, 4, 3, 1, 5).neg()


@pytest.mark.lowers
def test_compute_after_a_view_copy_of_a_channels_last_value_is_copied_as_inductor_lays_it_out():
    """``to(int32)`` of a channels-last input is a ``_to_dim_order_copy`` into channels-last, and the reshape a
    ``view_copy`` of it, traced contiguous. Inductor decomposes that ``view_copy`` into the view and a clone
    in the view's layout, and the ``neg`` reading it follows: the output came back ``(30, 1, 10, 10, 2)``
    where strideguard predicted it contiguous and copied nothing (found by ``make fuzz``, in a batch whose
    other part hid it)."""
    from strideguard.compiler.oracle.lowering import lower_edge_outputs

    x = torch.randn(3, 4, 3, 5).to(memory_format=torch.channels_last)
    edge = to_edge(torch.export.export(ReshapedIntegerOfChannelsLast(), (x,))).exported_program()
    untouched = lower_edge_outputs(edge).outputs[0]
    assert not has_layout(untouched.shape, untouched.strides, (0, 1, 2, 3, 4)), untouched.strides
    assert strideguard.inspect(edge).outputs[0].action is Action.COPY
    prepared = strideguard.prepare_for_aoti(edge)
    lowered = lower_edge_outputs(prepared).outputs[0]
    assert has_layout(lowered.shape, lowered.strides, (0, 1, 2, 3, 4)), lowered.strides
    with torch.no_grad():
        assert torch.equal(prepared.module()(x), ReshapedIntegerOfChannelsLast()(x))


@pytest.mark.parametrize("export", [programs.export_attention_head, lambda: export_view_heavy(200)], ids=["attention", "view-heavy"])
def test_the_drop_in_leaves_a_well_formed_graph_that_computes_the_same_values(export):
    """The drop-in rewrites the graph it is handed without linting it (a tenth of a small graph's pass): here
    its result lints, keeps the signature naming what the graph returns, and computes bit for bit what the
    Edge program did, its copies included."""
    from strideguard.testing.executorch_cpu import aoti_edge_program

    edge = aoti_edge_program(export())
    inputs = tuple(torch.randn(v.shape, generator=torch.Generator().manual_seed(3)) for v in edge.example_inputs[0])
    with torch.no_grad():
        expected = edge.module()(*inputs)
    program = copy.copy(edge)
    program._graph_module = copy.deepcopy(edge.graph_module)
    result = ReplaceViewCopyWithViewPass()(program)
    assert result.modified
    program.graph.lint()
    returned = list(program.graph.output_node().args[0])
    assert [spec.arg.name for spec in program.graph_signature.output_specs] == [node.name for node in returned]
    assert output_copies(program.graph), "the drop-in copied no output of a program with strided ones"
    for node in program.graph.nodes:  # the involutions share the clone's tensor_meta: it must be theirs too
        meta, value = node.meta.get("tensor_meta"), node.meta.get("val")
        if meta is not None and isinstance(value, torch.Tensor):
            assert (meta.shape, meta.stride, meta.dtype) == (value.shape, value.stride(), value.dtype), node.name
    with torch.no_grad():
        found = program.module()(*inputs)
    for index, (value, reference) in enumerate(zip(found, expected)):
        assert torch.equal(value, reference), f"output {index}"


class ConvOfChannelsLastSlice(torch.nn.Module):
    """A slice of a channels-last input feeding a convolution (the generated tests' finding): as a view it
    reaches the convolution with gaps, and the convolution rounds otherwise than of its dense copy."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 3, 1)

    def forward(self, x):
        return self.conv(x[:, :, 1:5]), x[:, :, 1:5] * 2


@pytest.mark.parametrize("export, converts_more, prepare_keeps", [
    (lambda: torch.export.export(
        ConvOfChannelsLastSlice().eval(), (torch.randn(3, 4, 6, 2).to(memory_format=torch.channels_last),)
    ), False, True),
    (lambda: export_view_heavy(200), True, False),
], ids=["conv-of-channels-last-slice", "view-heavy"])
def test_the_drop_in_converts_everything_executorchs_pass_converts(export, converts_more, prepare_keeps):
    """Standing in for ExecuTorch's view pass, the drop-in makes every conversion that pass makes, as it makes
    it, and more where there is more; ``prepare_for_aoti``, whose program is handed back (and converted by
    that pass later, in ``preprocess``), converts one early only where compute reads the view as it read the
    copy: not the slice a convolution reads with gaps."""
    from executorch.backends.aoti.passes.replace_view_copy_with_view import ReplaceViewCopyWithViewPass as ExecuTorchPass
    from strideguard.testing.executorch_cpu import aoti_edge_program

    edge = aoti_edge_program(export())
    original = {node.name: node.target for node in edge.graph.nodes}
    by_executorch = copy.deepcopy(edge.graph_module)
    ExecuTorchPass()(by_executorch)
    converted = {node.name: node.target for node in by_executorch.graph.nodes if node.target != original.get(node.name)}
    assert converted, "ExecuTorch's pass converted nothing: nothing to compare"

    program = copy.copy(edge)
    program._graph_module = copy.deepcopy(edge.graph_module)
    ReplaceViewCopyWithViewPass()(program)
    by_drop_in = {node.name: node.target for node in program.graph.nodes}
    assert {name: by_drop_in.get(name) for name in converted} == converted
    more = [name for name, target in by_drop_in.items() if target != original.get(name, target) and name not in converted]
    assert bool(more) == converts_more, more

    prepared = {node.name: node.target for node in strideguard.prepare_for_aoti(edge).graph.nodes}
    kept = [name for name in converted if prepared.get(name) == original[name]]
    assert bool(kept) == prepare_keeps, kept

"""Pushdown: returned pieces computed from pieces of their producers, compiled, run and compared.

One program returns a piece of every kind the rules cover (and three that
must not move); it is compiled once unfixed and once pushed down, and
``verify(..., reference=...)`` compares the two. The Edge path is checked
eagerly in both dim-order modes, validated.
"""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.utils import _pytree as pytree

import strideguard
from strideguard.decide.pushdown import graph_flops
from strideguard.prove.verification import PUSHDOWN_TOLERANCE, check_compiled

from . import generated
from .conftest import _compile, needs_executorch
from .generated import computations_left_unread, edge_program, snapshot

BATCH, POSITIONS, HIDDEN, VOCAB = 2, 6, 32, 300


class RMSNorm(torch.nn.Module):
    """As Llama writes it: a mean over the hidden size, never over positions."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(size) + 0.5)

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + 1e-6))


class Pieces(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, HIDDEN)
        self.norm = RMSNorm(HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, 64)
        self.head = torch.nn.Linear(64, VOCAB, bias=False)
        self.policy = torch.nn.Linear(HIDDEN, 16)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.heads = torch.nn.Linear(HIDDEN, 4 * 8)
        self.left, self.right = torch.nn.Linear(HIDDEN, 8), torch.nn.Linear(HIDDEN, 8)
        self.layer_norm = torch.nn.LayerNorm(HIDDEN)
        self.mix = torch.nn.Parameter(torch.randn(HIDDEN, 12))
        self.scores = torch.nn.Linear(HIDDEN, 10)
        self.shared = torch.nn.Linear(HIDDEN, 10)

    def forward(self, ids, x):
        logits = self.head(torch.relu(self.up(self.norm(self.embed(ids)))))
        h, shared = self.embed(ids), self.shared(x)
        return (
            logits[:, -1, :],                                               # 0 select through head, relu, up, norm, embedding
            self.policy(x)[..., :14],                                       # 1 slice of a linear's columns
            self.qkv(x).chunk(3, dim=-1)[2],                                # 2 a chunk, the others unread
            torch.matmul(x, self.mix)[:, 1:5],                              # 3 matmul rows
            torch.softmax(self.scores(x), -1)[:, 2],                        # 4 softmax over another dimension
            self.heads(x).view(BATCH, POSITIONS, 4, 8)[:, :, 1],            # 5 a head of a reshaped linear
            torch.cat([self.left(x), self.right(x)], -1)[..., 9:12],        # 6 a cat whose piece is in one input
            (self.layer_norm(h).to(torch.float64) * 2).narrow(1, 3, 2),     # 7 narrow through a type change and a norm
            torch.softmax(self.scores(x), -1)[..., :3],                     # 8 stops: softmax over the cut dimension
            shared[:, -1], shared.mean(),                                   # 9 stops: the full value is read elsewhere
        )


def inputs():
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, 100, (BATCH, POSITIONS), generator=generator),
            torch.randn(BATCH, POSITIONS, HIDDEN, generator=generator))


PUSHED = range(8)
STOPPED = (8, 9)


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    return torch.export.export(Pieces().eval(), inputs())


def test_inspect_says_how_far_each_piece_moves_and_what_it_saves(program):
    report = strideguard.inspect(program)
    for index in PUSHED:
        output = report.outputs[index]
        assert output.pushdown and 0 < output.flops_saved < 1, (index, output)
    for index in STOPPED:
        assert report.outputs[index].pushdown is None, report.outputs[index]
    first = report.outputs[0]
    assert first.pushdown == "select(dim=1, -1) pushed through linear, relu, linear, mul, mul, rsqrt, add, mean, pow into embedding"
    # head and up are 300x64 and 64x32 GEMMs over 6 positions, of which one is kept
    assert first.flops_saved > 0.8
    assert "with pushdown: select(dim=1, -1)" in str(report)


@pytest.mark.lowers
def test_pushdown_lands_dense_with_fewer_flops_and_leaves_the_input_alone(program):
    before = snapshot(program)
    pushed = strideguard.densify_outputs(program, pushdown=True)
    assert snapshot(program) == before
    assert set(pushed.state_dict) == set(program.state_dict)
    for name, tensor in program.state_dict.items():
        assert pushed.state_dict[name] is tensor, name
    report = strideguard.inspect(pushed, exact=True)
    for index in PUSHED:
        assert report.outputs[index].ok and report.outputs[index].action.value == "none", report.outputs[index]
    assert report.ok
    assert graph_flops(pushed.graph) < graph_flops(strideguard.densify_outputs(program).graph)
    for want, got in zip(program.module()(*inputs()), pushed.module()(*inputs())):
        torch.testing.assert_close(got, want, rtol=PUSHDOWN_TOLERANCE[0], atol=PUSHDOWN_TOLERANCE[1])


def test_a_pushed_down_program_keeps_no_full_size_node_that_feeds_nothing(program):
    pushed = strideguard.densify_outputs(program, pushdown=True)
    assert any("strideguard_pushdown" in n.meta.get("custom", {}) for n in pushed.graph.nodes)
    left = computations_left_unread(program.graph, pushed.graph)
    assert not left, f"pushdown left nodes that feed nothing: {left}"


def test_a_full_size_cat_goes_with_its_type_check_when_the_piece_stands_aside_from_it():
    """torch 2.14's export checks the dtype of a ``to``'s input (``_assert_tensor_metadata``). When the
    returned piece lies in one input of a ``cat``, the ``cat`` stands aside; its check must not keep the
    full-size ``cat`` alive (found by the generated pushdown oracle on torch 2.14.1)."""

    class CatThenPiece(torch.nn.Module):
        def forward(self, x):
            return (torch.cat([x, x + 1]).to(torch.float16) * 0.5)[2:4]

    x = torch.randn(2, 3)
    program = torch.export.export(CatThenPiece(), (x,))
    cat = next(n for n in program.graph.nodes if n.target is torch.ops.aten.cat.default)
    if not any(u.target is torch.ops.aten._assert_tensor_metadata.default for u in cat.users):
        with program.graph.inserting_after(cat):
            program.graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (cat,), {"dtype": torch.float32})
        program.graph_module.recompile()
    pushed = strideguard.densify_outputs(program, pushdown=True)
    targets = [n.target for n in pushed.graph.nodes]
    assert any("strideguard_pushdown" in n.meta.get("custom", {}) for n in pushed.graph.nodes)
    assert torch.ops.aten.cat.default not in targets and torch.ops.aten._assert_tensor_metadata.default not in targets
    torch.testing.assert_close(pushed.module()(x), program.module()(x), rtol=0, atol=0)


def test_a_full_size_value_goes_with_a_dropout_outside_training_that_reads_it():
    """A Hugging Face decoder's export keeps ``dropout(p=0.0, train=False)`` after its attention. FX
    counts a seeded op impure, so the full-size values it read stayed (17 nodes on the zoo's Qwen2
    prefill); outside training it draws nothing and goes with them. A dropout in training stays."""

    class ProjectThenLast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(8, 12)

        def forward(self, x):
            hidden = torch.ops.aten.dropout.default(torch.relu(x), 0.0, False)
            return self.head(hidden)[:, -1, :]

    x = torch.randn(2, 5, 8)
    program = torch.export.export(ProjectThenLast().eval(), (x,))
    assert any(n.target is torch.ops.aten.dropout.default for n in program.graph.nodes)
    pushed = strideguard.densify_outputs(program, pushdown=True)
    assert any("strideguard_pushdown" in n.meta.get("custom", {}) for n in pushed.graph.nodes)
    left = computations_left_unread(program.graph, pushed.graph)
    assert not left, f"pushdown left nodes that feed nothing: {left}"
    torch.testing.assert_close(pushed.module()(x), program.module()(x), rtol=PUSHDOWN_TOLERANCE[0], atol=PUSHDOWN_TOLERANCE[1])


def test_without_pushdown_nothing_moves(program):
    fixed = strideguard.densify_outputs(program)
    assert not any("strideguard_pushdown" in n.meta.get("custom", {}) for n in fixed.graph.nodes)
    assert graph_flops(fixed.graph) >= graph_flops(program.graph)


@pytest.mark.compiles
def test_compiled_pushdown_is_dense_and_within_tolerance_of_the_unfixed_program(program, compile_dir):
    pushed = strideguard.densify_outputs(program, pushdown=True)
    unfixed = _compile(program, compile_dir, "pushdown-unfixed")
    compiled = _compile(pushed, compile_dir, "pushdown-pushed")
    report = check_compiled(pushed, compiled.run, inputs(), reference=unfixed.run, tolerance=PUSHDOWN_TOLERANCE)
    assert report.ok, report.outputs
    for check in report.outputs:
        assert check.kind != "tensor" or check.in_target_layout, check
        assert check.reference_error is not None and check.reference_error <= 1e-4, check
    for index in STOPPED:
        # untouched by pushdown: only the output copy, bitwise
        assert report.outputs[index].reference_error == 0.0, report.outputs[index]
    strict = check_compiled(pushed, compiled.run, inputs(), reference=unfixed.run, tolerance=(0.0, 0.0))
    for check in strict.outputs:
        if check.reference_error is not None:
            # No tolerance: an output matches exactly when it is bitwise the unfixed program's.
            assert check.match == (check.reference_error == 0.0), check


@needs_executorch
@pytest.mark.parametrize("skip_dim_order", [False, True], ids=["dim-order", "memory-format"])
def test_edge_pushdown_validates_and_keeps_values(program, skip_dim_order):
    edge = edge_program(program, skip_dim_order=skip_dim_order)
    before = snapshot(edge)
    prepared = strideguard.prepare_for_aoti(edge, pushdown=True)
    prepared.validate()
    assert snapshot(edge) == before
    assert any("strideguard_pushdown" in n.meta.get("custom", {}) for n in prepared.graph.nodes)
    assert strideguard.inspect(prepared).ok
    for want, got in zip(edge.module()(*inputs()), prepared.module()(*inputs())):
        torch.testing.assert_close(got, want, rtol=PUSHDOWN_TOLERANCE[0], atol=PUSHDOWN_TOLERANCE[1])
        assert got.is_contiguous()


@needs_executorch
@pytest.mark.lowers
def test_the_executorch_pass_pushes_down_when_asked(program):
    from strideguard.executorch import DenseOutputsPass

    edge = edge_program(program, skip_dim_order=False)
    result = DenseOutputsPass(pushdown=True)(edge)
    assert result.modified
    assert graph_flops(result.exported_program.graph) < graph_flops(edge.graph)
    result.exported_program.validate()
    # every output in its promised layout by the lowering, and the values within the pushdown's tolerance
    assert strideguard.inspect(result.exported_program, exact=True).ok
    expected = pytree.tree_leaves(edge.module()(*inputs()))
    got = pytree.tree_leaves(result.exported_program.module()(*inputs()))
    assert len(got) == len(expected)
    for before, after in zip(expected, got):
        torch.testing.assert_close(after, before, rtol=PUSHDOWN_TOLERANCE[0], atol=PUSHDOWN_TOLERANCE[1])


@pytest.mark.lowers
def test_dynamic_batch_pushes_along_other_dimensions():
    model = Pieces().eval()

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model.head(torch.relu(self.model.up(self.model.embed(ids))))[:, -1, :]

    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Head(), (inputs()[0],), dynamic_shapes=({0: batch},))
    assert strideguard.inspect(program).outputs[0].pushdown
    pushed = strideguard.densify_outputs(program, pushdown=True)
    assert strideguard.inspect(pushed, exact=True).ok
    for size in (1, 5):
        ids = torch.randint(0, 100, (size, POSITIONS))
        torch.testing.assert_close(pushed.module()(ids), program.module()(ids), rtol=1e-4, atol=1e-5)


def test_verify_refuses_a_tolerance_that_is_not_a_pair(program):
    with pytest.raises(TypeError, match="tolerance"):
        strideguard.verify(program, reference=program, tolerance=1e-3)


def test_a_reference_difference_is_judged_by_the_tolerance_given():
    from strideguard.prove.verification import OutputCheck, _against_reference

    reference = torch.linspace(-1, 1, 64)
    nudged = reference + 1e-6
    check = OutputCheck(**{**{f: None for f in OutputCheck.__dataclass_fields__}, "index": 0, "match": True})
    (tight,) = _against_reference((check,), nudged, reference, (0.0, 0.0))
    (loose,) = _against_reference((check,), nudged, reference, PUSHDOWN_TOLERANCE)
    (same,) = _against_reference((check,), reference.clone(), reference, (0.0, 0.0))
    assert tight.reference_error == loose.reference_error == pytest.approx(1e-6, rel=0.1)
    assert (tight.match, loose.match, same.match) == (False, True, True)


# ---------------------------------------------------------------------------------------------
# Symbolic sizes: a dynamic batch, and values made by factories of the batch's size


def bare_symbols(program) -> list[tuple[str, object]]:
    """Symbolic values stored in a node's arguments as values rather than read from a size node: the
    generated code then names a symbol (``full((s10, 8, 0), 0)``) it never defines."""
    return [
        (node.format_node(), leaf)
        for node in program.graph.nodes
        for leaf in pytree.tree_leaves((node.args, node.kwargs))
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Basic))
    ]


class Factories(torch.nn.Module):
    """Returned pieces of values built with ``full``, ``zeros``, ``new_zeros``, ``new_ones``, ``ones`` and
    ``full_like`` of the batch's (symbolic) size, as a KV cache or a padding is. (No ``split`` or
    ``chunk``: ExecuTorch's AOTI path specializes the batch of a program that splits.)"""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, 16)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)

    def forward(self, x):
        batch = x.shape[0]
        return (
            torch.cat([self.up(x), torch.zeros(batch, POSITIONS, 0)], -1)[..., :5],        # 0 an empty padding
            (torch.full((batch, POSITIONS, HIDDEN), 0.5) * torch.relu(x))[:, 1:5],         # 1 a full of the batch
            torch.cat([x.new_zeros(batch, 2, HIDDEN), self.proj(x)], 1)[:, -1],             # 2 a KV cache's update
            (self.proj(x) + torch.ones(batch, 1, HIDDEN))[..., 3:9],                        # 3 a broadcast ones
            (self.proj(x) - torch.full_like(x, 2.0)).narrow(1, 2, 3),                       # 4 full_like
            (self.qkv(x) * x.new_ones(batch, POSITIONS, 3 * HIDDEN))[..., HIDDEN:2 * HIDDEN],  # 5 new_ones
            (torch.zeros(1, 1, HIDDEN).expand(batch, POSITIONS, HIDDEN) + self.proj(x))[:, :, :7],  # 6 an expand
        )


FACTORY_PUSHED = (0, 2, 3, 4, 5, 6)
"""The outputs pushdown moves into a producer (1's region is only its mul, of full and relu, each sliced)."""


def _factories_program():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=2, max=64)
    # Exported at a batch of 3: ``to_edge`` specializes a batch exported at its minimum (2).
    return torch.export.export(Factories().eval(), (torch.randn(3, POSITIONS, HIDDEN),), dynamic_shapes=({0: batch},))


def _assert_runs_like(pushed, original, sizes=(3, 7)):
    for size in sizes:
        x = torch.randn(size, POSITIONS, HIDDEN)
        for want, got in zip(original.module()(x), pushed.module()(x)):
            assert got.shape == want.shape and got.shape[0] == size
            torch.testing.assert_close(got, want, rtol=PUSHDOWN_TOLERANCE[0], atol=PUSHDOWN_TOLERANCE[1])


@pytest.mark.lowers
def test_dynamic_batch_factories_push_down_with_sizes_read_from_size_nodes():
    program = _factories_program()
    report = strideguard.inspect(program)
    for index in FACTORY_PUSHED:
        assert report.outputs[index].pushdown, report.outputs[index]
    pushed = strideguard.densify_outputs(program, pushdown=True)
    pushed.validate()
    assert not bare_symbols(pushed), bare_symbols(pushed)
    assert strideguard.inspect(pushed, exact=True).ok
    _assert_runs_like(pushed, program)


@needs_executorch
@pytest.mark.parametrize("skip_dim_order", [False, True], ids=["dim-order", "memory-format"])
def test_dynamic_batch_factories_push_down_on_edge_with_sizes_read_from_size_nodes(skip_dim_order):
    edge = edge_program(_factories_program(), skip_dim_order=skip_dim_order)
    assert generated.keeps_dynamic_batch(edge)
    prepared = strideguard.prepare_for_aoti(edge, pushdown=True)
    prepared.validate()
    assert any("strideguard_pushdown" in n.meta.get("custom", {}) for n in prepared.graph.nodes)
    assert not bare_symbols(prepared), bare_symbols(prepared)
    _assert_runs_like(prepared, edge)


EMPTY_CAT = generated.ProgramSpec(
    inputs=(generated.TensorSpec((3, 8, 0), "float32"),),
    weights=(),
    values=(generated.ValueSpec(("input", 0), (
        generated.Step("cat", ("empty", -1)), generated.Step("squeeze", (-1,)), generated.Step("add", (1.5,)),
        generated.Step("slice", (1, 1, 7, 1)),
    )),),
    outputs=(("value", 0),),
    dynamic_batch=True,
)
"""What the 25-minute fuzz found, as the generator writes it: a ``cat`` of empty tensors only, of a dynamic
batch. ExecuTorch's ``PruneEmptyTensorsPass`` (in ``to_edge``) replaces it with
``full(tuple(cat.meta["val"].shape), 0)``: the batch's SymInt stored in the arguments, so that the Edge
program calls ``full((s10, 8, 0), 0)`` and cannot run, before strideguard sees it."""


@needs_executorch
@pytest.mark.lowers
def test_an_edge_program_that_cannot_run_untouched_is_set_aside_and_pushdown_adds_no_bare_symbol():
    edge = edge_program(generated.export_program(EMPTY_CAT), skip_dim_order=False)
    prepared = strideguard.prepare_for_aoti(edge, pushdown=True)
    # Whatever the input holds, the pushdown writes no symbolic value of its own.
    new = {name for name, _ in bare_symbols(prepared)} - {name for name, _ in bare_symbols(edge)}
    assert not new, new
    # The oracle sets aside what ExecuTorch cannot run untouched, as check_batch does, instead of raising.
    assert not generated.check_pushdown([EMPTY_CAT]).problems
    assert not generated.check_batch([EMPTY_CAT]).problems

"""Pushdown: returned pieces computed from pieces of their producers, compiled, run and compared.

One program returns a piece of every kind the rules cover (and three that
must not move); it is compiled once unfixed and once pushed down, and
``verify(..., reference=...)`` compares the two. The Edge path is checked
eagerly in both dim-order modes, validated.
"""

from __future__ import annotations

import pytest
import torch

import strideguard
from strideguard.pushdown import graph_flops
from strideguard.verify import PUSHDOWN_TOLERANCE, check_compiled

from .conftest import _compile
from .generated import edge_program, snapshot

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


def test_without_pushdown_nothing_moves(program):
    fixed = strideguard.densify_outputs(program)
    assert not any("strideguard_pushdown" in n.meta.get("custom", {}) for n in fixed.graph.nodes)
    assert graph_flops(fixed.graph) >= graph_flops(program.graph)


@pytest.mark.aoti
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
    assert [c.reference_error for c in strict.outputs] == [c.reference_error for c in report.outputs]


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


def test_the_executorch_pass_pushes_down_when_asked(program):
    from strideguard.executorch import DenseOutputsPass

    edge = edge_program(program, skip_dim_order=False)
    result = DenseOutputsPass(pushdown=True)(edge)
    assert result.modified
    assert graph_flops(result.exported_program.graph) < graph_flops(edge.graph)
    result.exported_program.validate()


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


def test_verify_takes_a_reference_and_checks_its_tolerance(program):
    with pytest.raises(TypeError, match="tolerance"):
        strideguard.verify(program, reference=program, tolerance=1e-3)

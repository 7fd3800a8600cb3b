"""The CPU twin of ExecuTorch's AOTI backend on programs shaped like real policies.

Each test lowers a real program with ``lower_and_run`` (ExecuTorch's
``to_edge_transform_and_lower`` and ``AotiBackend.preprocess``, compiled by
AOTInductor) and runs the compiled delegate with torch's AOTI runner: lifted
tensor constants and weights reach the delegate, the caller's program is left
as it was, and a method may return ``None``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch", reason="needs ExecuTorch: pip install '.[executorch]'")

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult  # noqa: E402

from strideguard.testing.executorch_cpu import aoti_edge_program, lower_and_run  # noqa: E402


class Policy(torch.nn.Module):
    """A weight, a persistent and a non-persistent buffer, and a lifted tensor constant.

    The constant is 2-D, so Inductor keeps it as a constant of the .so (it inlines
    1-D constants of up to 8 elements), named after its own tracing
    (``_tensor_constant0``), not the program's (``lifted_tensor_0``).
    """

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 6)
        self.register_buffer("scale", torch.tensor([[0.5, 1.5, 2.5, 3.5]]))
        self.register_buffer("shift", torch.tensor([[1.0, -1.0, 2.0, -2.0]]), persistent=False)

    def forward(self, x):
        offset = x * self.scale + torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
        return self.linear(x)[..., :3], offset + self.shift


class NoneOutputs(torch.nn.Module):
    def forward(self, x):
        return None, x[:, :2], None, x * 2


def _input() -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


def _policy() -> Policy:
    torch.manual_seed(0)
    return Policy().eval()


def _assert_holds_the_same(mapping: dict, snapshot: dict) -> None:
    """The same names, in the same order, each for the very same object."""
    assert list(mapping) == list(snapshot)
    assert all(mapping[name] is value for name, value in snapshot.items())


class _Record(ExportedProgramPassBase):
    """A transform pass that changes nothing (the next test lowers with none)."""

    def call(self, exported_program):
        self.program = exported_program
        return ExportedProgramPassResult(exported_program, False)


@pytest.mark.compiles
def test_lifted_constant_and_weights_reach_the_delegate(tmp_path):
    x = _input()
    module = _policy()
    program = torch.export.export(module, (x,))
    assert sorted(program.constants) == ["lifted_tensor_0", "shift"]

    run = lower_and_run(program, (x,), transform_passes=[_Record()], workdir=str(tmp_path))

    expected = module(x)
    assert len(run.outputs) == len(expected)
    for got, want in zip(run.outputs, expected):
        torch.testing.assert_close(got, want)
    # The returned slice comes back as the delegate laid it out: a view into the
    # (2, 6) linear output, as eager has it, not a dense (2, 3) tensor.
    assert run.outputs[0].shape == (2, 3)
    assert run.outputs[0].stride() == (6, 1)
    assert run.outputs[1].stride() == (4, 1)


@pytest.mark.compiles
def test_lowering_leaves_the_callers_program_as_it_was(tmp_path):
    x = _input()
    module = _policy()
    program = torch.export.export(module, (x,))
    constants = dict(program.constants)
    state_dict = dict(program.state_dict)
    code = program.graph_module.code
    nodes = list(program.graph.nodes)
    signature = str(program.graph_signature)

    # No transform pass: the case in which ExecuTorch used to pop the lifted
    # constant and the non-persistent buffer out of the caller's dict.
    run = lower_and_run(program, (x,), workdir=str(tmp_path))

    _assert_holds_the_same(program.constants, constants)
    _assert_holds_the_same(program.state_dict, state_dict)
    assert program.graph_module.code == code
    assert list(program.graph.nodes) == nodes
    assert str(program.graph_signature) == signature
    expected = module(x)
    for got, want in zip(program.module()(x), expected):
        assert torch.equal(got, want)
    for got, want in zip(run.outputs, expected):
        torch.testing.assert_close(got, want)


def test_the_edge_program_has_containers_of_its_own():
    x = _input()
    module = _policy()
    program = torch.export.export(module, (x,))
    constants = dict(program.constants)
    state_dict = dict(program.state_dict)

    edge = aoti_edge_program(program)

    assert edge.constants is not program.constants
    assert edge.state_dict is not program.state_dict
    edge.constants.clear()
    edge.state_dict.clear()
    _assert_holds_the_same(program.constants, constants)
    _assert_holds_the_same(program.state_dict, state_dict)
    for got, want in zip(program.module()(x), module(x)):
        assert torch.equal(got, want)


@pytest.mark.compiles
def test_none_outputs_keep_their_places(tmp_path):
    x = _input()
    module = NoneOutputs()
    program = torch.export.export(module, (x,))

    run = lower_and_run(program, (x,), workdir=str(tmp_path))

    expected = module(x)
    assert len(run.outputs) == 4
    assert run.outputs[0] is None and run.outputs[2] is None
    assert torch.equal(run.outputs[1], expected[1])
    assert torch.equal(run.outputs[3], expected[3])

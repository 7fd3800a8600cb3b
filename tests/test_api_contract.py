"""The API refuses what it cannot mean, and a new program never shares a mutable container with its input."""

from __future__ import annotations

import pytest
import torch

import strideguard

from .conftest import needs_executorch


def _executorch():
    import strideguard.executorch

    return strideguard.executorch


class Sliced(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("table", torch.arange(6.0))

    def forward(self, x):
        return self.lin(x)[:, :5] + self.table[:5]


@pytest.fixture(scope="module")
def program():
    return torch.export.export(Sliced().eval(), (torch.randn(2, 8),))


def test_a_new_program_shares_tensors_not_dicts(program):
    fixed = strideguard.densify_outputs(program)
    assert fixed.state_dict is not program.state_dict and fixed.constants is not program.constants
    for name, tensor in program.state_dict.items():
        assert fixed.state_dict[name] is tensor
    fixed.state_dict["lin.weight"] = torch.zeros(8, 8)
    fixed.state_dict["new"] = torch.zeros(1)
    fixed.constants["added"] = torch.zeros(1)
    assert program.state_dict["lin.weight"].abs().sum() > 0
    assert "new" not in program.state_dict and "added" not in program.constants
    assert fixed.verifiers is not program.verifiers or not isinstance(program.verifiers, list)


@pytest.mark.parametrize("call", [
    lambda p: strideguard.densify_outputs(p, break_aliases="no"),
    lambda p: strideguard.densify_outputs(p, exact=1),
    lambda p: strideguard.prepare_for_aoti(p, copy_outputs=None),
    lambda p: strideguard.inspect(p, exact="yes"),
    lambda p: strideguard.inspect(p, policy="strideguard"),
    pytest.param(lambda p: _executorch().DenseOutputsPass(break_aliases="no"), marks=needs_executorch),
    pytest.param(lambda p: _executorch().ReplaceViewCopyWithViewPass(copy_outputs=0), marks=needs_executorch),
    lambda p: strideguard.verify(p, more_inputs=torch.randn(2, 8)),
    lambda p: strideguard.densify_outputs(p.module()),
])
def test_wrong_argument_types_raise_type_error(program, call):
    with pytest.raises(TypeError, match="strideguard"):
        call(program)


def test_an_unknown_device_raises_value_error_before_compiling(program):
    with pytest.raises(ValueError, match="device must be one of cpu, cuda, got 'tpu'"):
        strideguard.verify(program, device="tpu")


@needs_executorch
def test_protect_partitioner_checks_its_flag():
    from strideguard.testing.executorch_cpu import make_partitioner

    with pytest.raises(TypeError, match="copy_outputs"):
        _executorch().protect_partitioner(make_partitioner(), copy_outputs="yes")


@pytest.mark.compiles
@pytest.mark.commands
def test_the_librarys_calls_raise_no_notice_of_torchs_own(tmp_path):
    """With every warning shown (``python -W default``), ``inspect(exact=True)``, ``verify`` and
    ``aoti_compile_and_package`` print no warning: torch's notices about itself that these calls raised
    (three ``LeafSpec`` ones a call) are silenced around them, and only around them; a warning of the
    caller's own, after them, still shows."""
    import subprocess
    import sys

    script = (
        "import warnings, strideguard\n"
        "from strideguard.examples import export_policy\n"
        "program = export_policy(batch=1)\n"
        "strideguard.inspect(program, exact=True)\n"
        "strideguard.verify(program)\n"
        f"strideguard.aoti_compile_and_package(program, {str(tmp_path / 'policy.aoti.pt2')!r})\n"
        "warnings.warn('the caller speaks', FutureWarning)\n"
    )
    result = subprocess.run([sys.executable, "-W", "default", "-c", script], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    warned = [line for line in result.stderr.splitlines() if "Warning:" in line]
    assert len(warned) == 1 and "the caller speaks" in warned[0], warned

"""Real third-party models (``tests/zoo.py``) on both paths, judged by Inductor's own lowering.

For every model, on the ATen path and on the Edge path through ExecuTorch's
AOTI backend: every output whose layout ``inspect`` decides has exactly the
strides Inductor gives it, the copies strideguard adds are exactly the copies
needed, and after the fix every output is in its exact target layout; fixed
for CUDA (``exact=True, device="cuda"``), every output is proven in layout by
Inductor's CUDA lowering, run here on fake tensors. ``make zoo`` checks the
same against fully compiled methods, values included.
"""

from __future__ import annotations

import pytest

from . import zoo
from .conftest import needs_executorch

PATHS = ["aten", pytest.param("edge", marks=needs_executorch)]
IN_MAKE_TEST = ("llama-decode-b1-bfloat16",)
"""The robots lane (``make test-robots``, Python 3.12 with LeRobot) runs the ``lerobot`` tests of this file."""


def built(model: zoo.ZooModel) -> zoo.ZooModel:
    """``model``, or a skip naming the model library it needs (the project's zoo extra; LeRobot, which needs
    Python 3.12, is the robots lane's: ``make test-robots``)."""
    if model.library == "lerobot":
        pytest.importorskip("lerobot", reason=f"{model.name} needs LeRobot on Python 3.12: make test-robots")
    elif model.library is not None:
        pytest.importorskip(model.library, reason=f"{model.name} needs {model.library}: pip install -e '.[zoo]'")
    return model


@pytest.mark.parametrize("model", zoo.MODELS + zoo.ROBOTS, ids=[m.name for m in zoo.MODELS + zoo.ROBOTS])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.lowers
def test_zoo_model_is_predicted_and_fixed(model, path):
    judgement = (zoo.judge_aten if path == "aten" else zoo.judge_edge)(built(model))
    assert not judgement.mispredicted, judgement.mispredicted
    assert judgement.copied == judgement.needed, (
        f"copies at outputs {judgement.copied}, needed at {judgement.needed} (undecided: {judgement.undecided})"
    )
    assert not judgement.after, judgement.after


@pytest.mark.parametrize("model", zoo.MODELS, ids=[m.name for m in zoo.MODELS])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.lowers
def test_zoo_fixed_for_cuda_is_in_layout_under_cudas_lowering(model, path):
    """Judged by Inductor's CUDA lowering (fake tensors, sm90; no GPU needed): fixed with ``exact=True,
    device="cuda"``, every output proven in layout by the CUDA lowering of the fixed program."""
    judgement = zoo.judge_cuda(built(model), path)
    assert judgement.after == [], judgement.after
    assert "cuda sm90" in judgement.proof_target


@pytest.mark.parametrize("model", zoo.DECODERS, ids=[m.name for m in zoo.DECODERS])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.lowers
def test_zoo_decoder_pushdown_saves_work_and_lands_dense(model, path):
    judgement = zoo.judge_pushdown(built(model), path)
    assert judgement.pushed and "select(dim=1, -1) pushed through linear" in judgement.pushed[0], judgement.pushed
    assert judgement.saved > 0.5, judgement.row()
    assert judgement.flops_after < judgement.flops_before, judgement.row()
    assert not judgement.after, judgement.after
    assert not judgement.left_unread, f"full-size nodes that feed nothing: {judgement.left_unread}"
    assert judgement.max_error <= 1e-4, judgement.row()


LOW_PRECISION = [
    pytest.param(model, id=model.name, marks=() if model.name in IN_MAKE_TEST else pytest.mark.long)
    for model in zoo.LOW_PRECISION
]
"""The decode step is compiled in ``make test``; the others (a UNet's compile alone takes a minute and a half
here) in ``make test-long`` and ``make zoo``."""


@pytest.mark.parametrize("model", LOW_PRECISION)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.compiles
@pytest.mark.lowers
def test_zoo_in_bfloat16_is_proven_compiled_and_verified(model, path, tmp_path):
    judgement = zoo.judge_proven(built(model), path, directory=str(tmp_path))
    assert not judgement.after, judgement.after
    assert not judgement.wrong, judgement.wrong
    assert judgement.rounds >= 1


COMPILED_ROBOTS = [
    pytest.param(model, path, id=f"{model.name}-{path if isinstance(path, str) else 'edge'}")
    for model in zoo.ROBOTS
    for path in PATHS
    # ExecuTorch 1.5.1's AOTI runtime has no kernel for multinomial (nor detach_copy beside it): "Method forward
    # missing fallback kernels". Their Edge programs are judged by the lowering above, not run.
    if path == "aten" or not model.edge_exceptions
]


@pytest.mark.compiles
@pytest.mark.parametrize("model, path", COMPILED_ROBOTS)
def test_robot_policy_compiled_and_run_is_dense_with_equal_values(model, path, tmp_path):
    """What ``make zoo`` checks of the other models, for LeRobot's policies in their own lane: compiled with
    AOTInductor (ATen) or through ExecuTorch's AOTI path on the CPU (Edge), unfixed and fixed, and run."""
    judgement = (zoo.judge_aten if path == "aten" else zoo.judge_edge)(built(model), compile=True, directory=str(tmp_path))
    assert judgement.ok, judgement.row() | {"detail": judgement.mispredicted + judgement.after + judgement.values}

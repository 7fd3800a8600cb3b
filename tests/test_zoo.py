"""Real third-party models (``tests/zoo.py``) on both paths, judged by Inductor's own lowering.

For every model, on the ATen path and on the Edge path through ExecuTorch's
AOTI backend: every output whose layout ``inspect`` decides has exactly the
strides Inductor gives it, the copies strideguard adds are exactly the copies
needed, and after the fix every output is in its exact target layout. ``make
zoo`` checks the same against fully compiled methods, values included.
"""

from __future__ import annotations

import pytest

from . import zoo
from .conftest import needs_executorch

PATHS = ["aten", pytest.param("edge", marks=needs_executorch)]


def built(model: zoo.ZooModel) -> zoo.ZooModel:
    """``model``, or a skip naming the model library it needs (the project's zoo extra)."""
    if model.library is not None:
        pytest.importorskip(model.library, reason=f"{model.name} needs {model.library}: pip install -e '.[zoo]'")
    return model


@pytest.mark.parametrize("model", zoo.MODELS, ids=[m.name for m in zoo.MODELS])
@pytest.mark.parametrize("path", PATHS)
def test_zoo_model_is_predicted_and_fixed(model, path):
    judgement = (zoo.judge_aten if path == "aten" else zoo.judge_edge)(built(model))
    assert not judgement.mispredicted, judgement.mispredicted
    assert judgement.copied == judgement.needed, (
        f"copies at outputs {judgement.copied}, needed at {judgement.needed} (undecided: {judgement.undecided})"
    )
    assert not judgement.after, judgement.after


@pytest.mark.parametrize("model", zoo.DECODERS, ids=[m.name for m in zoo.DECODERS])
@pytest.mark.parametrize("path", PATHS)
def test_zoo_decoder_pushdown_saves_work_and_lands_dense(model, path):
    judgement = zoo.judge_pushdown(built(model), path)
    assert judgement.pushed and "select(dim=1, -1) pushed through linear" in judgement.pushed[0], judgement.pushed
    assert judgement.saved > 0.5, judgement.row()
    assert judgement.flops_after < judgement.flops_before, judgement.row()
    assert not judgement.after, judgement.after
    assert judgement.max_error <= 1e-4, judgement.row()


@pytest.mark.parametrize("model", zoo.LOW_PRECISION, ids=[m.name for m in zoo.LOW_PRECISION])
@pytest.mark.parametrize("path", PATHS)
def test_zoo_in_bfloat16_is_proven_compiled_and_verified(model, path, tmp_path):
    judgement = zoo.judge_proven(built(model), path, directory=str(tmp_path))
    assert not judgement.after, judgement.after
    assert not judgement.wrong, judgement.wrong
    assert judgement.rounds >= 1

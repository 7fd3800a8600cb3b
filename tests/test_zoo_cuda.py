"""The zoo judged by Inductor's CUDA lowering (fake tensors, sm90; no GPU needed): every model on both paths,
fixed for CUDA, proven in layout by the CUDA lowering of the fixed program. Its own file so that the test
workers (one file each at a time) share the zoo's lowerings with the other files."""

from __future__ import annotations

import pytest

from . import zoo
from .conftest import needs_executorch

ZOO = [pytest.param(m, id=m.name) for m in zoo.MODELS]


@pytest.mark.lowers
@pytest.mark.parametrize("path", ["aten", pytest.param("edge", marks=needs_executorch)])
@pytest.mark.parametrize("model", ZOO)
def test_zoo_fixed_for_cuda_is_in_layout_under_cudas_lowering(model, path):
    if model.library is not None:
        pytest.importorskip(model.library, reason=f"{model.name} needs {model.library}: pip install -e '.[zoo]'")
    judgement = zoo.judge_cuda(model, path)
    assert judgement.after == [], judgement.after
    assert "cuda sm90" in judgement.proof_target

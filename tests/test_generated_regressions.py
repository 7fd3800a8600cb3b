"""Failures ``make fuzz`` found, shrunk and kept (``tests/regressions/*.json``), replayed on every run.

A failure the lowering oracle found in a batch is replayed on its own program
here, and in its whole batch (some thirty programs as one method, several
minutes each) in the ``long`` tier, which ``make test-long`` and ``make fuzz``
run.

A record whose library bug is still open carries ``xfail``, the reason: the
replay is then a strict xfail, so the fix shows up as an unexpected pass and
the mark is removed with it (``xfail_in_batch``: open only in its whole batch,
its own program passing). Without ExecuTorch, an open finding on the Edge
path is skipped instead (its Edge checks do not run there).
"""

from __future__ import annotations

import json

import pytest

from . import generated
from .conftest import HAS_EXECUTORCH, needs_executorch


_TIERS = {"compiled": [pytest.mark.compiles, pytest.mark.lowers]}
"""Every other oracle lowers: an eager finding is judged by the lowering oracle too."""


def _cases(in_batch: bool) -> list:
    cases = []
    for path in sorted(generated.REGRESSIONS.glob("*.json")):
        record = json.loads(path.read_text())
        if in_batch and not record.get("batch"):
            continue
        oracle = generated.oracle_of(record)
        marks = list(_TIERS.get(oracle, [pytest.mark.lowers]))
        if in_batch:
            marks.append(pytest.mark.long)
        open_reason = record.get("xfail") or (record.get("xfail_in_batch") if in_batch else None)
        if open_reason:
            marks.append(pytest.mark.xfail(strict=True, reason=open_reason))
            if not HAS_EXECUTORCH and "edge" in (record["failure"] + open_reason).lower():
                # An open Edge finding (by what failed, or by where it is still open) cannot fail without
                # ExecuTorch: its strict xfail would pass unexpectedly.
                marks.append(needs_executorch)
        cases.append(pytest.param(record, marks=marks, id=path.stem))
    return cases


@pytest.mark.parametrize("record", _cases(in_batch=False))
def test_kept_failure_stays_fixed(record, tmp_path):
    generated.replay(record, str(tmp_path), in_batch=False)


@pytest.mark.parametrize("record", _cases(in_batch=True))
def test_kept_failure_stays_fixed_in_its_batch(record, tmp_path):
    generated.replay(record, str(tmp_path), in_batch=True)


KEPT_COMPILED_BATCH = 20
"""Kept programs compiled as one method: two compiles each (untouched, densified), 20 to 30 s a batch."""


@pytest.mark.long
@pytest.mark.compiles
@pytest.mark.lowers
def test_every_kept_failure_compiles_as_the_lowering_says(tmp_path):
    """Every kept failure, whichever oracle found it, compiled with AOTInductor before and after
    ``densify_outputs``: each output as its lowering said, dense after the fix, values unchanged. A weight
    view's size-one stride was found this way (``compiled-clone-of-a-weight-view-keeps-its-size-one-stride``);
    its own oracle had passed. A record still open (``xfail``) is left to its own replay."""
    records = [json.loads(path.read_text()) for path in sorted(generated.REGRESSIONS.glob("*.json"))]
    specs = [generated.ProgramSpec.from_json(record["spec"]) for record in records if not record.get("xfail")]
    problems = []
    for start in range(0, len(specs), KEPT_COMPILED_BATCH):
        result = generated.check_compiled_sample(specs[start:start + KEPT_COMPILED_BATCH], str(tmp_path / str(start)))
        problems += [text for _, text in result.problems]
    assert len(specs) >= 40 and not problems, "\n".join(problems)

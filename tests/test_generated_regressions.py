"""Failures ``make fuzz`` found, shrunk and kept (``tests/regressions/*.json``), replayed on every run.

A record whose library bug is still open carries ``xfail``, the reason: the
replay is then a strict xfail, so the fix shows up as an unexpected pass and
the mark is removed with it. Without ExecuTorch, an open finding on the Edge
path is skipped instead (its Edge checks do not run there).
"""

from __future__ import annotations

import json

import pytest

from . import generated
from .conftest import HAS_EXECUTORCH, needs_executorch


def _cases() -> list:
    cases = []
    for path in sorted(generated.REGRESSIONS.glob("*.json")):
        record = json.loads(path.read_text())
        marks = [pytest.mark.aoti] if generated.oracle_of(record) == "compiled" else []
        if record.get("xfail"):
            marks.append(pytest.mark.xfail(strict=True, reason=record["xfail"]))
            if not HAS_EXECUTORCH and "edge" in record["failure"].lower():
                # An open Edge finding cannot fail without ExecuTorch: its strict xfail would pass unexpectedly.
                marks.append(needs_executorch)
        cases.append(pytest.param(record, marks=marks, id=path.stem))
    return cases


@pytest.mark.parametrize("record", _cases())
def test_kept_failure_stays_fixed(record, tmp_path):
    generated.replay(record, str(tmp_path))

"""Random programs keep the contract: hand-written cases find the bugs we thought of, these find the others.

Each generated program (``tests/generated.py``) is exported, lowered to Edge in
both dim-order modes, and passed through ``densify_outputs`` (ATen) and
``prepare_for_aoti`` (Edge); the results are validated, run eagerly and
compared with the originals, their layouts predicted on fake tensors as
Inductor traces them (``generated.check_program``). A seeded sample of the
programs that pass is then compiled with AOTInductor, ten as one method, to
check that prediction against the compiler.

``make test`` runs a fixed, derandomized set of examples, unshrunk. ``make fuzz``
(``--fuzz-minutes``) generates for the given time, in batches, with hypothesis's
database under ``.hypothesis/``; each failure it finds is shrunk and written to
``tests/regressions/`` for ``test_generated_regressions.py`` to replay.
Shrinking is not bounded by the time given: each failure adds up to about
five minutes (hypothesis's own limit), as every example costs about a second.
"""

from __future__ import annotations

import random
import time
import traceback
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import HypothesisException

from . import generated
from .generated import ProgramSpec

CI_EXAMPLES = 80
"""Sized so that this file, compiles included, stays under three minutes on two cores."""

FUZZ_BATCH = 25
"""Examples per hypothesis run in fuzz mode; the time is checked between runs."""

COMPILED_SAMPLE = 10
CI_SAMPLE_SEED = 0

DATABASE = DirectoryBasedExampleDatabase(str(Path(__file__).parents[1] / ".hypothesis" / "examples"))

PASSED: dict[str, ProgramSpec] = {}
"""Programs that kept the contract in this session, by their JSON: the compile check samples them."""

COUNTS: Counter = Counter()


@pytest.fixture
def fuzz_minutes(request) -> float:
    return request.config.getoption("--fuzz-minutes")


def say(request, line: str) -> None:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def check_generated(spec: ProgramSpec) -> None:
    """Check the contract for ``spec``, rejecting what the exporters refuse."""
    try:
        generated.check_program(spec)
    except generated.Rejected as rejection:
        COUNTS["rejected"] += 1
        event(f"rejected by {rejection}")
        assume(False)
    COUNTS["passed"] += 1
    PASSED[spec.dumps()] = spec


def property_test(config: settings, failures: dict):
    """A hypothesis test over generated programs that keeps, per failure origin, the last failing
    program it ran: after shrinking, hypothesis replays the smallest one last."""

    @config
    @given(spec=generated.programs())
    def run(spec: ProgramSpec):
        try:
            check_generated(spec)
        except HypothesisException:
            raise
        except Exception as error:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            origin = (type(error).__name__, Path(frame.filename).name, frame.lineno)
            failures[origin] = (spec, f"{type(error).__name__}: {error}")
            COUNTS["failed"] += 1
            raise

    return run


def ci_settings() -> settings:
    """The same examples every run, and no shrinking: shrinking one failure can take minutes, which
    ``make test`` cannot spend; ``make fuzz`` shrinks what it finds."""
    return settings(
        max_examples=CI_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow],
    )


def fuzz_settings(first_batch: bool) -> settings:
    """Later batches skip the database replay: a failure found and kept already would end each batch."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
    return settings(
        max_examples=FUZZ_BATCH,
        deadline=None,
        database=DATABASE,
        phases=phases if first_batch else [p for p in phases if p is not Phase.reuse],
        suppress_health_check=[HealthCheck.too_slow],
    )


def fuzz(minutes: float) -> tuple[int, list[Path]]:
    """Run hypothesis batches until ``minutes`` are spent; returns the batches run and the kept failures."""
    deadline = time.monotonic() + minutes * 60
    kept: list[Path] = []
    batches, longest = 0, 0.0
    while time.monotonic() + longest < deadline:
        started = time.monotonic()
        failures: dict = {}
        try:
            property_test(fuzz_settings(first_batch=batches == 0), failures)()
        except Exception:  # noqa: BLE001 - every failure is recorded in ``failures`` and kept below
            pass
        kept += [generated.save_regression(spec, text) for spec, text in failures.values()]
        batches += 1
        longest = max(longest, time.monotonic() - started)
    return batches, sorted(set(kept))


def test_generated_programs_keep_the_contract(request, fuzz_minutes):
    if not fuzz_minutes:
        property_test(ci_settings(), {})()
        assert COUNTS["rejected"] < COUNTS["passed"], "most generated programs were rejected"
        return
    batches, kept = fuzz(fuzz_minutes)
    checked = COUNTS["passed"] + COUNTS["failed"]
    say(request, f"\nfuzz: {checked} programs checked in {batches} batches ({COUNTS['failed']} runs failed, "
                 f"shrinking included), {COUNTS['rejected']} rejected by the exporters")
    assert not kept, "failures kept as regression tests:\n" + "\n".join(str(p) for p in kept)


@pytest.mark.aoti
def test_a_sample_compiled_with_aotinductor_agrees_with_the_oracle(request, fuzz_minutes, tmp_path):
    if not PASSED:
        # Run alone: generate the CI set first; a failing program there is not sampled.
        try:
            property_test(ci_settings(), {})()
        except Exception:  # noqa: BLE001 - test_generated_programs_keep_the_contract reports it
            pass
    seed = random.randrange(2**32) if fuzz_minutes else CI_SAMPLE_SEED
    candidates = [PASSED[key] for key in sorted(PASSED)]
    sample = random.Random(seed).sample(candidates, min(COMPILED_SAMPLE, len(candidates)))
    assert sample, "no generated program passed the eager checks"
    result = generated.check_compiled_sample(sample, str(tmp_path))
    if result.uncompilable:
        say(request, f"\nAOTInductor cannot compile {len(result.uncompilable)} sampled programs even untouched: "
                     f"{sorted(set(result.uncompilable.values()))}")
    kept = []
    if fuzz_minutes:
        for part in sorted({part for part, _ in result.problems}):
            text = "\n".join(t for p, t in result.problems if p == part)
            kept.append(generated.save_regression(sample[part], text, compiled=True))
    assert not result.problems, f"sample seed {seed}:\n" + "\n".join(t for _, t in result.problems) + (
        "\nkept as regression tests:\n" + "\n".join(map(str, kept)) if kept else ""
    )

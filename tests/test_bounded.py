"""Every verb on a file whose cost the file controls ends in a result or one line, within a stated budget.

The budget, per run of one verb on one file, counted from a process that
has imported torch and strideguard (importing takes 0.3 GB and 2 s on the
CPU build of torch, over 0.6 GB on its CUDA build, whatever the file):

* at most ``BUDGET_SECONDS`` (``verify``: its ``--timeout`` plus the time to
  stop and report), and at most ``BUDGET_BYTES`` of memory more than the
  import took;
* exit 0 or 1 with a result, or exit 2 with exactly one line on stderr;
* nothing left on disk: no temporary beside the output, none in the
  temporary folder.

The files are ``costly.py``'s (legal programs whose cost the file controls)
and the hostile files of the same costs (``REFUSED``); every refusal of
``hostile.py`` is also measured, by reading alone, in
``test_loading_safety``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

import strideguard

from . import costly, hostile, tiers

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
BUDGET_SECONDS = 30.0
VERIFY_TIMEOUT = 20
BUDGET_BYTES = 1 << 30

VERBS = {
    "inspect": ["inspect", "{file}"],
    "inspect-json-plot": ["inspect", "{file}", "--json", "--plot", "{out}.png"],
    "inspect-exact": ["inspect", "{file}", "--exact"],
    "fix": ["fix", "{file}", "-o", "{out}.pt2"],
    "fix-exact": ["fix", "{file}", "-o", "{out}.exact.pt2", "--exact"],
    "verify": ["verify", "{file}", "--timeout", str(VERIFY_TIMEOUT)],
}

# Each verb in a child forked from one process that has imported everything, so that a run's peak memory
# is the import's plus the run's, and the import is paid once.
RUNNER = """
import json, os, resource, sys, time
import strideguard.cli
imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
for name, arguments, folder in json.loads(sys.argv[1]):
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        out = os.open(os.path.join(folder, name + ".stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(os.path.join(folder, name + ".stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1); os.dup2(err, 2)
        code = 3
        try:
            strideguard.cli.main(arguments)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 3
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    print(json.dumps([name, os.waitstatus_to_exitcode(status), time.monotonic() - started, usage.ru_maxrss * 1024, imported]), flush=True)
"""


@pytest.fixture(scope="module")
@tiers.needs("compiles", "lowers", "commands")
def measured(tmp_path_factory) -> dict:
    """Every verb on every costly file, run once: (exit code, seconds, peak bytes, imported bytes, stdout, stderr,
    the output folder's files, the temporary folder's strideguard entries before and after)."""
    folder = tmp_path_factory.mktemp("costly")
    files = costly.make(folder / "files")
    workshop = hostile.Workshop(folder / "hostile", hostile.save_sources(folder / "sources"))
    for case in REFUSED:
        files[case.name] = case.make(workshop, workshop.marker(case.name))
    runs, plan = {}, []
    for file_name, path in files.items():
        for verb, template in VERBS.items():
            name = f"{file_name}.{verb}"
            work = folder / name
            work.mkdir()
            arguments = [part.format(file=path, out=work / "out") for part in template]
            plan.append((name, arguments, str(work)))
    # A temporary folder of the runs' own: what other tests (or workers) create meanwhile is not theirs.
    temporary = folder / "tmp"
    temporary.mkdir()
    before = _our_temporaries(temporary)
    completed = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(plan)], env={**os.environ, "TMPDIR": str(temporary)},
        cwd=REPOSITORY, capture_output=True, text=True, timeout=len(plan) * (BUDGET_SECONDS + VERIFY_TIMEOUT),
    )
    after = _our_temporaries(temporary)
    for line in completed.stdout.splitlines():
        name, code, seconds, peak, imported = json.loads(line)
        work = folder / name
        runs[name] = dict(
            code=code, seconds=seconds, added=peak - imported, stdout=(work / f"{name}.stdout").read_text(),
            stderr=(work / f"{name}.stderr").read_text(), files=sorted(p.name for p in work.iterdir()),
        )
    assert len(runs) == len(plan), completed.stderr[-2000:]
    return {"runs": runs, "temporaries_left": sorted(after - before)}


def _our_temporaries(folder: pathlib.Path) -> set[str]:
    return {name for name in os.listdir(folder) if name.startswith("strideguard")}


REFUSED = [
    case for case in hostile.CASES
    if case.name in (
        "sympy-float-exponent", "sympy-floor-power", "sympy-nested-floor", "sympy-expanded-product",
        "sympy-expanded-power", "guard-floor-power", "guard-int-power", "torchscript-builtin",
    )
]
"""The hostile files of the costs a file controls (numbers, expansion, laundered guards, TorchScript builtins):
every verb refuses them."""
FILES = ["wide", "chain", "unbounded-loop", "node-named-self"] + [case.name for case in REFUSED]
RUN_NAMES = [f"{file}.{verb}" for file in FILES for verb in VERBS]


@pytest.mark.parametrize("name", RUN_NAMES)
def test_every_verb_ends_within_budget_in_a_result_or_one_line(measured, name):
    run = measured["runs"][name]
    verb = name.split(".", 1)[1]
    limit = VERIFY_TIMEOUT + BUDGET_SECONDS if verb == "verify" else BUDGET_SECONDS
    assert run["seconds"] < limit, f"{name} took {run['seconds']:.1f} s"
    assert run["added"] < BUDGET_BYTES, f"{name} added {run['added'] >> 20} MiB"
    assert run["code"] in (0, 1, 2), run["stderr"][-2000:]
    if run["code"] == 2:
        [line] = run["stderr"].splitlines()
        assert line.startswith("strideguard: error: ")
    else:
        assert "error" not in run["stderr"], run["stderr"][-2000:]
    assert not [f for f in run["files"] if f.endswith(".tmp")], run["files"]


def test_nothing_is_left_in_the_temporary_folder(measured):
    assert measured["temporaries_left"] == []


def test_the_costly_files_end_as_they_should(measured):
    """What each file is for: the wide output drawn, the long chain inspected, the loop stopped, the bad
    node name one line."""
    runs = measured["runs"]
    assert runs["wide.inspect-json-plot"]["code"] == 1 and "out.png" in runs["wide.inspect-json-plot"]["files"]
    assert json.loads(runs["wide.inspect-json-plot"]["stdout"])["outputs"][1]["action"] == "copy"
    assert runs["chain.inspect"]["code"] == 0 and "more views" in runs["chain.inspect"]["stdout"]
    assert runs["chain.fix"]["code"] == 0 and runs["chain.fix-exact"]["code"] == 0
    stopped = runs["unbounded-loop.verify"]
    assert stopped["code"] == 2 and "ran past the time limit of 20 s" in stopped["stderr"]
    assert runs["unbounded-loop.inspect"]["code"] in (0, 1)
    assert runs["node-named-self.verify"]["code"] == 2
    for case in REFUSED:
        for verb in VERBS:
            run = runs[f"{case.name}.{verb}"]
            assert run["code"] == 2 and case.says in run["stderr"], (case.name, verb, run["stderr"])


def test_outputs_sharing_one_memory_cost_linear_time_and_report_size():
    """2,000 outputs all viewing one input (each shares memory with every other): four times the outputs of
    500, about four times the time and the report; pairwise alias lists made it sixteen."""
    sizes = {}
    for count in (500, 2000):
        program = costly.many_slices(count)
        started = time.perf_counter()
        report = strideguard.inspect(program)
        text = report.to_json()
        sizes[count] = (time.perf_counter() - started, len(text))
        assert all(len(output.aliases) == 2 for output in report.outputs)
    time_ratio = sizes[2000][0] / sizes[500][0]
    size_ratio = sizes[2000][1] / sizes[500][1]
    assert size_ratio < 5, sizes
    assert time_ratio < 8, sizes


@pytest.mark.commands
def test_the_librarys_verify_runs_within_its_limits():
    """``verify(timeout=..., memory=...)`` stops its child at either limit, with one line saying which;
    limits that are not positive numbers are refused before anything runs."""
    from strideguard.examples import export_policy
    from strideguard.isolation import LimitExceeded

    program = export_policy(batch=1)
    with pytest.raises(LimitExceeded, match="ran past the time limit of 1 s"):
        strideguard.verify(program, timeout=1)
    with pytest.raises(LimitExceeded, match="more than 1 MiB of memory"):
        strideguard.verify(program, memory=1 << 20)
    for bad in (dict(timeout=0), dict(timeout="10"), dict(memory=True), dict(memory=-1)):
        with pytest.raises(ValueError, match="limit must be a positive number"):
            strideguard.verify(program, **bad)

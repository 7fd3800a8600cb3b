"""A hostile or broken ``.pt2`` file runs none of its code, hangs nothing, exhausts no memory, and gets one line.

The files come from ``tests/hostile.py``. Each is read in-process (fast)
under a time limit, except the ``heavy`` ones, which would hang or take
gigabytes if a check were missing: those are read in a subprocess whose peak
memory is measured. One more subprocess lets plain torch read the files
whose payloads it would run, to show that each payload is real.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import zipfile
from typing import Iterator

import pytest

from strideguard import cli
from strideguard.files import ProgramFileError, load_program
from strideguard.files import limits, program as program_rules, walk
from strideguard.files.expressions import check_guard, check_sympy_repr
from strideguard.files.errors import Refused
from torch._export.serde import schema

from . import hostile

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
LIGHT = [case for case in hostile.CASES if not case.heavy]
ONE_GIGABYTE = 1 << 30


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, tuple[hostile.Case, pathlib.Path, pathlib.Path]]:
    """Every case's file and marker, made once."""
    folder = tmp_path_factory.mktemp("hostile")
    workshop = hostile.Workshop(folder, hostile.save_sources(folder / "sources"))
    return {
        case.name: (case, case.make(workshop, workshop.marker(case.name)), workshop.marker(case.name))
        for case in hostile.CASES
    }


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail a test whose Python code runs past ``seconds`` instead of hanging the suite."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("case", LIGHT, ids=[case.name for case in LIGHT])
def test_refused_with_one_line_and_nothing_runs(corpus, case):
    _, path, marker = corpus[case.name]
    marker.unlink(missing_ok=True)
    with time_limit(20), pytest.raises(ProgramFileError) as refused:
        load_program(path)
    message = str(refused.value)
    assert message.isprintable(), "one line, no control characters"
    assert message.startswith(f"{path}: ")
    assert case.says in message
    assert not marker.exists(), "the payload ran"


@pytest.mark.parametrize("case", LIGHT, ids=[case.name for case in LIGHT])
def test_the_command_line_refuses_with_one_line_and_exit_2(corpus, case, capsys):
    _, path, marker = corpus[case.name]
    with time_limit(20), pytest.raises(SystemExit) as stopped:
        cli.main(["inspect", str(path), "--json"])
    captured = capsys.readouterr()
    assert stopped.value.code == 2
    [line] = captured.err.splitlines()
    assert line.startswith("strideguard: error: ") and case.says in line
    [error] = captured.out.splitlines()
    assert json.loads(error) == {"ok": False, "error": line.removeprefix("strideguard: error: ")}
    assert not marker.exists()


@pytest.mark.commands
def test_heavy_files_are_refused_at_once_in_little_memory(corpus, tmp_path):
    """Every file, heavy or not, read in one subprocess: each refused within seconds, in well under 1 GB.

    The bound is on what reading the files adds to the reader's memory once
    torch is imported: importing torch alone takes 0.3 GB on the CPU build and
    over 0.6 GB on the CUDA build, which is not the file's doing.
    """
    paths = {name: str(path) for name, (_, path, _) in corpus.items()}
    script = (
        "import json, sys, time, resource\n"
        "from strideguard.files import load_program, ProgramFileError\n"
        "print(json.dumps([None, None, 0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]), flush=True)\n"
        "for name, path in json.loads(sys.argv[1]).items():\n"
        "    started = time.perf_counter()\n"
        "    try:\n"
        "        load_program(path); message = None\n"
        "    except ProgramFileError as error:\n"
        "        message = str(error)\n"
        "    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "    print(json.dumps([name, message, time.perf_counter() - started, peak]), flush=True)\n"
    )
    results, imported_bytes, peak_bytes = run_measured(
        [sys.executable, "-c", script, json.dumps(paths)], tmp_path, timeout=120
    )
    assert set(results) == set(paths), "a file hung or crashed the reader"
    for case, _, marker in corpus.values():
        message, seconds = results[case.name]
        assert message is not None and case.says in message, case.name
        assert seconds < 5, f"{case.name} took {seconds:.1f} s"
        assert not marker.exists(), f"{case.name}'s payload ran"
    added = peak_bytes - imported_bytes
    assert added < ONE_GIGABYTE, f"reading the files added {added >> 20} MiB to the {imported_bytes >> 20} MiB of the imports"


def run_measured(command: list[str], folder: pathlib.Path, *, timeout: float) -> tuple[dict, int, int]:
    """Run ``command``, killing it after ``timeout``; its JSON lines by name, its peak memory once its
    imports were done (the line whose name is null), and its own peak memory, in bytes.

    ``os.wait4`` gives the resource usage of exactly this child, where
    ``RUSAGE_CHILDREN`` would give the largest of every child the test run
    has waited for.
    """
    output = folder / "measured.jsonl"
    with open(output, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, cwd=REPOSITORY)
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
        _, _, usage = os.wait4(process.pid, 0)
    finally:
        timer.cancel()
        process.returncode = 0  # reaped above; keeps Popen from waiting again
    results, imported = {}, usage.ru_maxrss
    for line in output.read_text().splitlines():
        name, message, seconds, peak_kib = json.loads(line)
        if name is None:
            imported = peak_kib
        else:
            results[name] = (message, seconds)
    return results, imported * 1024, usage.ru_maxrss * 1024


@pytest.mark.commands
def test_the_payloads_are_real(corpus):
    """Plain torch runs each payload that strideguard refuses: at load, or when the program is called."""
    demonstrated = [(case, path, marker) for case, path, marker in corpus.values() if case.runs_in_torch]
    for _, _, marker in demonstrated:
        marker.unlink(missing_ok=True)
    runs = [(str(path), case.runs_in_torch) for case, path, _ in demonstrated]
    subprocess.run(
        [sys.executable, "-m", "tests.hostile", json.dumps(runs)], cwd=REPOSITORY, capture_output=True, timeout=300
    )
    ran = {case.name for case, _, marker in demonstrated if marker.exists()}
    for _, _, marker in demonstrated:
        marker.unlink(missing_ok=True)
    assert ran == {case.name for case, _, _ in demonstrated}
    assert len(ran) >= 10


def test_every_text_field_of_torchs_schema_has_a_rule():
    """A field added to torch's schema must get a rule before strideguard reads it (the walk refuses it until then)."""
    rules = program_rules._ProgramChecker().rules()
    for root, table in ((schema.ExportedProgram, rules), (schema.PayloadConfig, program_rules._PAYLOAD_RULES)):
        for owner, name, where in walk.text_fields(root):
            known = table.text if where == "value" else table.keys
            assert (owner, name) in known, f"{owner.__name__}.{name} ({where}) has no rule"


@pytest.mark.parametrize(
    "expression",
    [
        "Symbol('s77', integer=True, positive=True)",
        "Mul(Integer(2), Symbol('s74', integer=True, positive=True))",
        "Pow(Symbol('s0', integer=True), Integer(2))",
        "FloorDiv(Add(Symbol('s0', integer=True), Integer(-1)), Integer(2))",
        "Piecewise(ExprCondPair(Integer(1), StrictGreaterThan(Symbol('s0', integer=True), Integer(2))), ExprCondPair(Integer(0), true))",
        "Float('1.5', precision=53)",
    ],
)
def test_expressions_torch_writes_are_accepted(expression):
    check_sympy_repr(expression)


@pytest.mark.parametrize(
    "expression, says",
    [
        ("Pow(Symbol('s0', integer=True), Integer(5000))", "power 5000"),
        ("Mul(" + ", ".join(["Pow(Symbol('s0'), Integer(64))"] * 2) + ")", f"more than {limits.MAX_BITS} bits"),
        ("LShift(Integer(1), Symbol('s0'))", "shifts"),
        ("Symbol('s0', evil=True)", "assumption"),
        ("Add(Integer(1), x)", "not plain sympy"),
        ("Symbol('s1234567')", "index above"),
    ],
)
def test_expressions_that_cost_without_bound_are_refused(expression, says):
    with pytest.raises(Refused, match=says):
        check_sympy_repr(expression)


@pytest.mark.parametrize(
    "guard, accepted",
    [
        ("L['x'].size()[0] <= 64", True),
        ("(L['x'].size()[0] // 2) <= L['x'].size()[0]", True),
        ("L['y'][0]['a'].stride()[1] == L['x'].size()[0] ** 2", True),
        ("L['x'].size()[0] == 2 ** 5000", False),
        ("L['x'].size()[0] ** L['x'].size()[1] > 0", False),
        ("L['x'].size()[0] > 5 # comment", False),
        ("L['x'].__class__ is None", False),
        ("L['x'].size()[0] == len('a')", False),
    ],
)
def test_guards(guard, accepted):
    if accepted:
        check_guard(guard)
    else:
        with pytest.raises(Refused):
            check_guard(guard)


@pytest.mark.commands
def test_a_file_refused_in_a_child_comes_back_in_the_loaders_words(tmp_path):
    """A file read in ``verify``'s child (``prove.isolation``) and refused there comes back saying it speaks for
    itself, so the command line prints the loader's one line as it is; any other failure in the child comes
    back marked as one, so the command line names the step that failed."""
    from strideguard.prove.isolation import ChildFailed, Limits, run_isolated

    hostile = tmp_path / "members.pt2"
    with zipfile.ZipFile(hostile, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model/models/model.json", b"{" * 1000)
    with pytest.raises(ChildFailed) as refused:
        run_isolated(load_program, str(hostile), limits=Limits(seconds=120), what="a hostile file")
    assert refused.value.speaks_for_itself and refused.value.kind == "ProgramFileError"
    assert str(refused.value).startswith(f"{hostile}: has a compressed member")
    with pytest.raises(ChildFailed) as plain:
        run_isolated(int, "not a number", limits=Limits(seconds=120), what="a plain failure")
    assert not plain.value.speaks_for_itself and plain.value.kind == "ValueError"

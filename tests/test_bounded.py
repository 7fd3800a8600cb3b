"""Every verb on a file whose cost the file controls ends in a result or one line, within a stated budget.

The budget, per run of one verb on one file, counted from a process that
has imported torch and strideguard (importing takes 0.3 GB and 2 s on the
CPU build of torch, over 0.6 GB on its CUDA build, whatever the file):

* at most ``BUDGET_SECONDS`` (``verify``: its ``--timeout`` plus the time to
  stop and report), and at most ``BUDGET_BYTES`` of memory more than the
  run's process held as it started, with the imports done;
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
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import strideguard
from strideguard.files import limits

from . import costly, hostile, tiers

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
BUDGET_SECONDS = 30.0
VERIFY_TIMEOUT = 2
BUDGET_BYTES = 1 << 30
PROMISED_NODES = 5_000
PER_NODE_SECONDS = 0.004
"""The promise for long programs (docs/loading-safety.md): 30 s up to ``PROMISED_NODES`` nodes, and at most
this much more for each node beyond, up to the loader's limit."""
NAME_VERIFY_TIMEOUT = 150
"""The policy compiled and run for its name's sake: its compile alone takes 20 to 30 s here."""
COMPILE_SECONDS = 150
"""``compile`` has no time limit of its own: Inductor's compile of the policy."""

VERBS = {
    "inspect": ["inspect", "{file}"],
    "inspect-json-plot": ["inspect", "{file}", "--json", "--plot", "{out}.png"],
    "inspect-exact": ["inspect", "{file}", "--exact"],
    "fix": ["fix", "{file}", "-o", "{out}.pt2"],
    "fix-exact": ["fix", "{file}", "-o", "{out}.exact.pt2", "--exact"],
    "verify": ["verify", "{file}", "--timeout", str(VERIFY_TIMEOUT)],
}
NAME_VERBS = {
    "inspect-plot": ["inspect", "{file}", "--plot", "{out}.png"],
    "fix": ["fix", "{file}", "-o", "{out}.pt2"],
    "compile": ["compile", "{file}", "-o", "{out}.so.pt2"],
    "verify": ["verify", "{file}", "--timeout", str(NAME_VERIFY_TIMEOUT)],
}
"""For the files whose names carry markup and escapes: every verb that prints a path, table titles and
the plot's title included."""
PLAIN_VERBS = ("inspect", "fix")
"""For the largest legal programs (their own size is the cost): ``--exact`` and ``verify`` add Inductor's
lowering and compile, about 7 ms a node, which the promise states per node rather than within 30 s."""
NAMES = {
    "markup-escapes": "m[/x]/[bold red]a[link=https:e]b[/link]e\x1b[2J\x1b]0;title\x07m\u202egnp.pt2",
    "math": "$x^{2$.pt2",
}
"""Each name as a path under the run's folder (``m[/x]`` is a folder), and the file it names: rich markup,
terminal escapes (clear screen, an OSC title, BEL) and a right-to-left override in one name."""
SHOWN = {
    "markup-escapes": ("[bold red]a[link=https:e]b[/link]e", "\\x1b[2J\\x1b]0;title\\x07m\\u202egnp.pt2"),
    "math": ("$x^{2$.pt2",),
}
"""How each name must print: literally, each escape as its escape."""
NAME_SOURCES = {"markup-escapes": "policy-named", "math": "wide"}
"""The markup-and-escapes name goes through every verb on a program that compiles (the policy); the math
name, which only the plot's title would read as math, through the verbs that draw and write."""

# Each verb in a child forked from one process that has imported everything, so that the import is paid
# once; a run's added memory is the child's peak less its resident memory as it started.
RUNNER = """
import json, os, sys, time
import strideguard.cli
page = os.sysconf("SC_PAGE_SIZE")
for name, arguments, folder in json.loads(sys.argv[1]):
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        # The child's own resident memory as it starts, against which its peak counts what the run added (the
        # parent's import peak was the wrong base: a child maps only what it touches, so runs read up to
        # 250 MiB below zero, and a run of 1 GiB would have passed the 1 GiB budget).
        with open("/proc/self/statm") as statm:
            start = int(statm.read().split()[1]) * page
        with open(os.path.join(folder, name + ".start"), "w") as file:
            file.write(str(start))
        out = os.open(os.path.join(folder, name + ".stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(os.path.join(folder, name + ".stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1); os.dup2(err, 2)
        code = 99  # no exit at all: not one of the command line's codes
        try:
            strideguard.cli.main(arguments)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 99
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    with open(os.path.join(folder, name + ".start")) as file:
        start = int(file.read())
    os.remove(os.path.join(folder, name + ".start"))
    print(json.dumps([name, os.waitstatus_to_exitcode(status), time.monotonic() - started, usage.ru_maxrss * 1024, start]), flush=True)
"""


@pytest.fixture(scope="module")
@tiers.needs("compiles", "lowers", "commands")
def measured(tmp_path_factory) -> dict:
    """Every verb on every costly file but the largest, run once: (exit code, seconds, peak bytes, imported
    bytes, stdout, stderr, the output folder's files, the temporary folder's strideguard entries before and
    after)."""
    folder = tmp_path_factory.mktemp("costly")
    files = costly.make(folder / "files")
    workshop = hostile.Workshop(folder / "hostile", hostile.save_sources(folder / "sources"))
    for case in REFUSED:
        files[case.name] = case.make(workshop, workshop.marker(case.name))
    return _measure(folder, files)


@pytest.fixture(scope="module")
@tiers.needs("compiles", "lowers", "commands")
def measured_names(tmp_path_factory) -> dict:
    """``measured`` for the files whose names carry markup and escapes; a fixture of its own, so that its
    compile and verify of the policy run on one worker while ``measured`` runs on the other
    (``tests/conftest.py``, ``GROUPS``)."""
    folder = tmp_path_factory.mktemp("named")
    sources = {"policy-named": hostile.save_sources(folder / "sources")["policy"], "wide": costly.make(folder / "files")["wide"]}
    files = {}
    for name, path in NAMES.items():
        named = folder / "names" / path
        named.parent.mkdir(parents=True, exist_ok=True)
        named.write_bytes(sources[NAME_SOURCES[name]].read_bytes())
        files[f"name-{name}"] = named
    return _measure(folder, files)


@pytest.fixture(scope="module")
@tiers.needs("commands")
def measured_large(tmp_path_factory) -> dict:
    """``measured`` for the largest legal programs (``costly.LARGE``): minutes to build and run, the ``long``
    tier's."""
    folder = tmp_path_factory.mktemp("costly-large")
    return _measure(folder, costly.make(folder / "files", large=True))


def _measure(folder: pathlib.Path, files: dict[str, pathlib.Path]) -> dict:
    runs, plan = {}, []
    for file_name, path in files.items():
        verbs = _verbs_for(file_name)
        for verb, template in verbs.items():
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
        cwd=REPOSITORY, capture_output=True, text=True, timeout=len(plan) * (BUDGET_SECONDS + VERIFY_TIMEOUT) + 2 * NAME_VERIFY_TIMEOUT,
    )
    after = _our_temporaries(temporary)
    arguments_of = {name: arguments for name, arguments, _ in plan}
    for line in completed.stdout.splitlines():
        name, code, seconds, peak, start = json.loads(line)
        work = folder / name
        runs[name] = dict(
            arguments=arguments_of[name],
            code=code, seconds=seconds, added=peak - start, stdout=(work / f"{name}.stdout").read_text(),
            stderr=(work / f"{name}.stderr").read_text(), files=sorted(p.name for p in work.iterdir()),
        )
    assert len(runs) == len(plan), completed.stderr[-2000:]
    if os.environ.get("STRIDEGUARD_BOUNDED_REPORT"):  # the figures docs/loading-safety.md quotes
        figures = {name: dict(code=run["code"], seconds=round(run["seconds"], 1), added_mib=run["added"] >> 20) for name, run in runs.items()}
        report = pathlib.Path(os.environ["STRIDEGUARD_BOUNDED_REPORT"])
        earlier = json.loads(report.read_text()) if report.exists() else {}
        report.write_text(json.dumps({**earlier, **figures}, indent=1))
    return {"runs": runs, "temporaries_left": sorted(after - before)}


def _verbs_for(file_name: str) -> dict[str, list[str]]:
    if file_name.startswith("name-"):
        if NAME_SOURCES[file_name.removeprefix("name-")] == "policy-named":
            return NAME_VERBS
        return {verb: NAME_VERBS[verb] for verb in ("inspect-plot", "fix")}
    if file_name in costly.LARGE:
        return {verb: VERBS[verb] for verb in PLAIN_VERBS}
    return VERBS


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
DECLARED = {
    "unbind-2**40": "lists 4 pieces of aten::unbind.int, which makes 1099511627776",
    "split-2**40": "lists 4 pieces of aten::split.Tensor, which makes 1099511627776",
    "weight-150000-dims": "declares a tensor of more than 64 dimensions (at the weight configuration",
    "tensor-150000-dims": "declares a tensor of more than 64 dimensions (at the program",
}
"""Legal-looking files whose declared sizes would cost what the file does not hold: refused, by what."""
FILES = ["wide", "chain", "unbounded-loop", "node-named-self", *DECLARED] + [case.name for case in REFUSED]
RUN_NAMES = [f"{file}.{verb}" for file in FILES for verb in _verbs_for(file)]
NAMED_RUN_NAMES = [f"name-{name}.{verb}" for name in NAMES for verb in _verbs_for(f"name-{name}")]
LARGE_RUN_NAMES = [f"{file}.{verb}" for file in costly.LARGE for verb in _verbs_for(file)]


@pytest.mark.parametrize("name", RUN_NAMES)
def test_every_verb_ends_within_budget_in_a_result_or_one_line(measured, name):
    _ends_within_budget(measured["runs"][name], name)


@pytest.mark.parametrize("name", NAMED_RUN_NAMES)
def test_every_verb_on_a_hostile_name_ends_within_budget(measured_names, name):
    _ends_within_budget(measured_names["runs"][name], name)


@pytest.mark.long
@pytest.mark.parametrize("name", LARGE_RUN_NAMES)
def test_the_largest_programs_end_within_budget(measured_large, name):
    run = measured_large["runs"][name]
    _ends_within_budget(run, name)
    assert run["code"] == 0, run["stderr"][-2000:]


def _ends_within_budget(run: dict, name: str) -> None:
    verb = name.split(".", 1)[1]
    # verify and compile compile the program: Inductor's time, bounded by verify's --timeout
    file = name.split(".", 1)[0]
    if file == "largest":
        limit = BUDGET_SECONDS + PER_NODE_SECONDS * (limits.MAX_NODES - PROMISED_NODES)
    elif verb == "verify":
        arguments = run["arguments"]
        limit = float(arguments[arguments.index("--timeout") + 1]) + BUDGET_SECONDS
    else:
        limit = COMPILE_SECONDS if verb == "compile" else BUDGET_SECONDS
    assert run["seconds"] < limit, f"{name} took {run['seconds']:.1f} s"
    assert 0 <= run["added"] < BUDGET_BYTES, f"{name} added {run['added'] >> 20} MiB"
    assert run["code"] in (0, 1, 2, 3), run["stderr"][-2000:]  # 3: a result, some output undecided
    if run["code"] == 2:
        [line] = run["stderr"].splitlines()
        assert line.startswith("strideguard: error: ")
    else:
        assert "error" not in run["stderr"], run["stderr"][-2000:]
    assert not [f for f in run["files"] if f.endswith(".tmp")], run["files"]


def test_nothing_is_left_in_the_temporary_folder(measured):
    assert measured["temporaries_left"] == []


def test_nothing_is_left_in_the_temporary_folder_by_hostile_names(measured_names):
    assert measured_names["temporaries_left"] == []


def test_the_costly_files_end_as_they_should(measured):
    """What each file is for: the wide output drawn, the long chain inspected, the loop stopped, the bad
    node name one line."""
    runs = measured["runs"]
    assert runs["wide.inspect-json-plot"]["code"] == 1 and "out.png" in runs["wide.inspect-json-plot"]["files"]
    assert json.loads(runs["wide.inspect-json-plot"]["stdout"])["outputs"][1]["action"] == "copy"
    assert runs["chain.inspect"]["code"] == 0 and "more views" in runs["chain.inspect"]["stdout"]
    assert runs["chain.fix"]["code"] == 0 and runs["chain.fix-exact"]["code"] == 0
    stopped = runs["unbounded-loop.verify"]
    assert stopped["code"] == 2 and f"ran past the time limit of {VERIFY_TIMEOUT} s" in stopped["stderr"]
    assert runs["unbounded-loop.inspect"]["code"] in (0, 1, 3)
    assert runs["node-named-self.verify"]["code"] == 2
    for case in REFUSED:
        for verb in VERBS:
            run = runs[f"{case.name}.{verb}"]
            assert run["code"] == 2 and case.says in run["stderr"], (case.name, verb, run["stderr"])
    for name, says in DECLARED.items():
        for verb in VERBS:
            run = runs[f"{name}.{verb}"]
            assert run["code"] == 2 and says in run["stderr"], (name, verb, run["stderr"])


def test_the_largest_admitted_program_is_the_largest_built():
    """The ``largest`` file's build holds exactly ``MAX_NODES`` nodes (so the budget test measures the limit),
    and one node more is refused in one line; so are distinct size expressions beyond
    ``MAX_EXPRESSIONS_TOTAL`` characters."""
    import zipfile

    from strideguard.files import ProgramFileError, load_program

    folder = pathlib.Path(tempfile.mkdtemp(prefix="largest-"))
    try:
        source = folder / "adds.pt2"
        torch.export.save(torch.export.export(costly.Adds(), (torch.randn(4),)), source)
        for count, admitted in ((limits.MAX_NODES, True), (limits.MAX_NODES + 1, False)):
            built = costly._edited(source, folder / f"adds-{count}.pt2", costly.longer_adds(count))
            with zipfile.ZipFile(built) as archive:
                [member] = [n for n in archive.namelist() if n.endswith("models/model.json")]
                assert len(json.loads(archive.read(member))["graph_module"]["graph"]["nodes"]) == count
            if admitted:
                continue
            with pytest.raises(ProgramFileError, match=f"more than {limits.MAX_NODES:,} nodes"):
                load_program(built)
        dynamic = folder / "adds-dynamic.pt2"
        torch.export.save(
            torch.export.export(costly.Adds(), (torch.randn(4),), dynamic_shapes=({0: torch.export.Dim("batch", min=2)},)), dynamic
        )
        longer = costly._edited(dynamic, folder / "longer.pt2", costly.longer_adds(100))
        padded = costly._edited(longer, folder / "padded.pt2", costly.padded_expressions(limits.MAX_EXPRESSIONS_TOTAL + 20_000))
        with pytest.raises(ProgramFileError, match=f"more than {limits.MAX_EXPRESSIONS_TOTAL:,} characters of distinct"):
            load_program(padded)
    finally:
        shutil.rmtree(folder)


def test_names_from_files_and_arguments_print_as_themselves(measured_names):
    """A path carrying rich markup, terminal escapes (clear screen, an OSC title, BEL), a right-to-left
    override or matplotlib math: every verb prints it literally, escapes shown as escapes, on success
    (table titles, "wrote ...") and on error, and the plot is drawn."""
    runs = measured_names["runs"]
    for name in NAMES:
        for verb in _verbs_for(f"name-{name}"):
            run = runs[f"name-{name}.{verb}"]
            text = run["stdout"] + run["stderr"]
            assert not any(c in text for c in "\x1b\x07\u202e"), (name, verb, text[:400])
            assert "Traceback" not in text and "MarkupError" not in text, (name, verb, text[-800:])
            assert all(part in " ".join(text.split()) for part in SHOWN[name]), (name, verb, text[:600])
        assert runs[f"name-{name}.inspect-plot"]["code"] == 1
        assert "out.png" in runs[f"name-{name}.inspect-plot"]["files"]
        assert runs[f"name-{name}.fix"]["code"] == 0 and "out.pt2" in runs[f"name-{name}.fix"]["files"]
    for name in ("markup-escapes",):
        assert runs[f"name-{name}.verify"]["code"] == 1, runs[f"name-{name}.verify"]["stderr"]  # the policy unfixed
        assert runs[f"name-{name}.compile"]["code"] == 0, runs[f"name-{name}.compile"]["stderr"]


def test_outputs_sharing_one_memory_cost_linear_time_and_report_size():
    """2,000 outputs all viewing one input (each shares memory with every other): four times the outputs of
    500, about four times the time and the report; pairwise alias lists made it sixteen. Timed in this
    process's CPU time, the better of two: the other test worker compiling beside it once stretched the wall
    time of the larger call alone (a ratio of 8.9 from a fresh Inductor cache, 4.2 to 5.7 alone)."""
    sizes = {}
    for count in (500, 2000):
        program = costly.many_slices(count)
        seconds = []
        for _ in range(2):
            started = time.process_time()
            report = strideguard.inspect(program)
            text = report.to_json()
            seconds.append(time.process_time() - started)
        sizes[count] = (min(seconds), len(text))
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
    from strideguard.prove.isolation import LimitExceeded

    program = export_policy(batch=1)
    with pytest.raises(LimitExceeded, match="ran past the time limit of 1 s"):
        strideguard.verify(program, timeout=1)
    with pytest.raises(LimitExceeded, match="more than 1 MiB of memory"):
        strideguard.verify(program, memory=1 << 20)
    for bad in (dict(timeout=0), dict(timeout="10"), dict(memory=True), dict(memory=-1)):
        with pytest.raises(ValueError, match="limit must be a positive number"):
            strideguard.verify(program, **bad)

"""``fix`` and ``--plot`` never lose a file: not the input, not one that exists or appears, not on a failed write.

The publishing mechanics are tested in-process on ``write_output`` and
``save_program``; the races, signals and a real file-size limit go through
the command line in subprocesses, run in parallel where they can be.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import resource
import signal
import stat
import subprocess
import sys
import time
import zipfile

import pytest
import torch

from strideguard.examples import export_policy
from strideguard.files import ProgramFileError, save_program, write_output
from strideguard.files import output as output_module

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("policy") / "policy.pt2"
    torch.export.save(export_policy(batch=1), path)
    return path


def leftovers(folder: pathlib.Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.endswith(".tmp"))


def strideguard(*arguments, **options) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "strideguard", *map(str, arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPOSITORY,
        **options,
    )


def test_a_file_appearing_at_the_output_during_the_run_survives(tmp_path):
    output = tmp_path / "out.bin"

    def write(file):
        file.write(b"new content")
        output.write_bytes(b"someone's file")  # another process, while strideguard writes

    with pytest.raises(ProgramFileError, match="appeared while strideguard was running"):
        write_output(output, write)
    assert output.read_bytes() == b"someone's file"
    assert leftovers(tmp_path) == []


@pytest.mark.commands
def test_two_concurrent_fix_runs_exactly_one_wins(policy, tmp_path):
    output = tmp_path / "fixed.pt2"
    runs = [strideguard("fix", policy, "-o", output) for _ in range(2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    assert sorted(code for code, _ in results) == [0, 2]
    [(_, refusal)] = [(code, err) for code, err in results if code == 2]
    assert len(refusal.strip().splitlines()) == 1 and str(output) in refusal
    assert zipfile.is_zipfile(output)
    assert leftovers(tmp_path) == []


FORKED_WRITERS = """
import json, os, pathlib, sys, time
from strideguard import cli
from strideguard.files import output

ready = None
write = output._Sink.write

def slow_write(self, data):
    if not ready.exists():
        ready.touch()  # the signal comes now, while torch's writer is inside a write
        deadline = time.monotonic() + 600
        while output._signals.pending is None and time.monotonic() < deadline:
            time.sleep(0.01)
    return write(self, data)

output._Sink.write = slow_write
children = {}
for folder, arguments in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:  # one writer per signal, forked from this process, which paid the imports once
        ready = pathlib.Path(folder) / "ready"
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.dup2(os.open(os.path.join(folder, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        code = 3
        try:
            cli.main(arguments)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 3
        finally:
            sys.stderr.flush()
            os._exit(code)
    children[pid] = folder
    print(json.dumps(["started", folder, pid]), flush=True)
for _ in list(children):
    pid, status = os.wait()
    print(json.dumps(["ended", children[pid], os.waitstatus_to_exitcode(status)]), flush=True)
"""


def _default_signal_dispositions() -> None:
    """A child inherits the signals its parent ignores, and strideguard rightly leaves an ignored signal
    ignored (as under ``nohup``). A suite started in the background by a shell without job control runs
    with SIGINT and SIGQUIT ignored, so its writers never saw SIGINT (it failed twice so): the children
    start with every handled signal at its default, as an interactive shell starts them."""
    for signum in output_module._HANDLED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.commands
def test_signals_during_the_write_remove_the_temporary_file(policy, tmp_path):
    """Every catchable signal that would end the process, not only SIGINT and SIGTERM: one writer per
    signal, each a process of its own (forked from one that imported strideguard once), signalled while
    torch's writer is inside a write."""
    folders = {signum: tmp_path / signum.name for signum in output_module._HANDLED_SIGNALS}
    for folder in folders.values():
        folder.mkdir()
    plan = [(str(folder), ["fix", str(policy), "-o", str(folder / "fixed.pt2")]) for folder in folders.values()]
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKED_WRITERS, json.dumps(plan)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY,
        preexec_fn=_default_signal_dispositions,
    )
    pids = {}
    for _ in folders:
        line = parent.stdout.readline()
        assert line, parent.stderr.read()
        _, folder, pid = json.loads(line)
        pids[folder] = pid
    # Each writer is signalled the moment it is ready, whichever is first, so none waits behind another.
    waiting, deadline = dict(folders), time.monotonic() + 480
    while waiting and time.monotonic() < deadline:
        for signum, folder in list(waiting.items()):
            if (folder / "ready").exists():
                os.kill(pids[str(folder)], signum)
                del waiting[signum]
        assert parent.poll() is None or not waiting, parent.stderr.read()
        time.sleep(0.05)
    assert not waiting, f"never ready to write: {sorted(s.name for s in waiting)}"
    codes = dict(json.loads(line)[1:] for line in parent.stdout)
    assert parent.wait(timeout=240) == 0, parent.stderr.read()
    for signum, folder in folders.items():
        assert codes[str(folder)] == 128 + signum, (signum.name, (folder / "stderr").read_text())
        assert (folder / "stderr").read_text().strip().splitlines() == [f"strideguard: error: interrupted by {signum.name}"]
        assert not (folder / "fixed.pt2").exists()
        assert leftovers(folder) == []


@pytest.mark.commands
def test_a_full_disk_is_one_line_and_exit_2(policy, tmp_path):
    """A file-size limit makes the write fail with EFBIG, as a full disk fails it with ENOSPC."""
    limit = policy.stat().st_size // 4

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    output = tmp_path / "fixed.pt2"
    run = strideguard("fix", policy, "-o", output, preexec_fn=small_files)
    code, error = run.wait(timeout=300), run.stderr.read()
    assert code == 2, error
    assert error.strip().splitlines() == [f"strideguard: error: {output}: cannot be written: File too large (nothing was written)"]
    assert not output.exists()
    assert leftovers(tmp_path) == []


def test_a_write_error_never_reaches_torchs_writer(policy, tmp_path, monkeypatch):
    """torch's C++ stream writer aborts the process if it sees a failed write; here it would abort pytest."""
    program = torch.export.load(policy)
    real_write = os.write
    written = []

    def disk_fills_up(descriptor, data):
        if sum(written) > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(len(data))
        return real_write(descriptor, data)

    monkeypatch.setattr(output_module.os, "write", disk_fills_up)
    output = tmp_path / "fixed.pt2"
    with pytest.raises(ProgramFileError, match="No space left on device"):
        save_program(program, output)
    assert not output.exists()
    assert leftovers(tmp_path) == []


def test_force_keeps_the_replaced_files_mode(tmp_path):
    output = tmp_path / "private.bin"
    output.write_bytes(b"old")
    output.chmod(0o600)
    write_output(output, lambda file: file.write(b"new"), overwrite=True)
    assert output.read_bytes() == b"new"
    assert stat.S_IMODE(output.stat().st_mode) == 0o600


def test_force_replaces_a_dangling_link_not_what_it_points_to(tmp_path):
    link = tmp_path / "link.bin"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ProgramFileError, match="already exists"):
        write_output(link, lambda file: file.write(b"new"))
    assert link.is_symlink()
    write_output(link, lambda file: file.write(b"new"), overwrite=True)
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    "name, says, overwrite",
    [
        ("folder/", "ends with a '/'", True),
        ("existing-folder", "is a directory", True),
        ("input.pt2", "is the input file", True),
        ("link-to-input.pt2", "is the input file", True),
        ("fifo", "not a regular file", True),
        ("missing-folder/out.pt2", "no folder", False),
    ],
)
def test_outputs_that_are_refused(tmp_path, name, says, overwrite):
    source = tmp_path / "input.pt2"
    source.write_bytes(b"input")
    (tmp_path / "existing-folder").mkdir()
    (tmp_path / "link-to-input.pt2").symlink_to(source)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ProgramFileError, match=says):
        write_output(f"{tmp_path}/{name}", lambda file: file.write(b"new"), input_path=source, overwrite=overwrite)
    assert source.read_bytes() == b"input"
    assert leftovers(tmp_path) == []


def test_a_long_output_name_is_written_or_refused_before_the_work(tmp_path):
    """A name the file system takes is written (its temporary's name is cut to fit); a longer one is refused
    at once, before anything is computed."""
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")
    fitting = tmp_path / ("f" * (longest - 4) + ".pt2")
    write_output(fitting, lambda file: file.write(b"new"))
    assert fitting.read_bytes() == b"new"
    calls = []
    with pytest.raises(ProgramFileError, match=f"longer than the {longest} bytes"):
        write_output(tmp_path / ("f" * longest + ".pt2"), lambda file: calls.append(file))
    assert calls == [] and leftovers(tmp_path) == []


def test_a_signal_ignored_at_start_stays_ignored():
    """``nohup strideguard fix ...`` ignores SIGHUP; strideguard must not turn it back into a stop."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with output_module.interruptible():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == output_module._signals.handle
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)

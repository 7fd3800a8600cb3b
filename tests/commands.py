"""The command line as users run it, each command a process of its own, without paying torch's import each time.

Starting ``python -m strideguard`` costs about 5 s here before the command
does anything (importing torch, Inductor and strideguard), which is most of
what a command-line test costs. A ``CommandServer`` is one Python process
that imports ``strideguard.cli`` once, and runs nothing of torch's itself;
for each command it forks a child, which runs ``strideguard.cli.main`` (what
``python -m strideguard`` runs) with its own working folder, environment,
stdin from ``/dev/null`` and stdout and stderr to files, and ends with the
command's exit code. So every command starts from the same untouched state,
as a fresh process would, and nothing one command does reaches another or the
test process. What a fresh interpreter adds (the import itself, ``-m``'s
lookup) is tested by the few tests that still start one
(``test_cli.test_version_usage_and_flags_read_as_documented``,
``test_output_safety``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

SERVER = r"""
import json, os, sys, traceback
import strideguard.cli
print(json.dumps({"ready": os.getpid()}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.setpgid(0, 0)
            if request["cwd"]:
                os.chdir(request["cwd"])
            os.environ.update(request["env"])
            stdin = os.open(os.devnull, os.O_RDONLY)
            out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(stdin, 0); os.dup2(out, 1); os.dup2(err, 2)
            sys.argv = ["strideguard", *request["arguments"]]
            strideguard.cli.main(request["arguments"])
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    print(json.dumps({"started": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class CommandServer:
    """Runs ``strideguard ARGS`` in a forked child of one process that has imported the command line."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="strideguard-commands-")
        self._count = 0
        self._pending = b""
        # As a user's shell runs a command into a pipe: no COLUMNS (pytest-xdist's workers set COLUMNS=80, which
        # the command line honours); a test that wants a width says so (``run(..., env={"COLUMNS": "80"})``).
        environment = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
        self._process = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
            cwd=Path(__file__).resolve().parent.parent, env=environment,
        )
        assert "ready" in self._reply(timeout=300), "the command server did not start"

    def run(
        self, *arguments: str | os.PathLike, cwd: Optional[os.PathLike] = None, env: Optional[dict] = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess:
        self._count += 1
        stdout, stderr = (os.path.join(self._folder.name, f"{self._count}.{name}") for name in ("out", "err"))
        arguments = [str(a) for a in arguments]
        request = dict(arguments=arguments, cwd=str(cwd) if cwd else None, env=env or {}, stdout=stdout, stderr=stderr)
        self._process.stdin.write((json.dumps(request) + "\n").encode())
        child = self._reply(timeout=60)["started"]
        try:
            code = self._reply(timeout=timeout)["code"]
        except TimeoutError:
            os.killpg(child, signal.SIGKILL)
            self._reply(timeout=60)
            raise subprocess.TimeoutExpired(["strideguard", *arguments], timeout) from None
        read = lambda path: Path(path).read_text(errors="replace")  # noqa: E731
        return subprocess.CompletedProcess(["strideguard", *arguments], code, read(stdout), read(stderr))

    def _reply(self, timeout: float) -> dict:
        """The server's next line, read from the pipe by hand: a buffered reader could hold a second line
        that ``select`` would then wait for in vain."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(self._process.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the command server ended (exit {self._process.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait(timeout=60)
        self._folder.cleanup()

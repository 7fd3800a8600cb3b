"""Running a handed program in a child process that cannot outlive a time limit or outgrow a memory limit.

``verify`` runs the program: its eager run executes every op the file names
with the sizes it declares, and a ``while_loop`` whose bound comes from the
file runs as long as that bound says. The loader bounds what a file can make
strideguard *read*; what the program *does* is bounded here, by running it in
a child and stopping the child:

* the child is a fresh interpreter (nothing of the parent's state is
  shared) in a session of its own, so that stopping it also stops the
  compiler and the compile workers it started;
* the parent polls the child's resident memory and elapsed time, and kills
  the whole session when either passes its limit (``LimitExceeded``, one line
  naming the limit and the option that raises it);
* everything the child prints goes to a file, which the parent shows only
  when asked (``--debug``): torch.fx prints the generated code of a failing
  graph to stderr, which is not the one line an error must be;
* an exception in the child comes back as ``ChildFailed`` with its first line;
* the child's temporary folder (``TMPDIR``) is inside one the parent
  removes, so a child stopped at a limit leaves nothing behind;
* a signal that stops the parent (``Interrupted``) kills the child's session
  before it propagates, so nothing keeps running or writing.
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

DEFAULT_SECONDS = 1800.0
"""A real model's verify (a UNet compiles in about a minute here) fits many times over."""
POLL_SECONDS = 0.05


def default_memory() -> int:
    """Three quarters of the machine's memory: a program may use most of it, never all of it."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4)
    except (OSError, ValueError):
        return 16 << 30


@dataclass(frozen=True)
class Limits:
    """How long, and how much resident memory, a child may take."""

    seconds: float = DEFAULT_SECONDS
    memory: Optional[int] = None
    """Bytes; ``None`` for ``default_memory()``."""

    def __post_init__(self) -> None:
        # finite: an infinite limit is none, and every comparison with nan is false, so neither would stop anything
        if not (
            isinstance(self.seconds, (int, float)) and not isinstance(self.seconds, bool)
            and math.isfinite(self.seconds) and self.seconds > 0
        ):
            raise ValueError(f"strideguard: a time limit must be a positive number of seconds, and finite, got {self.seconds!r}")
        if self.memory is not None and not (
            isinstance(self.memory, int) and not isinstance(self.memory, bool) and self.memory > 0
        ):
            raise ValueError(f"strideguard: a memory limit must be a positive number of bytes, got {self.memory!r}")

    @property
    def bytes(self) -> int:
        return self.memory if self.memory is not None else default_memory()


class LimitExceeded(RuntimeError):
    """The child passed its time or memory limit and was stopped; the message says which, on one line."""


class ChildFailed(RuntimeError):
    """The work raised in the child: ``kind`` is its exception's type name, the message its first line."""

    def __init__(self, kind: str, message: str, speaks_for_itself: bool = False):
        self.kind = kind
        self.speaks_for_itself = speaks_for_itself
        """The message is already the user's words (a refused file's): shown as it is."""
        super().__init__(message)


def run_isolated(
    work: Callable[..., Any],
    *arguments: Any,
    limits: Limits,
    what: str = "the program",
    log: Optional[Callable[[str], None]] = None,
) -> Any:
    """``work(*arguments)`` in a child within ``limits``; its return value (``work`` must be a module-level
    function, and its arguments and result must pickle). ``log`` receives what the child printed, when given
    (``--debug``).

    The child is a fresh interpreter (``python -c``), not a ``multiprocessing``
    one: spawning would re-run the caller's main script in the child.
    """
    with tempfile.TemporaryDirectory(prefix="strideguard-child-") as folder:
        request, answer, printed = (os.path.join(folder, name) for name in ("request", "answer", "printed"))
        with open(request, "wb") as file:
            pickle.dump((work, arguments), file)
        command = [sys.executable, "-c", "from strideguard.prove.isolation import _child; _child()", request, answer]
        scratch = os.path.join(folder, "tmp")
        os.mkdir(scratch)
        with open(printed, "wb") as output:
            child = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True, close_fds=True,
                env=_child_environment(scratch),
            )
        try:
            _wait(child, limits, what)
        finally:
            _stop(child)
            if log is not None:
                with open(printed, "rb") as output:
                    text = output.read().decode(errors="replace")
                if text:
                    log(text)
        if not os.path.exists(answer):
            code = child.returncode
            reason = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            raise ChildFailed("ChildDied", f"the process running {what} ended without a result ({reason})")
        with open(answer, "rb") as file:
            status, payload = pickle.load(file)
    if status == "ok":
        return payload
    kind, message, speaks_for_itself = payload
    raise ChildFailed(kind, message, speaks_for_itself)


def _child_environment(scratch: str) -> dict[str, str]:
    """The child's temporary folder is one the parent removes, so that a child killed at a limit leaves
    nothing behind; Inductor keeps its usual cache, which is not temporary."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    return {**os.environ, "TMPDIR": scratch, "TORCHINDUCTOR_CACHE_DIR": os.path.abspath(cache)}


def _wait(child: subprocess.Popen, limits: Limits, what: str) -> None:
    started, memory = time.monotonic(), limits.bytes
    while child.poll() is None:
        if _resident_bytes(child.pid) > memory:
            raise LimitExceeded(
                f"{what} used more than {_gigabytes(memory)} of memory and was stopped (raise the limit: --memory, "
                "or verify(memory=...))"
            )
        if time.monotonic() - started > limits.seconds:
            raise LimitExceeded(
                f"{what} ran past the time limit of {limits.seconds:g} s and was stopped (raise it: --timeout, or "
                "verify(timeout=...))"
            )
        time.sleep(POLL_SECONDS)


def _gigabytes(count: int) -> str:
    return f"{count / (1 << 30):.1f} GiB" if count >= 1 << 30 else f"{count / (1 << 20):.0f} MiB"


def _resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _stop(child: subprocess.Popen) -> None:
    """Kill the child's whole session (its compiler and workers too), then reap it."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def _child() -> None:
    """The child's side: read the request, run it, write the answer (a one-line error for any failure)."""
    request, answer = sys.argv[1], sys.argv[2]
    with open(request, "rb") as file:
        work, arguments = pickle.load(file)
    try:
        result = ("ok", work(*arguments))
    except BaseException as error:  # noqa: BLE001 - every failure is reported to the parent as one line
        traceback.print_exc()
        lines = str(error).strip().splitlines()
        speaks_for_itself = getattr(error, "speaks_for_itself", False) is True
        result = ("error", (type(error).__name__, lines[0] if lines else "no message", speaks_for_itself))
    written = answer + ".part"
    with open(written, "wb") as file:
        pickle.dump(result, file)
    os.replace(written, answer)

"""Writing a file so that nothing is lost: not the input, not a file that exists or appears, not a half-written output.

``write_output`` writes into a new temporary file in the output's folder,
flushes it to disk, then publishes it:

* without ``overwrite``, with ``os.link(temporary, output)``, which fails if
  ``output`` exists by then, so a file created at that path while strideguard
  ran (or by a second strideguard) is never replaced; on a file system without
  hard links, by creating ``output`` exclusively and copying;
* with ``overwrite``, with ``os.replace``, giving the new file the replaced
  file's permission bits.

Write errors never reach torch's C++ stream writer, which aborts the process
when its destructor sees a failed write: the writer torch is handed swallows
them and they are raised once torch is done. SIGINT, SIGTERM, SIGHUP and every
other catchable signal that would end the process (``_HANDLED_SIGNALS``)
during the write are held until torch returns, so that its writer is never
interrupted (it stops writing at once); then the temporary file is removed
and ``Interrupted`` is raised. A signal that comes once the file is complete
takes effect after it is published. The temporary file is removed on every
failure.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import shutil
import signal
import stat
from typing import BinaryIO, Callable, Iterator, Optional

import torch
from torch.export import ExportedProgram

from .errors import ProgramFileError

_HANDLED_SIGNALS = tuple(
    getattr(signal, name)
    for name in (
        "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF",
        "SIGXCPU", "SIGIO", "SIGPWR", "SIGSTKFLT",
    )
    if hasattr(signal, name)
)
"""Every signal whose default action ends the process and that Python can catch, except the faults a
running program raises on itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS, SIGTRAP), which no
handler could survive. SIGXFSZ is ignored instead; SIGKILL and SIGSTOP cannot be caught (a SIGKILL
during a write leaves the temporary ``.NAME.HEX.tmp`` beside the output)."""
MAX_TEMPORARY_SUFFIX = len(".") + 12 + len(".tmp") + len(".")
"""What the temporary's name adds to the output's: ``.NAME.<12 hex digits>.tmp``."""


class Interrupted(BaseException):
    """A signal asked strideguard to stop; whatever it was writing has been removed."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _Signals:
    """Turns handled signals into ``Interrupted``, or holds them while a write must not be interrupted."""

    def __init__(self) -> None:
        self.holding = False
        self.pending: Optional[int] = None

    def handle(self, signum: int, frame) -> None:
        if self.holding:
            self.pending = self.pending or signum
        else:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        holding, self.holding = self.holding, True
        try:
            yield
        finally:
            self.holding = holding
            if self.pending and not holding:
                signum, self.pending = self.pending, None
                raise Interrupted(signum)  # replaces any error in flight: the user asked to stop


_signals = _Signals()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within this block, SIGINT, SIGTERM, SIGHUP and the other signals that would end the process raise
    ``Interrupted`` (held during writes), unless they were ignored when it was entered.

    SIGXFSZ is ignored, so that exceeding a file-size limit fails the write
    with ``EFBIG`` (reported as a write error) instead of killing the process.
    """
    # A signal ignored when strideguard started (nohup's SIGHUP, SIGINT in a background job) stays ignored:
    # whoever started it asked for that.
    previous = {
        signum: signal.signal(signum, _signals.handle)
        for signum in _HANDLED_SIGNALS
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    previous_xfsz = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.signal(signal.SIGXFSZ, previous_xfsz)


def check_output_path(
    output: os.PathLike | str, *, input_path: Optional[os.PathLike | str] = None, overwrite: bool = False
) -> None:
    """Refuse an output that is a folder, the input, an existing file (unless ``overwrite``) or in no folder.

    Checked before the work starts so that a mistake costs nothing; the
    guarantee itself comes from how ``write_output`` publishes.
    """
    text = os.fspath(output)
    if not text:
        raise ProgramFileError(text, "is empty; give the path of the file to write")
    if text.endswith(("/", os.sep)) or (os.altsep and text.endswith(os.altsep)):
        raise ProgramFileError(text, "ends with a '/', which names a folder; give the path of the file to write")
    if os.path.isdir(text):
        raise ProgramFileError(text, "is a directory; give the path of the file to write")
    if os.path.lexists(text):
        if input_path is not None and _same_file(text, input_path):
            raise ProgramFileError(text, "is the input file; strideguard never overwrites its input")
        if not overwrite:
            raise ProgramFileError(text, "already exists; strideguard replaces a file only with --force")
        if os.path.exists(text) and not stat.S_ISREG(os.stat(text).st_mode):
            raise ProgramFileError(text, "is not a regular file; strideguard replaces regular files only")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise ProgramFileError(text, f"cannot be written: no folder {folder}")
    longest = _longest_name(folder)
    if len(os.fsencode(os.path.basename(text))) > longest:
        raise ProgramFileError(text, f"cannot be written: its name is longer than the {longest} bytes this file system allows")


def _longest_name(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _same_file(first: str, second: os.PathLike | str) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


class _Sink(io.RawIOBase):
    """What torch or matplotlib writes into: the temporary file, with errors and signals kept from the writer.

    Every ``write`` reports success to its caller. The first failure (or a
    held signal) stops the writing; ``finish`` raises it afterwards.
    """

    def __init__(self, descriptor: int):
        super().__init__()
        self.descriptor = descriptor
        self.error: Optional[OSError] = None
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if self.error is None and _signals.pending is None:
            try:
                done = 0
                while done < len(view):
                    done += os.write(self.descriptor, view[done:])
                self.written += done
            except OSError as error:
                self.error = error
        return len(view)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        # torch.export.save rewinds its buffer after writing; there is nothing to rewind for.
        return self.written

    def tell(self) -> int:
        return self.written

    def finish(self, output: str) -> None:
        if self.error is None:
            try:
                os.fsync(self.descriptor)
            except OSError as error:
                self.error = error
        if self.error is not None:
            raise ProgramFileError(output, f"cannot be written: {self.error.strerror or self.error} (nothing was written)")


def write_output(
    output: os.PathLike | str,
    write: Callable[[BinaryIO], None],
    *,
    input_path: Optional[os.PathLike | str] = None,
    overwrite: bool = False,
) -> None:
    """Have ``write`` fill a new file, then publish it at ``output`` (see the module docstring)."""
    output = os.fspath(output)
    check_output_path(output, input_path=input_path, overwrite=overwrite)
    folder = os.path.dirname(os.path.abspath(output))
    temporary = os.path.join(folder, _temporary_name(os.path.basename(output), _longest_name(folder)))
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as error:
        raise ProgramFileError(output, f"cannot be written: {error.strerror}") from None
    try:
        with _signals.held():  # a signal during the write stops it here, before anything is published
            try:
                sink = _Sink(descriptor)
                write(sink)
                sink.finish(output)
                if overwrite:
                    _keep_mode(descriptor, output)
            finally:
                os.close(descriptor)
        with _signals.held():  # once complete, the file is published whole, then a signal takes effect
            _publish(temporary, output, overwrite=overwrite, input_path=input_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    _sync_folder(folder)


def _temporary_name(name: str, longest: int) -> str:
    """``.NAME.<hex>.tmp``, the name cut short enough (in bytes) that the whole fits the file system's limit."""
    shortened = os.fsdecode(os.fsencode(name)[: max(longest - MAX_TEMPORARY_SUFFIX, 1)])
    return f".{shortened}.{secrets.token_hex(6)}.tmp"


def save_program(
    program: ExportedProgram,
    output: os.PathLike | str,
    *,
    input_path: Optional[os.PathLike | str] = None,
    overwrite: bool = False,
) -> None:
    """Write ``program`` with ``torch.export.save`` to ``output`` through ``write_output``."""
    write_output(output, lambda file: torch.export.save(program, file), input_path=input_path, overwrite=overwrite)


def _keep_mode(descriptor: int, output: str) -> None:
    """A replaced regular file keeps its permission bits (set-id bits are not carried over)."""
    try:
        status = os.lstat(output)
    except FileNotFoundError:
        return
    if stat.S_ISREG(status.st_mode):
        os.fchmod(descriptor, stat.S_IMODE(status.st_mode) & 0o777)


def _publish(temporary: str, output: str, *, overwrite: bool, input_path: Optional[os.PathLike | str]) -> None:
    if input_path is not None and os.path.lexists(output) and _same_file(output, input_path):
        raise ProgramFileError(output, "is the input file; strideguard never overwrites its input")
    if overwrite:
        try:
            os.replace(temporary, output)
        except IsADirectoryError:
            raise ProgramFileError(output, "is a directory; give the path of the file to write") from None
        except OSError as error:
            raise ProgramFileError(output, f"cannot be written: {error.strerror}") from None
        return
    try:
        os.link(temporary, output, follow_symlinks=False)
    except FileExistsError:
        raise ProgramFileError(
            output, "appeared while strideguard was running and was left as it is; strideguard replaces a file only with --force"
        ) from None
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS):
            raise ProgramFileError(output, f"cannot be written: {error.strerror}") from None
        _copy_exclusively(temporary, output)


def _copy_exclusively(temporary: str, output: str) -> None:
    """For file systems without hard links: create ``output`` only if absent, then copy into it."""
    try:
        descriptor = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        raise ProgramFileError(
            output, "appeared while strideguard was running and was left as it is; strideguard replaces a file only with --force"
        ) from None
    except OSError as error:
        raise ProgramFileError(output, f"cannot be written: {error.strerror}") from None
    try:
        with open(temporary, "rb") as source, os.fdopen(descriptor, "wb", closefd=False) as target:
            shutil.copyfileobj(source, target)
            target.flush()
            os.fsync(descriptor)
    except OSError as error:
        os.unlink(output)
        raise ProgramFileError(output, f"cannot be written: {error.strerror} (nothing was written)") from None
    except BaseException:
        os.unlink(output)
        raise
    finally:
        os.close(descriptor)


def _sync_folder(folder: str) -> None:
    """Make the new directory entry durable; not every file system supports it, and nothing depends on it."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

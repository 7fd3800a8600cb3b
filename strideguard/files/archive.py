"""The file and its zip archive: what may be opened, which members may exist, and how large they may be.

Checked before torch reads a byte of any member:

* the path names a regular file: a FIFO, a device such as ``/dev/zero``, a
  socket or a directory is refused after ``fstat``, without a blocking read
  (the file is opened with ``O_NONBLOCK``, which makes opening a FIFO return
  at once);
* the zip directory is small and lists few enough members;
* every member sits under the archive's one root folder, once, under a name
  ``torch.export.save`` writes (``torch.export.load`` reads every member under
  ``models/``, runs ``data/aotinductor/`` libraries and unpickles other
  formats, so anything else is refused);
* every member is stored uncompressed, as torch writes them, so a member
  costs what it occupies in the file: no zip bomb can expand, and the members
  together may not claim more bytes than the file has (which also rules out
  members overlapping in the file);
* torch's own reader (``PT2ArchiveReader``, the one ``load_pt2`` uses) sees
  exactly the same members with the same sizes, so that what was checked is
  what torch will read.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from typing import BinaryIO, Optional

import torch
from torch.export.pt2_archive import constants as pt2
from torch.export.pt2_archive._package import PT2ArchiveReader

from . import limits
from .errors import excerpt, ProgramFileError, Refused

MODEL = "model"
"""The one program name ``torch.export.save`` writes and ``torch.export.load`` returns."""

PROGRAM = pt2.MODELS_FILENAME_FORMAT.format(MODEL)
WEIGHTS_CONFIG = pt2.WEIGHTS_CONFIG_FILENAME_FORMAT.format(MODEL)
CONSTANTS_CONFIG = pt2.CONSTANTS_CONFIG_FILENAME_FORMAT.format(MODEL)
EXAMPLE_INPUTS = pt2.SAMPLE_INPUTS_FILENAME_FORMAT.format(MODEL)
WEIGHT_BLOB = re.compile(re.escape(pt2.WEIGHTS_DIR) + re.escape(pt2.WEIGHT_FILENAME_PREFIX) + r"[0-9]{1,9}")
CONSTANT_BLOB = re.compile(re.escape(pt2.CONSTANTS_DIR) + re.escape(pt2.TENSOR_CONSTANT_FILENAME_PREFIX) + r"[0-9]{1,9}")
def is_blob(member: str) -> bool:
    """A weight's or tensor constant's raw bytes."""
    return bool(WEIGHT_BLOB.fullmatch(member) or CONSTANT_BLOB.fullmatch(member))


_SMALL_MEMBERS = frozenset(
    {pt2.ARCHIVE_FORMAT_PATH, pt2.ARCHIVE_VERSION_PATH, "byteorder", "version", ".data/version", ".data/serialization_id"}
)
_EXTRA_FILE = re.compile(re.escape(pt2.EXTRA_DIR) + r"[A-Za-z0-9_.\-]{1,200}")

_FILE_KINDS = (
    (stat.S_ISDIR, "is a directory, not a .pt2 file"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a .pt2 file; strideguard reads regular files only"),
    (stat.S_ISCHR, "is a character device, not a .pt2 file; strideguard reads regular files only"),
    (stat.S_ISBLK, "is a block device, not a .pt2 file; strideguard reads regular files only"),
    (stat.S_ISSOCK, "is a socket, not a .pt2 file; strideguard reads regular files only"),
)


def open_regular_file(path: os.PathLike | str) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (symbolic links followed), or ``ProgramFileError``."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ProgramFileError(path, "no such file") from None
    except OSError as error:
        raise ProgramFileError(path, f"cannot be read: {error.strerror}") from None
    try:
        mode = os.fstat(descriptor).st_mode
        for is_kind, problem in _FILE_KINDS:
            if is_kind(mode):
                raise ProgramFileError(path, problem)
        if not stat.S_ISREG(mode):
            raise ProgramFileError(path, "is not a regular file")
        # Regular files ignore O_NONBLOCK; cleared anyway so that reads behave as usual.
        fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


@dataclass(frozen=True)
class Listing:
    """The members of a zip archive, by name under its root folder, with their sizes in bytes."""

    root: str
    sizes: dict[str, int]

    def __contains__(self, member: str) -> bool:
        return member in self.sizes


def list_members(file: BinaryIO, what: str, kind: str) -> Listing:
    """The members of the zip archive in ``file``, all stored, under one root, adding up to at most the file's size.

    ``kind`` says what the archive should be, for the refusal of one without a root folder.
    """
    file.seek(0, io.SEEK_END)
    size = file.tell()
    file.seek(0)
    try:
        end = zipfile._EndRecData(file)
    except OSError:
        end = None
    if not end:
        raise Refused(f"{what} is not a zip archive (torch.export.save writes a .pt2 zip archive)")
    if end[zipfile._ECD_ENTRIES_TOTAL] > limits.MAX_MEMBERS or end[zipfile._ECD_SIZE] > limits.MAX_CENTRAL_DIRECTORY:
        raise Refused(f"{what} lists more than {limits.MAX_MEMBERS} members or a larger directory than strideguard reads")
    try:
        infos = zipfile.ZipFile(file).infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
        raise Refused(f"{what} is a damaged zip archive") from None
    if not infos:
        raise Refused(f"{what} is an empty zip archive")
    if "/" not in infos[0].filename:
        raise Refused(f"{what} is a zip archive but not {kind}")
    root = infos[0].filename.split("/")[0]
    sizes: dict[str, int] = {}
    total = 0
    for info in infos:
        member = info.filename[len(root) + 1 :] if info.filename.startswith(root + "/") else None
        if member is None or not member:
            raise Refused(f"{what} has a member {excerpt(info.filename)} outside its root folder {excerpt(root)}")
        if member in sizes:
            raise Refused(f"{what} has the member {excerpt(member)} twice")
        if info.flag_bits & 0x1:
            raise Refused(f"{what} has an encrypted member {excerpt(member)}")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise Refused(
                f"{what} has a compressed member {excerpt(member)}; torch.export.save stores every member "
                "uncompressed, and strideguard reads no compressed member"
            )
        sizes[member] = info.file_size
        total += info.file_size
    if total > size:
        raise Refused(f"{what} has members adding up to {total} bytes in a file of {size} bytes")
    return Listing(root, sizes)


def check_program_members(listing: Listing, what: str) -> None:
    """Refuse any member ``torch.export.save`` would not write for one exported program."""
    if any(member.rsplit("/", 1)[-1] == "serialized_exported_program.json" for member in listing.sizes):
        raise Refused(
            f"{what} was saved in the format of torch 2.7 and earlier, whose weights torch unpickles with "
            "weights_only=False; strideguard does not read it: re-save the program with this torch"
        )
    if pt2.ARCHIVE_FORMAT_PATH not in listing or pt2.ARCHIVE_VERSION_PATH not in listing:
        raise Refused(f"{what} is a zip archive but not an exported program saved by torch.export.save")
    for member in listing.sizes:
        problem = _unexpected_member(member)
        if problem:
            raise Refused(f"{what} {problem}")
    for required in (PROGRAM, WEIGHTS_CONFIG, CONSTANTS_CONFIG, EXAMPLE_INPUTS):
        if required not in listing:
            raise Refused(f"{what} is incomplete: {required} is missing")


def _unexpected_member(member: str) -> Optional[str]:
    if member in _SMALL_MEMBERS or member in (PROGRAM, WEIGHTS_CONFIG, CONSTANTS_CONFIG, EXAMPLE_INPUTS):
        return None
    if WEIGHT_BLOB.fullmatch(member) or CONSTANT_BLOB.fullmatch(member) or _EXTRA_FILE.fullmatch(member):
        return None
    if member.startswith(pt2.AOTINDUCTOR_DIR):
        return (
            f"contains AOTInductor-compiled code ({pt2.AOTINDUCTOR_DIR}), which torch.export.load would "
            "load and run; strideguard reads exported programs only"
        )
    if member in (f"{pt2.WEIGHTS_DIR}{MODEL}.pt", f"{pt2.CONSTANTS_DIR}{MODEL}.pt"):
        return f"stores its weights or constants in the legacy pickled format ({member}), which torch unpickles unsafely"
    if member.startswith((pt2.CONSTANTS_DIR + pt2.CUSTOM_OBJ_FILENAME_PREFIX, pt2.CONSTANTS_DIR + pt2.OPAQUE_OBJ_FILENAME_PREFIX)):
        return f"holds a script or opaque object ({excerpt(member)}), which torch would unpickle; strideguard refuses pickled objects"
    if member.startswith(pt2.MODELS_DIR):
        return f"has the member {excerpt(member)}: torch would load every member under {pt2.MODELS_DIR}, strideguard reads only {PROGRAM}"
    return f"has the member {excerpt(member)}, which torch.export.save does not write"


class Archive:
    """A checked ``.pt2`` archive read through torch's own reader, refusing to read a member past its bound."""

    def __init__(self, file: BinaryIO):
        what = ""  # the messages are about the file itself: "<path>: is not a zip archive"
        self.listing = list_members(file, what, "an exported program saved by torch.export.save")
        check_program_members(self.listing, what)
        file.seek(0)
        try:
            self.reader = PT2ArchiveReader(file)
            names = set(self.reader.get_file_names())
            sizes = {name: self.reader.archive_file.get_record_size(name) for name in names}
        except Exception as error:
            raise Refused(f"torch {torch.__version__} cannot read the archive: {_first_line(error)}") from None
        if sizes != self.listing.sizes:
            raise Refused("reads differently with torch's zip reader and Python's: its directory is ambiguous")

    def size(self, member: str) -> int:
        return self.listing.sizes[member]

    def read(self, member: str, limit: int) -> bytes:
        if self.size(member) > limit:
            raise Refused(f"has a member {member} of {self.size(member)} bytes, more than the {limit} strideguard reads")
        return self.reader.read_bytes(member)

    def check_header(self) -> None:
        """The small members: format, version and byte order."""
        version = self.read(pt2.ARCHIVE_VERSION_PATH, limits.MAX_SMALL_MEMBER)
        if version != pt2.ARCHIVE_VERSION_VALUE.encode():
            raise Refused(
                f"was saved by an incompatible torch (archive version {excerpt(version.decode('latin-1'), 16)}; "
                f"torch {torch.__version__} reads version {pt2.ARCHIVE_VERSION_VALUE!r})"
            )
        for member in _SMALL_MEMBERS & self.listing.sizes.keys():
            self.read(member, limits.MAX_SMALL_MEMBER)
        for member in self.listing.sizes:
            if _EXTRA_FILE.fullmatch(member) and self.size(member) > limits.MAX_EXTRA_FILE:
                raise Refused(f"has an extra file {member} larger than {limits.MAX_EXTRA_FILE} bytes")


_SAVED_TENSORS_MEMBERS = re.compile(
    r"data\.pkl|\.format_version|\.storage_alignment|byteorder|version|\.data/version|\.data/serialization_id|data/[0-9]{1,9}"
)


def check_saved_tensors(file: BinaryIO, what: str) -> None:
    """The nested ``torch.save`` archive of the example inputs: known members, stored, within its own size."""
    listing = list_members(file, what, "an archive written by torch.save")
    for member, size in listing.sizes.items():
        if not _SAVED_TENSORS_MEMBERS.fullmatch(member):
            raise Refused(f"{what} has the member {excerpt(member)}, which torch.save does not write")
    if "data.pkl" not in listing:
        raise Refused(f"{what} is not a torch.save archive (no data.pkl)")
    if listing.sizes["data.pkl"] > limits.MAX_CONFIG_JSON:
        raise Refused(f"{what} has a pickle larger than {limits.MAX_CONFIG_JSON} bytes")


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return excerpt(lines[0], 200)

"""Reading ``.pt2`` files without letting a file run code, hang or exhaust memory, and writing them without losing one.

``torch.export.load`` trusts its file: it unpickles, ``eval``-s sympy
strings, runs compiled libraries, and the program it returns pastes names,
guards and strings from the file into Python and C++ that torch generates and
runs. ``load_program`` therefore accepts only what it knows to be harmless,
checking everything before torch deserializes anything:

* ``archive``: a regular file, a zip archive whose every member is one
  ``torch.export.save`` writes, stored uncompressed, within the file's size;
* ``program``: the program's JSON walked against torch's own schema
  dataclasses (``walk``), every string checked by what torch does with it
  (``text``, ``expressions``, ``operators``, ``trees``), every integer bounded;
* the weights and constants: plain tensors that fit in their stored bytes;
* the example inputs: plain containers of dense tensors and scalars with
  identifier keys, laid out as the program's input spec says.

Then ``load_pt2`` (what ``torch.export.load`` calls first) reads the same open
file; the pre-2.8 fallback of ``torch.export.load`` is never used. The bounds
are in ``limits``; ``docs/loading-safety.md`` describes the whole.

``output`` writes files (``save_program``, ``write_output``): never over the
input, never over an existing file without ``overwrite`` (even one created
while strideguard runs), atomically, and with write errors and signals
reported rather than aborting.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import types
import typing
from typing import Iterator

import torch
from torch._export.serde import serialize
from torch.export import ExportedProgram
from torch.export.pt2_archive import constants as pt2
from torch.export.pt2_archive._package import load_pt2

from . import archive, limits
from .archive import Archive
from .errors import ProgramFileError, Refused, excerpt
from .output import Interrupted, check_output_path, interruptible, save_program, write_output
from .program import ProgramFacts, check_payloads, check_program
from .trees import check_example_inputs, load_example_inputs, strict_json

__all__ = [
    "Interrupted",
    "ProgramFileError",
    "check_output_path",
    "interruptible",
    "load_program",
    "save_program",
    "write_output",
]


def load_program(path: os.PathLike | str) -> ExportedProgram:
    """The program ``torch.export.save`` wrote to ``path``, or ``ProgramFileError`` saying why it is refused."""
    with archive.open_regular_file(path) as file:
        try:
            check_file(file)
        except Refused as refusal:
            raise ProgramFileError(path, str(refusal)) from None
        file.seek(0)
        return _load_checked(path, file)


def check_file(file) -> None:
    """Every check ``load_program`` makes, on an open archive, in the order torch would read; raises ``Refused``."""
    checked = Archive(file)
    checked.check_header()
    facts = check_program(strict_json(checked.read(archive.PROGRAM, limits.MAX_PROGRAM_JSON), "the program"))
    _check_weights_and_constants(checked)
    _check_example_inputs(checked, facts)


def _check_weights_and_constants(checked: Archive) -> None:
    blobs = {member: size for member, size in checked.listing.sizes.items() if archive.is_blob(member)}
    used = set()
    for config_name, folder, prefix, kind in (
        (archive.WEIGHTS_CONFIG, pt2.WEIGHTS_DIR, pt2.WEIGHT_FILENAME_PREFIX, "weight"),
        (archive.CONSTANTS_CONFIG, pt2.CONSTANTS_DIR, pt2.TENSOR_CONSTANT_FILENAME_PREFIX, "constant"),
    ):
        config = strict_json(checked.read(config_name, limits.MAX_CONFIG_JSON), f"the {kind} configuration")
        used |= check_payloads(config, folder, prefix, kind, blobs)
    unused = sorted(blobs.keys() - used)
    if unused:
        raise Refused(f"has the member {unused[0]}, which no weight or constant uses")


def _check_example_inputs(checked: Archive, facts: ProgramFacts) -> None:
    """Empty example inputs are allowed (``verify`` then says it needs some); others must match the program."""
    data = checked.read(archive.EXAMPLE_INPUTS, checked.size(archive.EXAMPLE_INPUTS))
    if data:
        check_example_inputs(load_example_inputs(data, archive.check_saved_tensors), facts.in_spec, facts.user_inputs)


_TYPE_HINTS_LOCK = threading.Lock()


@contextlib.contextmanager
def _type_hints_read_once() -> Iterator[None]:
    """torch's reader (``serialize._dict_to_dataclass``) asks ``typing.get_type_hints`` again for every
    object it builds: 65 % of reading a 20,000-node program. The schema's classes do not change, so while
    it reads, the reader's own ``typing`` answers each class once (nothing else sees the difference)."""
    hints = functools.lru_cache(maxsize=None)(lambda cls: typing.get_type_hints(cls, globalns=vars(serialize.schema)))

    def get_type_hints(cls, globalns=None, localns=None, include_extras=False):
        if globalns is vars(serialize.schema) and localns is None and not include_extras:
            return hints(cls)
        return typing.get_type_hints(cls, globalns, localns, include_extras)

    cached = types.SimpleNamespace(**{name: getattr(typing, name) for name in dir(typing) if not name.startswith("__")})
    cached.get_type_hints = get_type_hints
    with _TYPE_HINTS_LOCK:
        if serialize.typing is not typing:  # another reader's, or torch's module no longer imports typing plainly
            yield
            return
        serialize.typing = cached
        try:
            yield
        finally:
            serialize.typing = typing


def _load_checked(path, file) -> ExportedProgram:
    try:
        with _type_hints_read_once():
            contents = load_pt2(file)
    except Exception as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise ProgramFileError(path, f"torch {torch.__version__} could not read the program: {excerpt(lines[0], 200)}") from error
    return contents.exported_programs[archive.MODEL]

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
from typing import Any, Iterator

import sympy

import torch
from torch._export.serde import serialize
from torch.export import ExportedProgram
from torch.export.pt2_archive import constants as pt2
from torch.export.pt2_archive._package import load_pt2

from . import archive, limits
from .archive import Archive
from .errors import excerpt, ProgramFileError, Refused
from .output import check_output_path, Interrupted, interruptible, save_program, write_output
from .program import check_payloads, check_program, ProgramFacts
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


_READER_LOCK = threading.Lock()


def _module_like(module: types.ModuleType, **replaced: Any) -> types.SimpleNamespace:
    space = types.SimpleNamespace(**{name: getattr(module, name) for name in dir(module) if not name.startswith("__")})
    for name, value in replaced.items():
        setattr(space, name, value)
    return space


@contextlib.contextmanager
def _torchs_reader_memoized() -> Iterator[None]:
    """torch's reader (``serialize.py``) works out again, for every object it builds, what it already knows:
    ``typing.get_type_hints`` of the schema class (65 % of reading a 20,000-node program), and
    ``sympy.sympify`` of every size expression, though a dynamic-shape program repeats a few thousand times
    the same few (10,000 parses of one expression took 17 s). While it reads, its own ``typing`` and
    ``sympy`` answer each class and each expression text once. Both answers depend on nothing else: the
    classes do not change, and a checked expression is ``sympy.srepr`` text, which names no symbol by its
    bare name. Nothing else sees the difference, and torch's modules are put back after."""
    schema_names = vars(serialize.schema)
    hints = functools.lru_cache(maxsize=None)(lambda cls: typing.get_type_hints(cls, globalns=schema_names))
    parsed: dict[str, Any] = {}

    def get_type_hints(cls, globalns=None, localns=None, include_extras=False):
        if globalns is schema_names and localns is None and not include_extras:
            return hints(cls)
        return typing.get_type_hints(cls, globalns, localns, include_extras)

    def sympify(value, *args, **kwargs):
        if not isinstance(value, str) or args or set(kwargs) - {"locals"}:
            return sympy.sympify(value, *args, **kwargs)
        if value not in parsed:
            parsed[value] = sympy.sympify(value, **kwargs)
        return parsed[value]

    with _READER_LOCK:
        if serialize.typing is not typing or serialize.sympy is not sympy:  # torch no longer imports them plainly
            yield
            return
        serialize.typing = _module_like(typing, get_type_hints=get_type_hints)
        serialize.sympy = _module_like(sympy, sympify=sympify)
        try:
            yield
        finally:
            serialize.typing, serialize.sympy = typing, sympy


def _load_checked(path, file) -> ExportedProgram:
    try:
        with _torchs_reader_memoized():
            contents = load_pt2(file)
    except Exception as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise ProgramFileError(path, f"torch {torch.__version__} could not read the program: {excerpt(lines[0], 200)}") from error
    return contents.exported_programs[archive.MODEL]

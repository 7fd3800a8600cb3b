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

import os

import torch
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


def _load_checked(path, file) -> ExportedProgram:
    try:
        contents = load_pt2(file)
    except Exception as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise ProgramFileError(path, f"torch {torch.__version__} could not read the program: {excerpt(lines[0], 200)}") from error
    return contents.exported_programs[archive.MODEL]

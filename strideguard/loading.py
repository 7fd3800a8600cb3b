"""Reading and writing ``.pt2`` files without letting a file run code.

``torch.export.load`` trusts its file. Reading torch 2.13's loader
(``torch/export/__init__.py``, ``torch/export/pt2_archive/_package.py``,
``torch/_export/serde/serialize.py``) and the code that later consumes a
loaded program, a ``.pt2`` file can run code of its author's choosing:

* at load: pickled tensor subclasses and tensor constants
  (``torch.load(weights_only=False)``), opaque constants (``pickle.loads``),
  TorchScript custom objects (``torch._C._pickle_load_obj``), example inputs
  that the safe unpickler refuses (retried with ``weights_only=False``),
  AOTInductor shared libraries under ``data/aotinductor/`` (loaded with
  ``dlopen``), symbolic-shape strings (``sympy.sympify``, which calls
  ``eval``), and, when any of this fails, a fallback to the pre-2.8 format
  whose weights are unpickled with ``weights_only=False``;
* when the program is turned back into a module or compiled (what ``verify``
  does): ``guards_code`` strings and string-valued inputs executed as Python,
  argument names and keyword names pasted into generated Python, and weight
  names, string arguments and stack traces pasted into generated C++.

So a file is read through torch's own archive reader and checked before
torch deserializes anything; then ``load_pt2`` (what ``torch.export.load``
calls first) loads it, never the legacy fallback. Operator libraries and
modules named in a file are never imported or loaded.
"""

from __future__ import annotations

import ast
import io
import json
import keyword
import os
import re
import secrets
import zipfile
from typing import IO, Any, Iterator

import sympy
import torch
import torch.utils._sympy.functions as torch_sympy_functions
from torch.export import ExportedProgram
from torch.export.pt2_archive import constants as archive
from torch.export.pt2_archive._package import PT2ArchiveReader, load_pt2
from torch._export.serde.schema import SCHEMA_VERSION



class ProgramFileError(Exception):
    """A file strideguard cannot or will not read or write; the message names it and says why."""

    def __init__(self, path: os.PathLike | str, problem: str):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


_ACCEPTED_DIALECTS = {"", "ATEN", "TRAINING"}
"""Verifiers that admit only operator overloads, higher-order operators and
symbolic-size builtins as node targets; torch checks them when it builds the
program, so no other Python callable can become a node."""

_CODE_CHARACTERS = re.compile(r"[\"\\\x00-\x1f\x7f]")
"""Characters that end or escape a string literal in generated Python or C++."""

_SYMPY_CLASSES = frozenset(
    {
        "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs", "floor", "ceiling",
        "Integer", "Rational", "Equality", "Unequality", "StrictLessThan", "LessThan",
        "StrictGreaterThan", "GreaterThan", "And", "Or", "Not", "Xor", "Piecewise", "ExprCondPair",
        "Tuple", "BooleanTrue", "BooleanFalse", "Infinity", "NegativeInfinity", "NaN", "ComplexInfinity",
        "Zero", "One", "NegativeOne", "Half",
    }
    | {
        name
        for name, value in vars(torch_sympy_functions).items()
        if isinstance(value, type) and issubclass(value, sympy.Basic)
    }
)
"""What ``sympy.printing.srepr`` writes for the expressions of symbolic shapes."""

_SYMPY_CONSTANTS = frozenset({"oo", "zoo", "nan", "true", "false", "int_oo", "pi", "E", "I"})
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)")

_GUARD_FUNCTIONS = frozenset({"max", "min", "abs", "int", "float", "round"})
_GUARD_MATH = frozenset({"floor", "ceil", "trunc", "sqrt", "isnan", "isinf", "inf", "exp", "log", "log2"})
_GUARD_TENSOR_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_GUARD_OPERATORS = (
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
    ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.BitAnd, ast.BitOr,
)


def load_program(path: os.PathLike | str) -> ExportedProgram:
    """The program ``torch.export.save`` wrote to ``path``, or ``ProgramFileError``.

    Nothing in the file is executed, unpickled beyond plain tensors, imported
    or dlopen-ed (see the module docstring).
    """
    try:
        file = open(path, "rb")
    except FileNotFoundError:
        raise ProgramFileError(path, "no such file") from None
    except IsADirectoryError:
        raise ProgramFileError(path, "is a directory, not a .pt2 file") from None
    except OSError as error:
        raise ProgramFileError(path, f"cannot be read: {error.strerror}") from None
    with file:
        _check_archive(path, file)
        file.seek(0)
        try:
            contents = load_pt2(file)
        except Exception as error:
            raise ProgramFileError(path, f"torch {torch.__version__} could not read the program: {_first_line(error)}") from error
    program = contents.exported_programs["model"]
    _check_call_spec(path, program)
    return program


def check_output_path(output: os.PathLike | str, *, input_path: os.PathLike | str, overwrite: bool) -> None:
    """Refuse an output that would replace the input, an existing file (unless ``overwrite``) or a folder."""
    if os.path.isdir(output):
        raise ProgramFileError(output, "is a directory; give the path of the .pt2 file to write")
    if os.path.exists(output):
        if os.path.exists(input_path) and os.path.samefile(output, input_path):
            raise ProgramFileError(output, "is the input file; strideguard never overwrites its input")
        if not overwrite:
            raise ProgramFileError(output, "already exists (strideguard fix replaces it only with --force)")
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise ProgramFileError(output, f"cannot be written: no folder {directory}")


def save_program(program: ExportedProgram, output: os.PathLike | str) -> None:
    """Write ``program`` with ``torch.export.save`` so that ``output`` is either untouched or complete.

    The archive goes to a new file in the same folder (same file system, so
    the final ``os.replace`` is atomic), created with the usual permissions,
    flushed to disk, then renamed over ``output``; on any failure it is
    removed and ``output`` keeps its old content.
    """
    output = os.fspath(output)
    temporary = os.path.join(
        os.path.dirname(os.path.abspath(output)), f".{os.path.basename(output)}.{secrets.token_hex(4)}.tmp"
    )
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as error:
        raise ProgramFileError(output, f"cannot be written: {error.strerror}") from None
    try:
        with os.fdopen(descriptor, "wb") as file:
            torch.export.save(program, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, output)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    line = text.splitlines()[0]
    return line if len(line) <= 300 else line[:297] + "..."


def _check_archive(path: os.PathLike | str, file: IO[bytes]) -> None:
    """Everything about the archive that must hold before torch deserializes it.

    The archive is read with torch's own reader (``PT2ArchiveReader``), so
    what is checked is exactly what ``load_pt2`` will read.
    """
    try:
        reader = PT2ArchiveReader(file)
    except Exception:
        raise ProgramFileError(path, _not_an_archive(file)) from None
    names = set(reader.get_file_names())
    if archive.ARCHIVE_VERSION_PATH not in names:
        raise ProgramFileError(path, "is a zip archive but not an exported program saved by torch.export.save")
    version = reader.read_string(archive.ARCHIVE_VERSION_PATH)
    if version != archive.ARCHIVE_VERSION_VALUE:
        raise ProgramFileError(
            path,
            f"was saved by an incompatible torch (archive version {version!r}; "
            f"torch {torch.__version__} reads version {archive.ARCHIVE_VERSION_VALUE!r})",
        )
    if any(name.startswith(archive.AOTINDUCTOR_DIR) for name in names):
        raise ProgramFileError(
            path,
            f"contains AOTInductor-compiled code ({archive.AOTINDUCTOR_DIR}), which torch.export.load would "
            "load and run; strideguard reads exported programs only",
        )
    models = sorted(
        name[len(archive.MODELS_DIR) : -len(".json")]
        for name in names
        if name.startswith(archive.MODELS_DIR) and name.endswith(".json")
    )
    if "model" not in models:
        raise ProgramFileError(path, "is a torch archive without an exported program (no models/model.json)")
    for model in models:
        where = f"program {model!r}" if model != "model" else "the program"
        _check_payloads(path, reader, names, model, where)
        _check_example_inputs(path, reader, names, model, where)
        try:
            serialized = json.loads(reader.read_bytes(archive.MODELS_FILENAME_FORMAT.format(model)))
        except ValueError:
            raise ProgramFileError(path, f"{where} is not valid JSON") from None
        _check_program_json(path, serialized, where)


def _not_an_archive(file: IO[bytes]) -> str:
    file.seek(0)
    if not zipfile.is_zipfile(file):
        return "is not a zip archive (torch.export.save writes a .pt2 zip archive)"
    file.seek(0)
    with zipfile.ZipFile(file) as legacy:
        if any(name.split("/")[-1] == "serialized_exported_program.json" for name in legacy.namelist()):
            return (
                "was saved in the format of torch 2.7 and earlier, whose weights torch unpickles with "
                "weights_only=False; strideguard does not read it: re-save the program with this torch"
            )
    return "is a zip archive but not an exported program saved by torch.export.save"


def _check_payloads(path, reader: PT2ArchiveReader, names: set[str], model: str, where: str) -> None:
    """Refuse weights and constants that torch would unpickle with more than the safe unpickler."""
    for folder, config_format, kind in (
        (archive.WEIGHTS_DIR, archive.WEIGHTS_CONFIG_FILENAME_FORMAT, "weight"),
        (archive.CONSTANTS_DIR, archive.CONSTANTS_CONFIG_FILENAME_FORMAT, "constant"),
    ):
        if f"{folder}{model}.pt" in names:
            raise ProgramFileError(
                path, f"{where} stores its {kind}s in the legacy pickled format, which torch unpickles unsafely"
            )
        config_name = config_format.format(model)
        if config_name not in names:
            raise ProgramFileError(path, f"is incomplete: {config_name} is missing")
        try:
            entries = json.loads(reader.read_bytes(config_name))["config"]
            items = list(entries.items())
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ProgramFileError(path, f"is damaged: {config_name} is not a payload configuration") from None
        for name, entry in items:
            _check_plain(path, name, f"the {kind} name")
            if not isinstance(entry, dict):
                raise ProgramFileError(path, f"is damaged: {config_name} entry {name!r}")
            if entry.get("use_pickle"):
                raise ProgramFileError(
                    path,
                    f"{where} holds {kind} {name!r} as a pickled object, which torch would unpickle with "
                    "weights_only=False; strideguard refuses pickled objects",
                )
            path_name = str(entry.get("path_name", ""))
            if kind == "constant" and not path_name.startswith(archive.TENSOR_CONSTANT_FILENAME_PREFIX):
                raise ProgramFileError(
                    path,
                    f"{where} holds constant {name!r} as a script or opaque object ({path_name}), which torch "
                    "would unpickle; strideguard refuses pickled objects",
                )


def _check_example_inputs(path, reader: PT2ArchiveReader, names: set[str], model: str, where: str) -> None:
    """Example inputs the safe unpickler refuses are retried by torch with ``weights_only=False``."""
    name = archive.SAMPLE_INPUTS_FILENAME_FORMAT.format(model)
    if name not in names:
        raise ProgramFileError(path, f"is incomplete: {name} is missing")
    data = reader.read_bytes(name)
    if not data:
        return
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise ProgramFileError(
            path,
            f"the example inputs of {where} cannot be loaded with weights_only=True ({_unpickler_complaint(error)}); "
            "torch would retry with weights_only=False, which strideguard refuses",
        ) from None


def _unpickler_complaint(error: Exception) -> str:
    """The line of a ``weights_only`` failure that names what was refused, e.g. ``Unsupported global: ...``."""
    for line in str(error).splitlines():
        _, found, complaint = line.partition("WeightsUnpickler error: ")
        if found:
            return complaint.split(". ")[0]
    return _first_line(error)


def _check_program_json(path, serialized: Any, where: str) -> None:
    if not isinstance(serialized, dict):
        raise ProgramFileError(path, f"{where} is not a serialized exported program")
    saved_by = serialized.get("torch_version") or "an unknown torch"
    version = serialized.get("schema_version") or {}
    if not isinstance(version, dict) or version.get("major") != SCHEMA_VERSION[0]:
        found = f"{version.get('major')}.{version.get('minor')}" if isinstance(version, dict) else repr(version)
        raise ProgramFileError(
            path,
            f"was saved by an incompatible torch ({saved_by}, schema {found}); "
            f"torch {torch.__version__} reads schema {SCHEMA_VERSION[0]}.x",
        )
    dialects = serialized.get("verifiers") or [""]
    if "EDGE" in dialects:
        raise ProgramFileError(
            path,
            "is an ExecuTorch Edge program, which torch.export.load cannot read; give strideguard the ATen "
            "program saved before to_edge, or call strideguard.prepare_for_aoti on the Edge program in Python",
        )
    if not isinstance(dialects, list) or not set(dialects) <= _ACCEPTED_DIALECTS:
        raise ProgramFileError(path, f"{where} is in a dialect strideguard does not read: {dialects!r}")
    for text, keys in _strings(serialized):
        _check_string(path, text, keys)
    for node in _nodes(serialized):
        _check_node(path, node)
    for name, bounds in (serialized.get("range_constraints") or {}).items():
        if not isinstance(bounds, dict) or not all(
            bound is None or type(bound) is int for bound in (bounds.get("min_val"), bounds.get("max_val"))
        ):
            raise ProgramFileError(path, f"is damaged: the range of {name!r} is not a pair of integers")


def _strings(value: Any, keys: tuple[str, ...] = ()) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Every string in a JSON value, with the dictionary keys leading to it (a key itself: with ``""`` appended)."""
    if isinstance(value, str):
        yield value, keys
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key, keys + ("",)
            yield from _strings(item, keys + (key,))
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, keys)


def _nodes(value: Any) -> Iterator[dict]:
    """Every graph node in a serialized program, control-flow subgraphs included."""
    if isinstance(value, dict):
        if {"target", "inputs", "outputs"} <= value.keys():
            yield value
        for item in value.values():
            yield from _nodes(item)
    elif isinstance(value, list):
        for item in value:
            yield from _nodes(item)


def _check_string(path, text: str, keys: tuple[str, ...]) -> None:
    """One string of the program, by where it ends up.

    Node metadata stays data (only Inductor's kernel-profile mode pastes
    stack traces into a C++ raw string); tree specs are parsed, and their
    keyword names checked once loaded; symbolic expressions reach ``eval``;
    guards and argument names reach generated Python; everything else may be
    pasted into a Python or C++ string literal.
    """
    if "metadata" in keys:
        if keys[-1] == "stack_trace" and ')"' in text:
            raise ProgramFileError(path, 'a stack trace in the program contains \')"\', which would end a C++ string')
        return
    if keys and keys[-1] in ("in_spec", "out_spec"):
        return
    if keys and keys[-1] == "expr_str":
        if not _is_symbolic_expression(text):
            raise ProgramFileError(path, f"contains a symbolic-shape expression that is not plain sympy: {text[:80]!r}")
        return
    if keys and keys[0] == "guards_code":
        if not _is_shape_guard(text):
            raise ProgramFileError(path, f"contains a guard that is not a plain shape check: {text[:80]!r}")
        return
    if keys and keys[-1] == "forward_arg_names":
        if not _is_identifier(text):
            raise ProgramFileError(path, f"names a program argument {text[:80]!r}, which is not a Python identifier")
        return
    _check_plain(path, text, "a name or string in the program")
    if keys[:3] in (("graph_module", "graph", "inputs"), ("graph_module", "signature", "input_specs")) and "'" in text:
        raise ProgramFileError(path, f"has a string input {text[:80]!r} with a quote, which torch pastes into a guard")


def _check_plain(path, text: str, what: str) -> None:
    if _CODE_CHARACTERS.search(text):
        raise ProgramFileError(
            path, f"{what} {text[:80]!r} contains a quote, backslash or control character, which torch would paste "
            "into generated code",
        )


def _check_node(path, node: dict) -> None:
    target = node.get("target")
    if not isinstance(target, str):
        raise ProgramFileError(path, "is damaged: a node has no operator")
    if target.startswith("torch.ops."):
        _check_operator(path, target)
    elif not target.startswith(("_operator.", "math.", "torch.")):
        raise ProgramFileError(path, f"uses {target}, which torch cannot resolve to an operator")
    for argument in node.get("inputs") or []:
        name = argument.get("name", "") if isinstance(argument, dict) else None
        if not isinstance(name, str) or (name and not _is_identifier(name)):
            raise ProgramFileError(path, f"passes {target} an argument named {str(name)[:80]!r}, not a Python identifier")


def _check_operator(path, target: str) -> None:
    """An operator must already be registered: strideguard never loads the library a file names."""
    parts = target.split(".")[2:]
    resolved: Any = torch.ops
    for part in parts:
        resolved = getattr(resolved, part, None)
        if resolved is None:
            break
    if isinstance(resolved, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return
    namespace, name = (parts + ["", ""])[:2]
    if resolved is None and namespace not in ("aten", "prims", "higher_order"):
        raise ProgramFileError(
            path,
            f"uses the custom operator {namespace}::{name}, which is not registered in this process "
            "(strideguard never imports or loads the library a file names)",
        )
    raise ProgramFileError(path, f"uses {target}, which this torch ({torch.__version__}) does not have as an operator")


def _is_identifier(text: str) -> bool:
    return text.isidentifier() and text.isascii() and not keyword.iskeyword(text)


def _is_symbolic_expression(text: str) -> bool:
    """Whether ``text`` is what ``sympy.srepr`` writes for a shape expression, and nothing else.

    ``sympy.sympify`` evaluates its string as Python with sympy and builtins in
    scope; allowing only calls of sympy classes on numbers, symbols and such
    calls leaves nothing to execute.
    """
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return _is_sympy_node(tree.body)


def _is_sympy_node(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, float, bool)
    if isinstance(node, ast.Name):
        return node.id in _SYMPY_CONSTANTS
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and _is_sympy_node(node.operand)
    if isinstance(node, ast.Tuple):
        return all(_is_sympy_node(item) for item in node.elts)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    name = node.func.id
    constant_keywords = all(
        flag.arg is not None and isinstance(flag.value, ast.Constant) and type(flag.value.value) in (bool, int)
        for flag in node.keywords
    )
    if name == "Symbol":
        return (
            len(node.args) == 1
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _is_identifier(node.args[0].value)
            and constant_keywords
        )
    if name == "Float":
        first = node.args[0] if len(node.args) == 1 else None
        return (
            isinstance(first, ast.Constant)
            and (type(first.value) in (int, float) or (isinstance(first.value, str) and _NUMBER.fullmatch(first.value)))
            and constant_keywords
        )
    return (
        name in _SYMPY_CLASSES
        and not node.keywords
        and all(_is_sympy_node(argument) for argument in node.args)
    )


def _is_shape_guard(text: str) -> bool:
    """Whether ``text`` is a comparison of input sizes and numbers, as export writes in ``guards_code``.

    Torch pastes each guard into a function it ``exec``-s, and its text
    (unparsed) into a double-quoted message: only arithmetic on
    ``L['name'].size()[i]``-style reads and numbers may pass.
    """
    if _CODE_CHARACTERS.search(text) or "#" in text:
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return all(_is_guard_node(node) for node in ast.walk(tree.body))


def _is_guard_node(node: ast.AST) -> bool:
    if isinstance(node, _GUARD_OPERATORS + (ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Load)):
        return True
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, float, bool) or (isinstance(node.value, str) and _is_identifier(node.value))
    if isinstance(node, ast.Name):
        return node.id in ("L", "math") or node.id in _GUARD_FUNCTIONS
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "math":
            return node.attr in _GUARD_MATH
        return node.attr in _GUARD_TENSOR_METHODS
    if isinstance(node, ast.Call):
        function = node.func
        if node.keywords:
            return False
        if isinstance(function, ast.Name):
            return function.id in _GUARD_FUNCTIONS
        if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) and function.value.id == "math":
            return function.attr in _GUARD_MATH
        return isinstance(function, ast.Attribute) and function.attr in _GUARD_TENSOR_METHODS and not node.args
    return False


def _check_call_spec(path, program: ExportedProgram) -> None:
    """Keyword-argument names of the call are pasted into generated Python by ``program.module()``."""
    spec = program.call_spec.in_spec
    if spec is None or spec.num_children != 2 or spec.child(1).type is not dict:
        return
    for name in spec.child(1).context:
        if not (isinstance(name, str) and _is_identifier(name)):
            raise ProgramFileError(path, f"has a keyword argument named {str(name)[:80]!r}, not a Python identifier")

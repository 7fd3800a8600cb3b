"""Hostile and broken ``.pt2`` files, made in-process by editing archives that ``torch.export.save`` wrote.

Each ``Case`` stands for one class of problem from the loading-safety issue
or one channel in docs/loading-safety.md. A payload never does harm: it
creates a marker file next to the case's file, and the tests assert that the
marker never appears when strideguard reads the file. For the cases marked
``runs_in_torch``, ``demonstrate`` shows that plain torch does run the
payload, at load (``"load"``) or when the loaded program is called as
``verify`` calls it (``"call"``), so that the case tests something real.

Cases marked ``heavy`` would hang or take gigabytes if accepted; the tests
only ever read them in a subprocess with a time limit and a memory measure.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import sys
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch

from strideguard.examples import export_policy
from strideguard.files import limits

MARKER_MODULE = "strideguard_marker_module"
"""A module whose import creates the marker: what a file that makes torch import modules could run."""


def payload(marker: pathlib.Path) -> str:
    """Python that creates ``marker``: the stand-in for anything a payload could do."""
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


def unquoted_payload(marker: pathlib.Path) -> str:
    """The same without quotes, for places that would mangle them."""
    return f"exec(bytes({tuple(payload(marker).encode())}).decode())"


class TouchesOnUnpickle:
    """Unpickling it creates a file: what a hostile pickle could do instead."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


class Rich(torch.nn.Module):
    """One program with every kind of field the cases edit: weights, a buffer, a constant, a dynamic batch,
    a string input, a nested keyword input, an operator string argument and a symbolic-size node."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("offset", torch.ones(8))
        self.table = torch.arange(8.0)

    def forward(self, x, mode: str, *, extra):
        y = torch.nn.functional.gelu(self.lin(x) + self.offset + self.table, approximate="tanh")
        return y[:, :3] * extra["scale"], x.shape[0] * 2


class Branches(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


def rich_inputs() -> tuple[tuple, dict]:
    return (torch.randn(8, 8), "mean"), {"extra": {"scale": torch.tensor(2.0)}}


def save_sources(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """The programs the cases are made from, saved by torch.export.save."""
    folder.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=4, max=64)
    args, kwargs = rich_inputs()
    rich = torch.export.export(
        Rich(), args, kwargs, dynamic_shapes={"x": {0: batch}, "mode": None, "extra": {"scale": None}}
    )
    sources = {
        "rich": rich,
        "branches": torch.export.export(Branches(), (torch.randn(3),)),
        "policy": export_policy(batch=1),
    }
    paths = {}
    for name, program in sources.items():
        paths[name] = folder / f"{name}.pt2"
        torch.export.save(program, paths[name])
    return paths


class Workshop:
    """Saved source programs, and the edits that turn them into the case files of one folder."""

    def __init__(self, folder: pathlib.Path, sources: dict[str, pathlib.Path]):
        self.folder = folder
        self.sources = sources
        folder.mkdir(parents=True, exist_ok=True)

    def marker(self, case: str) -> pathlib.Path:
        return self.folder / f"{case}.ran"

    def copy(
        self,
        case: str,
        source: str = "rich",
        edit: Callable[[str, bytes], bytes] = lambda member, data: data,
        extra: Optional[dict[str, bytes]] = None,
        drop: Iterable[str] = (),
    ) -> pathlib.Path:
        """``source`` rewritten member by member (names without the root folder), plus ``extra`` members."""
        target = self.folder / f"{case}.pt2"
        with zipfile.ZipFile(self.sources[source]) as original, zipfile.ZipFile(target, "w") as copy:
            root = original.namelist()[0].split("/")[0]
            for info in original.infolist():
                member = info.filename.split("/", 1)[1]
                if member not in drop:
                    copy.writestr(info, edit(member, original.read(info)))
            for member, data in (extra or {}).items():
                copy.writestr(f"{root}/{member}", data)
        return target

    def edit_json(self, case: str, member: str, change: Callable[[Any], Any], source: str = "rich") -> pathlib.Path:
        """A copy with one JSON member changed in place by ``change`` (or replaced by what it returns)."""

        def edit(name: str, data: bytes) -> bytes:
            if name != member:
                return data
            value = json.loads(data)
            result = change(value)
            return json.dumps(value if result is None else result).encode()

        return self.copy(case, source, edit)

    def edit_program(self, case: str, change: Callable[[dict], Any], source: str = "rich") -> pathlib.Path:
        return self.edit_json(case, "models/model.json", change, source)

    def with_example_inputs(self, case: str, inputs: Any) -> pathlib.Path:
        buffer = io.BytesIO()
        torch.save(inputs, buffer)
        return self.copy(case, edit=lambda member, data: buffer.getvalue() if member == "data/sample_inputs/model.pt" else data)

    def with_members(self, case: str, members: dict[str, tuple[bytes | Callable[[], Iterable[bytes]], int]]) -> pathlib.Path:
        """A copy of ``rich`` whose listed members are replaced by (data or chunk generator, compression)."""
        target = self.folder / f"{case}.pt2"
        with zipfile.ZipFile(self.sources["rich"]) as original, zipfile.ZipFile(target, "w", allowZip64=True) as copy:
            for info in original.infolist():
                member = info.filename.split("/", 1)[1]
                if member not in members:
                    copy.writestr(info, original.read(info))
                    continue
                data, compression = members[member]
                entry = zipfile.ZipInfo(info.filename)
                entry.compress_type = compression
                with copy.open(entry, "w", force_zip64=True) as out:
                    for chunk in (data() if callable(data) else [data]):
                        out.write(chunk)
        return target


# --- edits of the program's JSON ------------------------------------------------------------------------------


def graph(program: dict) -> dict:
    return program["graph_module"]["graph"]


def node(program: dict, target: str) -> dict:
    return next(n for n in graph(program)["nodes"] if n["target"] == target)


def symbolic_expressions(value: Any) -> Iterable[dict]:
    """Every ``SymExpr`` in a program."""
    if isinstance(value, dict):
        if "expr_str" in value:
            yield value
        for item in value.values():
            yield from symbolic_expressions(item)
    elif isinstance(value, list):
        for item in value:
            yield from symbolic_expressions(item)


def rename(value: Any, old: str, new: str) -> Any:
    """Every string and key equal to ``old`` renamed ``new``, as if the input had been called that."""
    if isinstance(value, str):
        return new if value == old else value
    if isinstance(value, list):
        return [rename(item, old, new) for item in value]
    if isinstance(value, dict):
        return {(new if key == old else key): rename(item, old, new) for key, item in value.items()}
    return value


def renamed_input(new: str, old: str = "x") -> Callable[[dict], dict]:
    return lambda program: rename(program, old, new)


def sympy_payload(marker: pathlib.Path, program: dict) -> None:
    expression = next(symbolic_expressions(program))
    expression["expr_str"] = expression["expr_str"].replace("Symbol(", f"{payload(marker)} or Symbol(", 1)


def in_spec(program: dict) -> dict:
    return program["graph_module"]["module_call_graph"][0]["signature"]


def enum_import_spec(spec: str) -> str:
    """An input spec whose dict context holds an object torch's tree-spec reader imports a module for."""
    data = json.loads(spec)
    context = json.dumps([{"__enum__": True, "fqn": f"{MARKER_MODULE}:Thing", "name": "X"}])
    data[1]["children_spec"][1]["context"] = context
    data[1]["children_spec"][1]["children_spec"] = [{"type": None, "context": None, "children_spec": []}]
    return json.dumps(data)


def custom_autograd_node(program: dict) -> None:
    """The node the exporter's verifier admits and that imports the module its first argument names."""
    graph(program)["nodes"].insert(
        0,
        {
            "target": "torch.export.custom_ops._call_custom_autograd_function_in_pre_dispatch",
            "inputs": [{"name": "", "arg": {"as_string": f"{MARKER_MODULE}.Thing"}, "kind": 1}],
            "outputs": [{"as_none": True}],
            "metadata": {},
            "name": "imported",
        },
    )


def wrap_operator_node(program: dict) -> None:
    graph(program)["nodes"].insert(
        0,
        {
            "target": "torch.ops.higher_order.wrap",
            "inputs": [{"name": "", "arg": {"as_operator": "torch.os.system"}, "kind": 1}],
            "outputs": [{"as_none": True}],
            "metadata": {},
            "name": "wrapped",
        },
    )


def retarget(target: str) -> Callable[[dict], None]:
    def change(program: dict) -> None:
        node(program, "torch.ops.aten.gelu.default")["target"] = target

    return change


# --- example inputs -------------------------------------------------------------------------------------------


def shared_levels(depth: int) -> list:
    """A list holding the same list twice, ``depth`` times over: small pickled, 2**depth leaves flattened."""
    level: list = [torch.tensor(2.0)]
    for _ in range(depth):
        level = [level, level]
    return level


# --- members --------------------------------------------------------------------------------------------------


def zeros(total: int, chunk: int = 1 << 20) -> Callable[[], Iterable[bytes]]:
    return lambda: (bytes(min(chunk, total - start)) for start in range(0, total, chunk))


def padded_program(source: pathlib.Path, padding: int) -> Callable[[], Iterable[bytes]]:
    """The program's JSON followed by ``padding`` spaces (valid JSON, compressible to almost nothing)."""

    def chunks() -> Iterable[bytes]:
        with zipfile.ZipFile(source) as archive:
            yield archive.read(archive.namelist()[0].split("/")[0] + "/models/model.json")
        yield from zeros(padding)()

    def spaces() -> Iterable[bytes]:
        for chunk in chunks():
            yield chunk if chunk.strip(b"\0") else b" " * len(chunk)

    return spaces


def weights_config(change: Callable[[dict], None]) -> Callable[[str, bytes], bytes]:
    def edit(member: str, data: bytes) -> bytes:
        if member != "data/weights/model_weights_config.json":
            return data
        config = json.loads(data)
        change(config["config"])
        return json.dumps(config).encode()

    return edit


def sixteen_gigabytes(config: dict) -> None:
    meta = config["lin.weight"]["tensor_meta"]
    meta["sizes"], meta["strides"] = [{"as_int": 1 << 32}], [{"as_int": 1}]


def pickled_member(marker: pathlib.Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(TouchesOnUnpickle(marker), buffer)
    return buffer.getvalue()


# --- the cases ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    """The class of problem or the channel this case stands for."""
    says: str
    """A phrase the one-line refusal must contain."""
    make: Callable[[Workshop, pathlib.Path], pathlib.Path]
    """Builds the file from the workshop and the marker path its payload (if any) creates."""
    heavy: bool = False
    runs_in_torch: Optional[str] = None


def _cases() -> list[Case]:
    cases = [
        # The file itself.
        Case("missing", "path", "no such file", lambda w, m: w.folder / "missing.pt2"),
        Case("directory", "path", "is a directory", lambda w, m: _mkdir(w.folder / "directory.pt2")),
        Case("fifo", "non-regular file (hangs)", "FIFO", lambda w, m: _mkfifo(w.folder / "fifo.pt2"), heavy=True),
        Case("dev-zero", "non-regular file (hangs)", "character device", lambda w, m: _symlink(w.folder / "zero.pt2", "/dev/zero"), heavy=True),
        Case("empty", "not an archive", "not a zip archive", lambda w, m: _write(w.folder / "empty.pt2", b"")),
        Case("text", "not an archive", "not a zip archive", lambda w, m: _write(w.folder / "text.pt2", b"not a zip archive")),
        Case("truncated", "not an archive", "zip archive", lambda w, m: _write(w.folder / "truncated.pt2", w.sources["rich"].read_bytes()[:3000])),
        Case("other-zip", "not an archive", "not an exported program", lambda w, m: _zip(w.folder / "other.pt2", {"readme.txt": b"hello"})),
        Case("legacy-format", "legacy fallback (weights_only=False)", "torch 2.7 and earlier", lambda w, m: _zip(w.folder / "legacy.pt2", {"p/serialized_exported_program.json": b"{}"})),
        Case("newer-archive", "version", "incompatible torch", lambda w, m: w.copy("newer-archive", edit=lambda n, d: b"1" if n == "archive_version" else d)),
        Case("newer-schema", "version", "incompatible torch (9.0.0", lambda w, m: w.edit_program("newer-schema", _newer_schema)),
        # Members.
        Case("unlisted-model", "unlisted member under models/", "every member under models/", _unlisted_model, runs_in_torch="load"),
        Case("compiled-library", "AOTInductor shared library", "AOTInductor-compiled code", lambda w, m: w.copy("compiled-library", extra={"data/aotinductor/model/model.so": b"\x7fELF"})),
        Case("legacy-weights", "legacy pickled weights", "legacy pickled format", lambda w, m: w.copy("legacy-weights", extra={"data/weights/model.pt": pickled_member(m)}), runs_in_torch="load"),
        Case("opaque-constant", "opaque constant (pickle.loads)", "script or opaque object", _opaque_constant, runs_in_torch="load"),
        Case("script-constant", "TorchScript custom object", "script or opaque object", lambda w, m: w.copy("script-constant", extra={"data/constants/custom_obj_0": b"\x80\x02."})),
        Case("stray-member", "unknown member", "torch.export.save does not write", lambda w, m: w.copy("stray-member", extra={"notes/readme.txt": b"hi"})),
        Case("duplicate-member", "ambiguous archive", "twice", _duplicate_member),
        Case("outside-root", "ambiguous archive", "outside its root folder", _outside_root),
        Case("unused-blob", "unknown member", "no weight or constant uses", lambda w, m: w.copy("unused-blob", extra={"data/weights/weight_99": bytes(64)})),
        Case("compressed-member", "compression", "compressed member", lambda w, m: w.with_members("compressed-member", {"byteorder": (b"little", zipfile.ZIP_DEFLATED)})),
        Case("zip-bomb-weights", "zip bomb", "compressed member", _weight_bomb, heavy=True),
        Case("zip-bomb-program", "zip bomb", "compressed member", _program_bomb, heavy=True),
        # Weights and constants.
        Case("pickled-weight", "pickled weight (weights_only=False)", "pickled object", _pickled_weight, runs_in_torch="load"),
        Case("pickled-constant", "pickled constant (weights_only=False)", "pickled object", _pickled_constant, runs_in_torch="load"),
        Case("empty-blob-16-gb", "declared size against stored size", "declares weight 'lin.weight' of 17179869184 bytes but stores 0", _empty_blob, heavy=True),
        Case("short-blob", "declared size against stored size", "but stores 32 bytes", lambda w, m: w.copy("short-blob", edit=lambda n, d: d[:32] if n == "data/weights/weight_0" else d)),
        Case("weight-name-quote", "weight name pasted into C++", "weight or buffer name", lambda w, m: w.edit_program("weight-name-quote", _weight_name_quote)),
        # Example inputs.
        Case("pickled-example-inputs", "example inputs (weights_only=False retry)", "weights_only=False", lambda w, m: w.with_example_inputs("pickled-example-inputs", ((TouchesOnUnpickle(m),), {})), runs_in_torch="load"),
        Case("example-input-key", "example-input keys pasted into a guard message", "dict key", lambda w, m: w.with_example_inputs("example-input-key", _keyed_inputs(m))),
        Case("example-inputs-mismatch", "example inputs against in_spec", "not laid out", lambda w, m: w.with_example_inputs("example-inputs-mismatch", ((torch.randn(8, 8), "mean", 5), rich_inputs()[1]))),
        Case("example-inputs-shared", "example inputs flattened exponentially", "one container in two places", lambda w, m: w.with_example_inputs("example-inputs-shared", ((torch.randn(8, 8), "mean"), {"extra": {"scale": shared_levels(40)}})), heavy=True),
        Case("example-input-expanded", "example input larger than its storage", "not dense", lambda w, m: w.with_example_inputs("example-input-expanded", ((torch.zeros(1, 1).expand(1 << 20, 8), "mean"), rich_inputs()[1]))),
        # Expressions.
        Case("sympy-eval", "expr_str to sympy.sympify", "not plain sympy", lambda w, m: w.edit_program("sympy-eval", lambda p: sympy_payload(m, p)), runs_in_torch="load"),
        Case("input-named-metadata", "strings skipped by key name", "not plain sympy", lambda w, m: w.edit_program("input-named-metadata", lambda p: _metadata_input(m, p)), runs_in_torch="load"),
        Case("sympy-exponent", "expression that never finishes", "power that is not a number", lambda w, m: w.edit_program("sympy-exponent", _sympy_exponent), heavy=True),
        Case("sympy-precision", "expression that never finishes", "precision", lambda w, m: w.edit_program("sympy-precision", _sympy_precision), heavy=True),
        Case("sympy-float-exponent", "number that never finishes", "more than 4096 bits", lambda w, m: w.edit_program("sympy-float-exponent", _expression("Float('1e2000000000')")), heavy=True),
        Case("sympy-floor-power", "number that never finishes", "more than 4096 bits", lambda w, m: w.edit_program("sympy-floor-power", _expression("Pow(Pow(floor(Float('1e308')), Integer(4096)), Integer(4096))")), heavy=True),
        Case("sympy-nested-floor", "number that never finishes", "nests deeper", lambda w, m: w.edit_program("sympy-nested-floor", _expression("FloorToInt(" * 40 + "Float('1e308')" + ")" * 40)), heavy=True),
        Case("sympy-expanded-product", "expansion that never finishes", "more than 4096 terms", lambda w, m: w.edit_program("sympy-expanded-product", _expression("Mul(" + ", ".join(f"Add(Symbol('s{2 * i}', integer=True), Symbol('s{2 * i + 1}', integer=True))" for i in range(60)) + ")")), heavy=True),
        Case("sympy-expanded-power", "expansion that never finishes", "more than 4096 terms", lambda w, m: w.edit_program("sympy-expanded-power", _expression("Pow(Add(" + ", ".join(f"Symbol('s{i}', integer=True)" for i in range(10)) + "), Integer(59))")), heavy=True),
        Case("guard-floor-power", "guard laundered through a float", "power that is not a number", lambda w, m: w.edit_program("guard-floor-power", lambda p: p.update(guards_code=["L['x'].size()[0] <= math.floor(2.0) ** 10 ** 1000"])), heavy=True),
        Case("guard-int-power", "guard laundered through a float", "more than 4096 bits", lambda w, m: w.edit_program("guard-int-power", lambda p: p.update(guards_code=["L['x'].size()[0] <= (int(1e308) ** 4096) ** 4096"])), heavy=True),
        Case("symbol-name", "expr_str to sympy.sympify", "size symbol", lambda w, m: w.edit_program("symbol-name", _symbol_name)),
        Case("unbacked-index", "symbol index loop", "index above", lambda w, m: w.edit_program("unbacked-index", _unbacked_index), heavy=True),
        Case("range-key", "range-constraint key", "printed size expression", lambda w, m: w.edit_program("range-key", _range_key)),
        Case("guard-code", "guards_code exec'd by module()", "not a size comparison", lambda w, m: w.edit_program("guard-code", lambda p: p.update(guards_code=[f"{payload(m)} is None"])), runs_in_torch="call"),
        Case("guard-exponent", "guard that never finishes", "power that is not a number", lambda w, m: w.edit_program("guard-exponent", lambda p: p.update(guards_code=["L['x'].size()[0] == 9**9**9**9"])), heavy=True),
        Case("string-input-quote", "string input pasted into a guard", "quote", lambda w, m: w.edit_program("string-input-quote", lambda p: _string_input(m, p)), runs_in_torch="call"),
        Case("symbolic-power", "symbolic-size node that never finishes", "not a number up to", lambda w, m: w.edit_program("symbolic-power", _symbolic_power), heavy=True),
        # Names pasted into generated Python.
        Case("input-name-code", "input name pasted into def forward", "not a plain Python identifier", lambda w, m: w.edit_program("input-name-code", renamed_input(f"y=[{unquoted_payload(m)}][0]", "observation"), source="policy"), runs_in_torch="load"),
        Case("input-name-keyword", "input name pasted into def forward", "not a plain Python identifier", lambda w, m: w.edit_program("input-name-keyword", renamed_input("class"))),
        Case("input-name-dunder", "input name pasted into def forward", "not a plain Python identifier", lambda w, m: w.edit_program("input-name-dunder", renamed_input("__builtins__"))),
        Case("forward-arg-name", "forward_arg_names", "not a plain Python identifier", lambda w, m: w.edit_program("forward-arg-name", lambda p: in_spec(p).update(forward_arg_names=[f"x=[{payload(m)}][0]", "mode", "extra"]))),
        Case("keyword-name", "keyword names of the call spec", "dict key", lambda w, m: w.edit_program("keyword-name", _keyword_name)),
        Case("hop-keyword", "keyword names of higher-order operators", "not an identifier", lambda w, m: w.edit_program("hop-keyword", _hop_keyword, source="branches")),
        Case("in-spec-import", "tree-spec context that imports a module", "not a name", _in_spec_import, runs_in_torch="load"),
        Case("out-spec-type", "tree-spec container type", "not a tuple, list or dict", lambda w, m: w.edit_program("out-spec-type", _out_spec_type)),
        # Node targets and arguments.
        Case("custom-autograd-import", "node target that imports a module", "not an operator strideguard reads", lambda w, m: w.edit_program("custom-autograd-import", custom_autograd_node)),
        Case("wrap-operator", "as_operator argument", "wrap", lambda w, m: w.edit_program("wrap-operator", wrap_operator_node)),
        Case("load-library", "node target that loads a library", "not an operator strideguard reads", lambda w, m: w.edit_program("load-library", retarget("torch.ops.load_library"))),
        Case("from-file", "operator that maps a file", "reads or maps a file", lambda w, m: w.edit_program("from-file", retarget("torch.ops.aten.from_file.default"))),
        Case("torchscript-builtin", "TorchScript builtin under aten", "returns a string", lambda w, m: w.edit_program("torchscript-builtin", retarget("torch.ops.aten.ljust.default"))),
        Case("save-operator", "operator that writes a file", "values of type t", lambda w, m: w.edit_program("save-operator", retarget("torch.ops.aten.save.default"))),
        Case("warn-operator", "operator that prints", "no tensor", lambda w, m: w.edit_program("warn-operator", retarget("torch.ops.aten.warn.default"))),
        Case("custom-namespace", "custom operator", "custom operator strideguard_test::scale", lambda w, m: w.edit_program("custom-namespace", retarget("torch.ops.strideguard_test.scale.default"))),
        Case("builtin-target", "node target outside torch.ops", "not an operator strideguard reads", lambda w, m: w.edit_program("builtin-target", retarget("math.sqrt"))),
        Case("unknown-argument", "argument names against the schema", "its schema does not have", lambda w, m: w.edit_program("unknown-argument", _unknown_argument)),
        # Strings pasted into C++ or kept as data.
        Case("string-argument-quote", "operator string argument pasted into C++", "quote, backslash or control character", lambda w, m: w.edit_program("string-argument-quote", _string_argument)),
        Case("stack-trace-raw-string", "stack trace pasted into a C++ raw string", "raw string", lambda w, m: w.edit_program("stack-trace-raw-string", lambda p: _stack_trace(p, 'File "a.py", line 1, in f\n    )" + evil + R"(\n'))),
        Case("stack-trace-carriage-return", "stack trace pasted into generated code", "control character", lambda w, m: w.edit_program("stack-trace-carriage-return", lambda p: _stack_trace(p, f'File "a.py", line 1, in f\n    x\r{payload(m)}\n'))),
        Case("node-metadata-key", "unknown metadata", "node metadata", lambda w, m: w.edit_program("node-metadata-key", lambda p: graph(p)["nodes"][0]["metadata"].update(evil="1"))),
        Case("custom-metadata-number", "metadata of the wrong JSON type", "not a JSON object", lambda w, m: w.edit_program("custom-metadata-number", lambda p: graph(p)["nodes"][0]["metadata"].update(custom="5"))),
        Case("custom-metadata-list", "metadata of the wrong JSON type", "not a JSON object", lambda w, m: w.edit_program("custom-metadata-list", lambda p: graph(p)["nodes"][0]["metadata"].update(custom="[1, 2]"))),
        Case("from-node-object", "metadata of the wrong JSON type", "not a list of node sources", lambda w, m: w.edit_program("from-node-object", lambda p: graph(p)["nodes"][0]["metadata"].update(from_node='{"name": "x"}'))),
        Case("from-node-field", "metadata of the wrong JSON type", "graph_id is not int", lambda w, m: w.edit_program("from-node-field", lambda p: graph(p)["nodes"][0]["metadata"].update(from_node='[{"name": "x", "graph_id": "1"}]'))),
        # The schema itself.
        Case("unknown-field", "field outside torch's schema", "does not have", lambda w, m: w.edit_program("unknown-field", lambda p: graph(p)["nodes"][0].update(evil=1))),
        Case("duplicate-key", "ambiguous JSON", "repeats a key", lambda w, m: w.copy("duplicate-key", edit=_duplicate_key)),
        Case("deep-json", "nesting", "not valid JSON", lambda w, m: w.copy("deep-json", edit=lambda n, d: b"[" * 100_000 + b"]" * 100_000 if n == "models/model.json" else d)),
        Case("huge-integer", "integer beyond int64", "64-bit integer", lambda w, m: w.edit_program("huge-integer", lambda p: node(p, "torch.ops.aten.slice.Tensor")["inputs"][3]["arg"].update(as_int=1 << 80))),
        Case("sparse-tensor", "tensor layout", "strided tensors only", lambda w, m: w.edit_program("sparse-tensor", lambda p: graph(p)["tensor_values"]["x"].update(layout=1))),
        Case("device-name", "device string", "is not one of", lambda w, m: w.edit_program("device-name", lambda p: graph(p)["tensor_values"]["x"]["device"].update(type="cpu'); evil('"))),
        Case("edge-dialect", "dialect", "ExecuTorch Edge program", lambda w, m: w.edit_program("edge-dialect", lambda p: p.update(verifiers=["EDGE"]))),
        Case("unknown-dialect", "dialect", "dialect strideguard does not read", lambda w, m: w.edit_program("unknown-dialect", lambda p: p.update(verifiers=["EVIL"]))),
        Case("script-object-value", "custom object metadata", "script object", lambda w, m: w.edit_program("script-object-value", lambda p: graph(p).update(custom_obj_values={"obj": {"name": "obj", "class_fqn": "os.system"}}))),
    ]
    return cases


def _mkdir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(exist_ok=True)
    return path


def _mkfifo(path: pathlib.Path) -> pathlib.Path:
    if not path.exists():
        os.mkfifo(path)
    return path


def _symlink(path: pathlib.Path, target: str) -> pathlib.Path:
    if not path.is_symlink():
        path.symlink_to(target)
    return path


def _write(path: pathlib.Path, data: bytes) -> pathlib.Path:
    path.write_bytes(data)
    return path


def _zip(path: pathlib.Path, members: dict[str, bytes]) -> pathlib.Path:
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path


def _newer_schema(program: dict) -> None:
    program["schema_version"]["major"] += 1
    program["torch_version"] = "9.0.0"


def _unlisted_model(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    """A second program under models/ with its own configs: torch deserializes it too, payload included."""
    with zipfile.ZipFile(w.sources["rich"]) as archive:
        root = archive.namelist()[0].split("/")[0]
        program = json.loads(archive.read(f"{root}/models/model.json"))
        sympy_payload(marker, program)
        members = {
            "models/evil.json": json.dumps(program).encode(),
            "data/weights/evil_weights_config.json": archive.read(f"{root}/data/weights/model_weights_config.json"),
            "data/constants/evil_constants_config.json": archive.read(f"{root}/data/constants/model_constants_config.json"),
            "data/sample_inputs/evil.pt": archive.read(f"{root}/data/sample_inputs/model.pt"),
        }
    return w.copy("unlisted-model", extra=members)


def _opaque_constant(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    def edit(member: str, data: bytes) -> bytes:
        if member != "data/constants/model_constants_config.json":
            return data
        config = json.loads(data)
        config["config"]["table"]["path_name"] = "opaque_obj_0"
        config["config"]["table"]["tensor_meta"]["dtype"] = 1  # bytes: torch first maps the member as a tensor
        return json.dumps(config).encode()

    return w.copy("opaque-constant", edit=edit, extra={"data/constants/opaque_obj_0": pickle.dumps(TouchesOnUnpickle(marker))})


def _duplicate_member(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    path = w.copy("duplicate-member")
    with zipfile.ZipFile(path, "a") as archive:
        root = archive.namelist()[0].split("/")[0]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            archive.writestr(f"{root}/archive_version", b"0")
    return path


def _outside_root(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    path = w.copy("outside-root")
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("elsewhere/models/model.json", b"{}")
    return path


def _weight_bomb(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    """256 MiB of zeros deflated to a few hundred KiB, declared as the weight it holds."""
    size = 256 << 20

    def edit(member: str, data: bytes) -> bytes:
        if member != "data/weights/model_weights_config.json":
            return data
        config = json.loads(data)
        meta = config["config"]["lin.weight"]["tensor_meta"]
        meta["sizes"], meta["strides"] = [{"as_int": size // 4}], [{"as_int": 1}]
        return json.dumps(config).encode()

    with zipfile.ZipFile(w.sources["rich"]) as archive:
        root = archive.namelist()[0].split("/")[0]
        config = edit("data/weights/model_weights_config.json", archive.read(f"{root}/data/weights/model_weights_config.json"))
    return w.with_members(
        "zip-bomb-weights",
        {"data/weights/weight_0": (zeros(size), zipfile.ZIP_DEFLATED), "data/weights/model_weights_config.json": (config, zipfile.ZIP_STORED)},
    )


def _program_bomb(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    """The program's JSON padded with 256 MiB of spaces, deflated to a few hundred KiB."""
    return w.with_members("zip-bomb-program", {"models/model.json": (padded_program(w.sources["rich"], 256 << 20), zipfile.ZIP_DEFLATED)})


def _pickled_weight(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    def edit(member: str, data: bytes) -> bytes:
        if member == "data/weights/weight_0":
            return pickled_member(marker)
        return weights_config(lambda config: config["lin.weight"].update(use_pickle=True))(member, data)

    return w.copy("pickled-weight", edit=edit)


def _pickled_constant(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    def edit(member: str, data: bytes) -> bytes:
        if member == "data/constants/tensor_0":
            return pickled_member(marker)
        if member == "data/constants/model_constants_config.json":
            config = json.loads(data)
            config["config"]["table"]["use_pickle"] = True
            return json.dumps(config).encode()
        return data

    return w.copy("pickled-constant", edit=edit)


def _empty_blob(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    def edit(member: str, data: bytes) -> bytes:
        if member == "data/weights/weight_0":
            return b""
        return weights_config(sixteen_gigabytes)(member, data)

    return w.copy("empty-blob-16-gb", edit=edit)


def _weight_name_quote(program: dict) -> None:
    spec = program["graph_module"]["signature"]["input_specs"][0]["parameter"]
    spec["parameter_name"] = 'lin.weight"); system("touch x'


def _keyed_inputs(marker: pathlib.Path) -> tuple:
    args, kwargs = rich_inputs()
    return args, {f'extra", {payload(marker)}, "': kwargs["extra"]}


def _metadata_input(marker: pathlib.Path, program: dict) -> dict:
    """The input renamed ``metadata``: a name the old deny-list skipped, with a payload in its size."""
    program = rename(program, "x", "metadata")
    sympy_payload(marker, graph(program)["tensor_values"]["metadata"])
    return program


def _sympy_exponent(program: dict) -> None:
    next(symbolic_expressions(program))["expr_str"] = "Pow(Integer(9), Pow(Integer(9), Integer(9)))"


def _sympy_precision(program: dict) -> None:
    next(symbolic_expressions(program))["expr_str"] = "Float('1.5', precision=1000000000)"


def _expression(expr_str: str) -> Callable[[dict], None]:
    def edit(program: dict) -> None:
        next(symbolic_expressions(program))["expr_str"] = expr_str

    return edit


def _symbol_name(program: dict) -> None:
    expression = next(symbolic_expressions(program))
    expression["expr_str"] = "Symbol('__import__', integer=True)"


def _unbacked_index(program: dict) -> None:
    program["range_constraints"]["u1000000000000000"] = {"min_val": 0, "max_val": 4}


def _range_key(program: dict) -> None:
    program["range_constraints"]["__import__('os')"] = {"min_val": 0, "max_val": 4}


def _string_input(marker: pathlib.Path, program: dict) -> dict:
    """A string input that ends the quotes torch puts it in, in the guard torch generates for it."""
    return rename(program, "mean", f"' or {payload(marker)} or '")


def _symbolic_power(program: dict) -> None:
    multiply = node(program, "_operator.mul")
    multiply["target"] = "_operator.pow"
    multiply["inputs"][1]["arg"] = {"as_int": 10**18}


def _in_spec_import(w: Workshop, marker: pathlib.Path) -> pathlib.Path:
    write_marker_module(w.folder, marker)
    return w.edit_program("in-spec-import", lambda p: in_spec(p).update(in_spec=enum_import_spec(in_spec(p)["in_spec"])))


def _keyword_name(program: dict) -> None:
    signature = in_spec(program)
    spec = json.loads(signature["in_spec"])
    spec[1]["children_spec"][1]["context"] = json.dumps(["extra=0)\nimport os\n(x"])
    signature["in_spec"] = json.dumps(spec)


def _hop_keyword(program: dict) -> None:
    condition = node(program, "torch.ops.higher_order.cond")
    condition["inputs"][-1].update(name="operands=0); import os; (x", kind=2)


def _out_spec_type(program: dict) -> None:
    signature = in_spec(program)
    spec = json.loads(signature["out_spec"])
    spec[1]["type"] = "collections.defaultdict"
    signature["out_spec"] = json.dumps(spec)


def _unknown_argument(program: dict) -> None:
    node(program, "torch.ops.aten.gelu.default")["inputs"][0]["name"] = "evil"


def _string_argument(program: dict) -> None:
    node(program, "torch.ops.aten.gelu.default")["inputs"][1]["arg"]["as_string"] = 'tanh"); system("touch x'


def _stack_trace(program: dict, trace: str) -> None:
    graph(program)["nodes"][1]["metadata"]["stack_trace"] = trace


def _duplicate_key(member: str, data: bytes) -> bytes:
    if member != "models/model.json":
        return data
    return data.replace(b'"guards_code": []', b'"guards_code": [], "guards_code": ["True"]', 1)


# --- hostile files the loader admits ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Admitted:
    """A hostile file with nothing in it the loader must refuse, whose cost its author controls all the same:
    every reading of it must cost time linear in its size (``tests/test_linear_text.py``)."""

    name: str
    kind: str
    make: Callable[[Workshop, pathlib.Path], pathlib.Path]
    source_line: str
    """What ``inspect`` must report as the returned node's source line, whole."""


LONG_TRACE_UNIT = 'File "a", line 1, in '


def long_trace(characters: int) -> str:
    """The stack trace of issue 45 (round four): a frame header repeated on one line, at most ``characters``
    long. A pattern searched over it backtracks to the line's end from every ``File "`` (minutes at 1 MiB)."""
    return LONG_TRACE_UNIT * (characters // len(LONG_TRACE_UNIT))


def _returned_node_trace(trace: str) -> Callable[[dict], None]:
    """The program's first returned value made by a node whose stack trace is ``trace``."""

    def change(program: dict) -> None:
        returned = graph(program)["outputs"][0]["as_tensor"]["name"]
        [maker] = [n for n in graph(program)["nodes"] if any(o.get("as_tensor", {}).get("name") == returned for o in n["outputs"])]
        maker["metadata"]["stack_trace"] = trace

    return change


def _long_file_name(name: str) -> str:
    """A trace of one frame whose file is ``name``, under a line of code."""
    return f'  File "{name}", line 7, in forward\n    y = x[:, :3]\n'


def _admitted_cases() -> list[Admitted]:
    largest = limits.MAX_METADATA_TEXT
    spare = largest - len(_long_file_name(""))
    return [
        Admitted(
            "stack-trace-one-long-line", "text read by a backtracking pattern",
            lambda w, m: w.edit_program("stack-trace-one-long-line", _returned_node_trace(long_trace(largest))),
            source_line="a:1",
        ),
        Admitted(
            "stack-trace-hexadecimal-file-name", "text printed through rich's highlighter",
            lambda w, m: w.edit_program("stack-trace-hexadecimal-file-name", _returned_node_trace(_long_file_name("f" * spare))),
            source_line="f" * spare + ":7  y = x[:, :3]",
        ),
        Admitted(
            "stack-trace-backslash-file-name", "text printed through rich's markup parser",
            lambda w, m: w.edit_program("stack-trace-backslash-file-name", _returned_node_trace(_long_file_name("\\" * spare))),
            source_line="\\" * spare + ":7  y = x[:, :3]",
        ),
    ]


ADMITTED = _admitted_cases()
"""Hostile files every verb must read, each in time linear in its size."""


# --- showing that plain torch runs the payloads ---------------------------------------------------------------


def write_marker_module(folder: pathlib.Path, marker: pathlib.Path) -> None:
    (folder / f"{MARKER_MODULE}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nThing = None\n")


def demonstrate(runs: list[tuple[str, str]]) -> None:
    """For each (file, step), let plain torch load it and, for ``"call"``, run the loaded program on its example
    inputs as ``verify`` does; errors are ignored: only whether the marker appears matters."""
    import warnings

    warnings.simplefilter("ignore")
    for path, step in runs:
        sys.path.insert(0, str(pathlib.Path(path).parent))
        try:
            program = torch.export.load(path)
            if step == "call":
                args, kwargs = program.example_inputs
                program.module()(*args, **kwargs)
        except Exception:
            pass
        finally:
            sys.path.pop(0)
            sys.modules.pop(MARKER_MODULE, None)


CASES = _cases()
"""Every hostile or broken file the tests read."""


if __name__ == "__main__":
    demonstrate(json.loads(sys.argv[1]))

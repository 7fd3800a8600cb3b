"""Legal ``.pt2`` files whose cost the file controls: what the loader accepts must still cost what it should.

Where ``hostile.py`` holds files that must be refused, these are programs
strideguard must read, and whose every verb must end, in time and memory
bounded by the file's size, in a result or in one line:

* ``wide``: an output viewing an input declared ``[2, 16384, 8192]`` (a
  storage of 2**27 elements): ``--plot`` draws only what it shows;
* ``chain``: a chain of 500 views, deeper than Python's recursion limit
  would allow a recursive walk;
* ``unbounded-loop``: a ``while_loop`` whose bound, 2**63 - 1, comes from the
  file: ``verify`` runs it, and stops it at its time limit;
* ``node-named-self``: a node named ``self``, which torch.fx does not rename,
  so that ``verify``'s eager run fails inside torch.fx, which prints the
  generated code before raising;
* ``slices``: ``n`` outputs all viewing one input, every one sharing memory
  with every other (``many_slices``; the linearity test builds two sizes);
* ``unbind-2**40`` and ``split-2**40``: a weight declared ``[2**40, 16]``
  with strides ``[0, 1]`` (64 stored bytes) that the program unbinds (or
  splits into rows) into the 4 pieces its graph lists;
* ``weight-150000-dims`` and ``tensor-150000-dims``: a weight's stored
  configuration, or a value of the program, declaring 150,000 sizes of
  2**63 - 1 with stride 0;
* ``chain-8000``: 8,000 chained views (FakeTensor keeps each view's chain of
  view functions, so a naive recomputation holds 32 million);
* ``largest``: the largest program the loader admits: ``limits.MAX_NODES``
  nodes (a dynamic-batch chain of ``add``s, built by editing the JSON of a
  short one) whose size expressions, padded with terms of no value, hold
  just under ``limits.MAX_EXPRESSIONS_TOTAL`` characters.
"""

from __future__ import annotations

import copy
import json
import pathlib
import zipfile
from typing import Callable

import torch
from torch._higher_order_ops.while_loop import while_loop
from torch._subclasses.fake_tensor import FakeTensorMode

from strideguard.examples import export_policy
from strideguard.files import limits

from .hostile import graph, rename


class Wide(torch.nn.Module):
    def forward(self, x):
        return (x[:, :3] * 2)[:, :, 1:], x[:, 1:, :2]


class Chain(torch.nn.Module):
    def __init__(self, views: int = 500):
        super().__init__()
        self.views = views

    def forward(self, x):
        y = x * 2
        for i in range(self.views):
            y = y.transpose(0, 1) if i % 2 else y[:, : y.shape[1]]
        return y[1:], y * 1


class Loop(torch.nn.Module):
    def forward(self, x):
        return while_loop(lambda i, y: i < 5, lambda i, y: (i + 1, y * 1.5), (torch.tensor(0), x))[1][:, :3]


class Slices(torch.nn.Module):
    def __init__(self, count: int):
        super().__init__()
        self.count = count

    def forward(self, x):
        return tuple(x[i : i + 1, 1:] for i in range(self.count))


class Rows(torch.nn.Module):
    """Returns a slice of one of the four rows of a weight, taken apart by ``unbind`` or ``split``."""

    def __init__(self, split: bool):
        super().__init__()
        self.split = split
        self.weight = torch.nn.Parameter(torch.randn(4, 16))

    def forward(self, x):
        rows = self.weight.split(1) if self.split else self.weight.unbind(0)
        return rows[1][..., 2:10], x + 1


class Adds(torch.nn.Module):
    def forward(self, x):
        return (x + 1) + 2


def many_slices(count: int) -> torch.export.ExportedProgram:
    return torch.export.export(Slices(count), (torch.randn(count, 4),))


def _wide() -> torch.export.ExportedProgram:
    """Exported on fake tensors: 2**27 elements are declared, none allocated (so it has no example inputs)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        program = torch.export.export(Wide(), (torch.empty(2, 1 << 14, 1 << 13),))
    program.example_inputs = None
    return program


def _unbounded(program: dict) -> None:
    [loop] = [node for node in graph(program)["nodes"] if node["target"] == "torch.ops.higher_order.while_loop"]
    condition = loop["inputs"][0]["arg"]["as_graph"]["graph"]
    [compare] = condition["nodes"]
    compare["inputs"][1]["arg"] = {"as_int": (1 << 63) - 1}


def _named_self(program: dict) -> dict:
    return rename(program, "linear", "self")


def _edited(
    source: pathlib.Path, target: pathlib.Path, change: Callable[[dict], object], member: str = "models/model.json"
) -> pathlib.Path:
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for info in original.infolist():
            data = original.read(info)
            if info.filename.endswith(member):
                program = json.loads(data)
                changed = change(program)
                data = json.dumps(program if changed is None else changed).encode()
            copy.writestr(info, data)
    return target


def _declared(meta: dict, sizes: list[int], strides: list[int]) -> None:
    meta["sizes"] = [{"as_int": size} for size in sizes]
    meta["strides"] = [{"as_int": stride} for stride in strides]


def _rows_declared(program: dict) -> None:
    """The weight declared ``[2**40, 16]``, every row the same 16 stored values."""
    _declared(graph(program)["tensor_values"]["p_weight"], [1 << 40, 16], [0, 1])


def _config_rows_declared(config: dict) -> None:
    _declared(config["config"]["weight"]["tensor_meta"], [1 << 40, 16], [0, 1])


_MANY = 150_000


def _config_many_dims(config: dict) -> None:
    _declared(config["config"]["weight"]["tensor_meta"], [(1 << 63) - 1] * _MANY, [0] * _MANY)


def _program_many_dims(program: dict) -> None:
    _declared(graph(program)["tensor_values"]["x"], [(1 << 63) - 1] * _MANY, [0] * _MANY)


def longer_chain(views: int) -> Callable[[dict], None]:
    """``Chain(2)``'s graph with its two views (an ``alias`` and a ``transpose`` of an 8 by 8 value)
    repeated to ``views``, every value declared as the views make it."""

    def change(program: dict) -> None:
        nodes, values = graph(program)["nodes"], graph(program)["tensor_values"]
        head, alias, transpose, *tail = nodes
        chain, previous, transposed = [], "mul", False
        for index in range(views):
            template = copy.deepcopy(transpose if index % 2 else alias)
            name = f"view_{index}"
            template["inputs"][0]["arg"]["as_tensor"]["name"] = previous
            template["outputs"][0]["as_tensor"]["name"] = name
            transposed ^= bool(index % 2)
            values[name] = copy.deepcopy(values["mul"])
            if transposed:
                values[name]["strides"].reverse()
            chain.append(template)
            previous = name
        for node in tail:
            node["inputs"][0]["arg"]["as_tensor"]["name"] = previous
        for name in ("alias", "transpose"):
            del values[name]
        values["slice_1"]["strides"] = copy.deepcopy(values[previous]["strides"])
        values["mul_1"]["strides"] = copy.deepcopy(values["mul"]["strides"])
        nodes[:] = [head, *chain, *tail]

    return change


def padded_expressions(total: int) -> Callable[[dict], None]:
    """Symbolic sizes of the program rewritten as ``Add(size, Mul(Integer(0), Add(Integer(1), ...)))`` (the
    same value), each text distinct and at most ``limits.MAX_EXPRESSION`` characters, until the program's
    distinct expressions hold just under ``total`` characters."""

    def change(program: dict) -> None:
        sizes = [size["as_expr"] for value in graph(program)["tensor_values"].values() for size in value["sizes"] if "as_expr" in size]
        spare = total - 1_000 - sum(len(text) for text in set(_expression_texts(program)))
        for index, expression in enumerate(sizes):
            if spare < 100:
                break
            original = expression["expr_str"]
            ones = (min(limits.MAX_EXPRESSION, spare) - len(original) - 60) // len("Integer(1), ")
            terms = ", ".join(["Integer(1)"] * max(ones, 2) + [f"Integer({index + 2})"])  # each text distinct
            padded = f"Add({original}, Mul(Integer(0), Add({terms})))"
            spare -= len(padded)
            expression["expr_str"] = padded

    return change


def _expression_texts(value) -> list[str]:
    """Every ``expr_str`` in a serialized program."""
    pending, found = [value], []
    while pending:
        current = pending.pop()
        if isinstance(current, dict):
            if isinstance(current.get("expr_str"), str):
                found.append(current["expr_str"])
            pending.extend(current.values())
        elif isinstance(current, list):
            pending.extend(current)
    return found


def longer_adds(count: int) -> Callable[[dict], None]:
    """``Adds``'s graph with its second ``add`` repeated until the graph holds ``count`` nodes."""

    def change(program: dict) -> None:
        nodes, values = graph(program)["nodes"], graph(program)["tensor_values"]
        first, second = nodes
        chain, previous = [first], first["outputs"][0]["as_tensor"]["name"]
        for index in range(count - 1):
            node = copy.deepcopy(second)
            name = f"add_{index + 2}"
            node["inputs"][0]["arg"]["as_tensor"]["name"] = previous
            node["outputs"][0]["as_tensor"]["name"] = name
            values[name] = copy.deepcopy(values[previous])
            chain.append(node)
            previous = name
        nodes[:] = chain
        graph(program)["outputs"][0]["as_tensor"]["name"] = previous
        [spec] = program["graph_module"]["signature"]["output_specs"]
        spec["user_output"]["arg"]["as_tensor"]["name"] = previous

    return change


LARGE = ("chain-8000", "largest")
"""The largest legal programs, whose own size is the cost: building and running them takes minutes, the
``long`` tier's."""


def make(folder: pathlib.Path, *, large: bool = False) -> dict[str, pathlib.Path]:
    """Every costly file, written into ``folder``, by name: those of ``LARGE`` only when ``large``, and then
    only they."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = {
        "wide": _wide,
        "chain": lambda: torch.export.export(Chain(), (torch.randn(8, 8),)),
        "loop": lambda: torch.export.export(Loop(), (torch.randn(4, 8),)),
        "policy": lambda: export_policy(batch=1),
        "rows-unbind": lambda: torch.export.export(Rows(split=False), (torch.randn(3),)),
        "rows-split": lambda: torch.export.export(Rows(split=True), (torch.randn(3),)),
        "chain-2": lambda: torch.export.export(Chain(2), (torch.randn(8, 8),)),
        "adds": lambda: torch.export.export(Adds(), (torch.randn(4),)),
        "adds-dynamic": lambda: torch.export.export(
            Adds(), (torch.randn(4),), dynamic_shapes=({0: torch.export.Dim("batch", min=2, max=1024)},)
        ),
    }
    needed = ("chain-2", "adds-dynamic") if large else tuple(sources)
    saved = {}
    for name in needed:
        saved[name] = folder / f"{name}.pt2"
        torch.export.save(sources[name](), saved[name])
    if large:
        return {
            "chain-8000": _edited(saved["chain-2"], folder / "chain-8000.pt2", longer_chain(8000)),
            "largest": _largest(saved["adds-dynamic"], folder / "largest.pt2"),
        }
    return {
        "wide": saved["wide"],
        "chain": saved["chain"],
        "unbounded-loop": _edited(saved["loop"], folder / "unbounded-loop.pt2", _unbounded),
        "node-named-self": _edited(saved["policy"], folder / "node-named-self.pt2", _named_self),
        "unbind-2**40": _rows(saved["rows-unbind"], folder / "unbind-2**40.pt2"),
        "split-2**40": _rows(saved["rows-split"], folder / "split-2**40.pt2"),
        "weight-150000-dims": _edited(saved["rows-unbind"], folder / "weight-150000-dims.pt2", _config_many_dims, WEIGHTS),
        "tensor-150000-dims": _edited(saved["rows-unbind"], folder / "tensor-150000-dims.pt2", _program_many_dims),
    }


def _largest(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """``limits.MAX_NODES`` nodes with a dynamic batch, their size expressions padded up to
    ``limits.MAX_EXPRESSIONS_TOTAL`` characters: the largest program every limit admits at once."""
    longer = _edited(source, target.with_suffix(".tmp"), longer_adds(limits.MAX_NODES))
    _edited(longer, target, padded_expressions(limits.MAX_EXPRESSIONS_TOTAL))
    longer.unlink()
    return target


WEIGHTS = "data/weights/model_weights_config.json"


def _rows(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    declared = _edited(source, target.with_suffix(".tmp"), _rows_declared)
    _edited(declared, target, _config_rows_declared, WEIGHTS)
    declared.unlink()
    return target

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
  with every other (``many_slices``; the linearity test builds two sizes).
"""

from __future__ import annotations

import json
import pathlib
import zipfile
from typing import Callable

import torch
from torch._higher_order_ops.while_loop import while_loop
from torch._subclasses.fake_tensor import FakeTensorMode

from strideguard.examples import export_policy

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


def _edited(source: pathlib.Path, target: pathlib.Path, change: Callable[[dict], object]) -> pathlib.Path:
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for info in original.infolist():
            data = original.read(info)
            if info.filename.endswith("models/model.json"):
                program = json.loads(data)
                changed = change(program)
                data = json.dumps(program if changed is None else changed).encode()
            copy.writestr(info, data)
    return target


def make(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every costly file, written into ``folder``, by name."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = {
        "wide": _wide(),
        "chain": torch.export.export(Chain(), (torch.randn(8, 8),)),
        "loop": torch.export.export(Loop(), (torch.randn(4, 8),)),
        "policy": export_policy(batch=1),
    }
    saved = {}
    for name, program in sources.items():
        saved[name] = folder / f"{name}.pt2"
        torch.export.save(program, saved[name])
    return {
        "wide": saved["wide"],
        "chain": saved["chain"],
        "unbounded-loop": _edited(saved["loop"], folder / "unbounded-loop.pt2", _unbounded),
        "node-named-self": _edited(saved["policy"], folder / "node-named-self.pt2", _named_self),
    }

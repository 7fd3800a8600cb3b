"""The user's words for what strideguard reports: output names, source lines and the names of inserted nodes.

A user knows an output by where it sits in what the method returns
(``actions``, ``[1]``, ``cache.key_cache[0]``), not by the graph node that
happens to produce it (``slice_1``, and after a fix ``neg_default_1``). The
program keeps that structure in its output spec (a pytree ``TreeSpec``), and
each node's ``stack_trace`` keeps the user's line; both survive
``torch.export.save`` and ExecuTorch's lowering, so every report reads them
here, by the paths torch's own ``pytree.tree_flatten_with_path`` gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.utils._pytree as pytree

SINGLE_OUTPUT = "output"
"""The name of the one output of a method that returns a bare tensor (its key path is empty)."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FRAME_HEADER = re.compile(
    r'^[ \t]*File "(?P<file>[^"\n]*)", line (?P<line>[0-9]+), in (?P<function>[^\n]*)$', re.MULTILINE
)
"""A line of a Python traceback that opens a frame: the whole line, from its start.

A pattern searched anywhere in the trace (``File "...", line N, in ...\\n...``, as this once was) backtracked
to the end of the line from every ``File "`` it tried: a loaded program may carry a 1 MiB trace on one line
(``'File "a", line 1, in ' * 49000``), which took minutes. Anchored at a line's start (anywhere else it fails
at once), with every part stopping at a character the next part needs (``"``, ``,``, the line's end), each
line is read once: linear in the trace, in the regular expression engine rather than a Python loop."""
_TORCH_DIR = torch.__file__.rsplit("/", 1)[0] + "/"


def _key_text(key: Any, first: bool) -> str:
    """One step of a key path as Python would write it; a string key that is an identifier reads as an
    attribute (``cache.key_cache``), as a user names the field."""
    if isinstance(key, pytree.MappingKey):
        if isinstance(key.key, str) and _IDENTIFIER.match(key.key):
            return key.key if first else f".{key.key}"
        return f"[{key.key!r}]"
    if isinstance(key, pytree.SequenceKey):
        return f"[{key.idx}]"
    if isinstance(key, pytree.GetAttrKey):
        return key.name if first else f".{key.name}"
    return str(key)


def path_name(path: Sequence[Any]) -> str:
    """A pytree key path in the user's spelling: ``actions``, ``[1]``, ``cache.key_cache[0]``."""
    if not path:
        return SINGLE_OUTPUT
    return "".join(_key_text(key, first=i == 0) for i, key in enumerate(path))


def positional_names(count: int) -> list[str]:
    """Names for ``count`` outputs whose structure is not known (a bare graph): ``[0]``, ``[1]``, ... or, for
    one output, ``output``."""
    return [SINGLE_OUTPUT] if count == 1 else [f"[{i}]" for i in range(count)]


def output_names(program: Any, count: int) -> list[str]:
    """Each user output's name, in return order, from ``program``'s output spec; positional where the program
    keeps no spec or one that does not match its ``count`` user outputs."""
    spec = getattr(getattr(program, "call_spec", None), "out_spec", None)
    if spec is None or spec.num_leaves != count:
        return positional_names(count)
    try:
        tree = pytree.tree_unflatten(list(range(count)), spec)
        paths = pytree.tree_flatten_with_path(tree)[0]
    except Exception:  # a spec naming a container type this process has not registered
        return positional_names(count)
    names = [path_name(path) for path, _ in paths]
    return names if len(set(names)) == count else positional_names(count)


def source_line(node: Any) -> Optional[str]:
    """Where in the user's code ``node`` was made, ``policy.py:17  joints[:, :6]``: the innermost frame of its
    stack trace outside torch itself (a library model's own file counts as the user's); ``None`` without one.
    Linear in the trace's length (``stack_frames``)."""
    trace = getattr(node, "meta", {}).get("stack_trace") if node is not None else None
    if not isinstance(trace, str):
        return None
    frames = stack_frames(trace)
    outside = [frame for frame in frames if not frame.file.startswith(_TORCH_DIR)] or frames
    if not outside:
        return None
    frame = outside[-1]
    where, code = f"{frame.file.rsplit('/', 1)[-1]}:{frame.line}", frame.code.strip()
    return f"{where}  {code}" if code else where


@dataclass(frozen=True)
class Frame:
    """One frame of a Python traceback: ``File "{file}", line {line}, in {function}`` and the code below it."""

    file: str
    line: str
    function: str
    code: str


def stack_frames(trace: str) -> list[Frame]:
    """The frames of a traceback as Python prints it, outermost first, in time linear in its length
    (``_FRAME_HEADER``). A frame's code is the line after its header, or empty where that line opens the next
    frame (Python could not read the file)."""
    headers = list(_FRAME_HEADER.finditer(trace))
    frames = []
    for header, following in zip(headers, [*headers[1:], None]):
        code_start = header.end() + 1  # past the header's line break
        code_end = trace.find("\n", code_start)
        has_code = code_start <= len(trace) and (following is None or following.start() > code_start)
        code = trace[code_start : len(trace) if code_end < 0 else code_end] if has_code else ""
        frames.append(Frame(header["file"], header["line"], header["function"], code))
    return frames


def node_stem(name: str) -> str:
    """An output's name made into the start of a node name: ``cache.key_cache[0]`` becomes
    ``cache_key_cache_0``, ``[1]`` becomes ``output_1``."""
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")
    if not stem or stem[0].isdigit():
        stem = f"{SINGLE_OUTPUT}_{stem}".rstrip("_")
    return stem


def symbol_meanings(program: Any) -> dict[str, str]:
    """What each symbolic size of ``program`` stands for, in the user's terms: ``{"s77": "x.size(0), 2 to 64"}``.

    ``torch.export`` does not keep a ``Dim``'s name in the program (not in memory, not in a ``.pt2``), so a
    size is named by the first user input dimension it is (``x.size(0)``), with the range the program admits.
    """
    from torch.utils._sympy.numbers import int_oo

    user_inputs = set(program.graph_signature.user_inputs)
    ranges = {str(symbol): bounds for symbol, bounds in program.range_constraints.items()}
    meanings: dict[str, str] = {}
    for node in program.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if node.name not in user_inputs or not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            symbol = str(size.node.expr) if isinstance(size, torch.SymInt) else None
            if symbol is None or symbol in meanings or not re.fullmatch(r"[a-z]+\d+", symbol):
                continue
            bounds = ranges.get(symbol)
            span = ""
            if bounds is not None:
                upper = "" if bounds.upper in (int_oo, float("inf")) else f" to {bounds.upper}"
                span = f", {bounds.lower}{upper}" if upper else f", {bounds.lower} or more"
            meanings[symbol] = f"{node.name}.size({dim}){span}"
    return meanings

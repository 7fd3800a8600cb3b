"""Input and output tree specs, and the stored example inputs, read as plain data and checked against each other.

Torch parses a tree spec (``in_spec``, ``out_spec``) with ``json.loads`` and
an object hook that imports any module a ``{"__enum__": ...}`` object names;
its container types are looked up in a registry that third-party code can
extend. Here a spec is accepted only if it is built from tuples, lists,
dicts, ordered dicts and registered named tuples, with dictionary keys that
are names, and contains no JSON object that could reach that hook.

The example inputs are unpickled by torch with ``weights_only=True`` (and,
when that fails, with ``weights_only=False``, which strideguard never lets
happen). They then become guard messages, keyword names and the inputs of
``verify``'s eager run. They are accepted only as plain containers of dense
tensors and scalars, with identifier keys, no container shared or nested
past a bound, laid out exactly as the program's ``in_spec`` says and matching
the program's user inputs one by one.
"""

from __future__ import annotations

import io
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.utils import _pytree as pytree

from ..program import density
from . import limits, text
from .errors import excerpt, Refused

_SEQUENCES = {"builtins.tuple": tuple, "builtins.list": list}
_MAPPINGS = {"builtins.dict": dict, "collections.OrderedDict": OrderedDict}
_NAMEDTUPLE = "collections.namedtuple"


@dataclass(frozen=True)
class Spec:
    """A tree spec as data: a container type name (``None`` for a leaf), its keys, and its children."""

    type: Optional[str]
    keys: tuple = ()
    children: tuple["Spec", ...] = ()

    @property
    def leaves(self) -> int:
        return 1 if self.type is None else sum(child.leaves for child in self.children)


LEAF = Spec(None)


def strict_json(data: str | bytes, what: str) -> Any:
    """``json.loads``, refusing duplicate keys (torch would silently keep the last) and text that is not UTF-8."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        result = dict(pairs)
        if len(result) != len(pairs):
            raise Refused(f"{what} repeats a key")
        return result

    try:
        if isinstance(data, bytes):
            data = data.decode("utf-8")
        return json.loads(data, object_pairs_hook=no_duplicates)
    except UnicodeDecodeError:
        raise Refused(f"{what} is not UTF-8 text") from None
    except (ValueError, RecursionError):
        raise Refused(f"{what} is not valid JSON") from None


def parse_treespec(serialized: str, what: str, *, identifier_keys: bool) -> Spec:
    """The spec ``torch.utils._pytree.treespec_loads`` would build from ``serialized``, or ``Refused``."""
    data = strict_json(serialized, what)
    if not (isinstance(data, list) and len(data) == 2 and data[0] == 1 and type(data[0]) is int):
        raise Refused(f"{what} is not a tree spec of protocol 1")
    return _SpecReader(what, identifier_keys).node(data[1], 0)


class _SpecReader:
    def __init__(self, what: str, identifier_keys: bool):
        self.what = what
        self.identifier_keys = identifier_keys
        self.count = 0

    def node(self, data: Any, depth: int) -> Spec:
        self.count += 1
        if self.count > limits.MAX_TREE_NODES or depth > limits.MAX_TREE_DEPTH:
            raise Refused(f"{self.what} is larger or deeper than strideguard reads")
        if not (isinstance(data, dict) and set(data) == {"type", "context", "children_spec"}):
            raise Refused(f"{self.what} has a node that is not a tree spec node")
        kind, context, children = data["type"], data["context"], data["children_spec"]
        if not isinstance(children, list):
            raise Refused(f"{self.what} has a node whose children are not a list")
        if kind is None:
            if context is not None or children:
                raise Refused(f"{self.what} has a leaf with a context or children")
            return LEAF
        specs = tuple(self.node(child, depth + 1) for child in children)
        if kind in _SEQUENCES:
            if context != "null":
                raise Refused(f"{self.what} gives a {kind} a context")
            return Spec(kind, (), specs)
        if kind in _MAPPINGS:
            keys = self.keys(context)
            if len(keys) != len(specs):
                raise Refused(f"{self.what} has a {kind} with {len(keys)} keys and {len(specs)} values")
            return Spec(kind, keys, specs)
        if kind == _NAMEDTUPLE:
            if not isinstance(context, str) or context not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
                raise Refused(f"{self.what} names a named tuple type this process has not registered")
            text.dotted_name(context, f"{self.what} names a named tuple type")
            return Spec(kind, (context,), specs)
        raise Refused(f"{self.what} has a container of type {excerpt(str(kind), 40)}, not a tuple, list or dict")

    def keys(self, context: Any) -> tuple:
        if not isinstance(context, str):
            raise Refused(f"{self.what} has a dict without its keys")
        keys = strict_json(context, f"{self.what}'s dict keys")
        if not isinstance(keys, list):
            raise Refused(f"{self.what} has dict keys that are not a list")
        for key in keys:
            if type(key) is int and not self.identifier_keys:
                continue
            if not isinstance(key, str):
                raise Refused(f"{self.what} has a dict key that is not a name")
            if self.identifier_keys:
                text.identifier(key, f"{self.what} has a dict key")
            else:
                text.string_literal(key, f"{self.what} has a dict key")
        return tuple(keys)


def load_example_inputs(data: bytes, check_archive: Callable[[io.BytesIO, str], None]) -> Any:
    """The stored example inputs, unpickled only by torch's ``weights_only`` unpickler, or ``Refused``.

    ``check_archive`` first checks the nested ``torch.save`` archive the way
    the outer archive is checked (members, sizes, compression).
    """
    what = "the example inputs"
    check_archive(io.BytesIO(data), "the example-input archive")
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise Refused(
            f"{what} cannot be loaded with weights_only=True ({_unpickler_complaint(error)}); "
            "torch would retry with weights_only=False, which strideguard refuses"
        ) from None


def _unpickler_complaint(error: Exception) -> str:
    """The line of a ``weights_only`` failure that names what was refused, e.g. ``Unsupported global: ...``."""
    for line in str(error).splitlines():
        _, found, complaint = line.partition("WeightsUnpickler error: ")
        if found:
            return excerpt(complaint.split(". ")[0], 120)
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return excerpt(lines[0], 120)


@dataclass(frozen=True)
class UserInput:
    """One leaf the program expects, in order: a tensor with its dtype and static sizes, or another value."""

    name: str
    dtype: Optional[torch.dtype] = None
    sizes: tuple[Optional[int], ...] = ()
    """``None`` where the size is symbolic."""

    @property
    def is_tensor(self) -> bool:
        return self.dtype is not None


def check_example_inputs(inputs: Any, in_spec: Spec, user_inputs: list[UserInput]) -> None:
    """Refuse example inputs that are not plain data laid out as ``in_spec`` with the program's user inputs."""
    what = "the example inputs"
    if not (type(inputs) is tuple and len(inputs) == 2 and type(inputs[0]) is tuple and type(inputs[1]) is dict):
        raise Refused(f"{what} are not a pair of positional and keyword arguments")
    leaves: list[Any] = []
    structure = _Structure(leaves).of(inputs, 0)
    if structure != in_spec:
        raise Refused(f"{what} are not laid out as the program's input spec says")
    if len(leaves) != len(user_inputs):
        raise Refused(f"{what} hold {len(leaves)} values for {len(user_inputs)} program inputs")
    for leaf, expected in zip(leaves, user_inputs):
        _check_leaf(leaf, expected)


class _Structure:
    """The tree spec of a value, visiting each container once, within the node and depth bounds."""

    def __init__(self, leaves: list):
        self.leaves = leaves
        self.count = 0
        self.seen: set[int] = set()

    def of(self, value: Any, depth: int) -> Spec:
        self.count += 1
        if self.count > limits.MAX_TREE_NODES or depth > limits.MAX_TREE_DEPTH:
            raise Refused("the example inputs are larger or deeper than strideguard reads")
        kind = type(value)
        if kind in (tuple, list, dict, OrderedDict):
            if id(value) in self.seen:
                raise Refused("the example inputs use one container in two places")
            self.seen.add(id(value))
        if kind in (tuple, list):
            return Spec(f"builtins.{kind.__name__}", (), tuple(self.of(item, depth + 1) for item in value))
        if kind in (dict, OrderedDict):
            for key in value:
                if not isinstance(key, str):
                    raise Refused("the example inputs have a dict key that is not a name")
                text.identifier(key, "the example inputs have a dict key")
            name = "builtins.dict" if kind is dict else "collections.OrderedDict"
            return Spec(name, tuple(value), tuple(self.of(item, depth + 1) for item in value.values()))
        self.leaves.append(value)
        return LEAF


def _check_leaf(leaf: Any, expected: UserInput) -> None:
    where = f"the example input for {expected.name}"
    if expected.is_tensor:
        if type(leaf) not in (torch.Tensor, torch.nn.Parameter):
            raise Refused(f"{where} is a {type(leaf).__name__}, not a tensor")
        _check_tensor(leaf, expected, where)
    elif isinstance(leaf, torch.Tensor):
        raise Refused(f"{where} is a tensor where the program expects a number, a string or None")
    elif type(leaf) is str:
        text.quoted_input(leaf, where)
    elif type(leaf) is int:
        if abs(leaf) > limits.MAX_INT:
            raise Refused(f"{where} is an integer beyond int64")
    elif type(leaf) not in (float, bool, type(None)):
        raise Refused(f"{where} is a {type(leaf).__name__}, not a tensor, number, string or None")


def _check_tensor(tensor: torch.Tensor, expected: UserInput, where: str) -> None:
    """A dense, strided tensor of the program's dtype and static sizes: it costs what its storage costs."""
    if tensor.layout is not torch.strided or tensor.device.type not in ("cpu", "cuda"):
        raise Refused(f"{where} is not a strided tensor on the CPU or a GPU")
    if density.is_non_overlapping_and_dense(tuple(tensor.shape), tensor.stride()) is not True:
        raise Refused(f"{where} is not dense (strides {list(tensor.stride())} for sizes {list(tensor.shape)})")
    if tensor.dtype != expected.dtype:
        raise Refused(f"{where} is {tensor.dtype}, but the program expects {expected.dtype}")
    if tensor.dim() != len(expected.sizes) or any(
        want is not None and got != want for got, want in zip(tensor.shape, expected.sizes)
    ):
        raise Refused(f"{where} has sizes {list(tensor.shape)}, but the program expects {list(expected.sizes)}")

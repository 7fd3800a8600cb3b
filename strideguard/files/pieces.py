"""Operators that return a list of tensors: the file must declare exactly the pieces the operator makes.

A node's outputs list its pieces, and the file pays for each one it lists.
What the operator makes is another matter: ``unbind`` of a weight declared
``[2**40, 16]`` with strides ``[0, 1]`` (64 stored bytes) makes 2**40 pieces,
and every later step that runs it (FakeTensor propagation, the view values,
Inductor's lowering) would build them all. So each such node is checked
here, from its arguments and its input's declared sizes, before torch reads
the file: the count it declares must be the count the operator makes. Then
the work is bounded by what the file holds.

An allow-list, by the rule that decides the count: sizes (``unbind``,
``split``, ``chunk``, ``tensor_split``), a list the file spells out
(``split_with_sizes``, ``meshgrid``), or the input's number of dimensions
(``where``). Any other operator returning a list of tensors is refused.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .errors import Refused

Count = Callable[["_Arguments"], int]


class _Arguments:
    """A node's arguments by schema name, defaults filled in, integers read from the file (a symbolic value
    by its hint)."""

    def __init__(self, overload: torch._ops.OpOverload, inputs: list[dict], tensor_values: dict):
        self.schema = overload._schema
        self.given = {argument["name"]: argument["arg"] for argument in inputs}
        self.tensor_values = tensor_values

    def _raw(self, name: str) -> Any:
        if name in self.given:
            return self.given[name]
        [argument] = [a for a in self.schema.arguments if a.name == name]
        return {"default": argument.default_value}

    def integer(self, name: str) -> int:
        [(kind, value)] = self._raw(name).items()
        if kind == "default" and isinstance(value, int):
            return value
        number = _integer({kind: value})
        if number is None:
            raise Refused(f"passes {name} as a value strideguard cannot count pieces from")
        return number

    def integers(self, name: str) -> list:
        [(kind, value)] = self._raw(name).items()
        if kind in ("as_ints", "as_sym_ints", "as_tensors", "as_optional_tensors"):
            return value
        raise Refused(f"passes {name} as a value strideguard cannot count pieces from")

    def dim_size(self, tensor: str, dim: str) -> int:
        sizes = self.sizes(tensor)
        index = self.integer(dim)
        if not -len(sizes) <= index < max(len(sizes), 1) or not sizes:
            raise Refused(f"splits dimension {index} of a tensor of {len(sizes)} dimensions")
        size = _integer(sizes[index])
        if size is None:
            raise Refused("splits a dimension whose size strideguard cannot read")
        return size

    def sizes(self, tensor: str) -> list:
        [(kind, value)] = self._raw(tensor).items()
        meta = self.tensor_values.get(value.get("name")) if kind == "as_tensor" else None
        if meta is None:
            raise Refused(f"passes {tensor} as a value that is not a declared tensor")
        return meta["sizes"]


def _integer(value: dict) -> Optional[int]:
    """An ``as_int``, or a symbolic integer's hint."""
    [(kind, content)] = value.items()
    if kind == "as_int":
        return content
    if kind in ("as_sym_int", "as_expr"):
        expression = content.get("as_expr", content) if kind == "as_sym_int" else content
        hint = expression.get("hint") if isinstance(expression, dict) else None
        if isinstance(hint, dict) and "as_int" in hint:
            return hint["as_int"]
        if "as_int" in content:
            return content["as_int"]
    return None


def _split(arguments: _Arguments) -> int:
    size, split_size = arguments.dim_size("self", "dim"), arguments.integer("split_size")
    if split_size < 0 or (split_size == 0 and size != 0):
        raise Refused(f"splits a dimension of {size} into pieces of {split_size}")
    return 1 if split_size == 0 else max(1, -(-size // split_size))


def _chunk(arguments: _Arguments) -> int:
    size, chunks = arguments.dim_size("self", "dim"), arguments.integer("chunks")
    if chunks <= 0:
        raise Refused(f"chunks a dimension into {chunks} pieces")
    split_size = -(-size // chunks)
    if split_size == 0:
        return chunks  # ATen's chunk of an empty dimension: ``chunks`` empty pieces
    return max(1, -(-size // split_size))


_COUNTS: dict[str, Count] = {
    "aten::unbind.int": lambda a: a.dim_size("self", "dim"),
    "aten::unbind_copy.int": lambda a: a.dim_size("self", "dim"),
    "aten::split.Tensor": _split,
    "aten::split_copy.Tensor": _split,
    "aten::unsafe_split.Tensor": _split,
    "aten::split.sizes": lambda a: len(a.integers("split_size")),
    "aten::split.default": lambda a: len(a.integers("split_size")),
    "aten::split_with_sizes.default": lambda a: len(a.integers("split_sizes")),
    "aten::split_with_sizes_copy.default": lambda a: len(a.integers("split_sizes")),
    "aten::unsafe_split_with_sizes.default": lambda a: len(a.integers("split_sizes")),
    "aten::chunk.default": _chunk,
    "aten::unsafe_chunk.default": _chunk,
    "aten::tensor_split.sections": lambda a: a.integer("sections"),
    "aten::tensor_split.indices": lambda a: len(a.integers("indices")) + 1,
    "aten::meshgrid.default": lambda a: len(a.integers("tensors")),
    "aten::meshgrid.indexing": lambda a: len(a.integers("tensors")),
    "aten::broadcast_tensors.default": lambda a: len(a.integers("tensors")),
    "aten::where.default": lambda a: len(a.sizes("condition")),
    "aten::nonzero_numpy.default": lambda a: len(a.sizes("self")),
}
"""How many pieces each allowed list-returning operator makes, keyed ``namespace::name.overload``."""


def returns_pieces(overload: torch._ops.OpOverload) -> bool:
    return any(result.type.kind() == "ListType" for result in overload._schema.returns)


def check_pieces(overload: torch._ops.OpOverload, node: dict, tensor_values: dict) -> None:
    """Refuse a node of a list-returning operator unless it lists exactly the pieces the operator makes."""
    key = f"{overload._schema.name}.{overload._overloadname}"
    count = _COUNTS.get(key)
    if count is None:
        raise Refused(f"uses {key}, which returns a list of tensors strideguard cannot count from the file")
    made = count(_Arguments(overload, node["inputs"], tensor_values))
    listed = [output for output in node["outputs"] if next(iter(output)) in ("as_tensors", "as_optional_tensors")]
    declared = sum(len(next(iter(output.values()))) for output in listed)
    if made != declared:
        raise Refused(f"lists {declared} pieces of {key}, which makes {made} from the sizes the file declares")

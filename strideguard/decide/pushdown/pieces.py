"""Returned pieces: a returned value that is a piece of another (a slice, select, narrow, or one piece of a
split or unbind), as a ``Narrowing`` of that value."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.fx import Node

from .nodes import arguments_of, positive_dim, slice_bounds, static_size, tensor_of, value_of
from ...program import ops
from ...program.dialect import aten_op
from ...program.ops import op_name


FULL = None
"""An input an op reads whole (a broadcast operand, the weight of a row cut): not narrowed."""


@dataclass(frozen=True)
class Narrowing:
    """Elements ``start:end:step`` of dimension ``dim`` of a value, keeping the dimension."""

    dim: int
    start: int
    end: int
    step: int = 1

    @property
    def length(self) -> int:
        return max(0, (self.end - self.start + self.step - 1) // self.step)

    def on(self, dim: int) -> "Narrowing":
        return Narrowing(dim, self.start, self.end, self.step)

    def shifted(self, offset: int) -> "Narrowing":
        return Narrowing(self.dim, self.start - offset, self.end - offset, self.step)

    def scaled(self, inner: int) -> "Narrowing":
        """The same rows of a dimension whose elements are ``inner`` times as many (a merged view)."""
        return Narrowing(self.dim, self.start * inner, self.end * inner, 1)


@dataclass(frozen=True)
class ReturnedPiece:
    """A returned piece of a value: ``narrowing`` of ``source``, with the dimension dropped for a select."""

    returned: Node
    """The node the program returns (the slice, select, or getitem of a split)."""
    source: Node
    narrowing: Narrowing
    drops_dim: bool
    text: str
    """How the program wrote it: ``select(dim=1, -1)``."""
    consumes: tuple[Node, ...] = ()
    """Nodes between ``source`` and ``returned`` (a split), removed with it."""


def _functional_packet(target: Any) -> Optional[torch._ops.OpOverloadPacket]:
    """The op behind ``target`` when it returns its result; ``None`` for an ``out=`` overload, which writes
    into an argument, and for a target that is not an op."""
    op = aten_op(target)
    if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable:
        return None
    return op.overloadpacket


def returned_piece(node: Any) -> Optional[ReturnedPiece]:
    """``node`` as a narrowing of another value, when it is a slice, select, narrow or split piece."""
    if not isinstance(node, Node) or node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return _piece(node)
    packet = _functional_packet(node.target)
    source = node.args[0] if node.args else None
    value = tensor_of(source)
    if value is None or packet is None:
        return None
    arguments = arguments_of(node)
    if not arguments:
        return None
    if packet in ops.SLICES:
        dim = positive_dim(arguments.get("dim", 0), value.dim())
        bounds = slice_bounds(arguments, static_size(value, dim))
        if bounds is None:
            return None
        start, end, step = bounds
        return ReturnedPiece(node, source, Narrowing(dim, start, max(start, end), step), False,
                           f"slice(dim={arguments.get('dim', 0)}, {_range(arguments)})")
    if packet in ops.SELECTS or packet in ops.NARROWS:
        dim = positive_dim(arguments["dim"], value.dim())
        size = static_size(value, dim)
        index = arguments.get("index", arguments.get("start"))
        if size is None or not isinstance(index, int):
            return None
        index = index + size if index < 0 else index
        if packet in ops.SELECTS:
            return ReturnedPiece(node, source, Narrowing(dim, index, index + 1), True,
                               f"select(dim={arguments['dim']}, {arguments['index']})")
        length = arguments.get("length")
        if not isinstance(length, int):
            return None
        return ReturnedPiece(node, source, Narrowing(dim, index, index + length), False,
                           f"narrow(dim={arguments['dim']}, {arguments['start']}, {length})")
    return None


def _piece(node: Node) -> Optional[ReturnedPiece]:
    """A ``getitem`` of a split or unbind whose only used piece is this one."""
    parent, index = node.args
    if not isinstance(parent, Node) or parent.op != "call_function" or not isinstance(index, int):
        return None
    packet = _functional_packet(parent.target)
    unread = [user for user in parent.users if user is not node]
    if packet not in ops.SPLITS and packet not in ops.UNBINDS or any(user.users for user in unread):
        return None
    source = parent.args[0]
    value, pieces = tensor_of(source), value_of(parent)
    if value is None or not isinstance(pieces, (list, tuple)):
        return None
    arguments = arguments_of(parent)
    if not arguments:
        return None
    dim = positive_dim(arguments.get("dim", 0), value.dim())
    if static_size(value, dim) is None:
        return None
    if packet in ops.UNBINDS:
        return ReturnedPiece(node, source, Narrowing(dim, index, index + 1), True,
                           f"unbind(dim={arguments.get('dim', 0)})[{index}]", consumes=(parent, *unread))
    sizes = [piece.shape[dim] for piece in pieces]
    if not all(type(s) is int for s in sizes):
        return None
    start = sum(sizes[:index])
    name = op_name(parent.target)
    return ReturnedPiece(node, source, Narrowing(dim, start, start + sizes[index]), False,
                       f"{name}(dim={arguments.get('dim', 0)})[{index}]", consumes=(parent, *unread))


def _range(arguments: dict) -> str:
    start, end, step = arguments.get("start"), arguments.get("end"), arguments.get("step", 1)
    text = f"{'' if start is None else start}:{'' if end is None or end >= 2**62 else end}"
    return text + (f":{step}" if step != 1 else "")

"""Allow-list grammars for the three kinds of expression a program carries, with bounded cost.

* ``expr_str`` (symbolic sizes): what ``sympy.srepr`` writes, such as
  ``Mul(Integer(2), Symbol('s77', integer=True, positive=True))``. Torch
  hands it to ``sympy.sympify``, which ``eval``-s it with builtins in scope.
* ``guards_code``: Python comparisons over input sizes, such as
  ``L['x'].size()[0] <= 64``. ``ExportedProgram.module()`` pastes each into a
  function it ``exec``-s and runs on every call.
* range-constraint keys: ``str()`` of an expression (``s77``, ``2*s74``);
  looked up by name only, except that torch loops up to the index of any
  key that names an unbacked symbol (``u12``).

Each is parsed with ``ast`` and accepted only if every node is one the
grammar names. Parsing is not enough: ``Pow(Integer(9), Pow(Integer(9),
Integer(9)))`` is plain sympy and takes forever to evaluate. So every
integer sub-expression gets a bound on its size in bits, with each input
size or symbol taken as 64 bits, and nothing may exceed ``MAX_BITS``.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from sympy.core.assumptions import _assume_defined as _SYMPY_ASSUMPTIONS

from . import limits
from .errors import Refused, excerpt

SYMBOL = re.compile(r"(s|u|zf|zuf)([0-9]+)")
"""Symbols of exported programs: sizes ``s``, unbacked integers ``u``, floats ``zf`` and unbacked floats ``zuf``."""
_UNBACKED_PREFIXES = ("u", "zuf")
_NUMBER_TEXT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?(inf|nan)")


def symbol_name(text: str, what: str = "a symbol") -> str:
    """``s77``, ``u3``: a known prefix and an index small enough for torch to count up to."""
    match = SYMBOL.fullmatch(text)
    if not match:
        raise Refused(f"{what} {excerpt(text)} is not a size symbol such as s0 or u0")
    if len(match.group(2)) > len(str(limits.MAX_SYMBOL_INDEX)) or int(match.group(2)) > limits.MAX_SYMBOL_INDEX:
        raise Refused(f"{what} {excerpt(text)} has an index above {limits.MAX_SYMBOL_INDEX}")
    return text


@dataclass(frozen=True)
class _Size:
    """What evaluating a sub-expression can produce: at most ``bits`` bits, or a float (which cannot grow)."""

    bits: int
    is_float: bool = False

    @staticmethod
    def of_int(value: int) -> "_Size":
        return _Size(max(value.bit_length(), 1))


_FLOAT = _Size(1024, True)
_BOOLEAN = _Size(1)
_INPUT = _Size(64)
"""An input size, stride or symbol: int64 to torch."""


def _bounded(size: _Size, where: str) -> _Size:
    if not size.is_float and size.bits > limits.MAX_BITS:
        raise Refused(f"{where} can compute an integer of more than {limits.MAX_BITS} bits")
    return size


def _widest(sizes: Iterable[_Size]) -> _Size:
    sizes = list(sizes) or [_BOOLEAN]
    if any(size.is_float for size in sizes):
        return _FLOAT
    return _Size(max(size.bits for size in sizes))


def _sum(sizes: list[_Size]) -> _Size:
    widest = _widest(sizes)
    return widest if widest.is_float else _Size(widest.bits + math.ceil(math.log2(max(len(sizes), 1))) + 1)


def _product(sizes: list[_Size]) -> _Size:
    return _FLOAT if any(size.is_float for size in sizes) else _Size(sum(size.bits for size in sizes))


def _power(base: _Size, exponent: Optional[int], where: str) -> _Size:
    """``base ** exponent`` where the exponent must be a literal: a symbolic one has no bound."""
    if base.is_float:
        return _FLOAT
    if exponent is None:
        raise Refused(f"{where} raises to a power that is not a number")
    if abs(exponent) > limits.MAX_BITS:
        raise Refused(f"{where} raises to the power {exponent}, above {limits.MAX_BITS}")
    return _Size(base.bits * max(abs(exponent), 1))


def _parse(text: str, what: str, limit: int) -> ast.expr:
    if len(text) > limit:
        raise Refused(f"{what} is longer than {limit} characters")
    if not text.isprintable() or not text.isascii() or "#" in text or "\\" in text:
        raise Refused(f"{what} {excerpt(text)} contains a character no expression needs")
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise Refused(f"{what} {excerpt(text)} is not an expression") from None


# --- sympy.srepr ----------------------------------------------------------------------------------------------

_SREPR_CONSTANTS = {"oo": _FLOAT, "zoo": _FLOAT, "nan": _FLOAT, "true": _BOOLEAN, "false": _BOOLEAN, "int_oo": _FLOAT}
_SREPR_WIDEST = frozenset(
    {
        "Max", "Min", "Abs", "floor", "ceiling", "Piecewise", "ExprCondPair", "Where", "Identity",
        "TruncToInt", "RoundToInt", "FloorToInt", "CeilToInt", "Mod", "PythonMod", "FloorDiv", "CleanDiv",
        "CeilDiv", "ModularIndexing", "RShift",
    }
)
"""Functions whose integer result is no wider than their widest argument."""
_SREPR_FLOAT = frozenset({"FloatTrueDiv", "IntTrueDiv", "ToFloat", "TruncToFloat", "FloatPow"})
_SREPR_BOOLEAN = frozenset(
    {
        "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan",
        "And", "Or", "Not", "Xor", "IsNonOverlappingAndDenseIndicator",
    }
)
SREPR_FUNCTIONS = _SREPR_WIDEST | _SREPR_FLOAT | _SREPR_BOOLEAN | {
    "Add", "Mul", "Pow", "PowByNatural", "LShift", "RoundDecimal", "Integer", "Rational", "Float", "Symbol",
}
"""Every callable an ``expr_str`` may name: sympy's classes and torch's ``torch.utils._sympy.functions``."""


def check_sympy_repr(text: str, what: str = "a symbolic-shape expression") -> None:
    """Refuse ``text`` unless it is ``sympy.srepr`` output over the allowed functions, with bounded integers."""
    _SreprChecker(what, text).size(_parse(text, what, limits.MAX_EXPRESSION))


class _SreprChecker:
    def __init__(self, what: str, text: str):
        self.where = f"{what} {excerpt(text)}"

    def refuse(self, problem: str) -> Refused:
        return Refused(f"{self.where} {problem}")

    def size(self, node: ast.expr) -> _Size:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return _Size.of_int(node.value)
        if isinstance(node, ast.Constant) and type(node.value) is float:
            return _FLOAT
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return self.size(node.operand)
        if isinstance(node, ast.Name) and node.id in _SREPR_CONSTANTS:
            return _SREPR_CONSTANTS[node.id]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SREPR_FUNCTIONS:
            return _bounded(self.call(node.func.id, node), self.where)
        raise self.refuse(f"uses {excerpt(ast.unparse(node), 40)}, which is not plain sympy")

    def call(self, name: str, node: ast.Call) -> _Size:
        if name == "Symbol":
            return self.symbol(node)
        if name == "Float":
            return self.float(node)
        if node.keywords:
            raise self.refuse(f"passes keywords to {name}")
        if name in ("Integer", "Rational"):
            if not node.args or not all(_literal_int(argument) is not None for argument in node.args):
                raise self.refuse(f"calls {name} on something other than integers")
            return _widest(_Size.of_int(_literal_int(argument)) for argument in node.args)
        arguments = [self.size(argument) for argument in node.args]
        if name == "Add":
            return _sum(arguments)
        if name == "Mul":
            return _product(arguments)
        if name in ("Pow", "PowByNatural"):
            self.arity(name, node, 2)
            return _power(arguments[0], _literal_int(node.args[1], allow_rational=True), self.where)
        if name == "LShift":
            self.arity(name, node, 2)
            shift = _literal_int(node.args[1])
            if shift is None or not 0 <= shift <= limits.MAX_BITS:
                raise self.refuse(f"shifts by something other than a number up to {limits.MAX_BITS}")
            return _Size(arguments[0].bits + shift, arguments[0].is_float)
        if name == "RoundDecimal":
            self.arity(name, node, 2)
            digits = _literal_int(node.args[1])
            if digits is None or abs(digits) > 1000:
                raise self.refuse("rounds to a number of digits that is not a small number")
            return arguments[0]
        if name in _SREPR_FLOAT:
            return _FLOAT
        if name in _SREPR_BOOLEAN:
            return _BOOLEAN
        return _widest(arguments)

    def arity(self, name: str, node: ast.Call, count: int) -> None:
        if len(node.args) != count:
            raise self.refuse(f"calls {name} with {len(node.args)} arguments")

    def symbol(self, node: ast.Call) -> _Size:
        if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant) or type(node.args[0].value) is not str:
            raise self.refuse("calls Symbol on something other than a name")
        name = symbol_name(node.args[0].value)
        for flag in node.keywords:
            if flag.arg not in _SYMPY_ASSUMPTIONS or not isinstance(flag.value, ast.Constant) or type(flag.value.value) is not bool:
                raise self.refuse(f"gives Symbol the assumption {flag.arg!r}, which is not a sympy assumption set to True or False")
        return _FLOAT if name.startswith(("zf", "zuf")) else _INPUT

    def float(self, node: ast.Call) -> _Size:
        if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant):
            raise self.refuse("calls Float on something other than a number")
        value = node.args[0].value
        if not (type(value) in (int, float) or (type(value) is str and len(value) <= 64 and _NUMBER_TEXT.fullmatch(value))):
            raise self.refuse("calls Float on something other than a number")
        for flag in node.keywords:
            precision = _literal_int(flag.value)
            if flag.arg not in ("precision", "dps") or precision is None or not 1 <= precision <= limits.MAX_FLOAT_PRECISION:
                raise self.refuse(f"gives Float a precision that is not a number up to {limits.MAX_FLOAT_PRECISION}")
        return _FLOAT


def _literal_int(node: ast.expr, *, allow_rational: bool = False) -> Optional[int]:
    """The value of an integer literal (``3``, ``-3``, ``Integer(3)``, ``Integer(-3)``); for a rational, its numerator."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal_int(node.operand, allow_rational=allow_rational)
        return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id == "Integer" and len(node.args) == 1:
            return _literal_int(node.args[0])
        if allow_rational and node.func.id == "Rational" and len(node.args) == 2 and _literal_int(node.args[1]) is not None:
            return _literal_int(node.args[0])
    return None


# --- guards ---------------------------------------------------------------------------------------------------

_GUARD_BINARY = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_GUARD_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_GUARD_TENSOR_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_GUARD_FUNCTIONS = frozenset({"max", "min", "abs", "int", "float"})
_GUARD_MATH = frozenset({"floor", "ceil", "trunc", "sqrt", "isnan", "isinf"})
_GUARD_MATH_CONSTANTS = frozenset({"inf", "nan", "pi", "e"})


def check_guard(text: str, what: str = "a guard") -> None:
    """Refuse ``text`` unless it is arithmetic and comparisons over input sizes and numbers, with bounded integers.

    Torch pastes the text into ``torch._assert(<guard>, "Guard failed: <guard>")``
    inside a function it ``exec``-s: besides the grammar, no quote, backslash,
    comment or line break may appear.
    """
    if '"' in text:
        raise Refused(f"{what} {excerpt(text)} contains a double quote, which would end torch's message string")
    _GuardChecker(f"{what} {excerpt(text)}").size(_parse(text, what, limits.MAX_TEXT))


class _GuardChecker:
    def __init__(self, where: str):
        self.where = where

    def size(self, node: ast.expr) -> _Size:
        return _bounded(self.unbounded_size(node), self.where)

    def unbounded_size(self, node: ast.expr) -> _Size:
        if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
            return _Size.of_int(int(node.value))
        if isinstance(node, ast.Constant) and type(node.value) is float:
            return _FLOAT
        if isinstance(node, ast.BoolOp):
            return _widest(self.size(value) for value in node.values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            return self.size(node.operand)
        if isinstance(node, ast.Compare) and all(isinstance(op, _GUARD_COMPARISONS) for op in node.ops):
            for operand in (node.left, *node.comparators):
                self.size(operand)
            return _BOOLEAN
        if isinstance(node, ast.BinOp) and isinstance(node.op, _GUARD_BINARY):
            return self.binary(node)
        if isinstance(node, ast.Attribute) and _is_name(node.value, "math") and node.attr in _GUARD_MATH_CONSTANTS:
            return _FLOAT
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        raise Refused(f"{self.where} uses {excerpt(ast.unparse(node), 40)}, which is not a size comparison")

    def binary(self, node: ast.BinOp) -> _Size:
        left, right = self.size(node.left), self.size(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, _literal_int(node.right), self.where)
        if isinstance(node.op, ast.Mult):
            return _product([left, right])
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return _sum([left, right])
        if isinstance(node.op, ast.Div):
            return _FLOAT
        return _widest([left, right])

    def call(self, node: ast.Call) -> _Size:
        function = node.func
        if node.keywords:
            raise Refused(f"{self.where} passes keywords")
        if isinstance(function, ast.Name) and function.id in _GUARD_FUNCTIONS:
            return _widest(self.size(argument) for argument in node.args)
        if isinstance(function, ast.Attribute) and _is_name(function.value, "math") and function.attr in _GUARD_MATH:
            return _widest(self.size(argument) for argument in node.args)
        if isinstance(function, ast.Attribute) and function.attr in _GUARD_TENSOR_METHODS and not node.args:
            self.input(function.value)
            return _INPUT
        raise Refused(f"{self.where} calls {excerpt(ast.unparse(function), 40)}, which is not a size query")

    def subscript(self, node: ast.Subscript) -> _Size:
        """``L['x']``, ``L['x'][0]['a']``, or ``L['x'].size()[1]``."""
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
            if _literal_int(node.slice) is None:
                raise Refused(f"{self.where} indexes a size with something other than a number")
            return self.call(node.value)
        self.input(node)
        return _INPUT

    def input(self, node: ast.expr) -> None:
        """A path into the inputs: ``L`` subscripted by identifiers and small integers."""
        while isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and type(key.value) is str:
                if not (key.value.isidentifier() and key.value.isascii()):
                    raise Refused(f"{self.where} reads an input named {excerpt(key.value)}, not an identifier")
            elif _literal_int(key) is None or abs(_literal_int(key)) > limits.MAX_INT:
                raise Refused(f"{self.where} reads an input with a key that is neither a name nor a number")
            node = node.value
        if not _is_name(node, "L"):
            raise Refused(f"{self.where} reads {excerpt(ast.unparse(node), 40)}, which is not an input")


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


# --- range-constraint keys ------------------------------------------------------------------------------------

_PRINTED_BINARY = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def check_range_key(text: str, what: str = "a range constraint") -> None:
    """``s77``, ``2*s74``, ``Mod(s0, 4)``: ``str()`` of an expression over symbols, only ever looked up.

    Torch counts up to the index of a key naming an unbacked symbol (``u3``),
    so such a key must be exactly one symbol with a bounded index.
    """
    if text.startswith(_UNBACKED_PREFIXES):
        symbol_name(text, what)
        return
    _check_printed(_parse(text, what, limits.MAX_NAME), f"{what} {excerpt(text)}")


def _check_printed(node: ast.expr, where: str) -> None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return
    if isinstance(node, ast.Name):
        if node.id not in _SREPR_CONSTANTS:
            symbol_name(node.id, where + " names")
        return
    children: Callable[[], list[ast.expr]]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        children = lambda: [node.operand]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, _PRINTED_BINARY):
        children = lambda: [node.left, node.right]
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in SREPR_FUNCTIONS
        and not node.keywords
    ):
        children = lambda: list(node.args)
    else:
        raise Refused(f"{where} uses {excerpt(ast.unparse(node), 40)}, which is not a printed size expression")
    for child in children():
        _check_printed(child, where)

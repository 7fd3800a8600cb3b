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
import decimal
import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from sympy.core.assumptions import _assume_defined as _SYMPY_ASSUMPTIONS

from . import limits
from .errors import excerpt, Refused

SYMBOL = re.compile(r"(s|u|zf|zuf)([0-9]+)")
"""Symbols of exported programs: sizes ``s``, unbacked integers ``u``, floats ``zf`` and unbacked floats ``zuf``."""
_UNBACKED_PREFIXES = ("u", "zuf")
_NUMBER_TEXT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?(inf|nan)")
"""A number as ``Float`` reads its text. Each part starts with a character no other part may (a digit, ``.``,
``e``), so a failing match gives back each digit once, in time linear in the text: ``[0-9]+\\.?[0-9]*``, as
this once was, tried every split of a run of digits between its two halves (quadratic; only ever tried on
64 characters, but each pattern run on a file's text is linear by construction)."""


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
    """A bound on what evaluating or expanding a sub-expression can cost.

    ``bits`` bounds the binary exponent of any value it can take, and of its
    reciprocal: an integer's bit length, a float's exponent either way (a
    sympy ``Float`` has an exponent of any size, so ``floor`` of one is an
    integer of that many bits). ``terms`` bounds how many terms it expands to
    (``ShapeEnv.simplify`` expands products of sums).
    """

    bits: int
    terms: int = 1

    @staticmethod
    def of_int(value: int) -> "_Size":
        return _Size(max(value.bit_length(), 1))


_ONE = _Size(1)
_INPUT = _Size(64)
"""An input size, stride or symbol: int64 to torch."""
_FLOAT_INPUT = _Size(1024)
"""A float symbol or a Python float: a double's exponent is at most 1,024 either way."""


def _float_size(value: float) -> _Size:
    if not math.isfinite(value) or value == 0:
        return _ONE
    return _Size(abs(math.frexp(value)[1]) + 1)


def _decimal_size(text: str) -> _Size:
    """A number written in decimal, however large its exponent, without evaluating it."""
    number = decimal.Decimal(text)
    if not number.is_finite() or number.is_zero():
        return _ONE
    return _Size(math.ceil((abs(number.adjusted()) + 1) * math.log2(10)) + 1)


def _bounded(size: _Size, where: str) -> _Size:
    if size.bits > limits.MAX_BITS:
        raise Refused(f"{where} can compute a number of more than {limits.MAX_BITS} bits")
    if size.terms > limits.MAX_TERMS:
        raise Refused(f"{where} can expand to more than {limits.MAX_TERMS} terms")
    return size


def _widest(sizes: Iterable[_Size]) -> _Size:
    """A function whose result is no larger than its largest argument (``Max``, ``floor``, ``Mod``)."""
    sizes = list(sizes) or [_ONE]
    return _Size(max(size.bits for size in sizes), sum(size.terms for size in sizes))


def _sum(sizes: list[_Size]) -> _Size:
    widest = _widest(sizes)
    return _Size(widest.bits + math.ceil(math.log2(max(len(sizes), 1))) + 1, widest.terms)


def _product(sizes: list[_Size]) -> _Size:
    """A product or a quotient: exponents add; expanded, every term of one multiplies every term of the others."""
    return _Size(sum(size.bits for size in sizes), math.prod(min(size.terms, limits.MAX_TERMS + 1) for size in sizes))


def _power(base: _Size, exponent: Optional[float], where: str) -> _Size:
    """``base ** exponent`` where the exponent must be a literal: a symbolic one has no bound."""
    if exponent is None:
        raise Refused(f"{where} raises to a power that is not a number")
    if not abs(exponent) <= limits.MAX_BITS:
        raise Refused(f"{where} raises to the power {exponent}, above {limits.MAX_BITS}")
    times = max(math.ceil(abs(exponent)), 1)
    terms = base.terms
    if exponent == int(exponent) and exponent > 1 and base.terms > 1:
        # The multinomial expansion of a k-term sum to the n-th power has C(n + k - 1, k - 1) terms.
        terms = math.comb(times + min(base.terms, limits.MAX_TERMS + 1) - 1, times)
    return _Size(base.bits * times, terms)


def _parse(text: str, what: str, limit: int) -> ast.expr:
    if len(text) > limit:
        raise Refused(f"{what} is longer than {limit} characters")
    if not text.isprintable() or not text.isascii() or "#" in text or "\\" in text:
        raise Refused(f"{what} {excerpt(text)} contains a character no expression needs")
    if _nesting(text) > limits.MAX_EXPRESSION_DEPTH:
        raise Refused(f"{what} {excerpt(text)} nests deeper than {limits.MAX_EXPRESSION_DEPTH} levels")
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise Refused(f"{what} {excerpt(text)} is not an expression") from None


def _nesting(text: str) -> int:
    """The deepest bracket nesting of ``text``, counted before Python or sympy recurse into it."""
    depth = deepest = 0
    for character in text:
        if character in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif character in ")]}":
            depth -= 1
    return deepest


# --- sympy.srepr ----------------------------------------------------------------------------------------------

_SREPR_CONSTANTS = {"oo": _ONE, "zoo": _ONE, "nan": _ONE, "true": _ONE, "false": _ONE, "int_oo": _ONE}
_SREPR_WIDEST = frozenset(
    {
        "Max", "Min", "Abs", "floor", "ceiling", "Piecewise", "ExprCondPair", "Where", "Identity",
        "TruncToInt", "RoundToInt", "FloorToInt", "CeilToInt", "Mod", "PythonMod", "FloorDiv", "CleanDiv",
        "CeilDiv", "ModularIndexing", "RShift", "ToFloat", "TruncToFloat",
    }
)
"""Functions whose result is no larger than their largest argument (a float's ``floor`` is as large as the float)."""
_SREPR_QUOTIENTS = frozenset({"FloatTrueDiv", "IntTrueDiv"})
"""A quotient is as large as its numerator times the reciprocal of its denominator."""
_SREPR_BOOLEAN = frozenset(
    {
        "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan",
        "And", "Or", "Not", "Xor", "IsNonOverlappingAndDenseIndicator",
    }
)
SREPR_FUNCTIONS = _SREPR_WIDEST | _SREPR_QUOTIENTS | _SREPR_BOOLEAN | {
    "Add", "Mul", "Pow", "PowByNatural", "FloatPow", "LShift", "RoundDecimal", "Integer", "Rational", "Float", "Symbol",
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
            return _float_size(node.value)
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
        if name in ("Pow", "PowByNatural", "FloatPow"):
            self.arity(name, node, 2)
            return _power(arguments[0], _literal_number(node.args[1]), self.where)
        if name in _SREPR_QUOTIENTS:
            return _product(arguments)
        if name == "LShift":
            self.arity(name, node, 2)
            shift = _literal_int(node.args[1])
            if shift is None or not 0 <= shift <= limits.MAX_BITS:
                raise self.refuse(f"shifts by something other than a number up to {limits.MAX_BITS}")
            return _Size(arguments[0].bits + shift, arguments[0].terms)
        if name == "RoundDecimal":
            self.arity(name, node, 2)
            digits = _literal_int(node.args[1])
            if digits is None or abs(digits) > 1000:
                raise self.refuse("rounds to a number of digits that is not a small number")
            return _Size(arguments[0].bits + math.ceil(abs(digits) * math.log2(10)), arguments[0].terms)
        if name in _SREPR_BOOLEAN:
            return _Size(1, _widest(arguments).terms)
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
        return _FLOAT_INPUT if name.startswith(("zf", "zuf")) else _INPUT

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
        return _decimal_size(str(value)) if type(value) is str else _float_size(float(value))


def _literal_number(node: ast.expr) -> Optional[float]:
    """The value of a numeric literal exponent: an integer, a rational's ``p/q`` or a plain float."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal_number(node.operand)
        return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, ast.Constant) and type(node.value) is float and math.isfinite(node.value):
        return node.value
    if (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Rational"
        and len(node.args) == 2 and not node.keywords
    ):
        numerator, denominator = _literal_int(node.args[0]), _literal_int(node.args[1])
        if numerator is None or not denominator:
            return None
        return numerator / denominator if abs(numerator) <= 1 << 64 and abs(denominator) <= 1 << 64 else None
    if (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Float"
        and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and not node.keywords
    ):
        try:
            value = float(node.args[0].value)
        except (TypeError, ValueError, OverflowError):
            return None
        return value if math.isfinite(value) else None
    value = _literal_int(node)
    return None if value is None or abs(value) > 1 << 64 else float(value)


def _literal_int(node: ast.expr) -> Optional[int]:
    """The value of an integer literal (``3``, ``-3``, ``Integer(3)``, ``Integer(-3)``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal_int(node.operand)
        return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id == "Integer" and len(node.args) == 1:
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
            return _float_size(node.value)
        if isinstance(node, ast.BoolOp):
            return _widest(self.size(value) for value in node.values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            return self.size(node.operand)
        if isinstance(node, ast.Compare) and all(isinstance(op, _GUARD_COMPARISONS) for op in node.ops):
            for operand in (node.left, *node.comparators):
                self.size(operand)
            return _ONE
        if isinstance(node, ast.BinOp) and isinstance(node.op, _GUARD_BINARY):
            return self.binary(node)
        if isinstance(node, ast.Attribute) and _is_name(node.value, "math") and node.attr in _GUARD_MATH_CONSTANTS:
            return _Size(2)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        raise Refused(f"{self.where} uses {excerpt(ast.unparse(node), 40)}, which is not a size comparison")

    def binary(self, node: ast.BinOp) -> _Size:
        left, right = self.size(node.left), self.size(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, _literal_number(node.right), self.where)
        if isinstance(node.op, ast.Mult):
            return _product([left, right])
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return _sum([left, right])
        if isinstance(node.op, ast.Div):
            # A Python float: a quotient too large for one raises OverflowError at once.
            return _Size(min(_product([left, right]).bits, _FLOAT_INPUT.bits))
        return _widest([left, right])

    def call(self, node: ast.Call) -> _Size:
        function = node.func
        if node.keywords:
            raise Refused(f"{self.where} passes keywords")
        if isinstance(function, ast.Name) and function.id == "float":
            # A Python float: an integer too large for one raises OverflowError at once.
            return _Size(min(_widest(self.size(argument) for argument in node.args).bits, _FLOAT_INPUT.bits))
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

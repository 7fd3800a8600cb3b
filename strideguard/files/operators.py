"""Which callables a node may name, and what each kind of node may be passed.

Torch resolves a node's target by attribute lookup from ``torch``,
``operator`` or ``math`` and calls whatever it finds when the program runs:
``torch.ops.load_library``, ``torch.ops.import_module`` or
``torch.export.custom_ops._call_custom_autograd_function_in_pre_dispatch``
(which the exporter's verifier admits, and which imports the module a string
argument names) all resolve. A node is accepted only if its target is one of:

* an operator overload ``torch.ops.<namespace>.<op>.<overload>`` registered in
  an allowed namespace (``aten``, ``prims``) whose schema is a tensor
  operator's (``schema_problem``: no TorchScript builtin such as ``ljust`` or
  ``save``), except ``from_file``, the one such operator that reads a file;
  its argument names must be those of the operator's schema, and it takes no
  graph or callable;
* a higher-order operator from a short list (control flow, grad and autocast
  regions, functionalized mutation); its arguments may be tensors, numbers,
  subgraphs and keyword names that are identifiers, and only the string or
  operator arguments each one needs;
* ``_operator.getitem`` or one of the symbolic-size operations torch's own
  serializer lists (``operator.add``, ``torch.sym_max``, ...), passed only
  numbers and size values.
"""

from __future__ import annotations

import enum
import functools
import operator
import re
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch._higher_order_ops  # registers the higher-order operators, so that lookups below can find them
from torch._export.serde.serialize import _SYM_OPS

from . import text
from .errors import excerpt, Refused, shown

ALLOWED_NAMESPACES = ("aten", "prims")
_NAME_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}")
REFUSED_OPERATORS = {
    "aten::from_file": "reads or maps a file named by the program",
    "aten::_print": "prints to the terminal",
}


class Kind(enum.Enum):
    OVERLOAD = "operator overload"
    HIGHER_ORDER = "higher-order operator"
    SYMBOLIC = "symbolic-size operation"


@dataclass(frozen=True)
class HigherOrderRule:
    """What one higher-order operator may be passed beyond tensors, numbers and subgraphs."""

    string_argument: Optional[tuple[int, str]] = None
    """(position, kind) of its one string argument: a ``device`` type or an ``identifier``."""
    operator_argument: bool = False
    """Whether its first argument is the operator it functionalizes."""


HIGHER_ORDER = {
    "cond": HigherOrderRule(),
    "while_loop": HigherOrderRule(),
    "map_impl": HigherOrderRule(),
    "scan": HigherOrderRule(),
    "wrap_with_set_grad_enabled": HigherOrderRule(),
    "wrap_with_autocast": HigherOrderRule(string_argument=(0, "device")),
    "auto_functionalized": HigherOrderRule(operator_argument=True),
    "auto_functionalized_v2": HigherOrderRule(operator_argument=True),
    "invoke_subgraph": HigherOrderRule(string_argument=(1, "identifier")),
}


def _serialized_name(target: Any) -> str:
    """How torch's serializer names a Python callable target (``GraphModuleSerializer.serialize_operator``)."""
    return f"{target.__module__}.{target.__name__}"


SYMBOLIC = frozenset(_serialized_name(target) for target in _SYM_OPS) | {_serialized_name(operator.getitem)}
"""Torch's own list of symbolic-size operations, as its serializer writes them, and ``getitem``."""

_VALUE_ARGUMENTS = frozenset(
    {
        "as_none", "as_tensor", "as_tensors", "as_int", "as_ints", "as_float", "as_floats", "as_bool", "as_bools",
        "as_sym_int", "as_sym_ints", "as_sym_bool", "as_sym_bools", "as_sym_float", "as_sym_floats",
        "as_scalar_type", "as_memory_format", "as_layout", "as_device", "as_optional_tensors",
        "as_optional_tensor", "as_complex", "as_nested_tensors", "as_int_lists", "as_float_lists",
    }
)
"""Argument kinds that are data: any node may be passed them."""
_SYMBOLIC_ARGUMENTS = frozenset({"as_int", "as_float", "as_bool", "as_sym_int", "as_sym_bool", "as_sym_float", "as_none"})


@dataclass(frozen=True)
class Target:
    kind: Kind
    name: str
    overload: Optional[torch._ops.OpOverload] = None


@functools.lru_cache(maxsize=4096)
def resolve(target: str) -> Target:
    """The allowed callable ``target`` names, or ``Refused`` saying why it is not one."""
    if target in SYMBOLIC:
        return Target(Kind.SYMBOLIC, target)
    parts = target.split(".")
    if parts[:3] == ["torch", "ops", "higher_order"] and len(parts) == 4:
        if parts[3] not in HIGHER_ORDER or not isinstance(getattr(torch.ops.higher_order, parts[3], None), torch._ops.HigherOrderOperator):
            raise Refused(f"uses the higher-order operator {excerpt(parts[3], 40)}, which strideguard does not read")
        return Target(Kind.HIGHER_ORDER, parts[3])
    if parts[:2] != ["torch", "ops"] or len(parts) != 5:
        raise Refused(f"calls {excerpt(target, 80)}, which is not an operator strideguard reads")
    namespace, name, overload_name = parts[2:]
    if not all(_NAME_PART.fullmatch(part) for part in parts[2:]):
        raise Refused(f"calls {excerpt(target, 80)}, which is not an operator name")
    if namespace not in ALLOWED_NAMESPACES:
        raise Refused(
            f"uses the custom operator {shown(namespace, 40)}::{shown(name, 40)}; strideguard reads only "
            f"{' and '.join(ALLOWED_NAMESPACES)} operators and never loads the library a file names"
        )
    qualified = f"{namespace}::{name}"
    if qualified in REFUSED_OPERATORS:
        raise Refused(f"uses {qualified}, which {REFUSED_OPERATORS[qualified]}; strideguard refuses it")
    packet = getattr(getattr(torch.ops, namespace), name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket) or overload_name not in packet.overloads():
        raise Refused(f"uses {excerpt(target, 80)}, which this torch ({torch.__version__}) does not have as an operator")
    overload = getattr(packet, overload_name)
    problem = schema_problem(overload._schema)
    if problem is not None:
        raise Refused(f"uses {qualified}.{overload_name}, which {problem}; a graph holds tensor operators only")
    return Target(Kind.OVERLOAD, target, overload)


_TENSOR_OPERATOR_TYPES = frozenset(
    {
        "TensorType", "IntType", "SymIntType", "FloatType", "SymFloatType", "BoolType", "SymBoolType",
        "NumberType", "ComplexType", "DeviceObjType", "GeneratorType", "ScalarTypeType", "LayoutType",
        "MemoryFormatType", "NoneType", "StringType",
    }
)
"""The types of a tensor operator's schema (``native_functions.yaml``'s vocabulary), lists and optionals of them."""
_TENSOR_VALUES = frozenset({"TensorType", "SymIntType", "SymFloatType", "SymBoolType", "NumberType"})


def _elements(type_: Any) -> list[Any]:
    if type_.kind() in ("ListType", "OptionalType"):
        return _elements(type_.getElementType())
    return [type_]


def schema_problem(schema: torch._C.FunctionSchema) -> Optional[str]:
    """Why an ``aten`` or ``prims`` schema is not a tensor operator's, or ``None`` when it is.

    The namespaces also hold about a thousand TorchScript builtins (``ljust``,
    ``format``, ``dict``, ``save``, ``warn``) that FakeTensorMode runs for real
    on their string and integer arguments. Decided from the schema alone: every
    argument and result is a tensor, a number, a size, a dtype, a device or the
    like (a string only as an argument, such as ``einsum``'s equation or an
    assertion's message), and at least one is a tensor, a symbolic size or a
    scalar. Generic types (``t``), dictionaries, storages, futures and classes
    are not a tensor operator's.
    """
    arguments = [type_ for argument in schema.arguments for type_ in _elements(argument.type)]
    results = [type_ for result in schema.returns for type_ in _elements(result.type)]
    foreign = sorted({str(type_) for type_ in arguments + results if type_.kind() not in _TENSOR_OPERATOR_TYPES})
    if foreign:
        return f"takes or returns values of type {', '.join(foreign)}"
    arguments, results = [type_.kind() for type_ in arguments], [type_.kind() for type_ in results]
    if "StringType" in results:
        return "returns a string"
    if not _TENSOR_VALUES.intersection(arguments + results):
        return "has no tensor, symbolic size or scalar in its schema"
    return None


def operator_argument(target: str) -> None:
    """An operator passed as an argument (to ``auto_functionalized``) must itself be an allowed overload."""
    if resolve(target).kind is not Kind.OVERLOAD:
        raise Refused(f"passes {excerpt(target, 80)} as an operator, which is not an operator overload")


def check_arguments(target: Target, inputs: list[dict]) -> None:
    """Refuse arguments a node of this kind may not be passed (names, graphs, callables, strings)."""
    if target.kind is Kind.OVERLOAD:
        _check_overload_arguments(target, inputs)
    elif target.kind is Kind.HIGHER_ORDER:
        _check_higher_order_arguments(target.name, inputs)
    else:
        for argument in inputs:
            if _kind(argument) not in _SYMBOLIC_ARGUMENTS:
                raise Refused(f"passes {target.name} an argument of kind {_kind(argument)}, not a number or size")


def _kind(argument: dict) -> str:
    return next(iter(argument["arg"]))


def _check_overload_arguments(target: Target, inputs: list[dict]) -> None:
    names = {argument.name for argument in target.overload._schema.arguments}
    for argument in inputs:
        if argument["name"] not in names:
            raise Refused(f"passes {target.name} an argument {excerpt(argument['name'], 40)} its schema does not have")
        if _kind(argument) not in _VALUE_ARGUMENTS | {"as_string", "as_strings"}:
            raise Refused(f"passes {target.name} an argument of kind {_kind(argument)}, which an operator does not take")


def _check_higher_order_arguments(name: str, inputs: list[dict]) -> None:
    rule = HIGHER_ORDER[name]
    for position, argument in enumerate(inputs):
        if argument["name"]:
            text.identifier(argument["name"], f"{name}'s keyword argument")
        kind = _kind(argument)
        if kind in _VALUE_ARGUMENTS or kind == "as_graph":
            continue
        if kind == "as_operator" and rule.operator_argument and position == 0:
            continue
        if kind == "as_string" and rule.string_argument and rule.string_argument[0] == position:
            value = argument["arg"]["as_string"]
            if rule.string_argument[1] == "device":
                text.device_type(value, f"{name}'s device")
            else:
                text.identifier(value, f"{name}'s name")
            continue
        raise Refused(f"passes {name} an argument of kind {kind} at position {position}, which strideguard does not accept there")

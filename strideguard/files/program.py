"""The serialized program (``models/model.json``) and the weight and constant configurations, field by field.

The walk itself is ``walk.walk`` over torch's schema dataclasses. This module
says what every text field and dictionary key may hold, by what torch does
with it (see ``text``, ``expressions``, ``operators``, ``trees``), and checks
what spans fields: a node's target against its arguments, tensor metadata,
the integer sizes a chain of symbolic-size operations can reach, and the
payload sizes each weight declares against the bytes stored for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch._export.serde import schema as s
from torch._export.serde.schema import SCHEMA_VERSION
from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE
from torch.export.pt2_archive import constants as pt2

from . import expressions, limits, operators, pieces, text, trees
from .errors import excerpt, Refused, shown
from .walk import Rules, TextRule, walk

ACCEPTED_DIALECTS = frozenset({"", "ATEN", "TRAINING"})
"""Verifiers that admit only operator overloads, higher-order operators and symbolic-size builtins as targets."""

_NODE_METADATA: dict[str, Callable[[str, str], Any]] = {
    "stack_trace": text.stack_trace,
    "nn_module_stack": text.data_text,
    "torch_fn": text.data_text,
    "custom": text.json_object,
    "from_node": text.node_sources,
}
"""The node metadata torch 2.13 writes and reads; ``source_fn_stack`` is checked by ``_source_functions``."""
_PAYLOAD_PATH = re.compile(r"(weight|tensor)_[0-9]{1,9}")


def _source_functions(value: str, what: str) -> None:
    """``name,target;...``: torch resolves each target by attribute lookup from ``torch`` and keeps it as data."""
    text.data_text(value, what)
    for entry in value.split(";"):
        parts = entry.split(",")
        if len(parts) != 2:
            raise Refused(f"{what} {excerpt(entry)} is not a name and a function")
        text.data_text(parts[0], what)
        text.dotted_name(parts[1], f"{what} names")


def _named(rule: Callable[[str, str], Any], what: str) -> TextRule:
    return lambda value, key: rule(value, what)


def _refuse(problem: str) -> TextRule:
    def rule(value: str, key: Optional[str]) -> None:
        raise Refused(problem)

    return rule


_NO_CUSTOM_OBJECTS = _refuse(
    "holds a script object, which torch would unpickle or look up by class name; strideguard refuses them"
)
_VALUE_NAME = _named(text.identifier, "a value name")
_WEIGHT_NAME = _named(text.qualified_name, "a weight or buffer name")


def _node_metadata(value: str, key: Optional[str]) -> None:
    if key == "source_fn_stack":
        _source_functions(value, "a node's source function")
    elif key in _NODE_METADATA:
        _NODE_METADATA[key](value, f"a node's {key}")
    else:
        raise Refused(f"has node metadata {excerpt(str(key), 40)}, which torch {torch.__version__} does not write")


def _graph_metadata(value: str, key: Optional[str]) -> None:
    if key != "custom":
        raise Refused(f"has program metadata {excerpt(str(key), 40)}, which torch {torch.__version__} does not write")
    text.json_object(value, "the program's custom metadata")


def _argument_name(value: str, key: Optional[str]) -> None:
    """Empty for a positional argument of a higher-order operator; the node check refines the rest."""
    if value and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,200}", value):
        raise Refused(f"names an argument {excerpt(value)}, which is not an identifier")


def _dialect(value: str, key: Optional[str]) -> None:
    if value not in ACCEPTED_DIALECTS:
        raise Refused(f"is in a dialect strideguard does not read: {excerpt(value, 40)}")


def _text_rules() -> dict:
    return {
        (s.Device, "type"): _named(text.device_type, "a device"),
        (s.SymIntArgument, "as_name"): _VALUE_NAME,
        (s.SymFloatArgument, "as_name"): _VALUE_NAME,
        (s.SymBoolArgument, "as_name"): _VALUE_NAME,
        (s.TensorArgument, "name"): _VALUE_NAME,
        (s.TokenArgument, "name"): _VALUE_NAME,
        (s.GraphArgument, "name"): _VALUE_NAME,
        (s.CustomObjArgument, "name"): _NO_CUSTOM_OBJECTS,
        (s.CustomObjArgument, "class_fqn"): _NO_CUSTOM_OBJECTS,
        (s.Argument, "as_string"): _named(text.string_literal, "a string argument"),
        (s.Argument, "as_strings"): _named(text.string_literal, "a string argument"),
        (s.Argument, "as_operator"): lambda value, key: operators.operator_argument(value),
        (s.NamedArgument, "name"): _argument_name,
        (s.Node, "target"): lambda value, key: operators.resolve(value),
        (s.Node, "name"): _VALUE_NAME,
        (s.Node, "metadata"): _node_metadata,
        (s.InputToConstantInputSpec, "name"): _VALUE_NAME,
        (s.ConstantValue, "as_string"): _named(text.quoted_input, "a string input"),
        (s.InputToParameterSpec, "parameter_name"): _WEIGHT_NAME,
        (s.InputToBufferSpec, "buffer_name"): _WEIGHT_NAME,
        (s.InputToTensorConstantSpec, "tensor_constant_name"): _WEIGHT_NAME,
        (s.InputToCustomObjSpec, "custom_obj_name"): _NO_CUSTOM_OBJECTS,
        (s.BufferMutationSpec, "buffer_name"): _WEIGHT_NAME,
        (s.ParameterMutationSpec, "parameter_name"): _WEIGHT_NAME,
        (s.GradientToParameterSpec, "parameter_name"): _WEIGHT_NAME,
        (s.GradientToUserInputSpec, "user_input_name"): _VALUE_NAME,
        (s.UserInputMutationSpec, "user_input_name"): _VALUE_NAME,
        (s.ModuleCallSignature, "in_spec"): lambda value, key: trees.parse_treespec(value, "an input spec", identifier_keys=True),
        (s.ModuleCallSignature, "out_spec"): lambda value, key: trees.parse_treespec(value, "an output spec", identifier_keys=False),
        (s.ModuleCallSignature, "forward_arg_names"): _named(text.identifier, "an argument name"),
        (s.ModuleCallEntry, "fqn"): _named(text.module_path, "a module path"),
        (s.NamedTupleDef, "field_names"): _named(text.identifier, "a named tuple field"),
        (s.GraphModule, "metadata"): _graph_metadata,
        (s.ExportedProgram, "verifiers"): _dialect,
        (s.ExportedProgram, "torch_version"): _named(text.version, "the torch version"),
        (s.ExportedProgram, "guards_code"): _named(expressions.check_guard, "a guard"),
    }


def _key_rules() -> dict:
    return {
        (s.Node, "metadata"): lambda key, _: None,  # checked with its value by _node_metadata
        (s.Graph, "tensor_values"): _VALUE_NAME,
        (s.Graph, "sym_int_values"): _VALUE_NAME,
        (s.Graph, "sym_bool_values"): _VALUE_NAME,
        (s.Graph, "sym_float_values"): _VALUE_NAME,
        (s.Graph, "custom_obj_values"): _NO_CUSTOM_OBJECTS,
        (s.Argument, "as_string_to_argument"): _refuse("passes a dictionary argument, which no operator strideguard reads takes"),
        (s.GraphModule, "metadata"): lambda key, _: None,  # checked with its value by _graph_metadata
        (s.GraphModule, "treespec_namedtuple_fields"): _named(text.dotted_name, "a named tuple type"),
        (s.ExportedProgram, "opset_version"): _named(text.identifier, "an operator namespace"),
        (s.ExportedProgram, "range_constraints"): _named(expressions.check_range_key, "a range constraint"),
    }


def _check_tensor_meta(meta: dict, path: str) -> None:
    """Strided tensors of a known dtype with non-negative sizes, strides and offset, at most ``MAX_DIMS``
    dimensions, and a number of elements and an extent within int64."""
    if meta["layout"] != s.Layout.Strided:
        raise Refused(f"declares a tensor with layout {s.Layout(meta['layout']).name}; strideguard reads strided tensors only (at {path})")
    if meta["dtype"] == s.ScalarType.UNKNOWN:
        raise Refused(f"declares a tensor of unknown dtype (at {path})")
    if max(len(meta["sizes"]), len(meta["strides"])) > limits.MAX_DIMS:
        raise Refused(f"declares a tensor of more than {limits.MAX_DIMS} dimensions (at {path})")
    if len(meta["sizes"]) != len(meta["strides"]):
        raise Refused(f"declares a tensor with {len(meta['sizes'])} sizes and {len(meta['strides'])} strides (at {path})")
    for value in (*meta["sizes"], *meta["strides"], meta["storage_offset"]):
        if "as_int" in value and value["as_int"] < 0:
            raise Refused(f"declares a negative size, stride or offset (at {path})")
    _declared_extent(meta, f"a tensor (at {path})")


def _declared_extent(meta: dict, what: str) -> int:
    """Elements from the storage's start to ``meta``'s last one (0 when it has none), over its static sizes;
    refused beyond int64, where torch's own arithmetic would overflow."""
    sizes = [size.get("as_int") for size in meta["sizes"]]
    strides = [stride.get("as_int") for stride in meta["strides"]]
    if 0 in sizes:
        return 0
    numel, extent = 1, meta["storage_offset"].get("as_int") or 0
    for size, stride in zip(sizes, strides):
        if size is None:
            continue
        numel *= size
        if stride is not None:
            extent += (size - 1) * stride
        if numel > limits.MAX_INT or extent >= limits.MAX_INT:
            raise Refused(f"declares {what} whose elements or extent pass int64")
    return extent + 1


def _check_pieces(graph: dict, path: str) -> None:
    """Each list-returning node lists the pieces its operator makes (``pieces``), read against the sizes
    the graph declares."""
    for index, node in enumerate(graph["nodes"]):
        target = operators.resolve(node["target"])
        if target.kind is operators.Kind.OVERLOAD and pieces.returns_pieces(target.overload):
            try:
                pieces.check_pieces(target.overload, node, graph["tensor_values"])
            except Refused as refusal:
                raise Refused(f"{refusal} (at {path}.nodes[{index}])") from None


def _check_device(device: dict, path: str) -> None:
    index = device.get("index")
    if index is not None and not 0 <= index <= 1024:
        raise Refused(f"names device index {index} (at {path})")


class _ProgramChecker:
    """Walks one program, keeping what the node checks need across nodes."""

    def __init__(self) -> None:
        self.integer_bits: dict[str, int] = {}
        """Bits each symbolic-size value computed by a node can reach; size reads are 64 bits."""
        self.nodes = 0
        self.expression_characters = 0
        self.expressions: set[str] = set()

    def rules(self) -> Rules:
        return Rules(
            text={**_text_rules(), (s.SymExpr, "expr_str"): self.check_expression},  # counts what it reads
            keys=_key_rules(),
            hooks={s.Node: self.check_node, s.Graph: _check_pieces, s.TensorMeta: _check_tensor_meta, s.Device: _check_device},
        )

    def check_expression(self, value: str, key: Optional[str]) -> None:
        """One symbolic-shape expression, the distinct ones within the program's total: torch's reader
        parses each distinct text once (``_torchs_reader_memoized``) at about 6 us a character, so 800
        legal expressions of 9,000 characters took 25 s."""
        if value in self.expressions:
            return
        self.expressions.add(value)
        self.expression_characters += len(value)
        if self.expression_characters > limits.MAX_EXPRESSIONS_TOTAL:
            raise Refused(
                f"has more than {limits.MAX_EXPRESSIONS_TOTAL:,} characters of distinct symbolic-shape expressions, "
                "the most strideguard reads from a file within its time bound; a program you trust can be read with "
                "torch.export.load and given to strideguard's Python API"
            )
        expressions.check_sympy_repr(value, "a symbolic-shape expression")

    def check_node(self, node: dict, path: str) -> None:
        self.nodes += 1
        if self.nodes > limits.MAX_NODES:
            raise Refused(
                f"has more than {limits.MAX_NODES:,} nodes, the most strideguard reads from a file within its time "
                "bound; a program you trust can be read with torch.export.load and given to strideguard's Python API"
            )
        target = operators.resolve(node["target"])
        try:
            operators.check_arguments(target, node["inputs"])
            if target.kind is operators.Kind.SYMBOLIC:
                self.bound_symbolic(target.name, node)
        except Refused as refusal:
            raise Refused(f"{refusal} (at {path})") from None

    def bound_symbolic(self, name: str, node: dict) -> None:
        """Python evaluates these on plain ints in ``verify``'s eager run: ``mul`` chains or ``pow`` can explode."""
        sizes = [self.argument_bits(argument["arg"]) for argument in node["inputs"]]
        operation = name.rsplit(".", 1)[-1]
        if operation in ("add", "sub"):
            bits = max(sizes, default=1) + 1
        elif operation == "mul":
            bits = sum(sizes)
        elif operation in ("pow", "lshift"):
            exponent = self.literal(node["inputs"][1]["arg"]) if len(node["inputs"]) == 2 else None
            if exponent is None or abs(exponent) > limits.MAX_BITS:
                raise Refused(f"computes {operation} with an operand that is not a number up to {limits.MAX_BITS}")
            bits = sizes[0] * max(abs(exponent), 1) if operation == "pow" else sizes[0] + abs(exponent)
        elif operation == "sym_int":
            bits = 1024  # of a float
        else:
            bits = max(sizes, default=1)
        if bits > limits.MAX_BITS:
            raise Refused(f"chains symbolic-size operations that can compute an integer of more than {limits.MAX_BITS} bits")
        for output in node["outputs"]:
            [(kind, value)] = output.items()
            if isinstance(value, dict) and "as_name" in value:
                self.integer_bits[value["as_name"]] = max(bits, self.integer_bits.get(value["as_name"], 0))

    def argument_bits(self, argument: dict) -> int:
        [(kind, value)] = argument.items()
        if kind == "as_int":
            return max(value.bit_length(), 1)
        if kind in ("as_sym_int", "as_sym_bool", "as_sym_float") and "as_name" in value:
            return self.integer_bits.get(value["as_name"], 64)
        if kind == "as_sym_int":
            return max(value["as_int"].bit_length(), 1)
        return 64

    @staticmethod
    def literal(argument: dict) -> Optional[int]:
        [(kind, value)] = argument.items()
        if kind == "as_int":
            return value
        if kind == "as_sym_int" and "as_int" in value:
            return value["as_int"]
        return None


def check_header(serialized: Any) -> None:
    """What decides whether the rest can be read at all: the schema version and the dialect."""
    if not isinstance(serialized, dict):
        raise Refused("is not a serialized exported program")
    saved_by = serialized.get("torch_version") if isinstance(serialized.get("torch_version"), str) else "an unknown torch"
    version = serialized.get("schema_version")
    if not isinstance(version, dict) or version.get("major") != SCHEMA_VERSION[0]:
        found = f"{version.get('major')}.{version.get('minor')}" if isinstance(version, dict) else "unknown"
        raise Refused(
            f"was saved by an incompatible torch ({shown(saved_by, 20)}, schema {shown(found, 20)}); "
            f"torch {torch.__version__} reads schema {SCHEMA_VERSION[0]}.x"
        )
    dialects = serialized.get("verifiers") or []
    if isinstance(dialects, list) and "EDGE" in dialects:
        raise Refused(
            "is an ExecuTorch Edge program, which torch.export.load cannot read; give strideguard the ATen "
            "program saved before to_edge, or call strideguard.prepare_for_aoti on the Edge program in Python"
        )


@dataclass
class ProgramFacts:
    """What the example-input check needs from the checked program."""

    in_spec: trees.Spec
    user_inputs: list[trees.UserInput] = field(default_factory=list)


def check_program(serialized: Any) -> ProgramFacts:
    """Refuse a program whose JSON is not exactly what torch's schema and strideguard's rules allow."""
    check_header(serialized)
    walk(serialized, s.ExportedProgram, _ProgramChecker().rules(), "the program")
    return _facts(serialized)


def _facts(program: dict) -> ProgramFacts:
    module = program["graph_module"]
    graph, specs = module["graph"], module["signature"]["input_specs"]
    if len(graph["inputs"]) != len(specs):
        raise Refused(f"has {len(graph['inputs'])} graph inputs for {len(specs)} input specs")
    calls = module["module_call_graph"]
    if not calls or calls[0]["fqn"] != "" or not calls[0].get("signature"):
        raise Refused("has no call signature for its root module")
    in_spec = trees.parse_treespec(calls[0]["signature"]["in_spec"], "the input spec", identifier_keys=True)
    if not (in_spec.type == "builtins.tuple" and len(in_spec.children) == 2 and in_spec.children[1].type == "builtins.dict"):
        raise Refused("has an input spec that is not positional and keyword arguments")
    user_inputs = [_user_input(spec, graph["tensor_values"]) for spec in specs if next(iter(spec)) in ("user_input", "constant_input")]
    if in_spec.leaves != len(user_inputs):
        raise Refused(f"has an input spec of {in_spec.leaves} values for {len(user_inputs)} user inputs")
    return ProgramFacts(in_spec, user_inputs)


def _user_input(spec: dict, tensor_values: dict) -> trees.UserInput:
    [(kind, body)] = spec.items()
    if kind == "constant_input":
        return trees.UserInput(body["name"])
    [(argument_kind, argument)] = body["arg"].items()
    if argument_kind != "as_tensor":
        return trees.UserInput(argument.get("as_name", "") if isinstance(argument, dict) else "")
    meta = tensor_values.get(argument["name"])
    if meta is None:
        raise Refused(f"declares no tensor for its input {excerpt(argument['name'])}")
    sizes = tuple(size.get("as_int") for size in meta["sizes"])
    return trees.UserInput(argument["name"], _SERIALIZE_TO_TORCH_DTYPE[s.ScalarType(meta["dtype"])], sizes)


# --- weights and constants ------------------------------------------------------------------------------------


def _payload_path(value: str, key: Optional[str]) -> None:
    if value.startswith((pt2.CUSTOM_OBJ_FILENAME_PREFIX, pt2.OPAQUE_OBJ_FILENAME_PREFIX)):
        raise Refused(f"holds a script or opaque object ({excerpt(value)}), which torch would unpickle")
    if not _PAYLOAD_PATH.fullmatch(value):
        raise Refused(f"stores a payload under {excerpt(value)}, not a name torch.export.save writes")


_PAYLOAD_RULES = Rules(
    text={
        (s.PayloadMeta, "path_name"): _payload_path,
        (s.Device, "type"): _named(text.device_type, "a device"),
        (s.SymExpr, "expr_str"): _refuse("declares a stored tensor with a symbolic size"),
    },
    keys={(s.PayloadConfig, "config"): _WEIGHT_NAME},
    hooks={s.TensorMeta: _check_tensor_meta, s.Device: _check_device},
)


def check_payloads(config: Any, folder: str, prefix: str, kind: str, blob_sizes: dict[str, int]) -> set[str]:
    """Check a weights or constants configuration against the stored blobs; returns the blobs it uses.

    Torch allocates each tensor from its blob, and a tensor whose blob is
    empty as zeros of the declared size: every tensor must fit in its blob.
    """
    walk(config, s.PayloadConfig, _PAYLOAD_RULES, f"the {kind} configuration")
    used = set()
    for name, meta in config["config"].items():
        where = f"{kind} {excerpt(name)}"
        if meta["use_pickle"]:
            raise Refused(f"holds {where} as a pickled object, which torch would unpickle with weights_only=False; strideguard refuses pickled objects")
        if meta["tensor_meta"] is None or not meta["path_name"].startswith(prefix):
            raise Refused(f"stores {where} in a form torch.export.save does not write")
        blob = folder + meta["path_name"]
        if blob not in blob_sizes:
            raise Refused(f"stores {where} in {blob}, which the archive does not have")
        _check_fits(meta["tensor_meta"], blob_sizes[blob], where)
        used.add(blob)
    return used


def _check_fits(meta: dict, stored: int, where: str) -> None:
    item = torch.empty((), dtype=_SERIALIZE_TO_TORCH_DTYPE[s.ScalarType(meta["dtype"])]).element_size()
    extent = _declared_extent(meta, where)
    if stored % item:
        raise Refused(f"stores {where} in {stored} bytes, not a whole number of {item}-byte elements")
    if extent * item > stored:
        raise Refused(f"declares {where} of {extent * item} bytes but stores {stored} bytes for it")

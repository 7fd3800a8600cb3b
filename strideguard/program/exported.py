"""Reading and rebuilding ``ExportedProgram``s without touching the original.

A transform works on a copy of the graph whose nodes share their metadata
values (fake tensors) with the original; the rebuilt program shares the
original's state dict and constants, so weights are never copied. The graph
signature is re-derived from the graph's output node, so it always names the
nodes the graph returns.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import torch
from torch.export import ExportedProgram
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    OutputKind as OutputSpecKind,
    OutputSpec,
    TensorArgument,
)

from .reports import Alias, AliasKind

_INPUT_ROLES = {
    InputKind.USER_INPUT: AliasKind.INPUT,
    InputKind.PARAMETER: AliasKind.PARAMETER,
    InputKind.BUFFER: AliasKind.BUFFER,
    InputKind.CONSTANT_TENSOR: AliasKind.CONSTANT,
}


def require_exported_program(program: Any, function: str) -> ExportedProgram:
    if not isinstance(program, ExportedProgram):
        raise TypeError(
            f"strideguard.{function} expects a torch.export.ExportedProgram "
            f"(from torch.export.export, or exported_program() of an ExecuTorch EdgeProgramManager), "
            f"got {type(program).__module__}.{type(program).__qualname__}"
        )
    return program


def require_flag(value: Any, name: str, function: str) -> bool:
    """A keyword that must be ``True`` or ``False``: ``"no"`` is not a way to say no."""
    if not isinstance(value, bool):
        raise TypeError(f"strideguard.{function}: {name} must be True or False, got {value!r}")
    return value


def placeholder_roles(signature: ExportGraphSignature) -> dict[str, Alias]:
    """Placeholder name -> what it is: a user input, a parameter, a buffer or a constant."""
    roles = {}
    for spec in signature.input_specs:
        kind = _INPUT_ROLES.get(spec.kind)
        if kind is None or not isinstance(spec.arg, TensorArgument):
            continue
        name = spec.arg.name if kind is AliasKind.INPUT else spec.target
        roles[spec.arg.name] = Alias(kind, name)
    return roles


PUSHED_DOWN = "strideguard_pushdown"
"""Key in a pushed node's ``meta["custom"]`` (kept by ``torch.export.save``): the pushdown that made it."""


def was_pushed_down(graph: torch.fx.Graph) -> bool:
    """Whether a pushdown made any of ``graph``'s nodes (its values may then differ by rounding)."""
    return any(PUSHED_DOWN in node.meta.get("custom", {}) for node in graph.nodes)


@dataclass(frozen=True)
class UserOutput:
    index: int
    """Position among user outputs."""
    position: int
    """Position among all outputs of the graph (mutation outputs come first)."""
    spec: OutputSpec


def user_outputs(signature: ExportGraphSignature) -> list[UserOutput]:
    found = []
    for position, spec in enumerate(signature.output_specs):
        if spec.kind == OutputSpecKind.USER_OUTPUT:
            found.append(UserOutput(len(found), position, spec))
    return found


def output_values(graph: torch.fx.Graph) -> list[Any]:
    return list(graph.output_node().args[0])


def copy_graph(program: ExportedProgram) -> torch.fx.Graph:
    """A graph with new nodes whose ``meta`` dicts are shallow copies.

    The fake tensors in ``meta["val"]`` are shared with the original (so their
    storage identities, which tell views from copies, survive), while edits to
    the new nodes and their ``meta`` dicts never reach the original program.
    Every node keeps its name, which the program's signature refers to.
    """
    return copy_of_graph(program.graph)


def copy_of_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """``copy_graph`` for a bare graph: what ``copy.deepcopy`` of a graph gives (``Graph.graph_copy``), node by
    node through FX's own API, but each node created without its positional arguments, set after:
    ``create_node`` scans a call's arguments for raw ``SymInt``s to warn about, which a copy of a graph
    already built need not do (a tenth of ``prepare_for_aoti`` on a graph of a few hundred nodes)."""
    copied = torch.fx.Graph(tracer_cls=graph._tracer_cls)
    nodes: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph.nodes:
        if node.op == "output":
            new = copied.output(torch.fx.node.map_arg(node.args[0], nodes.__getitem__), type_expr=node.type)
        else:
            kwargs = torch.fx.node.map_arg(node.kwargs, nodes.__getitem__)
            new = copied.create_node(node.op, node.target, kwargs=kwargs, name=node.name, type_expr=node.type)
            new.args = torch.fx.node.map_arg(node.args, nodes.__getitem__)
            nodes[node] = new
        # the new node's own empty dict, filled: a shallow copy, as ``node_copy`` makes, without a second
        # pass through ``Node.__setattr__`` (which re-files the node in the graph's lookup table)
        new.meta.update(node.meta)
    copied._codegen = copy.deepcopy(graph._codegen)
    return _keeping_names(graph, copied)


def _keeping_names(original: torch.fx.Graph, copied: torch.fx.Graph) -> torch.fx.Graph:
    """FX renames a copied node whose name shadows a Python builtin (``input`` becomes ``input_1``), but
    ``torch.export`` names placeholders after the arguments, and the signature names the nodes: put the
    original names back."""
    for old, new in zip(original.nodes, copied.nodes):
        if new.name != old.name:
            new.name = old.name
    return copied


def private_program(program: ExportedProgram) -> ExportedProgram:
    """``program`` with a graph, signature and containers of its own, holding the very same weights: a
    pass that edits it in place never reaches the caller's program, and no tensor is copied. ExecuTorch's
    lowering needs this: ``to_edge`` passes the ``constants`` dict along as it is, and when a delegate takes
    a lifted constant ``_unsafe_adjust_original_program`` pops it (the caller's ``ep.module()`` then fails);
    so do an AOTI backend's ``preprocess`` passes, which edit the graph in place."""
    return rebuild(program, copy_graph(program))


def signature_following_graph(signature: ExportGraphSignature, graph: torch.fx.Graph) -> ExportGraphSignature:
    """The signature with each tensor output renamed to the node the graph now returns there."""
    returned = output_values(graph)
    output_specs = []
    for spec, value in zip(signature.output_specs, returned):
        if isinstance(spec.arg, TensorArgument) and isinstance(value, torch.fx.Node) and value.name != spec.arg.name:
            spec = OutputSpec(kind=spec.kind, arg=TensorArgument(name=value.name), target=spec.target)
        output_specs.append(spec)
    return ExportGraphSignature(input_specs=list(signature.input_specs), output_specs=output_specs)


def lazy_graph_module(root: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A graph module around ``graph``, with ``root``'s attributes and metadata, that generates its Python
    code when first called or read (``_LazyGraphModule``, as torch.compile's own graphs do)."""
    module = _LazyGraphModule(root, graph)
    module.meta.update(root.meta)
    return module


def rebuild(program: ExportedProgram, graph: torch.fx.Graph) -> ExportedProgram:
    """A new program around ``graph``, sharing ``program``'s weights, constants and verifiers (the tensors, in
    dicts of its own).

    Built as ExecuTorch's pass manager builds its results: a shallow copy of the
    program with a new graph module and signature. The ``ExportedProgram``
    constructor would run the verifier, which for an Edge program propagates
    fake tensors through every node and costs more than the whole pass; the
    result is valid by construction and the tests call ``validate()`` (which
    checks more than ``lint()``, left out here for the same reason).

    The graph module generates its Python code when first called or read
    (``_LazyGraphModule``, as torch.compile's own graphs do): lowering calls
    ``module()``, which builds another module anyway, so the code is often
    never needed.
    """
    module = lazy_graph_module(program.graph_module, graph)
    rebuilt = copy.copy(program)
    # Tensors are shared, containers are not: assigning into the new program's dicts
    # must never reach the input program.
    rebuilt._state_dict = dict(program.state_dict)
    rebuilt._constants = dict(program.constants)
    rebuilt._verifiers = list(program._verifiers) if program._verifiers is not None else None
    rebuilt._graph_module = module
    rebuilt._graph_signature = signature_following_graph(program.graph_signature, graph)
    with warnings.catch_warnings():
        # Deep-copying the call specs trips torch's own LeafSpec deprecation warning.
        warnings.simplefilter("ignore", FutureWarning)
        rebuilt._module_call_graph = copy.deepcopy(program._module_call_graph)
    rebuilt._range_constraints = copy.copy(program._range_constraints)
    return rebuilt


def verifier_accepts(program: ExportedProgram) -> Callable[[Any], bool]:
    """Whether ``program``'s own verifiers admit an op as a node target.

    An Edge program built for an AOTI backend preserves the ops its
    partitioner asked for, and its verifier then refuses a view of any of
    them ("Cannot preserve operator aten.unbind.int because it is a view"):
    a view copy may become a view only where the verifier takes it.
    """
    verifiers = [verifier() for verifier in program.verifiers]

    @lru_cache(maxsize=None)
    def accepts(target: Any) -> bool:
        for verifier in verifiers:
            check = getattr(verifier, "check_valid_op", None)
            if check is None:
                continue
            try:
                check(target)
            except Exception:  # noqa: BLE001 - the verifier's refusal, whatever it raises
                return False
        return True

    return accepts

"""strideguard for ExecuTorch's AOTI backends (CUDA, Metal), through ExecuTorch's public APIs.

ExecuTorch's AOTI backends turn ``slice_copy``/``select_copy``/``split_copy``
back into views inside ``AotiBackend.preprocess``, after partitioning, where a
user's pass cannot reach. Three ways in, none patching ExecuTorch:

* ``DenseOutputsPass``: a transform pass for ``to_edge_transform_and_lower(...,
  transform_passes=[DenseOutputsPass()])`` or ``EdgeProgramManager.transform``.
  Before partitioning, it inserts into the Edge program exactly the copies the
  backend's own view conversion will make necessary, and nothing else.
* ``protect_partitioner``: wraps an AOTI partitioner so that outputs of each
  partition (not only of the method) are covered when a method is split into
  several delegates.
* ``ReplaceViewCopyWithViewPass``: for backend authors, a drop-in replacement
  for ExecuTorch's pass of that name: it converts a wider set of view copies
  and copies what then needs copying.

Whether to copy is a per-backend policy: the CUDA runtime pays a host round
trip and loses CUDA graphs for an output out of its layout, so copies are on; Metal's
runtime copies every output anyway, so they are off unless asked for.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import torch
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, OutputKind as OutputSpecKind, OutputSpec, TensorArgument
from torch.fx.passes.infra.pass_base import PassResult

from .compiler.backends import resolve_backend, unavailable_note
from .compiler.targets import resolve_target
from .decide.subject import Subject, subject_of
from .decide.view_conversion import DROP_IN, EXECUTORCH, view_copies_left_out_of_layout
from .fix.engine import AsCompiled, Choices, fix_graph_in_place, Pushdowns, transformed
from .program.dialect import dialect_of_graph
from .program.exported import lazy_graph_module, output_values, require_flag, signature_following_graph
from .program.quiet import quietly
from .prove.proof import fixed_and_proven, Proof

COPY_OUTPUTS_BY_BACKEND = {"CudaBackend": True, "MetalBackend": False}
"""Whether a backend's outputs need strideguard's copies; backends not named here get them."""

_DELEGATION_TAG = "delegation_tag"
logger = logging.getLogger(__name__)


def copies_outputs_for(backend_id: str) -> bool:
    return COPY_OUTPUTS_BY_BACKEND.get(backend_id, True)


class DenseOutputsPass(ExportedProgramPassBase):
    """Insert, before partitioning, the copies an AOTI backend's view conversion will need.

    Each returned ``slice_copy``/``select_copy``/``split_copy`` chunk that
    ExecuTorch's ``ReplaceViewCopyWithViewPass`` will turn into a view, and
    that would then come back in another layout than the program promises, is
    followed by one copy into that layout (``_clone_dim_order`` in dim-order
    mode, ``clone`` in memory-format mode, or a form Inductor cannot drop).
    ``detach_copy``, which the AOTI runtime cannot run, becomes ``alias_copy``.
    Nothing else changes.

    ``backend`` names the backend the method is delegated to (its class or
    name, e.g. ``"CudaBackend"``, with the ``compile_specs`` given to its
    partitioner; by default the one naming the method ``forward``): its own
    passes and decomposition table, which ``preprocess`` runs after this pass,
    are taken into account
    (``strideguard.compiler.backends``). With ``exact=True`` the decision is
    Inductor's lowering through that backend's pipeline, and the fixed program
    is lowered again and repaired until every output is proven in layout
    (``strideguard.prove.proof``; ``LayoutNotReached`` otherwise).

    The lowering is for the device the backend compiles for (``CudaBackend``:
    CUDA, compute capability sm90 unless ``device`` names another, e.g.
    ``"cuda:sm87"``; on fake tensors where no GPU is here). Where the
    backend's own passes cannot run here, a warning is logged and the
    ``Proof`` lists every output as unproven, with why.

    ``layouts`` gives some outputs a dim order of the user's choosing, as in
    ``strideguard.densify_outputs``; the program then promises it.
    """

    def __init__(
        self,
        *,
        copy_outputs: bool = True,
        break_aliases: bool = False,
        pushdown: bool = False,
        exact: bool = False,
        backend: Any = None,
        compile_specs: Optional[Sequence[Any]] = None,
        device: Any = None,
        layouts: Optional[dict] = None,
    ):
        self.copy_outputs = require_flag(copy_outputs, "copy_outputs", "executorch.DenseOutputsPass")
        self.break_aliases = require_flag(break_aliases, "break_aliases", "executorch.DenseOutputsPass")
        self.pushdown = require_flag(pushdown, "pushdown", "executorch.DenseOutputsPass")
        self.exact = require_flag(exact, "exact", "executorch.DenseOutputsPass")
        self.backend = resolve_backend(backend, compile_specs, function="executorch.DenseOutputsPass")
        self.device = resolve_target(device, function="executorch.DenseOutputsPass") if device is not None else None
        if layouts is not None and not isinstance(layouts, dict):
            raise TypeError(
                "strideguard.executorch.DenseOutputsPass: layouts must be a dict from an output's name or index "
                f"to a layout, got {type(layouts).__name__}"
            )
        self.layouts = dict(layouts or {})
        if self.backend is not None and not self.backend.available:
            logger.warning(
                "strideguard: %s; DenseOutputsPass copies every output in a form that holds whatever they do, "
                "and proves none", unavailable_note(self.backend),
            )
        self.proof: Optional[Proof] = None
        """How the last program this pass fixed with ``exact=True`` was proven."""

    @quietly
    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        subject = subject_of(
            exported_program, "executorch.DenseOutputsPass", device=self.device, backend=self.backend, layouts=self.layouts
        )
        choices = Choices(
            pushdowns=Pushdowns.APPLIED if self.pushdown else Pushdowns.NONE, copy_outputs=self.copy_outputs,
            break_aliases=self.break_aliases,
        )
        if self.exact and self.copy_outputs:
            program, changed, self.proof = fixed_and_proven(
                subject, EXECUTORCH, AsCompiled(EXECUTORCH), choices=choices, falls_back=True
            )
            changed = changed or bool(self.proof.strengthened)
        else:
            program, changed = transformed(subject, EXECUTORCH, choices=choices)
        changed = bool(changed)
        return ExportedProgramPassResult(program if changed else exported_program, changed)


_DROP_IN = "executorch.ReplaceViewCopyWithViewPass"


class ReplaceViewCopyWithViewPass:
    """Drop-in for ExecuTorch's AOTI ``ReplaceViewCopyWithViewPass``: more views, dense outputs.

    Called on a graph module it rewrites it in place and returns a
    ``PassResult``, as ExecuTorch's pass does. Because it sets
    ``requires_exported_program``, ``AotiBackend.preprocess`` hands it the whole
    program when it is one of the backend's custom passes: it then also knows
    which outputs are the user's (never a buffer mutation), names them in the
    user's words (``decide.subject.subject_of``), and keeps the graph
    signature naming the nodes the graph returns; and as ``preprocess`` builds
    a new module from the program before Inductor traces it, the program's
    module generates its Python code only when something asks for it. Like
    ExecuTorch's pass, it leaves converted nodes the fake values of the copies
    they were: Inductor traces the graph again. New copy nodes get correct values.
    """

    requires_exported_program = True

    def __init__(self, *, copy_outputs: bool = True):
        self.copy_outputs = require_flag(copy_outputs, "copy_outputs", "executorch.ReplaceViewCopyWithViewPass")

    def __call__(self, target: Any) -> PassResult:
        if isinstance(target, ExportedProgram):
            # the whole program: its outputs named in the user's words
            graph_module, signature = target.graph_module, target.graph_signature
            subject = subject_of(target, _DROP_IN)
        else:
            graph_module, signature = target, _all_outputs_are_the_users(target.graph)
            subject = Subject.of_graph(target.graph, signature, dialect_of_graph(target.graph), _DROP_IN)
        changed = fix_graph_in_place(
            graph_module.graph, subject, DROP_IN, copy_outputs=self.copy_outputs, update_values=False
        )
        if not changed:
            return PassResult(graph_module, False)
        # No ``lint()`` here (a tenth of a small graph's pass): every edit goes through FX's own node API, and
        # tests/test_executorch.py lints what the pass leaves.
        if isinstance(target, ExportedProgram):
            # preprocess builds a new module from this program (``module()``) before Inductor traces
            # it, so this one's Python code is generated only if something asks for it.
            target._graph_module = lazy_graph_module(graph_module, graph_module.graph)
            target._graph_signature = signature_following_graph(signature, graph_module.graph)
            return PassResult(target._graph_module, True)
        graph_module.recompile()
        return PassResult(graph_module, True)


def _all_outputs_are_the_users(graph: torch.fx.Graph) -> ExportGraphSignature:
    """The signature a bare graph implies: every placeholder an input, every output the user's."""
    inputs = [
        InputSpec(InputKind.USER_INPUT, TensorArgument(node.name), None)
        for node in graph.find_nodes(op="placeholder")
    ]
    outputs = [
        OutputSpec(OutputSpecKind.USER_OUTPUT, TensorArgument(value.name) if isinstance(value, torch.fx.Node) else None, None)
        for value in output_values(graph)
    ]
    return ExportGraphSignature(input_specs=inputs, output_specs=outputs)


class _ProtectedPartitioner(Partitioner):
    """An AOTI partitioner whose partitions hand each other no strided views."""

    def __init__(self, inner: Partitioner, copy_outputs: Optional[bool]):
        super().__init__(getattr(inner, "_spec", {}))
        self.inner = inner
        self.delegation_spec = getattr(inner, "delegation_spec", None)
        self.copy_outputs = copy_outputs

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        result = self.inner.partition(exported_program)
        tags = [
            tag
            for tag, spec in result.partition_tags.items()
            if (self.copy_outputs if self.copy_outputs is not None else copies_outputs_for(spec.backend_id))
        ]
        self.moved = move_strided_views_to_their_consumers(result.tagged_exported_program, tags)
        return result

    def ops_to_not_decompose(self, ep: ExportedProgram):
        return self.inner.ops_to_not_decompose(ep)


def protect_partitioner(partitioner: Partitioner, *, copy_outputs: Optional[bool] = None) -> Partitioner:
    """Wrap an AOTI partitioner (``CudaPartitioner``, ``MetalPartitioner``, any ``AotiPartitioner``).

    When a method is split into several delegates, a view copy at the edge of
    one partition becomes, inside its delegate, a view returned with its base's
    strides, and the next delegate, compiled for a dense input, reads it wrong.
    ExecuTorch forbids a partitioner to add nodes, so the wrapper moves such a
    view copy (with its ``getitem``s) into the partition that consumes it,
    where it is a free view of a dense input. Method outputs are
    ``DenseOutputsPass``'s job. ``copy_outputs`` overrides the per-backend
    policy (``COPY_OUTPUTS_BY_BACKEND``).
    """
    if copy_outputs is not None:
        require_flag(copy_outputs, "copy_outputs", "executorch.protect_partitioner")
    if not isinstance(partitioner, Partitioner):
        raise TypeError(
            "strideguard.executorch.protect_partitioner expects an executorch Partitioner, "
            f"got {type(partitioner).__module__}.{type(partitioner).__qualname__}"
        )
    return _ProtectedPartitioner(partitioner, copy_outputs)


def _in_partition(tag: str):
    return lambda node: node.meta.get(_DELEGATION_TAG) == tag


def move_strided_views_to_their_consumers(program: ExportedProgram, tags: list[str]) -> list[str]:
    """Retag each view copy that would leave its partition out of its layout into its one consuming partition.

    Returns the names of the nodes moved. A view copy whose users lie in its
    own partition too, or in several others, is left where it is and logged.
    """
    graph = program.graph
    moved: list[str] = []
    for tag in tags:
        for group in view_copies_left_out_of_layout(graph, EXECUTORCH, _in_partition(tag)):
            node = group[0]
            leaving = [u for member in group for u in member.users if u not in group]
            if not any(u.meta.get(_DELEGATION_TAG) != tag for u in leaving):
                continue
            consumers = {u.meta.get(_DELEGATION_TAG) for u in leaving if u.op != "output"}
            if len(consumers) != 1 or None in consumers or any(u.op == "output" for u in leaving):
                logger.warning(
                    "strideguard: %s leaves partition %s as a strided view and cannot be moved "
                    "(its users: %s); use DenseOutputsPass for method outputs",
                    node.name, tag, ", ".join(sorted(u.name for u in leaving)),
                )
                continue
            (consumer,) = consumers
            for member in group:
                member.meta[_DELEGATION_TAG] = consumer
            moved += [member.name for member in group]
    return moved

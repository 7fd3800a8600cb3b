"""What an ExecuTorch AOTI backend runs on a method before Inductor, read from the installed backend class.

``AotiBackend.preprocess`` hands Inductor not the Edge program strideguard
sees but that program after, in order: ExecuTorch's own
``ReplaceViewCopyWithViewPass``, the backend's ``get_custom_passes(compile_specs)``
(ExecuTorch 1.5.1's ``CudaBackend`` swaps SDPA for a Triton kernel with its own
output layout; ``MetalBackend`` decomposes ``linear``), and a retrace with its
``get_decomposition_table()``. Any of them can re-lay an output, so the
lowering oracle runs them as ``preprocess`` does, from the installed classes,
never a model of them.

A backend is named by its class or its class name. Where its module cannot be
imported here (``CudaBackend`` needs Triton, which a CPU machine lacks), the
``Backend`` says why, and strideguard copies every output conservatively
with that reason rather than guess.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from torch.export import ExportedProgram

from ..program.dialect import GraphOps
from ..program.exported import private_program

_KNOWN_MODULES = {
    "CudaBackend": "executorch.backends.cuda.cuda_backend",
    "MetalBackend": "executorch.backends.apple.metal.metal_backend",
    "StrideguardCpuAotiBackend": "strideguard.testing.executorch_cpu",
}
"""Where the AOTI backends ExecuTorch ships (and strideguard's CPU twin of them) are defined."""

_DEVICE_BY_NAME = {"CudaBackend": "cuda", "MetalBackend": "mps", "StrideguardCpuAotiBackend": "cpu"}
"""The device each of those compiles for, for when its module cannot be imported here."""

_NEEDS_THE_DEVICE = ("aot_inductor.emit_multi_arch_kernel", "triton.autotune_at_compile_time")


@dataclass(frozen=True)
class Backend:
    """An AOTI backend whose ``preprocess`` strideguard follows: its class, or why it is not available here."""

    name: str
    cls: Optional[type] = None
    unavailable: Optional[str] = None
    """Why the backend's own passes cannot run here (``None`` when they can)."""
    compile_specs: tuple = field(default=())
    """The compile specs its passes are asked with (``get_custom_passes(compile_specs)``)."""

    @property
    def available(self) -> bool:
        return self.cls is not None

    def custom_passes(self) -> list:
        return list(self.cls.get_custom_passes(list(self.compile_specs))) if self.cls is not None else []

    def decomposition_table(self) -> dict:
        return dict(self.cls.get_decomposition_table()) if self.cls is not None else {}

    @property
    def device_kind(self) -> Optional[str]:
        """The device the backend compiles for (its ``get_device_name()``; by name where it cannot be loaded)."""
        if self.cls is not None and hasattr(self.cls, "get_device_name"):
            name = str(self.cls.get_device_name())
            return {"metal": "mps"}.get(name, name)
        return _DEVICE_BY_NAME.get(self.name)

    def compile_context(self) -> Any:
        """The context the backend compiles in (``get_extra_aoti_compile_context_manager``; ``CudaBackend``
        restricts any SDPA its passes left to the math kernel there)."""
        factory = getattr(self.cls, "get_extra_aoti_compile_context_manager", None) if self.cls is not None else None
        return factory(list(self.compile_specs)) if factory is not None else contextlib.nullcontext()

    def lowering_options(self) -> tuple[dict, tuple[str, ...]]:
        """The backend's AOTI compile options (``get_aoti_compile_options``) that a lowering without its device
        can apply, and the names of those it cannot: autotuning benchmarks kernels on the device (it picks
        among GEMM and convolution kernels; each writes the layout Inductor fixed for it)."""
        if self.cls is None or not hasattr(self.cls, "get_aoti_compile_options"):
            return {}, ()
        saved = dict(os.environ)
        try:
            # CudaBackend sets CUDA environment variables for its own compile while answering.
            options = dict(self.cls.get_aoti_compile_options(list(self.compile_specs)))
        finally:
            if os.environ != saved:
                os.environ.clear()
                os.environ.update(saved)
        dropped = tuple(name for name in options if name in _NEEDS_THE_DEVICE or name.startswith("max_autotune"))
        return {name: value for name, value in options.items() if name not in dropped}, dropped


def resolve_backend(backend: Any, compile_specs: Optional[Sequence[Any]] = None, *, function: str) -> Optional[Backend]:
    """A ``Backend`` for a class, a class name or ``None`` (no backend: ExecuTorch's view pass only).

    A name is looked up among the loaded ``BackendDetails`` subclasses, then
    in the module ExecuTorch ships it in. A class must derive from
    ExecuTorch's ``AotiBackend``. ``compile_specs`` default to the one that
    names the method ``forward``, as ``AotiPartitioner`` users write.
    """
    if backend is None:
        return None
    if isinstance(backend, Backend):
        return backend
    if isinstance(backend, str):
        if not backend.isidentifier():
            raise ValueError(f"strideguard.{function}: backend must name an AOTI backend class, got {backend!r}")
        cls, reason = _find_class(backend)
        name = backend
    elif isinstance(backend, type):
        cls, reason, name = backend, None, backend.__name__
    else:
        raise TypeError(
            f"strideguard.{function}: backend must be an AOTI backend class or its name, got {type(backend).__name__}"
        )
    if cls is not None:
        from executorch.backends.aoti.aoti_backend import AotiBackend

        if not issubclass(cls, AotiBackend):
            raise TypeError(f"strideguard.{function}: backend {name} is not an ExecuTorch AotiBackend")
        specs = list(compile_specs) if compile_specs is not None else [cls.generate_method_name_compile_spec("forward")]
        return Backend(name, cls, None, tuple(specs))
    return Backend(name, None, reason, tuple(compile_specs or ()))


def _find_class(name: str) -> tuple[Optional[type], Optional[str]]:
    try:
        from executorch.exir.backend.backend_details import BackendDetails
    except ImportError as error:
        return None, f"ExecuTorch cannot be imported ({error})"
    for cls in BackendDetails.__subclasses__():
        if cls.__name__ == name:
            return cls, None
    module_name = _KNOWN_MODULES.get(name)
    if module_name is None:
        return None, f"no AOTI backend class named {name} is loaded; import its module first, or pass the class"
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure means its passes cannot run here
        return None, f"{module_name} cannot be imported here ({type(error).__name__}: {error})"
    return getattr(module, name, None), None


def run_pipeline(program: ExportedProgram, backend: Optional[Backend], convert_views: Any) -> ExportedProgram:
    """``program`` as ``preprocess`` hands it to Inductor: views converted by ``convert_views``, then the
    backend's custom passes and decompositions, on a copy (``program`` itself is never changed)."""
    from executorch.exir.graph_module import contains_any_call_fn_target_op

    converted = private_program(program)
    convert_views(converted.graph_module)
    if backend is None or not backend.available:
        return converted
    for custom_pass in backend.custom_passes():
        _run(custom_pass, converted)
    table = backend.decomposition_table()
    if table and contains_any_call_fn_target_op(converted.graph_module, table):
        converted = converted.run_decompositions(table)
    return converted


def _run(custom_pass: Any, program: ExportedProgram) -> None:
    """One of a backend's custom passes, given what ``preprocess`` gives it: the program, or its graph module."""
    custom_pass(program if getattr(custom_pass, "requires_exported_program", False) else program.graph_module)


def rewritten_ops(program: ExportedProgram, backend: Optional[Backend], ops_of_graph: GraphOps) -> dict[str, str]:
    """Nodes of ``program`` the backend's pipeline rewrites, by name, with what does it: its custom passes
    (run on a copy; a node whose target they change or remove) and its decomposition table (asked of
    ``ops_of_graph``, the ops of the program's graph or a copy of it, normalised). Cheap: no Inductor. Empty
    without a backend."""
    if backend is None or not backend.available:
        return {}
    before = {node.name: node.target for node in program.graph.nodes if node.op == "call_function"}
    table = backend.decomposition_table()
    rewritten = {node.name: f"{backend.name}'s decomposition table" for node, op in ops_of_graph.aten.items() if op in table}
    passes = backend.custom_passes()
    if passes:
        converted = private_program(program)
        for custom_pass in passes:
            targets = {n.name: n.target for n in converted.graph.nodes if n.op == "call_function"}
            _run(custom_pass, converted)
            after = {n.name: n.target for n in converted.graph.nodes if n.op == "call_function"}
            for name, target in targets.items():
                if name in before and after.get(name) is not target and name not in rewritten:
                    rewritten[name] = f"{backend.name}'s {type(custom_pass).__name__}"
    return rewritten


def unavailable_note(backend: Optional[Backend]) -> Optional[str]:
    if backend is None or backend.available:
        return None
    return f"{backend.name}'s own passes cannot run here: {backend.unavailable}"


@dataclass(frozen=True)
class BackendRewrites:
    """What an AOTI backend's own pipeline does to a program, as far as the graph can tell without
    Inductor: the nodes it rewrites, by name, with what rewrites each; or why it cannot run here."""

    rewritten: Mapping[str, str]
    unavailable: Optional[str]


def backend_rewrites(
    program: ExportedProgram, backend: Optional[Backend], ops_of_graph: GraphOps
) -> Optional[BackendRewrites]:
    """What ``backend``'s own pipeline does to ``program`` (``ops_of_graph``: its graph's ops, normalised)."""
    if backend is None:
        return None
    note = unavailable_note(backend)
    return BackendRewrites(rewritten_ops(program, backend, ops_of_graph), note)


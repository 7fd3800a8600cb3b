"""Run ExecuTorch's real AOTI lowering path on the CPU and execute what it compiles.

ExecuTorch's AOTI backends (CUDA, Metal) turn view copies back into views inside
``AotiBackend.preprocess`` and then compile with AOTInductor. Whether an output
comes back dense is decided there, so a test of strideguard's passes has to go
through that code, not a re-implementation of it. Those backends need their
device; this module supplies a CPU twin of them, so the whole path
(``to_edge_transform_and_lower``, ``ReplaceViewCopyWithViewPass``, AOTInductor)
runs on machines without a GPU, and then loads each compiled ``.so`` with
torch's own AOTI runner to observe the strides the delegate really returns.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Sequence

import torch
from executorch.backends.aoti.aoti_backend import AotiBackend
from executorch.backends.aoti.aoti_partitioner import AotiPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.backend.backend_details import BackendDetails
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from executorch.exir.lowered_backend_module import LoweredBackendModule
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind as OutputSpecKind

from ..program.exported import private_program

_CPU_SHIM_PREFIX = "aoti_torch_cpu_"
_SO_BLOB_KEY_SUFFIX = "_so_blob"
_WEIGHTS_BLOB_KEY_SUFFIX = "_weights_blob"


class _CpuShimKernels(dict):
    """The fallback kernels the CPU backend accepts: every CPU c-shim.

    ``AotiBackend`` records a kernel as missing unless ``kernel in
    get_supported_fallback_kernels()``. Real backends list the few shims their
    runtime links; on the CPU every ``aoti_torch_cpu_*`` shim lives in libtorch,
    which torch's runner loads, so all of them are admitted. Ops that Inductor
    can only reach through its proxy executor (``aten::...`` runtime lookups)
    stay missing: ExecuTorch's AOTI runtime has no proxy executor either.
    """

    def __contains__(self, kernel: object) -> bool:
        return isinstance(kernel, str) and kernel.startswith(_CPU_SHIM_PREFIX)


class StrideguardCpuAotiBackend(AotiBackend, BackendDetails):
    """ExecuTorch's AOTI backend, compiling for the CPU instead of a GPU.

    It derives directly from ``BackendDetails`` because ExecuTorch finds a
    backend by name among ``BackendDetails.__subclasses__()`` (direct subclasses
    only), so ``AotiPartitioner("StrideguardCpuAotiBackend", ...)`` reaches it.
    For the same reason tests configure it through class attributes rather than
    subclasses: ``custom_passes`` are run by ``preprocess`` after ExecuTorch's
    ``ReplaceViewCopyWithViewPass``, as a real backend's would be.
    """

    custom_passes: ClassVar[list[Any]] = []
    # Where ``codesign_so`` keeps each compiled .so, keyed by the name
    # ``preprocess`` stores it under; set only while ``capture_compiled_sos`` runs.
    _so_capture: ClassVar[_SoCapture | None] = None

    @classmethod
    def get_device_name(cls) -> str:
        return "cpu"

    @classmethod
    def get_supported_fallback_kernels(cls) -> dict[str, Any]:
        return _CpuShimKernels()

    @classmethod
    def get_decomposition_table(cls) -> dict[Any, Any]:
        """Attention written out as matmuls and a softmax: Inductor's CPU flash-attention kernel has no C
        shim (the CUDA backend swaps in a kernel of its own instead)."""
        from torch._decomp import core_aten_decompositions

        table = core_aten_decompositions()
        attention = (
            torch.ops.aten.scaled_dot_product_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        )
        return {op: table[op] for op in attention if op in table}

    @classmethod
    def get_aoti_compile_options(
        cls, compile_specs: list[CompileSpec]
    ) -> dict[str, Any]:
        """Separate the weights from the .so, as ExecuTorch's runtime expects.

        ``preprocess`` raises unless AOTInductor writes a ``.wrapper_weights.blob``
        beside the ``.so``, which only the ``binary_blob`` format does.
        """
        return {
            "aot_inductor.package": True,
            "aot_inductor.package_constants_in_so": False,
            "aot_inductor.package_constants_on_disk_format": "binary_blob",
        }

    @classmethod
    def get_custom_passes(cls, compile_specs: list[CompileSpec]) -> list[Any]:
        return list(cls.custom_passes)

    @classmethod
    def codesign_so(cls, so_path: str, compile_specs: list[CompileSpec]) -> None:
        """Keep a copy of the compiled .so, which ``preprocess`` deletes next.

        This is the last hook that sees the file. The copy is named after the key
        ``preprocess`` stores the .so under (its SHA-256), so a delegate's
        ``processed_bytes`` find it again.
        """
        if cls._so_capture is not None:
            cls._so_capture.keep(so_path)


@dataclass
class _SoCapture:
    """Copies of compiled .so files, by the named-data key of their bytes."""

    directory: str
    paths_by_key: dict[str, str]

    def keep(self, so_path: str) -> None:
        with open(so_path, "rb") as so_file:
            key = hashlib.sha256(so_file.read()).hexdigest() + _SO_BLOB_KEY_SUFFIX
        # A fresh name for every copy: re-writing a .so that a runner has
        # already loaded corrupts that mapping and breaks the next load.
        descriptor, copy_path = tempfile.mkstemp(
            prefix=key[:16] + "_", suffix=".so", dir=self.directory
        )
        os.close(descriptor)
        shutil.copyfile(so_path, copy_path)
        self.paths_by_key[key] = copy_path


@contextlib.contextmanager
def capture_compiled_sos(directory: str) -> Iterator[dict[str, str]]:
    """While active, keep every .so the backend compiles in ``directory``.

    Yields the mapping from each .so's named-data key (the first line of its
    delegate's ``processed_bytes``) to its copy.
    """
    if StrideguardCpuAotiBackend._so_capture is not None:
        raise RuntimeError("capture_compiled_sos is already active")
    os.makedirs(directory, exist_ok=True)
    capture = _SoCapture(directory=directory, paths_by_key={})
    StrideguardCpuAotiBackend._so_capture = capture
    try:
        yield capture.paths_by_key
    finally:
        StrideguardCpuAotiBackend._so_capture = None


def make_partitioner(method_name: str = "forward") -> AotiPartitioner:
    """The partitioner that sends a whole method to ``StrideguardCpuAotiBackend``."""
    return AotiPartitioner(
        StrideguardCpuAotiBackend.__name__,
        [StrideguardCpuAotiBackend.generate_method_name_compile_spec(method_name)],
    )


class _Stop(Exception):
    pass


class _StoppingPartitioner(AotiPartitioner):
    """An AOTI partitioner (the same ops kept undecomposed) that stops lowering at partitioning."""

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        raise _Stop


class _Capture(ExportedProgramPassBase):
    """The last transform pass: keeps the program it sees, the one ``DenseOutputsPass`` would see."""

    def __init__(self):
        self.program: ExportedProgram | None = None

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        self.program = exported_program
        return ExportedProgramPassResult(exported_program, False)


def aoti_edge_program(
    program: ExportedProgram,
    *,
    transform_passes: Sequence[Callable] = (),
    skip_dim_order: bool = False,
    core_aten_exceptions: Sequence[str] = (),
) -> ExportedProgram:
    """The Edge program ExecuTorch's AOTI path builds from ``program``, as its transform passes see it.

    Not ``to_edge``'s: the AOTI partitioner asks that no op be decomposed, so
    a ``split`` stays a ``split_copy`` (which ExecuTorch's view pass converts)
    where ``to_edge`` would write ``split_with_sizes_copy`` (which it does not).
    Lowering stops at partitioning, which works on fake weights. ``program``
    itself is left as it was. ``core_aten_exceptions`` names ops (``"aten::multinomial"``)
    that ``to_edge``'s verifier must accept although they are not core ATen.
    """
    from executorch.exir import EdgeCompileConfig

    partitioner = _StoppingPartitioner(
        StrideguardCpuAotiBackend.__name__, [StrideguardCpuAotiBackend.generate_method_name_compile_spec("forward")]
    )
    capture = _Capture()
    try:
        to_edge_transform_and_lower(
            private_program(program),
            partitioner=[partitioner],
            transform_passes=[*transform_passes, capture],
            compile_config=EdgeCompileConfig(
                _skip_dim_order=skip_dim_order, _core_aten_ops_exception_list=_overloads(core_aten_exceptions)
            ),
        )
    except _Stop:
        pass
    if capture.program is None:
        raise RuntimeError("to_edge_transform_and_lower ran no transform pass")
    return capture.program


@dataclass
class DelegateRun:
    """What running a lowered method's delegates produced.

    ``outputs`` are the method's user outputs in its return order, exactly as
    the delegates returned them (strides and storage included); an output the
    method returns as ``None`` is ``None`` here.
    """

    outputs: list[torch.Tensor | None]
    edge_program: ExportedProgram
    so_paths: list[str]


def _overloads(names: Sequence[str]) -> list:
    """Every overload of each ``namespace::op`` named."""
    found = []
    for name in names:
        namespace, op = name.split("::")
        packet = getattr(getattr(torch.ops, namespace), op)
        found += [getattr(packet, overload) for overload in packet.overloads()]
    return found


def lower_and_run(
    program: ExportedProgram,
    inputs: tuple,
    *,
    transform_passes: Sequence[Callable] = (),
    partitioner_wrapper: Callable[[Partitioner], Partitioner] | None = None,
    workdir: str,
    core_aten_exceptions: Sequence[str] = (),
) -> DelegateRun:
    """Lower ``program`` with ExecuTorch's AOTI path on the CPU and run it.

    ``transform_passes`` run on the Edge program before partitioning, as
    ``to_edge_transform_and_lower`` runs them. ``partitioner_wrapper`` may wrap
    the partitioner (to observe or alter partitioning). Compiled .so copies are
    kept under ``workdir``. The lowered method may hold several delegates, but
    nothing else: an op left outside every delegate raises NotImplementedError.
    ``program`` itself is left as it was. ``core_aten_exceptions`` as for ``aoti_edge_program``.
    """
    from executorch.exir import EdgeCompileConfig

    partitioner: Partitioner = make_partitioner("forward")
    if partitioner_wrapper is not None:
        partitioner = partitioner_wrapper(partitioner)

    with capture_compiled_sos(workdir) as so_paths_by_key:
        edge_manager = to_edge_transform_and_lower(
            private_program(program),
            partitioner=[partitioner],
            transform_passes=list(transform_passes),
            compile_config=EdgeCompileConfig(_core_aten_ops_exception_list=_overloads(core_aten_exceptions)),
        )
    edge_program = edge_manager.exported_program()
    outputs, so_paths = _run_lowered_method(edge_program, inputs, so_paths_by_key)
    return DelegateRun(outputs=outputs, edge_program=edge_program, so_paths=so_paths)


def _run_lowered_method(
    edge_program: ExportedProgram,
    inputs: tuple,
    so_paths_by_key: dict[str, str],
) -> tuple[list[torch.Tensor | None], list[str]]:
    """Interpret the lowered method: delegate calls and the getitems on them.

    A delegate's outputs follow its own sub-program, not the method's return
    order, so the method's ``getitem`` nodes are followed to put each output
    where the method returns it. An output that is no node (a ``None`` the
    method returns) is returned as it is.
    """
    graph_module = edge_program.graph_module
    user_input_names = edge_program.graph_signature.user_inputs
    if len(inputs) != len(user_input_names):
        raise ValueError(
            f"the method takes {len(user_input_names)} inputs, got {len(inputs)}"
        )
    values: dict[torch.fx.Node, Any] = {}
    used_so_paths: list[str] = []
    user_output_values: list[torch.Tensor | None] = []
    inputs_by_name = dict(zip(user_input_names, inputs))

    for node in graph_module.graph.nodes:
        if node.op == "placeholder":
            if node.name in inputs_by_name:
                values[node] = inputs_by_name[node.name]
            elif node.users:
                raise NotImplementedError(
                    f"input {node.name} is not a user input and was not delegated"
                )
        elif node.op == "get_attr":
            values[node] = getattr(graph_module, node.target)
        elif node.target is torch.ops.higher_order.executorch_call_delegate:
            lowered_module, *delegate_args = node.args
            so_path = _compiled_so_path(values[lowered_module], so_paths_by_key)
            used_so_paths.append(so_path)
            values[node] = _run_delegate(
                so_path,
                values[lowered_module],
                [values[arg] for arg in delegate_args],
            )
        elif node.target is operator.getitem:
            source, index = node.args
            values[node] = values[source][index]
        elif node.op == "output":
            returned = node.args[0]
            output_specs = edge_program.graph_signature.output_specs
            user_output_values = [
                values[returned_node] if isinstance(returned_node, torch.fx.Node) else returned_node
                for returned_node, spec in zip(returned, output_specs)
                if spec.kind == OutputSpecKind.USER_OUTPUT
            ]
        else:
            raise NotImplementedError(
                f"{node.format_node()} is outside every delegate; only delegate "
                "calls and getitems on them can be run"
            )
    return user_output_values, used_so_paths


def _compiled_so_path(
    lowered_module: LoweredBackendModule, so_paths_by_key: dict[str, str]
) -> str:
    """The kept copy of the .so a delegate's ``processed_bytes`` name."""
    so_key = lowered_module.processed_bytes.decode("utf-8").splitlines()[0]
    if so_key not in so_paths_by_key:
        raise RuntimeError(
            f"no compiled .so was captured for delegate key {so_key}; was it "
            f"lowered by {StrideguardCpuAotiBackend.__name__}?"
        )
    return so_paths_by_key[so_key]


def _run_delegate(
    so_path: str,
    lowered_module: LoweredBackendModule,
    delegate_inputs: list[torch.Tensor],
) -> list[torch.Tensor]:
    """Load one compiled delegate with torch's AOTI runner and run it.

    The .so was built without its weights. They are loaded as ExecuTorch's AOTI
    runtime loads them: the weights blob ``preprocess`` stored in the
    delegate's named data (keyed by the second line of ``processed_bytes``)
    goes through the .so's ``AOTInductorModelUpdateConstantsFromBlob``, which
    torch's runner calls from ``update_constant_buffer_from_blob``. Supplying
    tensors by name instead does not work: AOTInductor names the constants of
    the module ``preprocess`` unlifts, not the sub-program's, so a lifted
    constant (``lifted_tensor_0`` in the sub-program) is ``_tensor_constant0``
    in the .so, its own name as its "original" FQN.
    """
    sub_program = lowered_module.original_module
    expected_inputs = len(sub_program.graph_signature.user_inputs)
    if len(delegate_inputs) != expected_inputs:
        raise NotImplementedError(
            f"delegate takes {len(delegate_inputs)} arguments but its program has "
            f"{expected_inputs} user inputs; delegates that borrow the method's "
            "weights are not supported"
        )
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so_path, 1)
    if runner.get_constant_names_to_original_fqns():
        runner.update_constant_buffer_from_blob(_weights_blob_path(lowered_module, os.path.dirname(so_path)))
    return runner.run(delegate_inputs)


def _weights_blob_path(lowered_module: LoweredBackendModule, directory: str) -> str:
    """A file in ``directory`` holding the weights blob a delegate's ``processed_bytes`` name."""
    lines = lowered_module.processed_bytes.decode("utf-8").splitlines()
    weights_key = lines[1] if len(lines) > 1 else ""
    if not weights_key.endswith(_WEIGHTS_BLOB_KEY_SUFFIX):
        raise RuntimeError(f"the delegate's processed_bytes name no weights blob: {lines}")
    store = lowered_module.named_data_store_output
    entries = {} if store is None else {**store.pte_data}
    if store is not None:
        for external_entries in store.external_data.values():
            entries.update(external_entries)
    if weights_key not in entries:
        raise RuntimeError(f"the delegate's named data lacks its weights blob {weights_key}")
    buffer = store.buffers[entries[weights_key].buffer_index]
    data = buffer if isinstance(buffer, bytes) else buffer.to_bytes()
    # The key is the blob's SHA-256, so a file named after it is that blob.
    if hashlib.sha256(data).hexdigest() + _WEIGHTS_BLOB_KEY_SUFFIX != weights_key:
        raise RuntimeError(f"the delegate's weights blob does not match its key {weights_key}")
    path = os.path.join(directory, weights_key + ".blob")
    if not os.path.exists(path):
        with open(path, "wb") as blob_file:
            blob_file.write(data)
    return path

"""Ask Inductor how it lays out each output: its own lowering, stopped before code generation.

AOTInductor decides an output's strides while lowering the graph
(``GraphLowering.output`` and the layout rules of each lowering, after its own
decompositions such as ``cat`` of one non-empty input becoming a
``clone``), and its C++ wrapper then copies any output that is a view of a
constant (``aoti_torch_clone``). Modelling all of that from the graph is
guesswork where the compiler has freedom; running the lowering is not. This
module runs exactly the path ``aoti_compile_and_package`` runs, up to the
point where the graph's outputs are fixed, reads each output's layout, and
stops: no C++ is generated or compiled, so it costs a small fraction of a
compile (measured in ``docs/benchmarks.md``).

The stop uses Inductor's scheduler hook ``_pre_fusion_custom_pass``, passed as
a per-call config option (never patched into global state): the hook is
called once the lowered graph exists and before any kernel is generated,
reads ``V.graph``, and raises ``_Lowered`` with what it read.

For an Edge program the path is ExecuTorch's AOTI backend's: the installed
ExecuTorch's own ``ReplaceViewCopyWithViewPass`` runs on a copy of the graph
(or strideguard's policy, when asked), then the module is lowered with the
user inputs' fake values, as ``AotiBackend.preprocess`` does.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import sympy
import torch
from torch.export import ExportedProgram
try:
    from torch._inductor.custom_graph_pass import CustomSchedulerPass
except ImportError:  # torch 2.11 (a GPU machine's own) has the hook, a plain callable, not its base class
    CustomSchedulerPass = object
from torch._inductor.utils import sympy_product

from ...program import density
from ...program.dialect import dialect_of, graph_ops
from ..targets import CPU, LoweringUnavailable, Target

_HOOK = "_pre_fusion_custom_pass"


@dataclass(frozen=True)
class LoweredOutput:
    """One user output as the compiled method returns it, by Inductor's own lowering.

    ``shape`` and ``strides`` are ints where known and the program's symbols
    where not; ``copied_by_wrapper`` is set for a view of a constant, which
    AOTInductor's wrapper returns as ``clone`` of it (whose strides these are).
    """

    shape: tuple
    strides: tuple
    storage_offset: Any
    copied_by_wrapper: bool
    kernel_memory: bool = False
    """It has a size-one dimension and may be written into memory an extern kernel allocated (in place, or
    reused once freed), whose strides in size-one dimensions are the kernel's, not Inductor's model of
    them (``ExternKernelMemory``): ``strides`` may then not be what it returns."""
    alternatives: tuple = ()
    """Its strides under each other kernel choice the target device could make at compile time (CUDA's SDPA
    backend, where ``sdp_utils``' choice is not decided by what is known here: ``Lowering.undecided``), where
    they differ from ``strides``; empty where they do not."""

    benchmark_decides: bool = False
    """Its strides differ between the branches of a decision the device's own benchmark makes when it compiles
    (``pad_mm``: ``strideguard.compiler.oracle.padded_matmuls``); ``alternatives`` then hold the other branch's."""

    @property
    def every_strides(self) -> tuple:
        """``strides`` and each alternative: the output is in a layout only if it is under every choice."""
        return (self.strides, *self.alternatives)


@dataclass(frozen=True)
class Lowering:
    """Every user output of one method, lowered; ``None`` where an output is not a tensor."""

    outputs: tuple[Optional[LoweredOutput], ...]
    seconds: float
    backend: Optional[str] = None
    """The AOTI backend whose ``preprocess`` passes ran before Inductor (``None``: ExecuTorch's view pass only)."""
    unavailable: Optional[str] = None
    """Why that backend's own passes could not run here; its outputs are then not decided by this lowering."""
    target: Target = CPU
    """The device Inductor lowered for (``strideguard.compiler.targets``)."""
    kernel_choices: tuple = ()
    """The device's kernel choices this lowering followed (``strideguard.compiler.oracle.attention_kernels.KernelChoice``)."""
    options_not_applied: tuple[str, ...] = ()
    """The backend's compile options a lowering without its device cannot apply (autotuning)."""
    pad_decisions: tuple = ()
    """The matmuls whose padding the device's benchmark decides (``strideguard.compiler.oracle.padded_matmuls.PadDecision``):
    the lowering ran both ways where there are any."""

    relaid_convolutions: tuple = ()
    """Input shapes of the CUDA convolutions whose memory format this build of torch could not ask cuDNN
    (``compiler.oracle.fake_device.convolution_formats``): the lowering ran both ways where there are any."""

    @property
    def undecided(self) -> str:
        """Why the device's kernel choices are not all decided here (empty when they are)."""
        reasons = [choice.undecided for choice in self.kernel_choices if choice.undecided]
        if self.relaid_convolutions:
            shapes = ", ".join(str(list(shape)) for shape in self.relaid_convolutions[:3])
            reasons.append(
                f"cuDNN picks the memory format of the convolution of {shapes} on the device, and this build of "
                "torch has no cuDNN to ask"
            )
        return "; ".join(dict.fromkeys(reasons))

    @property
    def benchmark_undecided(self) -> str:
        """What the device's benchmark decides when it compiles, in words (empty when nothing)."""
        from .padded_matmuls import described

        return described(list(self.pad_decisions)) if self.pad_decisions else ""


class _Lowered(Exception):
    """Raised from inside Inductor to stop it once the outputs are laid out; ``lowering`` numbers the lowering
    that raised it, so that only its own compile reads it (never one left in an exception's context)."""

    def __init__(self, outputs: list, lowering: int):
        super().__init__("strideguard: lowering read, stopping before code generation")
        self.outputs = outputs
        self.lowering = lowering


_lowerings = itertools.count()


def lower_outputs(
    program: ExportedProgram,
    example_inputs: Optional[Any] = None,
    *,
    inductor_configs: Optional[dict] = None,
    target: Target = CPU,
) -> Lowering:
    """Lower an ATen ``program`` as ``aoti_compile_and_package`` would and read each user output's layout.

    ``example_inputs`` (a tuple, or ``(args, kwargs)``) defaults to the
    program's stored ones, and else to the fake values of its user inputs,
    which keep its dynamic dimensions symbolic. ``inductor_configs`` are the
    options the program will be compiled with (they can change layouts). ``target`` is the device it is
    compiled for (``strideguard.compiler.targets``); for another device than the CPU the lowering runs on fake
    tensors of that device (``strideguard.compiler.oracle.fake_device``), made from the program's own fake values
    (``example_inputs`` are not used then).
    """
    if dialect_of(program).is_edge:
        raise ValueError("strideguard: lower_outputs takes an ATen program; use lower_edge_outputs for Edge")
    return lower_aten_outputs(program, example_inputs, inductor_configs=inductor_configs, target=target)


def lower_aten_outputs(
    program: ExportedProgram,
    example_inputs: Optional[Any] = None,
    *,
    inductor_configs: Optional[dict] = None,
    target: Target = CPU,
) -> Lowering:
    """``lower_outputs`` for a caller that knows ``program`` is ATen (its dialect read once, elsewhere)."""
    # For another device the inputs are the program's own fake values, moved there (``compiler.oracle.fake_device.on_target``).
    args, kwargs = _inputs(program, example_inputs) if target.is_cpu else ((), {})
    module = program.module(check_guards=False)
    return _with_program_symbols(_lower(module, args, kwargs, inductor_configs, target, _fake_mode(program)), program)


def lower_edge_outputs(
    program: ExportedProgram,
    *,
    convert_views: Optional[Any] = None,
    backend: Optional[Any] = None,
    target: Target = CPU,
) -> Lowering:
    """Lower an Edge ``program`` as ExecuTorch's AOTI backend does inside ``preprocess``.

    ``convert_views`` turns view copies into views on a copy of the graph
    before lowering; by default it is the installed ExecuTorch's own
    ``ReplaceViewCopyWithViewPass``. Pass ``lambda graph_module: None`` to
    lower the graph as it is (a program ``prepare_for_aoti`` already
    converted). ``backend`` (a ``strideguard.compiler.backends.Backend``) adds what
    that backend's ``preprocess`` runs next: its custom passes and its
    decomposition table (``strideguard.compiler.backends.run_pipeline``). ``target`` as for ``lower_outputs``.
    """
    from ..backends import run_pipeline, unavailable_note

    converted = run_pipeline(program, backend, convert_views or executorch_view_pass())
    names = set(converted.graph_signature.user_inputs)
    fake_inputs = tuple(n.meta["val"] for n in converted.graph.find_nodes(op="placeholder") if n.name in names)
    options, dropped, context = None, (), contextlib.nullcontext()
    if backend is not None and backend.available and not target.is_cpu:
        options, dropped = backend.lowering_options()
        context = backend.compile_context()
    with context:
        lowering = _with_program_symbols(
            _lower(converted.module(), fake_inputs, {}, options, target, _fake_mode(converted)), program
        )
    note = unavailable_note(backend)
    return replace(
        lowering, backend=backend.name if backend is not None else None, unavailable=note, options_not_applied=dropped
    )


def _fake_mode(program: ExportedProgram):
    """The fake mode of the program's placeholders' values (with its shape environment), if any."""
    from torch._guards import detect_fake_mode

    values = [n.meta.get("val") for n in program.graph.find_nodes(op="placeholder")]
    return detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])


def _with_program_symbols(lowering: Lowering, program: ExportedProgram) -> Lowering:
    """Symbolic sizes and strides as ``SymInt``s of ``program``'s own shape environment.

    Inductor's expressions name the program's symbols (``s77``); as SymInts
    they go through the same layout predicates as the analysis' values.
    """
    shape_env = getattr(_fake_mode(program), "shape_env", None)

    def as_symint(value):
        if isinstance(value, sympy.Expr) and shape_env is not None:
            return shape_env.create_symintnode(value, hint=None)
        return value

    outputs = tuple(
        None
        if out is None
        else replace(
            out,
            shape=tuple(map(as_symint, out.shape)),
            strides=tuple(map(as_symint, out.strides)),
            storage_offset=as_symint(out.storage_offset),
        )
        for out in lowering.outputs
    )
    return replace(lowering, outputs=outputs)


def executorch_view_pass():
    """The installed ExecuTorch's AOTI ``ReplaceViewCopyWithViewPass``, which ``AotiBackend.preprocess`` runs."""
    from executorch.backends.aoti.passes.replace_view_copy_with_view import ReplaceViewCopyWithViewPass

    return ReplaceViewCopyWithViewPass()


def _inputs(program: ExportedProgram, example_inputs: Optional[Any]) -> tuple[tuple, dict]:
    if example_inputs is None:
        example_inputs = program.example_inputs
    if example_inputs is None:
        names = set(program.graph_signature.user_inputs)
        values = tuple(n.meta["val"] for n in program.graph.find_nodes(op="placeholder") if n.name in names)
        return values, {}
    if isinstance(example_inputs, tuple) and len(example_inputs) == 2 and isinstance(example_inputs[1], dict):
        return tuple(example_inputs[0]), dict(example_inputs[1])
    return tuple(example_inputs), {}


def _lower(
    module: torch.fx.GraphModule,
    args: tuple,
    kwargs: dict,
    inductor_configs: Optional[dict] = None,
    target: Target = CPU,
    fake_mode: Any = None,
) -> Lowering:
    if not hasattr(torch._inductor.config, _HOOK):
        raise LoweringUnavailable(
            f"strideguard: torch {torch.__version__}'s Inductor has no {_HOOK} hook; "
            "the lowering oracle cannot stop before code generation"
        )
    from . import fake_device

    with fake_device.one_lowering():
        return _lower_holding(module, args, kwargs, inductor_configs, target, fake_mode)


def _lower_holding(module, args, kwargs, inductor_configs, target: Target, fake_mode) -> Lowering:
    if target.is_cpu:
        return replace(_lower_once(module, args, kwargs, inductor_configs or {}), target=target)
    from . import attention_kernels, fake_device

    fake_device.require_supported(target)
    module, flat = fake_device.on_target(module, target, fake_mode)
    in_spec = getattr(module, "_in_spec", None)
    args, kwargs = torch.utils._pytree.tree_unflatten(list(flat), in_spec) if in_spec is not None else (flat, {})
    ops_of_module = graph_ops(module.graph)
    choices = attention_kernels.choices(ops_of_module, target)
    options = {**(inductor_configs or {}), **fake_device.OPTIONS}
    chosen = [attention_kernels.with_kernels(module, scenario, target.torch_device)
              for scenario in attention_kernels.scenarios(choices)]
    # Each kernel choice lowered with the device's benchmark saying "do not pad"; where a matmul reached that
    # benchmark, each again with it saying "pad" (``compiler.oracle.padded_matmuls``); where this build of torch could
    # not ask cuDNN a convolution's memory format, each again with cuDNN's channels-last; where Inductor put
    # an SDPA in itself whose kernel is undecided, each again with every other candidate.
    asked = DeviceQuestions()
    base = [_lower_for(each, args, kwargs, options, target, asked=asked) for each in chosen]
    padded = [_lower_for(each, args, kwargs, options, target, DeviceAnswers(pad=True)) for each in chosen] if asked.pads else []
    relaid = [
        _lower_for(each, args, kwargs, options, target, DeviceAnswers(channels_last=True)) for each in chosen
    ] if asked.convolutions else []
    width = max((len(choice.candidates) for choice in asked.inserted), default=1)
    others = [_lower_for(chosen[0], args, kwargs, options, target, DeviceAnswers(kernel=index)) for index in range(1, width)]
    merged = _merged(base, padded, [*relaid, *others])
    return replace(
        merged, target=target, kernel_choices=tuple(choices) + tuple(dict.fromkeys(asked.inserted)),
        pad_decisions=tuple(asked.pads), relaid_convolutions=tuple(dict.fromkeys(asked.convolutions)),
    )


@dataclass(frozen=True)
class DeviceAnswers:
    """How one lowering answers the choices the device makes itself: ``pad``, ``pad_mm``'s benchmark;
    ``channels_last``, cuDNN's convolution format; ``kernel``, which candidate an SDPA Inductor inserts runs."""

    pad: bool = False
    channels_last: bool = False
    kernel: int = 0


@dataclass
class DeviceQuestions:
    """What a lowering asked of the device: the matmuls its benchmark may pad, the convolutions whose format
    cuDNN picks, the SDPAs Inductor put in itself (each lowered again with the other answers)."""

    pads: list = field(default_factory=list)
    convolutions: list = field(default_factory=list)
    inserted: list = field(default_factory=list)


def _lower_for(
    module, args, kwargs, options, target: Target, answers: DeviceAnswers = DeviceAnswers(),
    asked: Optional[DeviceQuestions] = None,
) -> Lowering:
    """One lowering on fake tensors of ``target``, with the device's own choices answered as ``answers``
    says; what was asked is added to ``asked``."""
    from . import attention_kernels, fake_device

    asked = asked if asked is not None else DeviceQuestions()
    attention = attention_kernels.inserted_kernels(target, answers.kernel, asked.inserted)
    with fake_device.lowering_for(target), fake_device.benchmark_answers(target, answers.pad, asked.pads), \
            fake_device.convolution_formats(target, answers.channels_last, asked.convolutions), \
            fake_device.inserted_attention(target, attention):
        return _lower_once(module, args, kwargs, options)


def _merged(base: list[Lowering], padded: Sequence[Lowering] = (), relaid: Sequence[Lowering] = ()) -> Lowering:
    """One lowering per scenario of the device's undecided choices, as one: an output whose strides differ
    carries the others as ``alternatives``. ``padded`` are ``base`` again with matmuls padded, ``relaid`` with
    convolutions channels-last: an output whose strides differ from its unpadded twin's is decided by the
    device's benchmark."""
    lowerings = [*base, *padded, *relaid]
    first, rest = lowerings[0], lowerings[1:]
    outputs = []
    for index, lowered in enumerate(first.outputs):
        if lowered is None or not rest:
            outputs.append(lowered)
            continue
        others = dict.fromkeys(tuple(other.outputs[index].strides) for other in rest)
        by_benchmark = any(
            tuple(each.outputs[index].strides) != tuple(twin.outputs[index].strides) for each, twin in zip(base, padded)
        )
        outputs.append(replace(
            lowered, alternatives=tuple(s for s in others if s != tuple(lowered.strides)), benchmark_decides=by_benchmark
        ))
    return replace(first, outputs=tuple(outputs), seconds=sum(lowering.seconds for lowering in lowerings))


def _lower_once(module: torch.fx.GraphModule, args: tuple, kwargs: dict, inductor_configs: dict) -> Lowering:
    number = next(_lowerings)
    options = {
        **inductor_configs,
        "aot_inductor.package": True,
        _HOOK: functools.partial(_read_outputs_and_stop, lowering=number),
        # A cached compile skips lowering, and with it the hook.
        "fx_graph_cache": False,
    }
    started = time.perf_counter()
    try:
        with torch.no_grad():
            torch._inductor.aot_compile(module, args, kwargs, options=options)
    except Exception as error:  # noqa: BLE001 - Inductor wraps what the hook raised
        lowered = _find_lowered(error, number)
        if lowered is None:
            raise
        return Lowering(tuple(lowered.outputs), time.perf_counter() - started)
    raise RuntimeError("strideguard: Inductor compiled without calling its pre-fusion hook; nothing was read")


def _find_lowered(error: BaseException, lowering: int) -> Optional[_Lowered]:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, _Lowered) and error.lowering == lowering:
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _read_outputs_and_stop(nodes, *, lowering: int):
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    graph = V.graph
    kernel_memory = _kernel_memory(graph)
    outputs = []
    for value in graph.graph_outputs:
        if not (isinstance(value, ir.IRNode) and value.has_tensor_output()) or isinstance(
            value, ir.ShapeAsConstantBuffer
        ):
            outputs.append(None)
            continue
        fixed = value.get_layout()
        shape, strides = tuple(fixed.size), tuple(fixed.stride)
        if _returned_as_clone(value, graph.constants):
            strides = _clone_strides(shape, strides, fixed.dtype)
            outputs.append(LoweredOutput(_plain(shape), _plain(strides), 0, True))
        else:
            at_risk = _has_size_one_dim(shape) and (fixed.dtype, sympy_product(shape)) in kernel_memory
            outputs.append(LoweredOutput(_plain(shape), _plain(strides), _plain((fixed.offset,))[0], False, at_risk))
    raise _Lowered(outputs, lowering)


def _has_size_one_dim(shape: Sequence) -> bool:
    """A size-one dimension after the first larger one: where a kernel and Inductor's model of it can place
    it differently in memory order. A leading run of size-one dimensions (a batch of one) is outermost in
    both, with the same strides."""
    inner = list(shape)
    while inner and inner[0] == 1:
        inner.pop(0)
    return any(size == 1 for size in inner) and sympy_product(shape) != 1


def _kernel_allocated(graph) -> list:
    """Buffers an extern kernel allocates itself (a fallback's outputs) with a size-one dimension: Inductor
    models their strides from the op's meta function, which need not give the kernel's own strides in those
    dimensions (measured: CPU flash attention's output, (64, 16, 64, 1) where the model has (64, 16, 16, 1))."""
    from torch._inductor import ir

    return [
        buffer for buffer in graph.buffers
        if isinstance(buffer, (ir.MultiOutput, ir.ExternKernelAlloc))
        and isinstance(buffer.layout, ir.Layout)
        and _has_size_one_dim(tuple(buffer.get_size()))
    ]


def _kernel_memory(graph) -> set:
    """``(dtype, numel)`` of each extern-kernel-allocated buffer with a size-one dimension: an output of the
    same dtype and size may be computed into its memory (in place, or reused) and come back with its strides."""
    return {(buffer.get_dtype(), sympy_product(buffer.get_size())) for buffer in _kernel_allocated(graph)}


class ExternKernelMemory(CustomSchedulerPass):
    """Inductor's scheduler hook for a real compile: memory an extern kernel allocated with a size-one
    dimension is never reused or written in place for another buffer, so each output comes back in the
    strides Inductor lays it out in, as the lowering oracle reads them (``LoweredOutput.kernel_memory``).

    Nothing else changes; the only cost is that those buffers' memory is not recycled.
    """

    def __call__(self, nodes):
        from torch._inductor.virtualized import V

        V.graph.never_reuse_buffers.update(buffer.get_name() for buffer in _kernel_allocated(V.graph))
        return nodes

    def uuid(self) -> str:
        return "strideguard.compiler.oracle.lowering.ExternKernelMemory/1"


def _returned_as_clone(value, constants) -> bool:
    """Whether the wrapper returns ``aoti_torch_clone`` of this output, as ``CppWrapperCpu.generate_return``
    decides: when its reference is a constant's name (the constant itself, in its boxes; any
    ``ReinterpretView`` is referred to through a new handle), or it is a view whose storage is a constant."""
    from torch._inductor import ir

    if isinstance(value, ir.BaseView):
        storage = value.unwrap_view()
        return isinstance(getattr(storage, "data", None), ir.ConstantBuffer)
    inner = value
    while isinstance(inner, ir.MutableBox):
        inner = inner.data
    return isinstance(inner, ir.Buffer) and inner.get_name() in constants


def _clone_strides(shape: Sequence, strides: Sequence, dtype: torch.dtype) -> tuple:
    """The strides ``at::clone`` (``preserve_format``) gives a tensor of these strides, asked of torch itself.

    Asked of its C++ meta kernel, as the wrapper's ``aoti_torch_clone`` runs it: Inductor lowers with the
    Python dispatcher on, whose ``clone`` goes through ``empty_like`` and drops a size-one dimension's stride
    (measured: ``(1,)`` for a ``[1]`` view of stride 3, where the compiled program returns ``(3,)``)."""
    from torch._dispatch.python import no_python_dispatcher

    if any(not isinstance(s, (int, sympy.Integer)) for s in (*shape, *strides)):
        return tuple(strides) if density.is_non_overlapping_and_dense(shape, strides) else tuple(
            density.strides_for_order(shape, density.identity_order(len(shape)))
        )
    with no_python_dispatcher():
        tensor = torch.empty_strided([int(s) for s in shape], [int(s) for s in strides], dtype=dtype, device="meta")
        return tuple(tensor.clone().stride())


def _plain(values: Sequence) -> tuple:
    """Sympy integers as ints; symbolic expressions stay sympy expressions."""
    out = []
    for v in values:
        if isinstance(v, (int, sympy.Integer)) or (isinstance(v, sympy.Expr) and v.is_number):
            out.append(int(v))
        else:
            out.append(v)
    return tuple(out)

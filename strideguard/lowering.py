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

import copy
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import sympy
import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from . import layout

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


@dataclass(frozen=True)
class Lowering:
    """Every user output of one method, lowered; ``None`` where an output is not a tensor."""

    outputs: tuple[Optional[LoweredOutput], ...]
    seconds: float


class LoweringUnavailable(RuntimeError):
    """This torch's Inductor has no hook to stop after lowering."""


class _Lowered(Exception):
    """Raised from inside Inductor to stop it once the outputs are laid out."""

    def __init__(self, outputs: list):
        super().__init__("strideguard: lowering read, stopping before code generation")
        self.outputs = outputs


def lower_outputs(program: ExportedProgram, example_inputs: Optional[Any] = None) -> Lowering:
    """Lower an ATen ``program`` as ``aoti_compile_and_package`` would and read each user output's layout.

    ``example_inputs`` (a tuple, or ``(args, kwargs)``) defaults to the
    program's stored ones, and else to the fake values of its user inputs,
    which keep its dynamic dimensions symbolic.
    """
    from .dialect import dialect_of

    if dialect_of(program).is_edge:
        raise ValueError("strideguard: lower_outputs takes an ATen program; use lower_edge_outputs for Edge")
    args, kwargs = _inputs(program, example_inputs)
    module = program.module(check_guards=False)
    return _with_program_symbols(_lower(module, args, kwargs), program)


def lower_edge_outputs(program: ExportedProgram, *, convert_views: Optional[Any] = None) -> Lowering:
    """Lower an Edge ``program`` as ExecuTorch's AOTI backend does inside ``preprocess``.

    ``convert_views`` turns view copies into views on a copy of the graph
    before lowering; by default it is the installed ExecuTorch's own
    ``ReplaceViewCopyWithViewPass``. Pass ``lambda graph_module: None`` to
    lower the graph as it is (a program ``prepare_for_aoti`` already
    converted).
    """
    converted = copy.copy(program)
    graph_module = copy.deepcopy(program.graph_module)
    (convert_views or executorch_view_pass())(graph_module)
    converted._graph_module = graph_module
    names = set(program.graph_signature.user_inputs)
    fake_inputs = tuple(n.meta["val"] for n in graph_module.graph.find_nodes(op="placeholder") if n.name in names)
    return _with_program_symbols(_lower(converted.module(), fake_inputs, {}), program)


def _with_program_symbols(lowering: Lowering, program: ExportedProgram) -> Lowering:
    """Symbolic sizes and strides as ``SymInt``s of ``program``'s own shape environment.

    Inductor's expressions name the program's symbols (``s77``); as SymInts
    they go through the same layout predicates as the analysis' values.
    """
    from torch._guards import detect_fake_mode

    values = [n.meta.get("val") for n in program.graph.find_nodes(op="placeholder")]
    fake_mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
    shape_env = getattr(fake_mode, "shape_env", None)

    def as_symint(value):
        if isinstance(value, sympy.Expr) and shape_env is not None:
            return shape_env.create_symintnode(value, hint=None)
        return value

    outputs = tuple(
        None
        if out is None
        else LoweredOutput(
            tuple(map(as_symint, out.shape)),
            tuple(map(as_symint, out.strides)),
            as_symint(out.storage_offset),
            out.copied_by_wrapper,
        )
        for out in lowering.outputs
    )
    return Lowering(outputs, lowering.seconds)


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


def _lower(module: torch.fx.GraphModule, args: tuple, kwargs: dict) -> Lowering:
    if not hasattr(torch._inductor.config, _HOOK):
        raise LoweringUnavailable(
            f"strideguard: torch {torch.__version__}'s Inductor has no {_HOOK} hook; "
            "the lowering oracle cannot stop before code generation"
        )
    options = {
        "aot_inductor.package": True,
        _HOOK: _read_outputs_and_stop,
        # A cached compile skips lowering, and with it the hook.
        "fx_graph_cache": False,
    }
    started = time.perf_counter()
    try:
        with torch.no_grad():
            torch._inductor.aot_compile(module, args, kwargs, options=options)
    except Exception as error:  # noqa: BLE001 - Inductor wraps what the hook raised
        lowered = _find_lowered(error)
        if lowered is None:
            raise
        return Lowering(tuple(lowered.outputs), time.perf_counter() - started)
    raise RuntimeError("strideguard: Inductor compiled without calling its pre-fusion hook; nothing was read")


def _find_lowered(error: BaseException) -> Optional[_Lowered]:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, _Lowered):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _read_outputs_and_stop(nodes):
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    graph = V.graph
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
            outputs.append(LoweredOutput(_plain(shape), _plain(strides), _plain((fixed.offset,))[0], False))
    raise _Lowered(outputs)


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
    """The strides ``at::clone`` (``preserve_format``) gives a tensor of these strides, asked of torch itself."""
    if any(not isinstance(s, (int, sympy.Integer)) for s in (*shape, *strides)):
        return tuple(strides) if layout.is_non_overlapping_and_dense(shape, strides) else tuple(
            layout.strides_for_order(shape, layout.identity_order(len(shape)))
        )
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

"""Compile with AOTInductor, run, and measure what comes back.

The proof that an output comes back dense is to compile the program, run it,
and look at the tensors: their strides, what memory they share, and their
values against the same program run eagerly.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import sympy
import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from . import layout
from .api import inspect
from .dialect import dialect_of, target_dim_orders
from .lowering import lower_outputs
from .program import require_exported_program, user_outputs
from .pushdown import was_pushed_down
from .records import OutputCheck, VerifyReport


DEVICES = ("cpu", "cuda")

PUSHDOWN_TOLERANCE = (1e-4, 1e-5)
"""``(rtol, atol)`` within which a pushed-down program's outputs must equal its reference's: a GEMM over
fewer rows or columns may round differently. Without pushdown the comparison is bitwise."""


def aoti_program(program: ExportedProgram, device: str = "cpu") -> ExportedProgram:
    """The ATen program AOTInductor compiles for ``program`` on ``device``.

    An Edge program, or one bound for another device than the CPU, is exported
    again from its module (on that device, with its stored example inputs):
    AOTInductor compiles ATen programs, for the device their tensors are on.
    Its dynamic dimensions are then specialized to the example inputs.
    """
    if not dialect_of(program).is_edge and device == "cpu":
        return program
    if program.example_inputs is None:
        raise ValueError("strideguard: recompiling this program needs its stored example inputs")
    args, kwargs = _to_device(program.example_inputs, device)
    return torch.export.export(program.module().to(device), args, kwargs)


def compile_program(program: ExportedProgram, directory: str, *, device: str = "cpu") -> Any:
    """Compile ``program`` with AOTInductor for ``device`` into ``directory`` and load it; returns a callable."""
    program = aoti_program(program, device)
    os.makedirs(directory, exist_ok=True)
    package = torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(directory, "program.pt2"))
    return torch._inductor.aoti_load_package(package)


def _split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, tuple) and len(example_inputs) == 2 and isinstance(example_inputs[1], dict):
        return tuple(example_inputs[0]), dict(example_inputs[1])
    return tuple(example_inputs), {}


def _to_device(tree: Any, device: str) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), tree)


@dataclass(frozen=True)
class Expectations:
    """What each user output should come back as: its target layout, and the strides strideguard
    predicted (``inspect``) and Inductor's lowering gave, each ``None`` where there is none."""

    target_orders: tuple
    predicted: tuple
    lowered: tuple


def expectations(program: ExportedProgram, compiled_program: ExportedProgram) -> Expectations:
    """Targets from ``program`` (an Edge program's promised dim orders); predictions and lowering of the
    ATen program AOTInductor compiles for it."""
    predicted = inspect(compiled_program)
    lowering = lower_outputs(compiled_program)
    return Expectations(
        target_orders=target_dim_orders(program),
        predicted=tuple(
            o.strides if o.kind == "tensor" and o.in_target_layout is not None else None for o in predicted.outputs
        ),
        lowered=tuple(out.strides if out is not None else None for out in lowering.outputs),
    )


def verify(
    program: ExportedProgram,
    example_inputs: Optional[Any] = None,
    *,
    device: str = "cpu",
    more_inputs: Sequence[Any] = (),
    reference: Optional[ExportedProgram] = None,
    tolerance: tuple[float, float] = PUSHDOWN_TOLERANCE,
) -> VerifyReport:
    """Compile ``program`` with AOTInductor, run it, and check every user output.

    ``example_inputs`` is a tuple of positional arguments, or ``(args, kwargs)``;
    by default the program's stored example inputs. ``more_inputs`` are further
    input sets run on the same compiled artifact (a dynamic batch dimension at
    other sizes). Each output is checked against the program run eagerly and
    against its target layout (``layout.has_layout``: exact strides, as
    ExecuTorch's runtime compares them), and its strides are compared with
    what ``inspect`` predicted and Inductor's lowering gave.

    With ``reference`` (the program before strideguard rewrote it), that
    program is compiled and run too, and each output must equal its
    reference's: bitwise, or, where ``program`` was pushed down, within
    ``tolerance`` (``(rtol, atol)``); ``reference_error`` is the largest
    difference measured.
    """
    program = require_exported_program(program, "verify")
    if reference is not None:
        reference = require_exported_program(reference, "verify")
    if not (isinstance(tolerance, tuple) and len(tolerance) == 2 and all(isinstance(t, float) and t >= 0 for t in tolerance)):
        raise TypeError(f"strideguard.verify: tolerance must be a tuple (rtol, atol) of non-negative floats, got {tolerance!r}")
    if not isinstance(device, str) or device not in DEVICES:
        raise ValueError(f"strideguard.verify: device must be one of {', '.join(DEVICES)}, got {device!r}")
    if not isinstance(more_inputs, (list, tuple)):
        raise TypeError(f"strideguard.verify: more_inputs must be a list or tuple of input sets, got {type(more_inputs).__name__}")
    with tempfile.TemporaryDirectory(prefix="strideguard-") as directory:
        compiled_program = aoti_program(program, device)
        expected = expectations(program, compiled_program)
        started = time.perf_counter()
        compiled = compile_program(compiled_program, directory, device=device)
        compile_seconds = time.perf_counter() - started
        compiled_reference = None
        if reference is not None:
            compiled_reference = compile_program(reference, os.path.join(directory, "reference"), device=device)
        return check_compiled(
            program,
            compiled,
            example_inputs,
            more_inputs=more_inputs,
            device=device,
            compile_seconds=compile_seconds,
            expected=expected,
            reference=compiled_reference,
            tolerance=tolerance if was_pushed_down(program.graph) else None,
        )


def check_compiled(
    program: ExportedProgram,
    compiled: Any,
    example_inputs: Optional[Any] = None,
    *,
    more_inputs: Sequence[Any] = (),
    device: str = "cpu",
    compile_seconds: float = 0.0,
    expected: Optional[Expectations] = None,
    reference: Optional[Any] = None,
    tolerance: Optional[tuple[float, float]] = None,
) -> VerifyReport:
    """Run an already compiled ``program`` on each input set and check its outputs; with ``reference``
    (another compiled callable), against its outputs too: within ``tolerance``, or bitwise when it is ``None``."""
    if example_inputs is None:
        if program.example_inputs is None:
            raise ValueError("strideguard.verify: the program stores no example inputs; pass example_inputs")
        example_inputs = program.example_inputs
    if expected is None:
        expected = Expectations(target_dim_orders(program), (), ())
    input_sets = [_split_inputs(example_inputs)] + [_split_inputs(i) for i in more_inputs]
    eager = program.module()
    runs = []
    with torch.no_grad():
        for number, (args, kwargs) in enumerate(input_sets):
            expected_values = eager(*args, **kwargs)
            sizes = _symbol_values(program, args, kwargs)
            args, kwargs = _to_device((args, kwargs), device)
            got = compiled(*args, **kwargs)
            checks = _check_outputs(program, got, expected_values, (args, kwargs), expected, sizes)
            if reference is not None:
                checks = _against_reference(checks, got, reference(*args, **kwargs), tolerance)
            runs.append((f"inputs {number}", checks))
    return VerifyReport(device=device, compile_seconds=compile_seconds, outputs=runs[0][1], runs=tuple(runs[1:]))


def _against_reference(checks: tuple, got: Any, wanted: Any, tolerance: Optional[tuple[float, float]]) -> tuple:
    """Each check with the largest difference from the reference's output, and failed where that is too much."""
    got_leaves = pytree.tree_leaves(got, is_leaf=lambda x: x is None)
    wanted_leaves = pytree.tree_leaves(wanted, is_leaf=lambda x: x is None)
    if len(got_leaves) != len(wanted_leaves):
        raise RuntimeError(f"the program returned {len(got_leaves)} values and its reference {len(wanted_leaves)}")
    measured = []
    for check, value, reference in zip(checks, got_leaves, wanted_leaves):
        if not isinstance(value, torch.Tensor) or not isinstance(reference, torch.Tensor):
            measured.append(check)
            continue
        same = value.shape == reference.shape and value.dtype == reference.dtype
        error = _max_difference(value, reference) if same and value.numel() else 0.0
        if same and tolerance is not None and (value.is_floating_point() or value.is_complex()):
            same = torch.allclose(value, reference, rtol=tolerance[0], atol=tolerance[1], equal_nan=True)
        elif same:
            same = torch.equal(value, reference) or (value.is_floating_point() and torch.equal(value.isnan(), reference.isnan())
                                                     and torch.equal(value.nan_to_num(), reference.nan_to_num()))
        measured.append(replace(check, reference_error=error, match=check.match and bool(same)))
    return tuple(measured)


def _max_difference(value: torch.Tensor, reference: torch.Tensor) -> float:
    wide = torch.complex128 if value.is_complex() else torch.float64
    difference = (value.to(wide) - reference.to(value.device, wide)).abs()
    return float(difference.nan_to_num(nan=0.0).max()) if difference.numel() else 0.0


def _symbol_values(program: ExportedProgram, args: tuple, kwargs: dict) -> dict:
    """The value each size symbol of ``program`` takes for these inputs (read off the user inputs' shapes)."""
    leaves = pytree.tree_leaves((args, kwargs))
    names = program.graph_signature.user_inputs
    placeholders = {n.name: n for n in program.graph.find_nodes(op="placeholder")}
    values = {}
    for name, leaf in zip(names, leaves):
        fake = placeholders[name].meta.get("val") if name in placeholders else None
        if not (isinstance(fake, torch.Tensor) and isinstance(leaf, torch.Tensor)) or fake.dim() != leaf.dim():
            continue
        for size, actual in zip(fake.shape, leaf.shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                values[size.node.expr] = int(actual)
    return values


def _concrete(strides: Optional[tuple], sizes: dict) -> Optional[tuple]:
    """Strides with every symbol replaced by its value here; ``None`` when some symbol has none."""
    if strides is None:
        return None
    out = []
    for stride in strides:
        if isinstance(stride, torch.SymInt):
            stride = stride.node.expr
        if isinstance(stride, str):
            stride = sympy.sympify(stride, locals={str(k): k for k in sizes})
        if isinstance(stride, sympy.Expr):
            stride = stride.subs(sizes)
            if not stride.is_number:
                return None
        out.append(int(stride))
    return tuple(out)


def _check_outputs(program, got, expected_values, inputs, expected: Expectations, sizes: dict) -> tuple[OutputCheck, ...]:
    specs = user_outputs(program.graph_signature)
    got_leaves = pytree.tree_leaves(got, is_leaf=lambda x: x is None)
    expected_leaves = pytree.tree_leaves(expected_values, is_leaf=lambda x: x is None)
    if not len(got_leaves) == len(expected_leaves) == len(specs):
        raise RuntimeError(
            f"the compiled method returned {len(got_leaves)} values and the eager one {len(expected_leaves)}, "
            f"but the program has {len(specs)} user outputs"
        )
    leaves = pytree.tree_leaves(inputs)
    names = program.graph_signature.user_inputs
    if len(names) != len(leaves):
        names = [str(i) for i in range(len(leaves))]
    input_storages = {
        t.untyped_storage().data_ptr(): f"input {name}"
        for name, t in zip(names, leaves)
        if isinstance(t, torch.Tensor) and t.numel()
    }
    output_storages: dict[int, list[int]] = {}
    for out, value in zip(specs, got_leaves):
        if isinstance(value, torch.Tensor) and value.numel():
            output_storages.setdefault(value.untyped_storage().data_ptr(), []).append(out.index)

    def at(values: tuple, index: int) -> Optional[tuple]:
        return _concrete(values[index], sizes) if index < len(values) else None

    return tuple(
        _check_one(
            out, value, reference, input_storages, output_storages,
            target_order=expected.target_orders[out.index] if out.index < len(expected.target_orders) else None,
            predicted=at(expected.predicted, out.index),
            lowered=at(expected.lowered, out.index),
        )
        for out, value, reference in zip(specs, got_leaves, expected_leaves)
    )


def _check_one(out, value, reference, input_storages, output_storages, *, target_order, predicted, lowered) -> OutputCheck:
    name = getattr(out.spec.arg, "name", None)
    if not isinstance(reference, torch.Tensor):
        # AOTInductor hands back an int or float output as a 0-dim tensor.
        kind = "none" if reference is None else type(reference).__name__
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        return OutputCheck(index=out.index, name=name, kind=kind, match=value == reference)
    shape, strides = tuple(value.shape), tuple(value.stride())
    aliases = []
    if value.numel():
        pointer = value.untyped_storage().data_ptr()
        if pointer in input_storages:
            aliases.append(input_storages[pointer])
        aliases += [f"output {i}" for i in output_storages.get(pointer, ()) if i != out.index]
    reference = reference.to(value.device)
    match = value.shape == reference.shape and value.dtype == reference.dtype
    error = 0.0
    if match and value.numel():
        difference = (value.to(torch.complex128 if value.is_complex() else torch.float64)
                      - reference.to(torch.complex128 if reference.is_complex() else torch.float64)).abs()
        error = float(difference.nan_to_num(nan=float("inf")).max()) if not torch.equal(value, reference) else 0.0
        if value.is_floating_point() or value.is_complex():
            match = torch.allclose(value, reference, rtol=1e-4, atol=1e-5, equal_nan=True)
        else:
            match = torch.equal(value, reference)
    order = target_order if target_order is not None else layout.identity_order(value.dim())
    return OutputCheck(
        index=out.index,
        name=name,
        kind="tensor",
        shape=shape,
        dtype=str(value.dtype).removeprefix("torch."),
        strides=strides,
        storage_offset=value.storage_offset(),
        contiguous=value.is_contiguous(),
        dense=layout.is_non_overlapping_and_dense(shape, strides),
        target_dim_order=tuple(order),
        in_target_layout=layout.has_layout(shape, strides, order) is True,
        aliases=tuple(aliases),
        max_abs_error=error,
        match=bool(match),
        predicted_strides=predicted,
        lowered_strides=lowered,
    )

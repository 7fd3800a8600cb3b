"""Compile with AOTInductor, run, and measure what comes back.

The proof that an output comes back dense is to compile the program, run it,
and look at the tensors: their strides, what memory they share, and their
values against the same program run eagerly.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Optional, Sequence

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from . import layout
from .dialect import dialect_of
from .program import require_exported_program, user_outputs
from .records import OutputCheck, VerifyReport


def compile_program(program: ExportedProgram, directory: str, *, device: str = "cpu") -> Any:
    """Compile ``program`` with AOTInductor for ``device`` into ``directory`` and load it; returns a callable.

    An Edge program, or one bound for another device than the CPU, is exported
    again from its module (on that device, with its stored example inputs):
    AOTInductor compiles ATen programs, for the device their tensors are on.
    Its dynamic dimensions are then specialized to the example inputs.
    """
    if dialect_of(program).is_edge or device != "cpu":
        if program.example_inputs is None:
            raise ValueError("strideguard: recompiling this program needs its stored example inputs")
        args, kwargs = _to_device(program.example_inputs, device)
        program = torch.export.export(program.module().to(device), args, kwargs)
    os.makedirs(directory, exist_ok=True)
    package = torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(directory, "program.pt2"))
    return torch._inductor.aoti_load_package(package)


def _split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, tuple) and len(example_inputs) == 2 and isinstance(example_inputs[1], dict):
        return tuple(example_inputs[0]), dict(example_inputs[1])
    return tuple(example_inputs), {}


def _to_device(tree: Any, device: str) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), tree)


def verify(
    program: ExportedProgram,
    example_inputs: Optional[Any] = None,
    *,
    device: str = "cpu",
    more_inputs: Sequence[Any] = (),
) -> VerifyReport:
    """Compile ``program`` with AOTInductor, run it, and check every user output.

    ``example_inputs`` is a tuple of positional arguments, or ``(args, kwargs)``;
    by default the program's stored example inputs. ``more_inputs`` are further
    input sets run on the same compiled artifact (a dynamic batch dimension at
    other sizes). Each output is checked against the program run eagerly and
    against its target layout (contiguous).
    """
    program = require_exported_program(program, "verify")
    with tempfile.TemporaryDirectory(prefix="strideguard-") as directory:
        started = time.perf_counter()
        compiled = compile_program(program, directory, device=device)
        compile_seconds = time.perf_counter() - started
        return check_compiled(
            program, compiled, example_inputs, more_inputs=more_inputs, device=device, compile_seconds=compile_seconds
        )


def check_compiled(
    program: ExportedProgram,
    compiled: Any,
    example_inputs: Optional[Any] = None,
    *,
    more_inputs: Sequence[Any] = (),
    device: str = "cpu",
    compile_seconds: float = 0.0,
) -> VerifyReport:
    """Run an already compiled ``program`` on each input set and check its outputs."""
    if example_inputs is None:
        if program.example_inputs is None:
            raise ValueError("strideguard.verify: the program stores no example inputs; pass example_inputs")
        example_inputs = program.example_inputs
    input_sets = [_split_inputs(example_inputs)] + [_split_inputs(i) for i in more_inputs]
    eager = program.module()
    runs = []
    with torch.no_grad():
        for number, (args, kwargs) in enumerate(input_sets):
            expected = eager(*args, **kwargs)
            args, kwargs = _to_device((args, kwargs), device)
            got = compiled(*args, **kwargs)
            runs.append((f"inputs {number}", _check_outputs(program, got, expected, (args, kwargs))))
    return VerifyReport(device=device, compile_seconds=compile_seconds, outputs=runs[0][1], runs=tuple(runs[1:]))


def _check_outputs(program: ExportedProgram, got: Any, expected: Any, inputs: Any) -> tuple[OutputCheck, ...]:
    specs = user_outputs(program.graph_signature)
    got_leaves = pytree.tree_leaves(got, is_leaf=lambda x: x is None)
    expected_leaves = pytree.tree_leaves(expected, is_leaf=lambda x: x is None)
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
    return tuple(
        _check_one(out, value, reference, input_storages, output_storages)
        for out, value, reference in zip(specs, got_leaves, expected_leaves)
    )


def _check_one(out, value, reference, input_storages, output_storages) -> OutputCheck:
    name = getattr(out.spec.arg, "name", None)
    if not isinstance(reference, torch.Tensor):
        # AOTInductor hands back an int or float output as a 0-dim tensor.
        kind = "none" if reference is None else type(reference).__name__
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        return OutputCheck(out.index, name, kind, None, None, None, None, None, None, None, (), None, value == reference)
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
        in_target_layout=value.is_contiguous(),
        aliases=tuple(aliases),
        max_abs_error=error,
        match=bool(match),
    )

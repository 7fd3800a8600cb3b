"""Compile with AOTInductor, run, and measure what comes back.

Verification, as distinct from the fix-time proof (``prove.proof``: Inductor's
lowering of the fixed program): compile the program, run it, and look at the
tensors, their strides, what memory they share, and their values against the
same program run eagerly.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

import sympy
import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree
from torch.utils._sympy.numbers import int_oo

from ..compiler.oracle.lowering import lower_aten_outputs
from ..decide.subject import Subject, subject_of
from ..decide.view_conversion import EXECUTORCH
from ..fix.engine import program_plan
from .isolation import DEFAULT_SECONDS, Limits, run_isolated
from ..program import density
from ..program.dialect import Dialect, dialect_of
from ..program.exported import output_values, require_exported_program, user_outputs, was_pushed_down
from ..program.naming import output_names
from ..program.promises import KEEP
from ..program.quiet import quietly
from ..program.reports import Alias, AliasKind, memory_group_peer, OutputCheck, OutputKind, VerifyReport


DEVICES = ("cpu", "cuda")

PUSHDOWN_TOLERANCE = (1e-4, 1e-5)
"""``(rtol, atol)`` within which a pushed-down program's outputs must equal its reference's: a GEMM over
fewer rows or columns may round differently. Without pushdown the comparison is bitwise."""

EAGER_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (2e-3, 2e-3),
    torch.complex64: (1e-4, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
"""``(rtol, atol)`` by dtype within which a compiled output must equal the program run eagerly:
``|compiled - eager| <= atol + rtol * |eager|`` elementwise, NaN equal to NaN, an infinity only to itself.

Compiled code legitimately rounds differently from eager: Inductor fuses pointwise ops and keeps a
low-precision intermediate in float32 where eager rounds it after every op, and it may reduce in another
order. Started from ``torch.testing.assert_close``'s defaults, then:

- ``float32`` (and ``complex64``) stay at ``(1e-4, 1e-5)``, looser than ``assert_close``'s ``1.3e-6``:
  a compiled GEMM or reduction differs from eager's by more than that on real models.
- ``bfloat16``: ``rtol`` is ``assert_close``'s ``1.6e-2``, about two units in the last place (``eps`` is
  ``2**-7``; one ulp is at most ``eps`` relative), so a difference of one or two roundings is equal, while
  a value 10% off is not (for any ``|eager|`` above 0.2). ``atol`` is raised from ``1e-5`` (less than one
  bfloat16 ulp anywhere above ``2**-10``, so meaningless for values of order 1) to the same ``1.6e-2``:
  near zero a value's rounding error is measured against the operands it was computed from (a sum that
  cancels, a softmax's smallest probabilities), not against itself.
- ``float16`` (and ``complex32``): the same rule, two ulps (``eps`` is ``2**-10``): ``(2e-3, 2e-3)``,
  where ``assert_close``'s ``rtol`` of ``1e-3`` is barely one ulp. A value 10% off is unequal above 0.03.
- ``float64`` (and ``complex128``): ``assert_close``'s ``(1e-7, 1e-7)``.

An output is judged by the loosest entry (the largest ``rtol`` and the largest ``atol``) over its own
dtype and the floating dtypes of every value computed on the way to it in the graph: ``logits.float()``
of a bfloat16 model is judged as bfloat16, a float64 output computed in float32 as float32. Inputs and
weights do not count, eager and compiled get the same ones. A floating dtype not listed here (the
float8 kinds) gets two ulps, ``2 * torch.finfo(dtype).eps`` for both. Integers and ``bool`` are compared
exactly. ``verify(..., tolerances={dtype: (rtol, atol)})`` overrides entries.
"""


def aoti_program(program: ExportedProgram, device: str = "cpu", *, dialect: Optional[Dialect] = None) -> ExportedProgram:
    """The ATen program AOTInductor compiles for ``program`` (whose ``dialect`` the caller may know) on ``device``.

    An Edge program, or one bound for another device than the CPU, is exported
    again from its module (on that device, with its stored example inputs):
    AOTInductor compiles ATen programs, for the device their tensors are on.
    Its dynamic dimensions are then specialized to the example inputs.
    """
    if not (dialect if dialect is not None else dialect_of(program)).is_edge and device == "cpu":
        return program
    if program.example_inputs is None:
        raise ValueError("strideguard: recompiling this program needs its stored example inputs")
    args, kwargs = _to_device(program.example_inputs, device)
    return torch.export.export(program.module().to(device), args, kwargs)


def compile_program(program: ExportedProgram, directory: str, *, device: str = "cpu") -> Any:
    """Compile ``program`` with AOTInductor for ``device`` into ``directory`` and load it; returns a callable."""
    return _compiled(aoti_program(program, device), directory)


def _compiled(program: ExportedProgram, directory: str) -> Any:
    """``compile_program`` for the ATen program AOTInductor compiles (``aoti_program``), exported once."""
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
    """What each user output should come back as: named, and held to its target layout, as the verified
    program's subject says (``decide.subject.Subject``); and the strides strideguard predicted (the plan
    ``inspect`` reports) and Inductor's lowering gave, each ``None`` where there is none."""

    subject: Subject
    predicted: tuple = ()
    lowered: tuple = ()


def expectations(subject: Subject, compiled: Subject) -> Expectations:
    """Targets from the verified program's ``subject`` (an Edge program's promised dim orders); predictions
    and lowering of the ATen program AOTInductor compiles for it (``compiled``: the subject itself, or a
    program of its own)."""
    predicted = [fact.reported for fact in program_plan(compiled, EXECUTORCH).outputs]
    lowering = lower_aten_outputs(compiled.program)
    return Expectations(
        subject,
        predicted=tuple(o.strides if o.kind == "tensor" and o.in_target_layout is not None else None for o in predicted),
        lowered=tuple(out.strides if out is not None else None for out in lowering.outputs),
    )


@quietly
def verify(
    program: ExportedProgram,
    example_inputs: Optional[Any] = None,
    *,
    device: str = "cpu",
    more_inputs: Sequence[Any] = (),
    reference: Optional[ExportedProgram] = None,
    tolerance: tuple[float, float] = PUSHDOWN_TOLERANCE,
    tolerances: Optional[Mapping[torch.dtype, tuple[float, float]]] = None,
    timeout: Optional[float] = None,
    memory: Optional[int] = None,
) -> VerifyReport:
    """Compile ``program`` with AOTInductor, run it, and check every user output.

    ``example_inputs`` is a tuple of positional arguments, or ``(args, kwargs)``;
    by default the program's stored example inputs. ``more_inputs`` are further
    input sets run on the same compiled artifact (a dynamic batch dimension at
    other sizes). Each output is checked against the program run eagerly
    (within ``EAGER_TOLERANCES`` for its dtype, entries of which ``tolerances``,
    a dict from ``torch.dtype`` to ``(rtol, atol)``, overrides; exactly for
    integers and ``bool``) and against its target layout (``program.density.has_layout``: exact strides, as
    ExecuTorch's runtime compares them), and its strides are compared with
    what ``inspect`` predicted and Inductor's lowering gave.

    With ``reference`` (the program before strideguard rewrote it), that
    program is compiled and run too, and each output must equal its
    reference's: bitwise, or, where ``program`` was pushed down, within
    ``tolerance`` (``(rtol, atol)``); ``reference_error`` is the largest
    difference measured.

    With ``timeout`` (seconds) or ``memory`` (bytes of resident memory), the
    whole check runs in a child process that is stopped when it passes
    either (``strideguard.prove.isolation``; the other limit takes its default):
    ``LimitExceeded`` says which. The programs reach the child through
    ``torch.export.save``.
    """
    if reference is not None:
        # Before anything runs, in-process or in the child: the reference is called on the program's inputs,
        # and a compiled reference exported at another size reads past them (a crash, blamed on the program).
        difference = reference_difference(require_exported_program(program, "verify"), require_exported_program(reference, "verify"))
        if difference is not None:
            raise ValueError(f"strideguard.verify: reference= is not this program's reference: {difference}")
    if timeout is not None or memory is not None:
        limits = Limits(timeout if timeout is not None else DEFAULT_SECONDS, memory)
        options = dict(
            example_inputs=example_inputs, device=device, more_inputs=more_inputs, tolerance=tolerance, tolerances=tolerances
        )
        with tempfile.TemporaryDirectory(prefix="strideguard-verify-") as directory:
            saved = _saved(require_exported_program(program, "verify"), os.path.join(directory, "program.pt2"))
            reference_saved = None
            if reference is not None:
                reference_saved = _saved(require_exported_program(reference, "verify"), os.path.join(directory, "reference.pt2"))
            return run_isolated(_verify_saved, saved, reference_saved, options, limits=limits)
    program = require_exported_program(program, "verify")
    if reference is not None:
        reference = require_exported_program(reference, "verify")
    if not (isinstance(tolerance, tuple) and len(tolerance) == 2 and all(isinstance(t, float) and t >= 0 for t in tolerance)):
        raise TypeError(f"strideguard.verify: tolerance must be a tuple (rtol, atol) of non-negative floats, got {tolerance!r}")
    table = _tolerance_table(tolerances)
    if not isinstance(device, str) or device not in DEVICES:
        raise ValueError(f"strideguard.verify: device must be one of {', '.join(DEVICES)}, got {device!r}")
    if not isinstance(more_inputs, (list, tuple)):
        raise TypeError(f"strideguard.verify: more_inputs must be a list or tuple of input sets, got {type(more_inputs).__name__}")
    subject = subject_of(program, "verify", device=device)
    with tempfile.TemporaryDirectory(prefix="strideguard-") as directory:
        compiled_program = aoti_program(program, device, dialect=subject.dialect)
        compiled_subject = subject if compiled_program is program else subject_of(compiled_program, "verify", device=device)
        expected = expectations(subject, compiled_subject)
        started = time.perf_counter()
        compiled = _compiled(compiled_program, directory)
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
            tolerances=table,
        )


class _Symbols:
    """One program's size symbols renamed in the order its inputs show them (``d0``, ``d1``, ...), so that two
    programs exported alike compare equal whatever torch called their symbols (``s77`` here, ``s0`` there),
    and two sizes that are one symbol in one program must be one symbol in the other; each with its range."""

    def __init__(self, program: ExportedProgram):
        self.ranges = {str(symbol): bounds for symbol, bounds in program.range_constraints.items()}
        self.renamed: dict[sympy.Symbol, sympy.Symbol] = {}
        self.first_seen: dict[sympy.Symbol, str] = {}

    def sizes(self, sizes: Sequence[Any], where: str) -> tuple[str, str]:
        """The sizes of ``where`` (an input or output) as compared (numbers, and expressions over the renamed
        symbols with their ranges) and as shown (the program's own symbols, each with its range where it first
        appears, else where it did: ``s77 is x.size(0)``)."""
        compared, shown, notes = [], [], {}
        for dim, size in enumerate(sizes):
            expr = size.node.expr if isinstance(size, torch.SymInt) else size
            if not isinstance(expr, sympy.Expr) or expr.is_number:
                compared.append(str(int(expr)))
                shown.append(str(int(expr)))
                continue
            symbols = sorted(expr.free_symbols, key=str)  # a new symbol is numbered where it first appears
            for symbol in symbols:
                if symbol not in self.renamed:
                    self.renamed[symbol] = sympy.Symbol(f"d{len(self.renamed)}", integer=True)
                    self.first_seen[symbol] = f"{where}.size({dim})"
                    notes.setdefault(str(symbol), f"{symbol} {self._span(symbol)}")
                else:
                    notes.setdefault(str(symbol), f"{symbol} is {self.first_seen[symbol]}")
            ranges = ", ".join(f"{self.renamed[symbol]} {self._span(symbol)}" for symbol in symbols)
            compared.append(f"{expr.xreplace(self.renamed)} with {ranges}")
            shown.append(str(expr))
        return "; ".join(compared), f"[{', '.join(shown)}]" + (f" ({', '.join(notes.values())})" if notes else "")

    def _span(self, symbol: sympy.Symbol) -> str:
        bounds = self.ranges.get(str(symbol))
        if bounds is None:
            return "of any value"
        upper = bounds.upper
        return f"at least {bounds.lower}" if upper in (int_oo, sympy.oo, float("inf")) else f"from {bounds.lower} to {upper}"


def _described(value: Any, symbols: _Symbols, where: str) -> tuple[str, str]:
    """What a call takes or gives at one place: (the form compared, the text a message shows)."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        compared, shown = symbols.sizes(value.shape, where)
        return f"tensor {dtype} {compared}", f"a {dtype} tensor {shown}"
    if isinstance(value, torch.SymInt):
        compared, shown = symbols.sizes([value], where)
        return f"size {compared}", f"the size {shown.removeprefix('[').replace(']', '', 1)}"
    return f"{type(value).__name__} {value!r}", f"the {type(value).__name__} {value!r}"


def _user_input_values(program: ExportedProgram) -> list[tuple[str, Any]]:
    """Each user input's name and traced value (a fake tensor, a symbolic size, or the constant it was)."""
    placeholders = {node.name: node for node in program.graph.find_nodes(op="placeholder")}
    return [
        (name, placeholders[name].meta.get("val") if name in placeholders else None)
        for name in program.graph_signature.user_inputs
    ]


def _user_output_values(program: ExportedProgram) -> list[Any]:
    """Each user output's traced value, in return order."""
    returned = output_values(program.graph)
    values = [returned[out.position] for out in user_outputs(program.graph_signature)]
    return [value.meta.get("val") if isinstance(value, torch.fx.Node) else value for value in values]


def reference_difference(program: ExportedProgram, reference: ExportedProgram) -> Optional[str]:
    """What makes ``reference`` unfit to stand beside ``program`` in ``verify``, in words (``None``: nothing).

    ``verify`` runs the compiled reference on the program's inputs and compares output with output, so the
    reference must take the same inputs (as many, nested alike, each of the same shape and dtype,
    every symbolic size over the same range, the same constants) and return the same outputs (as many, named
    alike, each of the same shape and dtype). Unchecked, a reference exported at another input size read
    past the input's memory (a crash in the child, blamed on the program; in-process, a crash of the
    caller), and one whose outputs differed in shape or dtype was reported equal (``reference_error`` 0)."""
    ours, theirs = _Symbols(program), _Symbols(reference)
    inputs, reference_inputs = _user_input_values(program), _user_input_values(reference)
    names, reference_names = [name for name, _ in inputs], [name for name, _ in reference_inputs]
    if len(names) != len(reference_names):  # by position: the call passes them so, whatever each is called
        return (
            f"the reference takes {_counted(reference_names, 'input')} and the program {_counted(names, 'input')}"
        )
    for (name, value), (_, reference_value) in zip(inputs, reference_inputs):
        compared, shown = _described(value, ours, name)
        reference_compared, reference_shown = _described(reference_value, theirs, name)
        if compared != reference_compared:
            return f"input {name} is {reference_shown} in the reference and {shown} in the program"
    if program.call_spec.in_spec != reference.call_spec.in_spec:
        return "the reference takes its inputs nested otherwise than the program (arguments, keywords, containers)"
    outputs, reference_outputs = _user_output_values(program), _user_output_values(reference)
    names, reference_names = output_names(program, len(outputs)), output_names(reference, len(reference_outputs))
    if names != reference_names:
        return (
            f"the reference returns {_counted(reference_names, 'output')} and the program {_counted(names, 'output')}"
        )
    for index, (name, value, reference_value) in enumerate(zip(names, outputs, reference_outputs)):
        compared, shown = _described(value, ours, name)
        reference_compared, reference_shown = _described(reference_value, theirs, name)
        if compared != reference_compared:
            return f"output {index} ({name}) is {reference_shown} in the reference and {shown} in the program"
    return None


def _counted(names: Sequence[str], what: str) -> str:
    return f"{len(names)} {what}{'' if len(names) == 1 else 's'} ({', '.join(names)})"


def _saved(program: ExportedProgram, path: str) -> str:
    torch.export.save(program, path)
    return path


def _verify_saved(path: str, reference_path: Optional[str], options: dict) -> VerifyReport:
    """``verify`` in the child ``run_isolated`` starts, on programs the parent saved (so trusted)."""
    reference = torch.export.load(reference_path) if reference_path is not None else None
    return verify(torch.export.load(path), reference=reference, **options)


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
    tolerances: Optional[Mapping[torch.dtype, tuple[float, float]]] = None,
) -> VerifyReport:
    """Run an already compiled ``program`` on each input set and check its outputs: against the program run
    eagerly within ``EAGER_TOLERANCES`` (``tolerances`` overrides entries, as for ``verify``); with ``reference``
    (another compiled callable), against its outputs too: within ``tolerance``, or bitwise when it is ``None``."""
    table = _tolerance_table(tolerances)
    if example_inputs is None:
        if program.example_inputs is None:
            raise ValueError("strideguard.verify: the program stores no example inputs; pass example_inputs")
        example_inputs = program.example_inputs
    if expected is None:
        expected = Expectations(subject_of(program, "verify", device=device))
    computed = _computed_on_the_way(expected.subject)
    input_sets = [_split_inputs(example_inputs)] + [_split_inputs(i) for i in more_inputs]
    eager = program.module()
    runs = []
    with torch.no_grad():
        for number, (args, kwargs) in enumerate(input_sets):
            expected_values = eager(*args, **kwargs)
            sizes = _symbol_values(program, args, kwargs)
            args, kwargs = _to_device((args, kwargs), device)
            got = compiled(*args, **kwargs)
            checks = _check_outputs(program, got, expected_values, (args, kwargs), expected, sizes, table, computed)
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
        comparable = value.shape == reference.shape and value.dtype == reference.dtype
        # another shape or dtype is no match at any distance (``verify`` refuses such a reference up front;
        # ``check_compiled`` is handed a compiled one it cannot look into)
        error = largest_difference(value, reference) if comparable else float("inf")
        same = _values_match(value, reference, tolerance)
        measured.append(replace(check, reference_error=error, match=check.match and same))
    return tuple(measured)


def largest_difference(value: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest ``|value - reference|`` over the elements, by the one NaN rule of every comparison
    strideguard makes: a NaN equals a NaN (difference 0), an infinity equals itself (0) and nothing else
    (infinite), and a NaN against a number is infinitely far from it. In float64 (complex128), so that a
    narrower dtype's difference is not rounded again; 0 for an empty tensor."""
    if not value.numel():
        return 0.0
    wide = torch.complex128 if value.is_complex() else torch.float64
    value, reference = value.to(wide), reference.to(value.device, wide)
    difference = (value - reference).abs()
    same = (value == reference) | (value.isnan() & reference.isnan())
    difference = torch.where(same, torch.zeros_like(difference), difference.nan_to_num(nan=float("inf"), posinf=float("inf")))
    return float(difference.max())


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


def _check_outputs(
    program, got, expected_values, inputs, expected: Expectations, sizes: dict,
    table: Mapping = EAGER_TOLERANCES, computed: Sequence[frozenset] = (),
) -> tuple[OutputCheck, ...]:
    subject = expected.subject
    specs = subject.outputs
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
        t.untyped_storage().data_ptr(): Alias(AliasKind.INPUT, name)
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
        _check_one(out, value, reference, input_storages, output_storages, OutputExpectation(
            name=subject.names[out.index], kept=subject.requested.get(out.index) == KEEP, line=subject.lines[out.index],
            target_order=subject.target_orders[out.index],
            predicted=at(expected.predicted, out.index),
            lowered=at(expected.lowered, out.index),
            tolerance=_output_tolerance(
                reference.dtype, computed[out.index] if out.index < len(computed) else (), table
            ) if isinstance(reference, torch.Tensor) else None,
        ))
        for out, value, reference in zip(specs, got_leaves, expected_leaves)
    )


_NON_TENSOR_KINDS = {type(None): OutputKind.NONE, bool: OutputKind.BOOL, int: OutputKind.INT, float: OutputKind.FLOAT}


@dataclass(frozen=True)
class OutputExpectation:
    """What one output is measured against, besides its eager value."""

    target_order: Optional[tuple] = None
    predicted: Optional[tuple] = None
    """The strides ``inspect`` predicted, at the run's sizes."""
    lowered: Optional[tuple] = None
    """The strides Inductor's lowering gave, at the run's sizes."""
    tolerance: Optional[tuple[float, float]] = None
    """The ``(rtol, atol)`` its floating values must equal eager's within (``None``: exactly); an integer or
    ``bool`` output is compared exactly whatever it is."""
    name: Optional[str] = None
    kept: bool = False
    """The user asked for it as the compiler lays it out."""
    line: Optional[str] = None


def _check_one(out, value, reference, input_storages, output_storages, expected: OutputExpectation) -> OutputCheck:
    """One output measured against ``expected``."""
    node = getattr(out.spec.arg, "name", None) or None
    name = expected.name or node
    if not isinstance(reference, torch.Tensor):
        # AOTInductor hands back an int or float output as a 0-dim tensor.
        kind = _NON_TENSOR_KINDS.get(type(reference), OutputKind.OTHER)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        return OutputCheck(
            index=out.index, name=name, kind=kind, match=value == reference, node=node, source_line=expected.line
        )
    shape, strides = tuple(value.shape), tuple(value.stride())
    aliases = []
    if value.numel():
        pointer = value.untyped_storage().data_ptr()
        if pointer in input_storages:
            aliases.append(input_storages[pointer])
        aliases += [Alias(AliasKind.OUTPUT, i) for i in memory_group_peer(output_storages.get(pointer, ()), out.index)]
    reference = reference.to(value.device)
    tolerance = expected.tolerance if value.is_floating_point() or value.is_complex() else None
    comparable = value.shape == reference.shape and value.dtype == reference.dtype
    error = largest_difference(value, reference) if comparable else 0.0
    match = _values_match(value, reference, tolerance)
    order = expected.target_order if expected.target_order is not None else density.identity_order(value.dim())
    return OutputCheck(
        index=out.index,
        name=name,
        kind=OutputKind.TENSOR,
        shape=shape,
        dtype=str(value.dtype).removeprefix("torch."),
        strides=strides,
        storage_offset=value.storage_offset(),
        contiguous=value.is_contiguous(),
        dense=density.is_non_overlapping_and_dense(shape, strides),
        target_dim_order=tuple(order),
        in_target_layout=density.has_layout(shape, strides, order) is True,
        aliases=tuple(aliases),
        max_abs_error=error,
        eager_tolerance=tolerance,
        match=bool(match),
        predicted_strides=expected.predicted,
        lowered_strides=expected.lowered,
        node=node,
        kept=expected.kept,
        source_line=expected.line,
    )


def _values_match(value: torch.Tensor, reference: torch.Tensor, tolerance: Optional[tuple[float, float]]) -> bool:
    """Whether ``value`` equals ``reference`` (same shape and dtype): within ``(rtol, atol)`` for floating and
    complex values, exactly when ``tolerance`` is ``None`` or the dtype is not floating; in every case by the
    NaN rule of ``largest_difference`` (a NaN equals a NaN, an infinity only itself).

    The comparison runs in float64 (complex128), where the difference of two values of a narrower dtype and
    the allowance ``atol + rtol * |reference|`` are exact or nearly so: in bfloat16 they would be rounded again.
    """
    if value.shape != reference.shape or value.dtype != reference.dtype:
        return False
    reference = reference.to(value.device)
    if not (value.is_floating_point() or value.is_complex()):
        return bool(torch.equal(value, reference))
    if tolerance is None:
        return largest_difference(value, reference) == 0.0
    if not value.numel():
        return True
    wide = torch.complex128 if value.is_complex() else torch.float64
    rtol, atol = tolerance
    return bool(torch.isclose(value.to(wide), reference.to(wide), rtol=rtol, atol=atol, equal_nan=True).all())


def _tolerance_table(tolerances: Any) -> dict[torch.dtype, tuple[float, float]]:
    """``EAGER_TOLERANCES`` with the entries of ``tolerances`` (``verify``'s keyword) put over it, checked."""
    if tolerances is None:
        return dict(EAGER_TOLERANCES)
    if not isinstance(tolerances, Mapping):
        raise TypeError(
            "strideguard.verify: tolerances must be a dict mapping a torch.dtype to (rtol, atol), "
            f"got {type(tolerances).__name__}"
        )
    table = dict(EAGER_TOLERANCES)
    for dtype, pair in tolerances.items():
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"strideguard.verify: tolerances keys must be torch dtypes (torch.bfloat16), got {dtype!r}")
        if not (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(
                f"strideguard.verify: tolerances[{dtype}]: {dtype} is compared exactly; "
                "only floating and complex dtypes take a tolerance"
            )
        if not (
            isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in pair)
        ):
            raise TypeError(
                f"strideguard.verify: tolerances[{dtype}] must be a tuple (rtol, atol) of two numbers, got {pair!r}"
            )
        if not all(0 <= t < float("inf") for t in pair):
            raise ValueError(
                f"strideguard.verify: tolerances[{dtype}] must be (rtol, atol), each finite and non-negative, "
                f"got {pair!r}"
            )
        table[dtype] = (float(pair[0]), float(pair[1]))
    return table


def _loosest(
    dtypes: Iterable[torch.dtype], table: Mapping[torch.dtype, tuple[float, float]]
) -> Optional[tuple[float, float]]:
    """The largest ``rtol`` and the largest ``atol`` over the floating and complex ``dtypes``, each from ``table``
    or, where it has none, two ulps (``2 * eps``); ``None`` (exact) when none of them has one."""
    rtol = atol = None
    for dtype in dtypes:
        if not (dtype.is_floating_point or dtype.is_complex):
            continue
        pair = table.get(dtype)
        if pair is None:
            try:
                eps = torch.finfo(dtype).eps
            except (TypeError, RuntimeError):  # a packed dtype (float4_e2m1fn_x2) has no ulp to go by
                continue
            pair = (2 * eps, 2 * eps)
        rtol = pair[0] if rtol is None else max(rtol, pair[0])
        atol = pair[1] if atol is None else max(atol, pair[1])
    return None if rtol is None else (rtol, atol)


def _computed_dtypes(value: Any) -> set:
    """The dtype a node computes (a single tensor); none for a placeholder or a node of several outputs,
    whose ``getitem`` users say which one they take."""
    if not isinstance(value, torch.fx.Node) or value.op not in ("call_function", "call_method", "call_module"):
        return set()
    fake = value.meta.get("val")
    return {fake.dtype} if isinstance(fake, torch.Tensor) else set()


def _computed_on_the_way(subject: Subject) -> tuple[frozenset, ...]:
    """For each user output, the dtypes computed on the way to it in the graph, its own included."""
    program = subject.program
    computed: dict[torch.fx.Node, frozenset] = {}
    for node in program.graph.nodes:
        found = set(_computed_dtypes(node))
        for parent in node.all_input_nodes:
            found |= computed.get(parent, frozenset())
        computed[node] = frozenset(found)
    returned = output_values(program.graph)
    return tuple(
        computed.get(returned[out.position], frozenset())
        if out.position < len(returned) and isinstance(returned[out.position], torch.fx.Node) else frozenset()
        for out in subject.outputs
    )


def _output_tolerance(
    dtype: torch.dtype,
    computed: Iterable[torch.dtype] = (),
    table: Mapping[torch.dtype, tuple[float, float]] = EAGER_TOLERANCES,
) -> Optional[tuple[float, float]]:
    """The ``(rtol, atol)`` an output of ``dtype`` computed through ``computed`` dtypes must equal eager's within,
    by ``table`` (``EAGER_TOLERANCES`` with ``verify``'s overrides); ``None``: exactly (integers, ``bool``)."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return None
    return _loosest({dtype, *computed}, table)

"""Random programs as plain data, the module each describes, the hypothesis strategy, and the checks.

A generated program is a ``ProgramSpec``: inputs, weights, a few values (each
a source followed by view ops with ordinary compute between them) and the
outputs that return them. It is data, not code, so a failing example can be
written to JSON, read back and replayed exactly; ``GeneratedModule`` turns it
into the ``nn.Module`` that is exported.

The strategy draws each step against "probe" tensors on the meta device that
follow the eager values step by step, so every drawn step is legal for the
shape and strides it meets. With a dynamic batch the probes are built at two
batch sizes; a dimension whose size differs between them carries the batch,
and steps that would fix it to a constant (select, narrow, split, ...) are not
drawn there, which keeps export's rejections rare.

``check_program`` checks the contract on one program, eagerly, with the
layouts AOTInductor will return predicted by ``compiled_strides``;
``check_compiled_sample`` checks that prediction against AOTInductor itself.
Failures are kept as JSON records under ``tests/regressions/``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from hypothesis import strategies as st
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind as OutputSpecKind, TensorArgument
from torch.utils import _pytree as pytree

import strideguard
from strideguard import Action
from strideguard.program import density
from strideguard.decide.subject import subject_of
from strideguard.fix.engine import AsCompiled, Choices, lower_as_compiled
from strideguard.program.dialect import copy_call, dialect_of
from strideguard.program.promises import target_dim_orders
from strideguard.compiler.oracle.lowering import lower_edge_outputs, lower_outputs
from strideguard.decide.view_conversion import STRIDEGUARD
from strideguard.program.copies import copied_source
from strideguard.program.copies import copy_form_of
from strideguard.program.exported import user_outputs
from strideguard.program.copies import is_involution
from strideguard.prove.verification import PUSHDOWN_TOLERANCE, compile_program

from .conftest import HAS_EXECUTORCH

if HAS_EXECUTORCH:  # the Edge halves of the checks; the ATen halves run without ExecuTorch
    from executorch.exir.dialects._ops import ops as exir_ops

    from strideguard.executorch import DenseOutputsPass
    from strideguard.testing.executorch_cpu import aoti_edge_program

def _remember_composite_ops() -> None:
    """Compute torch's set of composite-implicit ops once per process rather than in every
    ``run_decompositions`` (which ``to_edge`` calls): it walks every operator namespace, 0.15 s a call,
    most of the eager checks' time. Registered ops do not change while the tests run."""
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    collect = getattr(exported_program, "_collect_all_valid_cia_ops", None)
    if collect is None or getattr(collect, "remembered", False):
        return
    known: list = []

    def remembered() -> set:
        if not known:
            known.append(frozenset(collect()))
        return set(known[0])

    remembered.remembered = True
    exported_program._collect_all_valid_cia_ops = remembered
    decomp_utils._collect_all_valid_cia_ops = remembered


_remember_composite_ops()

EXAMPLE_BATCH = 3
"""The batch size programs are exported with."""

OTHER_BATCH = 5
"""A second batch size a dynamic program is run at."""

MAX_DIMS = 5
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
DTYPES = FLOAT_DTYPES + ("int64", "int32", "uint8", "bool")
"""float32 first: hypothesis shrinks towards the first choice."""

VIEW_OPS = (
    "detach", "slice", "select", "narrow", "transpose", "permute", "expand", "unsqueeze", "squeeze",
    "split", "chunk", "unbind", "diagonal", "view", "reshape", "T",
)
COMPUTE_OPS = (
    "add", "mul", "neg", "logical_not", "to", "linear", "cat", "stack", "kv_update", "sdpa", "layer_norm",
    "rms_norm", "softmax", "matmul", "conv",
)
"""Ordinary compute, and what real models return: concatenations (empty and single inputs included), a
KV cache's first and later updates, attention, norms, and extern kernels (GEMMs, convolution)."""

MODULE_STEPS = ("linear", "conv")
"""Steps whose weights live in a module of their own."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    """Sizes at the example batch; with a dynamic batch, dimension 0 of input 0 is the batch."""
    dtype: str
    channels_last: bool = False
    """A 4-D input laid out channels-last, as a vision pipeline hands it over."""


@dataclass(frozen=True)
class WeightSpec:
    kind: str
    """``parameter`` or ``buffer``."""
    tensor: TensorSpec


@dataclass(frozen=True)
class Step:
    op: str
    args: tuple = ()


@dataclass(frozen=True)
class ValueSpec:
    source: tuple[str, int]
    """``("input", i)``, ``("weight", i)`` or ``("value", i)`` for an earlier value."""
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class ProgramSpec:
    inputs: tuple[TensorSpec, ...]
    weights: tuple[WeightSpec, ...]
    values: tuple[ValueSpec, ...]
    outputs: tuple[tuple, ...]
    """Each ``("value", i)``, ``("input", i)``, ``("weight", i)``, ``("none",)``,
    ``("int", k)`` or ``("size", input, dim)`` (a SymInt with a dynamic batch)."""
    dynamic_batch: bool = False
    mutates_buffer: bool = False
    """Whether forward also bumps a counter buffer: in the functional form (``run_decompositions``,
    ``to_edge``) the graph then returns a buffer mutation before the user outputs."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> "ProgramSpec":
        def tensor(d):
            return TensorSpec(tuple(d["shape"]), d["dtype"], d.get("channels_last", False))

        return ProgramSpec(
            inputs=tuple(tensor(d) for d in data["inputs"]),
            weights=tuple(WeightSpec(d["kind"], tensor(d["tensor"])) for d in data["weights"]),
            values=tuple(
                ValueSpec(tuple(v["source"]), tuple(Step(s["op"], tuple(s["args"])) for s in v["steps"]))
                for v in data["values"]
            ),
            outputs=tuple(tuple(o) for o in data["outputs"]),
            dynamic_batch=data["dynamic_batch"],
            mutates_buffer=data["mutates_buffer"],
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Building and running


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def make_tensor(spec: TensorSpec, seed: int, *, batch: Optional[int] = None) -> torch.Tensor:
    """Deterministic, NaN-free values; small integers, so that compute cannot overflow."""
    shape = list(spec.shape)
    if batch is not None:
        shape[0] = batch
    generator = torch.Generator().manual_seed(seed)
    dtype = _dtype(spec.dtype)
    if dtype.is_floating_point:
        value = torch.randn(shape, generator=generator).to(dtype)
        return value.to(memory_format=torch.channels_last) if spec.channels_last else value
    if dtype is torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    low = 0 if dtype is torch.uint8 else -50
    return torch.randint(low, 50, shape, generator=generator, dtype=dtype)


def make_inputs(spec: ProgramSpec, batch: int = EXAMPLE_BATCH) -> tuple[torch.Tensor, ...]:
    return tuple(
        make_tensor(t, seed=100 + i, batch=batch if spec.dynamic_batch and i == 0 else None)
        for i, t in enumerate(spec.inputs)
    )


def input_sets(spec: ProgramSpec) -> list[tuple[torch.Tensor, ...]]:
    """The example inputs, and for a dynamic batch the same program at another batch size."""
    sets = [make_inputs(spec)]
    if spec.dynamic_batch:
        sets.append(make_inputs(spec, OTHER_BATCH))
    return sets


def runnable_sets(program: ExportedProgram, sets: list[tuple]) -> list[tuple]:
    """The example inputs, and each other input set the program itself accepts: ``run_decompositions`` can
    keep a batch range of [2, 64] and still guard the batch below it (found by ``make fuzz``: ``2 + 8 *
    batch <= 32`` after decomposing a buffer-mutating program with a channels-last input), and a program
    that cannot run at a batch has nothing to be compared with there."""
    kept = sets[:1]
    for inputs in sets[1:]:
        try:
            run(program, inputs)
        except AssertionError as error:
            if "Guard failed" not in str(error):
                raise
            continue
        kept.append(inputs)
    return kept


def dynamic_shapes(spec: ProgramSpec, batch: Optional[Dim] = None) -> Optional[tuple]:
    if not spec.dynamic_batch:
        return None
    batch = batch or Dim("batch", min=2, max=64)
    # ``forward(*inputs)`` takes one argument, the tuple of inputs.
    return (tuple({0: batch} if i == 0 else None for i in range(len(spec.inputs))),)


def apply_step(t: torch.Tensor, step: Step, module: Optional[nn.Module] = None) -> torch.Tensor:
    """One step, as user code writes it; the same code runs on the probes and in the module."""
    op, args = step.op, step.args
    if op == "detach":
        return t.detach()
    if op == "slice":
        dim, start, stop, stride = args
        return t[(slice(None),) * dim + (slice(start, stop, stride),)]
    if op == "select":
        return t.select(*args)
    if op == "narrow":
        return t.narrow(*args)
    if op == "transpose":
        return t.transpose(*args)
    if op == "permute":
        return t.permute(*args)
    if op == "expand":
        return t.expand(list(args))
    if op == "unsqueeze":
        return t.unsqueeze(*args)
    if op == "squeeze":
        return t.squeeze(*args)
    if op == "split":
        size, dim, index = args
        return t.split(list(size) if isinstance(size, (list, tuple)) else size, dim)[index]
    if op == "chunk":
        chunks, dim, index = args
        return t.chunk(chunks, dim)[index]
    if op == "unbind":
        dim, index = args
        return t.unbind(dim)[index]
    if op == "diagonal":
        return t.diagonal(*args)
    if op == "view":
        return t.view(list(args))
    if op == "reshape":
        return t.reshape(list(args))
    if op == "T":
        return t.T
    if op == "add":
        return t + args[0]
    if op == "mul":
        return t * args[0]
    if op == "neg":
        return -t
    if op == "logical_not":
        return torch.logical_not(t)
    if op == "to":
        return t.to(_dtype(args[0]))
    if op in MODULE_STEPS:
        return module(t)
    if op == "cat":
        how, dim = args
        # "empty" is a KV cache's first update: torch.cat([torch.tensor([]), new]).
        parts = {"empty": [t.new_empty(0), t], "single": [t], "twice": [t, t], "pair": [t, t + 1]}[how]
        return torch.cat(parts, dim)
    if op == "stack":
        how, dim = args
        return torch.stack({"single": [t], "pair": [t, t * 2]}[how], dim)
    if op == "kv_update":
        past_length, dim = args
        shape = list(t.shape)
        shape[dim] = past_length
        return torch.cat([t.new_zeros(shape), t], dim)
    if op == "sdpa":
        return torch.nn.functional.scaled_dot_product_attention(t, t, t)
    if op == "layer_norm":
        return torch.nn.functional.layer_norm(t, t.shape[-1:])
    if op == "rms_norm":
        return torch.nn.functional.rms_norm(t, t.shape[-1:])
    if op == "softmax":
        return t.softmax(args[0])
    if op == "matmul":
        (transposed,) = args
        product = t @ t.mT
        return product.mT if transposed else product
    raise ValueError(f"unknown step {op}")


def make_module(step: Step, generator: Optional[torch.Generator] = None, device: str = "cpu") -> nn.Module:
    """The module a ``linear`` or ``conv`` step runs, with deterministic weights."""
    if step.op == "linear":
        in_features, out_features = step.args
        layer = nn.Linear(in_features, out_features, device=device)
    else:
        in_channels, out_channels, kernel = step.args
        layer = nn.Conv2d(in_channels, out_channels, kernel, device=device)
    if generator is not None:
        with torch.no_grad():
            for parameter in layer.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return layer


def _linear_name(value: int, step: int) -> str:
    return f"linear_{value}_{step}"


class GeneratedModule(nn.Module):
    """The module a ``ProgramSpec`` describes."""

    def __init__(self, spec: ProgramSpec):
        super().__init__()
        self.spec = spec
        for i, weight in enumerate(spec.weights):
            tensor = make_tensor(weight.tensor, seed=200 + i)
            if weight.kind == "parameter":
                self.register_parameter(f"weight_{i}", nn.Parameter(tensor, requires_grad=False))
            else:
                self.register_buffer(f"weight_{i}", tensor)
        if spec.mutates_buffer:
            self.register_buffer("counter", torch.zeros(1, dtype=torch.int64))
        self.linears = nn.ModuleDict()
        generator = torch.Generator().manual_seed(300)
        for v, value in enumerate(spec.values):
            for s, step in enumerate(value.steps):
                if step.op in MODULE_STEPS:
                    self.linears[_linear_name(v, s)] = make_module(step, generator)

    def forward(self, *inputs):
        if self.spec.mutates_buffer:
            self.counter.add_(1)
        values: list[torch.Tensor] = []

        def tensor(ref):
            kind, i = ref[0], ref[1]
            if kind == "input":
                return inputs[i]
            if kind == "weight":
                return getattr(self, f"weight_{i}")
            return values[i]

        for v, value in enumerate(self.spec.values):
            t = tensor(value.source)
            for s, step in enumerate(value.steps):
                t = apply_step(t, step, self.linears[_linear_name(v, s)] if step.op in MODULE_STEPS else None)
            values.append(t)
        outputs = []
        for ref in self.spec.outputs:
            if ref[0] == "none":
                outputs.append(None)
            elif ref[0] == "int":
                outputs.append(ref[1])
            elif ref[0] == "size":
                outputs.append(inputs[ref[1]].shape[ref[2]])
            else:
                outputs.append(tensor(ref))
        return tuple(outputs)


class CombinedModule(nn.Module):
    """Several generated programs as one method, so that one AOTInductor compile covers them all."""

    def __init__(self, specs: Sequence[ProgramSpec]):
        super().__init__()
        self.specs = list(specs)
        self.parts = nn.ModuleList(GeneratedModule(s) for s in specs)

    def forward(self, *inputs):
        outputs = []
        start = 0
        for spec, part in zip(self.specs, self.parts):
            outputs += part(*inputs[start:start + len(spec.inputs)])
            start += len(spec.inputs)
        return tuple(outputs)


def combined_inputs(specs: Sequence[ProgramSpec], batch: int = EXAMPLE_BATCH) -> tuple[torch.Tensor, ...]:
    return tuple(t for spec in specs for t in make_inputs(spec, batch))


def combined_dynamic_shapes(specs: Sequence[ProgramSpec]) -> Optional[tuple]:
    """One batch dimension shared by every part that has one."""
    if not any(s.dynamic_batch for s in specs):
        return None
    batch = Dim("batch", min=2, max=64)
    return (tuple(
        entry for spec in specs for entry in (dynamic_shapes(spec, batch) or ((None,) * len(spec.inputs),))[0]
    ),)


# ---------------------------------------------------------------------------------------------
# The strategy


class Probe:
    """Meta tensors standing for one value at each batch size the program runs at."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.tensors = tuple(tensors)

    @staticmethod
    def of(spec: TensorSpec, batched: bool) -> "Probe":
        batches = (EXAMPLE_BATCH, OTHER_BATCH) if batched else (None,)
        probes = []
        for batch in batches:
            shape = list(spec.shape)
            if batch is not None:
                shape[0] = batch
            probe = torch.empty(shape, dtype=_dtype(spec.dtype), device="meta")
            probes.append(probe.to(memory_format=torch.channels_last) if spec.channels_last else probe)
        return Probe(probes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensors[0].shape)

    @property
    def ndim(self) -> int:
        return self.tensors[0].dim()

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[0].dtype

    @property
    def batch_dims(self) -> set[int]:
        """Dimensions whose size depends on the batch."""
        return {d for d in range(self.ndim) if len({t.shape[d] for t in self.tensors}) > 1}

    def fixed_dims(self) -> list[int]:
        return [d for d in range(self.ndim) if d not in self.batch_dims]

    def then(self, step: Step) -> "Probe":
        module = make_module(step, device="meta") if step.op in MODULE_STEPS else None
        return Probe([apply_step(t, step, module) for t in self.tensors])


def _index_or_negative(draw, index: int, size: int) -> int:
    """``index`` as drawn, or the same position counted from the end."""
    return index - size if draw(st.booleans()) else index


def _dim(draw, dims: Sequence[int], ndim: int) -> int:
    return _index_or_negative(draw, draw(st.sampled_from(dims)), ndim)


def _applicable_views(probe: Probe) -> list[str]:
    shape, ndim, fixed = probe.shape, probe.ndim, probe.fixed_dims()
    ops = ["detach", "reshape", "view", "expand"]
    if ndim >= 1:
        ops += ["slice", "transpose", "permute", "squeeze"]
    if ndim < MAX_DIMS:
        ops.append("unsqueeze")
    if fixed:
        ops += ["narrow", "split", "chunk"]
    if any(shape[d] > 0 for d in fixed):
        ops += ["select", "unbind"]
    if len(fixed) >= 2:
        ops.append("diagonal")
    if ndim == 2:
        ops.append("T")  # other ranks are deprecated
    if probe.batch_dims and 0 in shape:
        ops.remove("view")  # -1 cannot stand for the batch in a zero-size tensor
        ops.remove("reshape")
    return [op for op in VIEW_OPS if op in ops]


def _view_shape(draw, probe: Probe) -> tuple[int, ...]:
    """A new shape for ``view``/``reshape``: dimensions merged, split or added; the batch as ``-1``."""
    shape, batch = list(probe.shape), probe.batch_dims
    # Each new dimension remembers whether it carries the batch.
    dims = [(size, d in batch) for d, size in enumerate(shape)]
    how = draw(st.sampled_from(["merge", "split", "add_one", "flatten"]))
    if how == "merge" and len(dims) >= 2:
        i = draw(st.integers(0, len(dims) - 2))
        dims[i:i + 2] = [(dims[i][0] * dims[i + 1][0], dims[i][1] or dims[i + 1][1])]
    elif how == "split" and len(dims) < MAX_DIMS and any(not b and s >= 2 for s, b in dims):
        i = draw(st.sampled_from([k for k, (s, b) in enumerate(dims) if not b and s >= 2]))
        size = dims[i][0]
        factor = draw(st.sampled_from([f for f in range(1, size + 1) if size % f == 0]))
        dims[i:i + 1] = [(factor, False), (size // factor, False)]
    elif how == "flatten":
        dims = [(math.prod(shape), bool(batch))]
    elif len(dims) < MAX_DIMS:
        i = draw(st.integers(0, len(dims)))
        dims.insert(i, (1, False))
    if any(b for _, b in dims):
        return tuple(-1 if b else s for s, b in dims)
    if 0 not in shape and dims and draw(st.booleans()):
        i = draw(st.integers(0, len(dims) - 1))
        dims[i] = (-1, False)
    return tuple(s for s, _ in dims)


@st.composite
def view_steps(draw, probe: Probe, among: Sequence[str] = VIEW_OPS) -> Step:
    """One view op legal for ``probe`` (of those ``among``)."""
    op = draw(st.sampled_from([op for op in _applicable_views(probe) if op in among]))
    shape, ndim, fixed, batch = probe.shape, probe.ndim, probe.fixed_dims(), probe.batch_dims
    if op in ("detach", "T"):
        return Step(op)
    if op == "slice":
        dim = draw(st.integers(0, ndim - 1))
        if dim in batch:
            return Step(op, (dim, None, None, 1))  # a step would make export guard the batch's parity
        size = shape[dim]
        bound = st.none() | st.integers(-size - 1, size + 1)
        return Step(op, (dim, draw(bound), draw(bound), draw(st.integers(1, 3))))
    if op == "select":
        dim = draw(st.sampled_from([d for d in fixed if shape[d] > 0]))
        index = draw(st.integers(0, shape[dim] - 1))
        return Step(op, (_index_or_negative(draw, dim, ndim), _index_or_negative(draw, index, shape[dim])))
    if op == "narrow":
        dim = draw(st.sampled_from(fixed))
        start = draw(st.integers(0, shape[dim]))
        length = draw(st.integers(0, shape[dim] - start))
        if start < shape[dim]:
            start = _index_or_negative(draw, start, shape[dim])
        return Step(op, (_index_or_negative(draw, dim, ndim), start, length))
    if op == "transpose":
        dims = list(range(ndim))
        return Step(op, (_dim(draw, dims, ndim), _dim(draw, dims, ndim)))
    if op == "permute":
        return Step(op, tuple(draw(st.permutations(range(ndim)))))
    if op == "expand":
        leading = draw(st.lists(st.integers(0, 3), max_size=max(0, min(2, MAX_DIMS - ndim))))
        sizes = [
            draw(st.sampled_from([-1, 2, 3, 0])) if size == 1 and d not in batch else -1 for d, size in enumerate(shape)
        ]
        return Step(op, tuple(leading + sizes))
    if op == "unsqueeze":
        return Step(op, (draw(st.integers(-ndim - 1, ndim)),))
    if op == "squeeze":
        return Step(op, (draw(st.integers(-ndim, ndim - 1)),))
    if op == "split":
        dim = draw(st.sampled_from(fixed))
        size = shape[dim]
        if size >= 1 and draw(st.booleans()):
            sections = []
            left = size
            while left:
                sections.append(draw(st.integers(1, left)))
                left -= sections[-1]
            split = sections
        else:
            split = draw(st.integers(1, max(size, 1)))
        count = len(probe.tensors[0].split(split, dim))
        return Step(op, (split, _index_or_negative(draw, dim, ndim), draw(st.integers(0, count - 1))))
    if op == "chunk":
        dim = draw(st.sampled_from(fixed))
        chunks = draw(st.integers(1, 4))
        count = len(probe.tensors[0].chunk(chunks, dim))
        return Step(op, (chunks, _index_or_negative(draw, dim, ndim), draw(st.integers(0, count - 1))))
    if op == "unbind":
        dim = draw(st.sampled_from([d for d in fixed if shape[d] > 0]))
        return Step(op, (_index_or_negative(draw, dim, ndim), draw(st.integers(0, shape[dim] - 1))))
    if op == "diagonal":
        first, second = draw(st.permutations(fixed))[:2]
        return Step(op, (draw(st.integers(-2, 2)), first, second))
    if op in ("view", "reshape"):
        new_shape = _view_shape(draw, probe)
        if op == "view":
            try:
                probe.then(Step("view", new_shape))
            except RuntimeError:
                op = "reshape"  # not viewable with these strides: reshape copies instead
        return Step(op, new_shape)
    raise AssertionError(op)


def _applicable_compute(probe: Probe) -> list[str]:
    dtype, shape, ndim, batch = probe.dtype, probe.shape, probe.ndim, probe.batch_dims
    ops = ["to"]
    if dtype is torch.bool:
        ops.append("logical_not")
    else:
        ops += ["add", "mul"]
        if dtype is not torch.uint8:
            ops.append("neg")
    if ndim >= 1:
        ops += ["cat", "stack", "kv_update"]
    if dtype is torch.float32 and ndim >= 1 and ndim - 1 not in batch and 0 < shape[-1] <= 8:
        ops += ["linear", "layer_norm", "rms_norm", "softmax"]
    if dtype is torch.float32 and ndim in (2, 3) and ndim - 1 not in batch and ndim - 2 not in batch and 0 not in shape:
        ops.append("matmul")
    if dtype is torch.float32 and 3 <= ndim <= 4 and ndim - 1 not in batch and 0 not in shape:
        ops.append("sdpa")
    if dtype is torch.float32 and ndim == 4 and 1 not in batch and 0 not in shape and 0 < shape[1] <= 4:
        ops.append("conv")
    return [op for op in COMPUTE_OPS if op in ops]


@st.composite
def compute_steps(draw, probe: Probe, among: Sequence[str] = COMPUTE_OPS) -> Step:
    """Ordinary compute that keeps values exact and NaN-free, and the ops real models return (of those ``among``)."""
    op = draw(st.sampled_from([op for op in _applicable_compute(probe) if op in among]))
    ndim, batch = probe.ndim, probe.batch_dims
    if op in ("add", "mul"):
        scalar = {"add": 1.5, "mul": 0.5} if probe.dtype.is_floating_point else {"add": 3, "mul": 2}
        return Step(op, (scalar[op],))
    if op == "to":
        name = str(probe.dtype).removeprefix("torch.")
        # A negative float cast to uint8 is undefined behaviour in C++: kernels may disagree.
        targets = [d for d in DTYPES if d != name and not (probe.dtype.is_floating_point and d == "uint8")]
        return Step(op, (draw(st.sampled_from(targets)),))
    if op == "linear":
        return Step(op, (probe.shape[-1], draw(st.integers(1, 6))))
    if op == "cat":
        how = draw(st.sampled_from(["empty", "single", "twice", "pair"]))
        if probe.dtype is torch.bool and how == "pair":
            how = "twice"
        dims = [d for d in range(ndim) if d not in batch] or [0]
        if how == "empty":
            # torch.cat skips a 1-D empty tensor whatever the dimension.
            return Step(op, (how, _dim(draw, range(ndim), ndim)))
        return Step(op, (how, _dim(draw, dims if how in ("twice", "pair") else range(ndim), ndim)))
    if op == "stack":
        how = "single" if probe.dtype is torch.bool else draw(st.sampled_from(["single", "pair"]))
        return Step(op, (how, draw(st.integers(-ndim - 1, ndim))))
    if op == "kv_update":
        dims = [d for d in range(ndim) if d not in batch]
        dim = draw(st.sampled_from(dims)) if dims else None
        if dim is None:
            return Step("cat", ("single", 0))
        return Step(op, (draw(st.sampled_from([0, 0, 2])), dim - ndim))
    if op == "softmax":
        return Step(op, (_dim(draw, [ndim - 1], ndim),))
    if op == "matmul":
        return Step(op, (draw(st.booleans()),))
    if op == "conv":
        kernels = [1, 3] if min(probe.shape[2:]) >= 3 else [1]
        return Step(op, (probe.shape[1], draw(st.integers(1, 4)), draw(st.sampled_from(kernels))))
    return Step(op)


class _Chain:
    """Steps taken one after another from a value, with the probe of what each gives."""

    def __init__(self, probe: Probe):
        self.probe, self.steps = probe, []

    def take(self, step: Step) -> None:
        self.probe = self.probe.then(step)
        self.steps.append(step)

    def can_take(self, among: Sequence[str]) -> bool:
        return any(op in among for op in _applicable_views(self.probe))

    def made(self) -> tuple[tuple[Step, ...], Probe]:
        return tuple(self.steps), self.probe


@st.composite
def chains(draw, probe: Probe) -> tuple[tuple[Step, ...], Probe]:
    """One to four view ops, with compute before, between and after them now and then."""
    chain = _Chain(probe)
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 3)) == 3:
            chain.take(draw(compute_steps(chain.probe)))
        chain.take(draw(view_steps(chain.probe)))
    if draw(st.integers(0, 4)) == 4:
        chain.take(draw(compute_steps(chain.probe)))
    return chain.made()


PUSHABLE_COMPUTE = ("add", "mul", "neg", "to", "linear", "cat", "layer_norm", "rms_norm", "softmax", "matmul")
PUSHABLE_VIEWS = ("transpose", "permute", "view", "reshape", "unsqueeze", "T")
CUTS = ("slice", "select", "narrow", "split", "chunk", "unbind")


@st.composite
def pushdown_chains(draw, probe: Probe) -> tuple[tuple[Step, ...], Probe]:
    """Compute a returned piece could move through (and some it cannot), then the piece: what
    ``pushdown=True`` works on."""
    chain = _Chain(probe)
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 3)) == 3 and chain.can_take(PUSHABLE_VIEWS):
            chain.take(draw(view_steps(chain.probe, PUSHABLE_VIEWS)))
        else:
            chain.take(draw(compute_steps(chain.probe, PUSHABLE_COMPUTE)))
    if chain.can_take(CUTS):
        # A cut that keeps every element (``x[:, 0:]``, a select of a dimension of one) saves nothing: an
        # alias or a view, nothing to push down.
        whole = chain.probe.shape

        def drops_elements(step: Step) -> bool:
            cut = chain.probe.then(step).shape
            return math.prod(cut) < math.prod(whole) or (not math.prod(whole) and cut != whole)

        chain.take(draw(view_steps(chain.probe, CUTS).filter(drops_elements)))
    return chain.made()


def pushdown_programs() -> st.SearchStrategy[ProgramSpec]:
    """Programs shaped for ``pushdown=True``: compute, then a returned piece of it (``pushdown_chains``),
    each value made fresh and returned."""
    return programs(pushdown_chains, fresh_sources=True)


def tensor_specs(*, batched: bool) -> st.SearchStrategy[TensorSpec]:
    size = st.sampled_from([4, 1, 2, 3, 5, 0])
    min_dims = 1 if batched else 0
    shapes = st.lists(size, min_size=min_dims, max_size=4).map(tuple)
    if batched:
        shapes = shapes.map(lambda s: (EXAMPLE_BATCH,) + s[1:])
    plain = st.builds(TensorSpec, shapes, st.sampled_from(DTYPES))
    image_shapes = st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([2, 3, 4]), size, size)
    if batched:
        image_shapes = image_shapes.map(lambda s: (EXAMPLE_BATCH,) + s[1:])
    images = st.builds(TensorSpec, image_shapes, st.just("float32"), st.booleans())
    return st.one_of(plain, plain, plain, images)


def weight_specs() -> st.SearchStrategy[WeightSpec]:
    """Parameters (floating point) and buffers (any dtype), of at least one dimension: Inductor folds a
    0-dim weight into its code as a number, and then cannot lower most views of it (an expand, a split:
    "'Constant' object has no attribute 'data'"), so no program returning one compiles."""
    shapes = tensor_specs(batched=False).map(lambda t: t.shape).filter(len)
    parameters = st.builds(TensorSpec, shapes, st.sampled_from(FLOAT_DTYPES)).map(lambda t: WeightSpec("parameter", t))
    buffers = tensor_specs(batched=False).filter(lambda t: len(t.shape)).map(lambda t: WeightSpec("buffer", t))
    return parameters | buffers


@st.composite
def programs(draw, make_chains=chains, *, fresh_sources: bool = False) -> ProgramSpec:
    """Inputs, weights, values made by ``make_chains`` (views and compute by default), and outputs.

    ``fresh_sources``: each value is made from an input or a weight three times in four (not from an
    earlier value), and every value is returned, in a drawn order: what a returned piece needs to be pushed
    down (a value with other users is computed in full anyway)."""
    dynamic = draw(st.booleans())
    inputs = [draw(tensor_specs(batched=dynamic and i == 0)) for i in range(draw(st.integers(1, 2)))]
    weights = draw(st.lists(weight_specs(), max_size=2))
    probes: dict[tuple[str, int], Probe] = {}
    for i, t in enumerate(inputs):
        probes[("input", i)] = Probe.of(t, batched=dynamic and i == 0)
    for i, w in enumerate(weights):
        probes[("weight", i)] = Probe.of(w.tensor, batched=False)

    values = []
    for v in range(draw(st.integers(1, 4))):
        # Earlier values first: views of views, and two views of one base, are the interesting cases.
        sources = [("value", i) for i in reversed(range(v))] + [k for k in probes if k[0] != "value"]
        if fresh_sources and (v == 0 or draw(st.integers(0, 3)) != 3):
            sources = [k for k in probes if k[0] != "value"]
        source = draw(st.sampled_from(sources))
        steps, probe = draw(make_chains(probes[source]))
        probes[("value", v)] = probe
        values.append(ValueSpec(source, steps))

    value_refs = [("value", i) for i in range(len(values))]
    other_refs = [("input", i) for i in range(len(inputs))] + [("weight", i) for i in range(len(weights))]
    other_refs += [("none",), ("int", 7), ("size", 0, 0)] if inputs[0].shape else [("none",), ("int", 7)]
    # Values twice as often as inputs, weights and non-tensors.
    output = st.one_of(st.sampled_from(value_refs), st.sampled_from(value_refs), st.sampled_from(other_refs))
    outputs = draw(st.lists(output, min_size=1, max_size=6))
    if fresh_sources:
        outputs = draw(st.permutations(value_refs)) + outputs[:draw(st.integers(0, 2))]
    return ProgramSpec(
        inputs=tuple(inputs),
        weights=tuple(weights),
        values=tuple(values),
        outputs=tuple(outputs),
        dynamic_batch=dynamic,
        mutates_buffer=draw(st.integers(0, 4)) == 4,
    )


# ---------------------------------------------------------------------------------------------
# The contract, checked by running programs eagerly


def export_program(spec: ProgramSpec) -> ExportedProgram:
    return torch.export.export(GeneratedModule(spec).eval(), make_inputs(spec), dynamic_shapes=dynamic_shapes(spec))


def edge_program(program: ExportedProgram, *, skip_dim_order: bool) -> ExportedProgram:
    """The Edge program as ExecuTorch's AOTI path builds it (no op decomposed), the one its passes see."""
    return aoti_edge_program(program, skip_dim_order=skip_dim_order)


def run(program: ExportedProgram, inputs: Sequence[torch.Tensor]) -> list:
    with torch.no_grad():
        return _leaves(program.module()(*inputs))


def _leaves(outputs: Any) -> list:
    return pytree.tree_leaves(outputs, is_leaf=lambda x: x is None)


def _storage(value: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(value.untyped_storage())


def same_value(expected: Any, got: Any) -> bool:
    if isinstance(expected, torch.Tensor):
        return (
            isinstance(got, torch.Tensor) and got.dtype == expected.dtype and got.shape == expected.shape
            and torch.equal(got, expected)
        )
    return type(got) is type(expected) and got == expected


def snapshot(program: ExportedProgram) -> tuple:
    """Everything a pass must leave alone in its input program."""
    metadata = [
        (n.name, str(getattr(n.meta.get("val"), "shape", None)), str(_strides(n.meta.get("val"))))
        for n in program.graph.nodes
    ]
    return (str(program.graph), program.graph_signature, metadata, program.graph_module.code)


def _strides(value: Any) -> Any:
    return value.stride() if isinstance(value, torch.Tensor) else None


def user_output_nodes(program: ExportedProgram) -> list[Any]:
    returned = list(program.graph.output_node().args[0])
    specs = program.graph_signature.output_specs
    return [returned[i] for i, s in enumerate(specs) if s.kind == OutputSpecKind.USER_OUTPUT]


def _describe(report, index: int) -> str:
    record = report.outputs[index]
    return f"output {index} ({record.name}: {record.cause or record.explanation}, planned {record.action.value})"


def check_is_sound_rewrite(original: ExportedProgram, result: ExportedProgram, before: tuple) -> None:
    """Validity: the result verifies, names its nodes, shares the weights; the original is untouched."""
    result.validate()
    assert snapshot(original) == before, "the pass changed its input program"
    for name, tensor in original.state_dict.items():
        assert result.state_dict[name] is tensor, f"weight {name} was copied"
    for name, value in original.constants.items():
        assert result.constants[name] is value, f"constant {name} was copied"
    returned = list(result.graph.output_node().args[0])
    for spec, value in zip(result.graph_signature.output_specs, returned):
        if isinstance(spec.arg, TensorArgument):
            assert isinstance(value, torch.fx.Node) and spec.arg.name == value.name, (
                f"the signature names {spec.arg.name}, the graph returns {value}"
            )


def new_copies(original: ExportedProgram, result: ExportedProgram, copy_op: Any) -> dict[int, Any]:
    """The copies ``result`` adds, by the user output each is returned as.

    A copy is ``copy_op`` or a form Inductor keeps (``CopyForm``): every new node must be tagged as part of
    one, each copy returned as exactly one output, and its value must have its source's shape and dtype.
    """
    old = {n.name for n in original.graph.nodes}
    new = [n for n in result.graph.nodes if n.name not in old]
    assert all(copy_form_of(n) for n in new), f"new nodes other than copies: {[str(n.target) for n in new]}"
    assert all(n.target == copy_op for n in new if not is_involution(n.target)), (
        f"copies by other ops than {copy_op}: {[str(n.target) for n in new]}"
    )
    returned = user_output_nodes(result)
    copied = {i: node for i, node in enumerate(returned) if node in new}
    ends = [n for n in new if not any(copy_form_of(user) for user in n.users)]
    assert len(copied) == len(ends), "a new copy is not returned as exactly one output"
    for node in ends:
        value, source = node.meta["val"], copied_source(node).meta["val"]
        assert value.shape == source.shape and value.dtype == source.dtype, f"metadata of {node.name}"
    return copied


def check_values(
    reference: ExportedProgram, result: ExportedProgram, plan, input_sets: Sequence[tuple], *, dynamic: bool
) -> None:
    """Semantics: every user output of ``result``, run eagerly, is bitwise equal to ``reference``'s.

    Layouts are the lowering oracle's job (``check_batch``), which
    asks Inductor, in batches, rather than trusting eager kernels.
    """
    for inputs in input_sets:
        expected, got = run(reference, inputs), run(result, inputs)
        batch = f" at batch {inputs[0].shape[0]}" if dynamic else ""
        for i, (want, have) in enumerate(zip(expected, got)):
            assert same_value(want, have), f"{_describe(plan, i)}{batch}: values differ from the original program's"


def check_densify_outputs(program: ExportedProgram, input_sets: Sequence[tuple]) -> None:
    """The contract for ``densify_outputs`` on an ATen program: every output comes back contiguous."""
    before = snapshot(program)
    plan = strideguard.inspect(program)
    fixed = strideguard.densify_outputs(program)
    check_is_sound_rewrite(program, fixed, before)
    copied = new_copies(program, fixed, torch.ops.aten.clone.default)
    planned = [o.index for o in plan.copies_needed]
    assert sorted(copied) == planned, f"copies at outputs {sorted(copied)}, the plan has {planned}"
    assert strideguard.inspect(fixed).ok, str(strideguard.inspect(fixed))
    check_values(program, fixed, plan, runnable_sets(program, input_sets), dynamic=len(input_sets) > 1)


def _is_tensor_node(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)


def promised_order(node: Any) -> Optional[tuple[int, ...]]:
    """The dim order an Edge program promises for an output: that of its metadata."""
    if not _is_tensor_node(node):
        return None
    value = node.meta["val"]
    order = density.dim_order_of(value.shape, value.stride())
    return order if order is not None else density.identity_order(value.dim())


def prepare_for_aoti_problems(edge: ExportedProgram, input_sets: Sequence[tuple]) -> list[tuple[Optional[int], str]]:
    """The contract for ``prepare_for_aoti`` on an Edge program, run eagerly: problems as (user output or
    ``None`` for the whole program, text). The plan to compare with is ``inspect`` under the policy
    ``prepare_for_aoti`` converts with; layouts are the lowering oracle's to judge."""
    dialect = dialect_of(edge)
    before = snapshot(edge)
    plan = strideguard.inspect(edge, policy=STRIDEGUARD)
    prepared = strideguard.prepare_for_aoti(edge)
    problems: list[tuple[Optional[int], str]] = []
    try:
        check_is_sound_rewrite(edge, prepared, before)
        copy_op, _ = copy_call(dialect, ())
        copied = set(new_copies(edge, prepared, copy_op))
        detach_copy = exir_ops.edge.aten.detach_copy.default
        assert not any(n.target == detach_copy for n in prepared.graph.nodes), "a detach_copy is left"
    except AssertionError as error:
        return [(None, f"{dialect.value}: {error}")]
    planned = {o.index for o in plan.copies_needed}
    after = strideguard.inspect(prepared)
    for index in sorted(copied ^ planned):
        problems.append((index, f"{dialect.value}: {_describe(plan, index)}: "
                                f"{'copied but not planned' if index in copied else 'planned but not copied'}"))
    problems += [(o.index, f"{dialect.value}: after prepare_for_aoti: {o.explanation}") for o in after.outputs if not o.ok]
    for inputs in input_sets:
        expected, got = run(edge, inputs), run(prepared, inputs)
        for index, (want, have) in enumerate(zip(expected, got)):
            if not same_value(want, have):
                problems.append((index, f"{dialect.value}: {_describe(plan, index)}: values differ from the original's"))
    return problems


def keeps_dynamic_batch(program: ExportedProgram) -> bool:
    """Whether the first user input's dimension 0 is still symbolic (``to_edge`` sometimes specializes it)."""
    specs = program.graph_signature.input_specs
    first = next(s.arg.name for s in specs if s.kind == InputKind.USER_INPUT)
    value = next(n for n in program.graph.nodes if n.name == first).meta["val"]
    size = value.shape[0] if value.dim() else None
    return isinstance(size, torch.SymInt) and size.node.maybe_as_int() is None


class Rejected(Exception):
    """``torch.export`` or ``to_edge`` refused a generated program: an illegal combination, not a finding."""


def check_program(spec: ProgramSpec) -> None:
    """The eager contract for one generated program on its ATen program under ``densify_outputs``.

    The Edge programs are checked in batches, many programs as one method
    (``check_batch``): ``to_edge`` costs a third of a second a call, most of
    it the same for one program or forty.
    """
    try:
        program = export_program(spec)
    except Exception as error:  # noqa: BLE001
        raise Rejected(f"torch.export: {type(error).__name__}") from error
    sets = input_sets(spec)
    check_densify_outputs(program, sets)
    if spec.mutates_buffer:
        check_densify_outputs(program.run_decompositions({}), sets)


# ---------------------------------------------------------------------------------------------
# The oracle: Inductor's own lowering, in batches, and a compiled sample to keep it honest


def export_combined(specs: Sequence[ProgramSpec]) -> ExportedProgram:
    return torch.export.export(
        CombinedModule(specs).eval(), combined_inputs(specs), dynamic_shapes=combined_dynamic_shapes(specs)
    )


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def _shown(values: Sequence) -> list:
    """Sizes or strides as reports write them: ints, and symbolic ones as text."""
    return [v if isinstance(v, (int, str)) else density.format_strides([v])[0] for v in values]


def _has_elements(shape: Sequence) -> bool:
    return not any(density.same_sizes((size,), (0,)) for size in shape)


@dataclass
class Sample:
    """What a batch showed: problems (part, text), and parts Inductor cannot lower or compile even untouched."""

    problems: list[tuple[int, str]]
    refused: dict[int, str]


def _owners(specs: Sequence[ProgramSpec]) -> list[tuple[int, int]]:
    return [(part, j) for part, spec in enumerate(specs) for j in range(len(spec.outputs))]


def _try_each(specs: Sequence[ProgramSpec], attempt, offset: int = 0) -> dict[int, str]:
    """The parts for which ``attempt`` fails alone, with why: halves tried first, so that one bad part
    in a batch costs a few attempts, not one per part."""
    try:
        attempt(specs)
        return {}
    except Exception as error:  # noqa: BLE001 - which part fails is the finding
        if len(specs) == 1:
            return {offset: first_line(error)}
    middle = len(specs) // 2
    return {
        **_try_each(specs[:middle], attempt, offset),
        **_try_each(specs[middle:], attempt, offset + middle),
    }


class _StageFailed(Exception):
    """One stage of an attempt failed; blaming parts needs only that stage."""

    def __init__(self, stage, error: Exception):
        super().__init__(first_line(error))
        self.stage = stage


def _without_refused(specs: Sequence[ProgramSpec], attempt, check) -> Sample:
    """Run ``check(parts, attempt(parts))`` on the parts that ``attempt`` accepts untouched (what the
    exporters, Inductor or the compiler cannot handle untouched is not a finding)."""
    kept = list(range(len(specs)))
    refused: dict[int, str] = {}
    while kept:
        parts = [specs[part] for part in kept]
        try:
            attempted = attempt(parts)
        except Exception as error:  # noqa: BLE001
            stage = error.stage if isinstance(error, _StageFailed) else attempt
            blamed = _try_each(parts, stage) or {i: f"fails only together: {first_line(error)}" for i in range(len(parts))}
            refused.update({kept[i]: text for i, text in blamed.items()})
            kept = [part for i, part in enumerate(kept) if i not in blamed]
            continue
        inner = check(parts, attempted)
        return Sample([(kept[part], text) for part, text in inner.problems], refused)
    return Sample([], refused)


@dataclass
class _Untouched:
    """A batch as one method: exported, lowered to Edge in both modes, and Inductor's lowering of each, untouched."""

    program: ExportedProgram
    lowering: Any
    edge: Optional[ExportedProgram]
    edge_lowering: Any
    memory_format: Optional[ExportedProgram]
    """The Edge programs and the lowering of the first; ``None`` without ExecuTorch."""


def _lower_aten(specs: Sequence[ProgramSpec]) -> tuple:
    program = export_combined(specs)
    return program, lower_outputs(program)


def _to_edge(specs: Sequence[ProgramSpec]) -> tuple:
    """Both Edge programs; ``to_edge`` sometimes writes a graph that cannot run, which is its limit, not a finding."""
    inputs = combined_inputs(specs)
    edges = []
    for skip_dim_order in (False, True):
        edge = edge_program(export_combined(specs), skip_dim_order=skip_dim_order)
        run(edge, inputs)
        edges.append(edge)
    return tuple(edges)


def _lower_edge(specs: Sequence[ProgramSpec]) -> Any:
    return lower_edge_outputs(edge_program(export_combined(specs), skip_dim_order=False))


def _lower_untouched(specs: Sequence[ProgramSpec]) -> _Untouched:
    try:
        program, lowering = _lower_aten(specs)
    except Exception as error:  # noqa: BLE001 - blamed part by part, on this stage alone
        raise _StageFailed(_lower_aten, error) from error
    if not HAS_EXECUTORCH:
        return _Untouched(program, lowering, None, None, None)
    try:
        edge, memory_format = _to_edge(specs)
    except Exception as error:  # noqa: BLE001
        raise _StageFailed(_to_edge, error) from error
    try:
        edge_lowering = lower_edge_outputs(edge)
    except Exception as error:  # noqa: BLE001
        raise _StageFailed(_lower_edge, error) from error
    return _Untouched(program, lowering, edge, edge_lowering, memory_format)


def check_batch(specs: Sequence[ProgramSpec]) -> Sample:
    """The contract on generated programs, many as one method, judged eagerly and by Inductor's lowering.

    Eagerly, on the Edge programs in both dim-order modes: ``prepare_for_aoti``
    validates, leaves its input alone, copies exactly what ``inspect`` plans,
    and keeps every value bitwise. By Inductor's own lowering: for the ATen
    program, for its Edge program in dim-order mode (lowered as ExecuTorch's
    AOTI backend does, its own view pass included) and for strideguard's
    conversions, every output ``inspect`` decides must have exactly the
    strides Inductor gives it and be copied exactly when Inductor returns it
    out of its target layout; one it leaves to Inductor must be copied.
    After ``densify_outputs``, ``DenseOutputsPass`` and ``prepare_for_aoti``
    (both modes), Inductor must return every output in its target layout. A
    program that ``to_edge`` or Inductor cannot handle untouched is set aside;
    one Inductor cannot lower after strideguard's rewrite is a finding.
    """
    return _without_refused(list(specs), _lower_untouched, _check_batch)


def _batch_input_sets(specs: Sequence[ProgramSpec], edge: ExportedProgram) -> list[tuple]:
    sets = [combined_inputs(specs)]
    if any(s.dynamic_batch for s in specs) and keeps_dynamic_batch(edge):
        sets.append(combined_inputs(specs, OTHER_BATCH))
    return runnable_sets(edge, sets)


def _check_batch(specs: list[ProgramSpec], untouched: _Untouched) -> Sample:
    owners = _owners(specs)
    problems: list[tuple[int, str]] = []

    def problem(index: int, text: str) -> None:
        part, j = owners[index]
        problems.append((part, f"part {part} output {j} ({specs[part].outputs[j]}): {text}"))

    def judge_prediction(path: str, report, lowering) -> None:
        for index, (record, lowered) in enumerate(zip(report.outputs, lowering.outputs)):
            if record.kind != "tensor" or lowered is None or not _has_elements(lowered.shape):
                continue
            order = record.target_dim_order
            needed = density.has_layout(lowered.shape, lowered.strides, order) is not True
            copied = record.action is Action.COPY
            where = f"{path}: {record.name} ({record.cause or record.explanation})"
            if record.in_target_layout is None:
                if not copied:
                    problem(index, f"{where}: undecided but not copied")
                continue
            if _shown(record.strides) != _shown(lowered.strides):
                problem(index, f"{where}: inspect predicts strides {_shown(record.strides)}, "
                               f"Inductor lowers {_shown(lowered.strides)}")
            elif copied != needed:
                problem(index, f"{where}: {'copied although' if copied else 'not copied although'} Inductor lowers "
                               f"strides {_shown(lowered.strides)} for dim order {list(order)}")

    def judge_fixed(path: str, program: ExportedProgram, lower) -> None:
        try:
            lowering = lower(program)
        except Exception as error:  # noqa: BLE001 - lowers untouched, not after strideguard's rewrite
            for part in range(len(specs)):
                problems.append((part, f"{path}: Inductor cannot lower the rewritten batch: {first_line(error)}"))
            return
        orders = target_dim_orders(program)
        for index, (order, lowered) in enumerate(zip(orders, lowering.outputs)):
            if order is None or lowered is None:
                continue
            if density.has_layout(lowered.shape, lowered.strides, order) is not True:
                problem(index, f"{path}: Inductor lowers strides {_shown(lowered.strides)} for shape "
                               f"{_shown(lowered.shape)}, not those of dim order {list(order)}")

    program, edge = untouched.program, untouched.edge
    judge_prediction("ATen", strideguard.inspect(program), untouched.lowering)
    judge_fixed("ATen densify_outputs", strideguard.densify_outputs(program), lower_outputs)
    if edge is None:
        return Sample(problems, {})
    for mode in (edge, untouched.memory_format):
        for index, text in prepare_for_aoti_problems(mode, _batch_input_sets(specs, mode)):
            if index is None:
                problems.extend((part, text) for part in range(len(specs)))
            else:
                problem(index, text)
    judge_prediction("Edge", strideguard.inspect(edge), untouched.edge_lowering)
    try:
        converted = lower_as_compiled(edge, subject_of(edge, "test"), AsCompiled(STRIDEGUARD))
    except Exception as error:  # noqa: BLE001
        problems += [(part, f"Edge: Inductor cannot lower strideguard's conversions: {first_line(error)}")
                     for part in range(len(specs))]
    else:
        judge_prediction("Edge, strideguard's conversions", strideguard.inspect(edge, policy=STRIDEGUARD), converted)
    judge_fixed("Edge DenseOutputsPass", DenseOutputsPass().call(edge).exported_program, lower_edge_outputs)
    judge_fixed("Edge prepare_for_aoti", strideguard.prepare_for_aoti(edge), lower_edge_outputs)
    judge_fixed(
        "Edge (memory format) prepare_for_aoti", strideguard.prepare_for_aoti(untouched.memory_format), lower_edge_outputs
    )
    return Sample(problems, {})


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal for exact dtypes; for floats, Inductor may fuse and round less often than eager does."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not want.dtype.is_floating_point:
        return torch.equal(got, want)
    tolerance = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(want.dtype, 1e-4)
    return torch.allclose(got.double(), want.double(), rtol=tolerance, atol=tolerance)


def _plain(value: Any, reference: Any) -> Any:
    """AOTInductor hands back a non-tensor output (an int, a SymInt) as a 0-dim tensor."""
    if not isinstance(reference, torch.Tensor) and isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


def check_compiled_sample(specs: Sequence[ProgramSpec], directory: str) -> Sample:
    """Compile several generated programs as one method, before and after ``densify_outputs``: what
    AOTInductor returns must be what its lowering said, every densified output in layout, values equal."""
    counter = iter(range(1_000_000))

    def compile_parts(parts):
        return compile_program(export_combined(parts), os.path.join(directory, f"attempt-{next(counter)}"))

    return _without_refused(list(specs), compile_parts, lambda parts, plain: _check_compiled(parts, plain, directory))


def _check_compiled(specs: list[ProgramSpec], plain: Any, directory: str) -> Sample:
    owners = _owners(specs)
    problems: list[tuple[int, str]] = []

    def expect(condition: bool, index: int, text: str) -> None:
        if not condition:
            part, j = owners[index]
            problems.append((part, f"part {part} output {j} ({specs[part].outputs[j]}): {text}"))

    program = export_combined(specs)
    try:
        dense = compile_program(strideguard.densify_outputs(program), os.path.join(directory, "aten-densified"))
    except Exception as error:  # noqa: BLE001 - compiles untouched but not after the pass: a finding
        return Sample([(part, f"compiles untouched, not after densify_outputs: {first_line(error)}")
                       for part in range(len(specs))], {})
    lowering = lower_outputs(program)
    batches = [EXAMPLE_BATCH] + ([OTHER_BATCH] if any(s.dynamic_batch for s in specs) else [])
    for batch in batches:
        inputs = combined_inputs(specs, batch)
        expected = run(program, inputs)
        with torch.no_grad():
            got_plain, got_dense = _leaves(plain(*inputs)), _leaves(dense(*inputs))
        for i, (want, before, after, lowered) in enumerate(zip(expected, got_plain, got_dense, lowering.outputs)):
            before, after = _plain(before, want), _plain(after, want)
            if not isinstance(want, torch.Tensor):
                expect(before == want and after == want, i, f"values {before}, {after}, expected {want}")
                continue
            if before.numel():
                predicted = _at_batch(lowered.strides, program, batch)
                expect(predicted is None or tuple(before.stride()) == predicted, i,
                       f"batch {batch}: AOTInductor returns strides {before.stride()}, its lowering said {predicted}")
            expect(density.has_layout(after.shape, after.stride(), density.identity_order(after.dim())) is True, i,
                   f"batch {batch}: densified, AOTInductor returns strides {after.stride()}")
            expect(torch.equal(before, after) and _close(after, want), i, f"batch {batch}: values differ")
    return Sample(problems, {})


# ---------------------------------------------------------------------------------------------
# Pushdown


PUSHDOWN_RTOL, PUSHDOWN_ATOL = PUSHDOWN_TOLERANCE


PUSHED_OUTPUTS: list[str] = []
"""What ``check_pushdown`` pushed down, as ``inspect`` describes it: a check that it had work to do."""

PUSHED_PROGRAMS: set[str] = set()
"""The generated programs (``ProgramSpec.dumps()``) in which ``check_pushdown`` pushed at least one output
down: the fuzz reports their share."""


def check_pushdown(specs: Sequence[ProgramSpec]) -> Sample:
    """The contract of ``pushdown=True`` on generated programs, many as one method.

    ATen (``densify_outputs``) and Edge in both modes (``prepare_for_aoti``):
    the input is left alone and its weights shared, the result validates, its
    values equal the original's within the pushdown tolerance at every batch
    size, the pushdown never adds FLOPs, and by Inductor's own lowering every
    output comes back in its target layout.
    """
    return _without_refused(list(specs), _export_and_lower, _check_pushdown)


def _export_and_lower(specs: Sequence[ProgramSpec]) -> ExportedProgram:
    program = export_combined(specs)
    lower_outputs(program)
    return program


def _unread_computations(graph: torch.fx.Graph) -> dict[str, str]:
    """The computing nodes whose results reach no output, by name, each as ``target(shape)`` (type checks,
    which compute nothing, aside)."""
    reaching, pending = set(), list(graph.find_nodes(op="output"))
    while pending:
        node = pending.pop()
        if node not in reaching:
            reaching.add(node)
            pending += node.all_input_nodes
    return {n.name: f"{n.target}{tuple(n.meta['val'].shape) if isinstance(n.meta.get('val'), torch.Tensor) else ''}"
            for n in graph.nodes
            if n.op == "call_function" and n not in reaching and n.target is not torch.ops.aten._assert_tensor_metadata.default}


def computations_left_unread(original: torch.fx.Graph, rewritten: torch.fx.Graph) -> list[str]:
    """What a rewrite left computing for no output that the original did not: a rewrite must add none.
    By node name, so that a node the original already left unread is not counted again once the rewrite
    made it a view (found by ``make fuzz``: an unread ``view_copy`` chain in front of an unread ``sdpa``,
    which ``to_edge`` keeps, made views)."""
    before = _unread_computations(original)
    return sorted(what for name, what in _unread_computations(rewritten).items() if name not in before)


def _check_pushdown(specs: Sequence[ProgramSpec], program: ExportedProgram) -> Sample:
    from strideguard.decide.pushdown import graph_flops
    from strideguard.fix.engine import Pushdowns, program_plan

    problems: list[tuple[int, str]] = []
    owners = _owners(specs)

    def expect(condition: bool, index: int, text: str) -> None:
        if not condition:
            part, j = owners[index]
            problems.append((part, f"pushdown: part {part} output {j} ({specs[part].outputs[j]}): {text}"))

    only_pushed = program_plan(
        subject_of(program, "test"), STRIDEGUARD, choices=Choices(pushdowns=Pushdowns.APPLIED, copy_outputs=False)
    )
    PUSHED_OUTPUTS.extend(pushdown.description for pushdown in only_pushed.pushdowns)
    by_position = {out.position: out.index for out in user_outputs(program.graph_signature)}
    PUSHED_PROGRAMS.update(specs[owners[by_position[pushdown.output]][0]].dumps()
                           for pushdown in only_pushed.pushdowns if pushdown.output in by_position)
    before, after = graph_flops(program.graph), graph_flops(only_pushed.graph)
    if before is not None and after is not None and after > before:
        problems += [(part, f"pushdown raised the FLOPs from {before} to {after}") for part in range(len(specs))]
    sets = [combined_inputs(specs)] + ([combined_inputs(specs, OTHER_BATCH)] if any(s.dynamic_batch for s in specs) else [])
    sets = runnable_sets(program, sets)
    candidates = [("ATen", program, lambda p: strideguard.densify_outputs(p, pushdown=True), lower_outputs)]
    for skip_dim_order in (False, True) if HAS_EXECUTORCH else ():
        try:
            edge = edge_program(export_combined(specs), skip_dim_order=skip_dim_order)
            run(edge, sets[0])
        except Exception:  # noqa: BLE001 - to_edge's limit (an Edge program that cannot run untouched), as check_batch sets aside
            continue
        prepare = lambda p: strideguard.prepare_for_aoti(p, pushdown=True)  # noqa: E731
        judge = lower_edge_outputs if not skip_dim_order else None
        candidates.append((f"Edge ({'memory-format' if skip_dim_order else 'dim-order'})", edge, prepare, judge))
    for name, original, fix, lower in candidates:
        before_snapshot = snapshot(original)
        fixed = fix(original)
        check_is_sound_rewrite(original, fixed, before_snapshot)
        left = computations_left_unread(original.graph, fixed.graph)
        if left:
            problems += [(part, f"{name}: pushdown left nodes that feed nothing: {left}") for part in range(len(specs))]
        for inputs in sets if name == "ATen" or keeps_dynamic_batch(original) else sets[:1]:
            for index, (want, got) in enumerate(zip(run(original, inputs), run(fixed, inputs))):
                if isinstance(want, torch.Tensor):
                    close = isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype and (
                        torch.allclose(got, want, rtol=PUSHDOWN_RTOL, atol=PUSHDOWN_ATOL, equal_nan=True)
                        if want.is_floating_point() else torch.equal(got, want))
                    expect(close, index, f"{name}: values differ from the original's beyond the tolerance")
                else:
                    expect(got == want, index, f"{name}: {got} returned, {want} expected")
        if lower is None:
            continue
        try:
            lowering = lower(fixed)
        except Exception as error:  # noqa: BLE001 - lowers untouched but not after pushdown: a finding
            problems += [(part, f"{name}: Inductor cannot lower the pushed-down program: {first_line(error)}")
                         for part in range(len(specs))]
            continue
        orders = target_dim_orders(fixed)
        for index, (lowered, order) in enumerate(zip(lowering.outputs, orders)):
            if lowered is None or order is None or not _has_elements(lowered.shape):
                continue
            expect(density.has_layout(lowered.shape, lowered.strides, order) is True, index,
                   f"{name}: Inductor lowers strides {_shown(lowered.strides)}, not dim order {list(order)}")
    return Sample(problems, {})


def _at_batch(strides: Sequence, program: ExportedProgram, batch: int) -> Optional[tuple]:
    """Strides with the batch symbol (the only one generated programs have) set to ``batch``."""
    out = []
    for stride in strides:
        if isinstance(stride, torch.SymInt):
            expr = stride.node.expr
            stride = int(expr.subs({symbol: batch for symbol in expr.free_symbols}))
        out.append(int(stride))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Kept failures


REGRESSIONS = Path(__file__).parent / "regressions"
"""One JSON file per shrunk failure: ``spec``, ``failure``, ``compiled`` (found by the compile
check), and, while the library bug it shows is open, ``xfail`` with the reason."""


ORACLES = ("eager", "batch", "compiled", "pushdown")
"""Which check found a kept failure: the eager contract of one program (``check_program``), a batch
judged eagerly on Edge and by Inductor's lowering (``check_batch``), or the compiled sample
(``check_compiled_sample``), or ``pushdown=True`` (``check_pushdown``). An eager or batch replay runs
both of the first two."""


def oracle_of(record: dict[str, Any]) -> str:
    return record.get("oracle") or ("compiled" if record.get("compiled") else "eager")


def save_regression(
    spec: ProgramSpec, failure: str, *, oracle: str = "eager", batch: Optional[Sequence[ProgramSpec]] = None
) -> Path:
    """Write a failing program where ``test_generated_regressions`` replays it, unless it is kept already;
    a new file is named by its spec's hash (rename it to say what it shows). A program that failed in a
    batch keeps the whole batch too (``batch``), so that the replay runs what failed."""
    assert oracle in ORACLES, oracle
    REGRESSIONS.mkdir(exist_ok=True)
    for path in REGRESSIONS.glob("*.json"):
        record = json.loads(path.read_text())
        if ProgramSpec.from_json(record["spec"]) == spec and oracle_of(record) == oracle:
            return path
    text = spec.dumps()
    prefix = "" if oracle == "eager" else f"{oracle}-"
    path = REGRESSIONS / f"{prefix}{hashlib.sha1(text.encode()).hexdigest()[:12]}.json"
    record = {"spec": spec.to_json(), "failure": failure[:1000], "oracle": oracle}
    if batch is not None and len(batch) > 1:
        record["batch"] = [member.to_json() for member in batch]
    path.write_text(format_record(record))
    return path


def format_record(record: dict[str, Any]) -> str:
    """One key per line, the spec on one line: short files, readable diffs."""
    lines = [f" {json.dumps(key)}: {json.dumps(value, sort_keys=True)}" for key, value in sorted(record.items())]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def replay(record: dict[str, Any], directory: str, *, in_batch: bool = False) -> None:
    """Run the check that found a kept failure, on its program alone or, ``in_batch``, in the batch it
    failed in as the fuzz ran it; raises while the failure is there."""
    spec = ProgramSpec.from_json(record["spec"])
    oracle = oracle_of(record)
    check = check_pushdown if oracle == "pushdown" else check_batch
    if oracle == "compiled":
        result = check_compiled_sample([spec], directory)
    elif in_batch:
        # Parts Inductor cannot lower untouched are set aside, as in the fuzz.
        result = check([ProgramSpec.from_json(member) for member in record["batch"]])
    else:
        if oracle != "pushdown":
            check_program(spec)
        result = check([spec])
        if oracle != "eager":
            # An eager finding may be a program Inductor itself cannot lower untouched: set aside, as in the fuzz.
            assert not result.refused, result.refused
    assert not result.problems, "\n".join(text for _, text in result.problems)

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
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.dialects._ops import ops as exir_ops
from hypothesis import strategies as st
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument
from torch.utils import _pytree as pytree

import strideguard
from strideguard import Action, layout
from strideguard.dialect import copy_call, dialect_of
from strideguard.passes.view_copies_to_views import STRIDEGUARD
from strideguard.verify import compile_program

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
COMPUTE_OPS = ("add", "mul", "neg", "logical_not", "to", "linear")


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    """Sizes at the example batch; with a dynamic batch, dimension 0 of input 0 is the batch."""
    dtype: str


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
            return TensorSpec(tuple(d["shape"]), d["dtype"])

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
        return torch.randn(shape, generator=generator).to(dtype)
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


def dynamic_shapes(spec: ProgramSpec, batch: Optional[Dim] = None) -> Optional[tuple]:
    if not spec.dynamic_batch:
        return None
    batch = batch or Dim("batch", min=2, max=64)
    # ``forward(*inputs)`` takes one argument, the tuple of inputs.
    return (tuple({0: batch} if i == 0 else None for i in range(len(spec.inputs))),)


def apply_step(t: torch.Tensor, step: Step, linear: Optional[nn.Module] = None) -> torch.Tensor:
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
    if op == "linear":
        return linear(t)
    raise ValueError(f"unknown step {op}")


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
                if step.op == "linear":
                    in_features, out_features = step.args
                    layer = nn.Linear(in_features, out_features)
                    with torch.no_grad():
                        layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator))
                        layer.bias.copy_(torch.randn(layer.bias.shape, generator=generator))
                    self.linears[_linear_name(v, s)] = layer

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
                t = apply_step(t, step, self.linears[_linear_name(v, s)] if step.op == "linear" else None)
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
            probes.append(torch.empty(shape, dtype=_dtype(spec.dtype), device="meta"))
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
        linear = None
        if step.op == "linear":
            in_features, out_features = step.args
            linear = nn.Linear(in_features, out_features, device="meta")
        return Probe([apply_step(t, step, linear) for t in self.tensors])


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
def view_steps(draw, probe: Probe) -> Step:
    """One view op legal for ``probe``."""
    op = draw(st.sampled_from(_applicable_views(probe)))
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
    dtype = probe.dtype
    ops = ["to"]
    if dtype is torch.bool:
        ops.append("logical_not")
    else:
        ops += ["add", "mul"]
        if dtype is not torch.uint8:
            ops.append("neg")
    if dtype is torch.float32 and probe.ndim >= 1 and probe.ndim - 1 not in probe.batch_dims and probe.shape[-1] <= 8:
        ops.append("linear")
    return [op for op in COMPUTE_OPS if op in ops]


@st.composite
def compute_steps(draw, probe: Probe) -> Step:
    """Ordinary compute that keeps values exact and NaN-free."""
    op = draw(st.sampled_from(_applicable_compute(probe)))
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
    return Step(op)


@st.composite
def chains(draw, probe: Probe) -> tuple[tuple[Step, ...], Probe]:
    """One to four view ops, with compute before, between and after them now and then."""
    steps = []

    def take(step: Step):
        nonlocal probe
        probe = probe.then(step)
        steps.append(step)

    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 3)) == 3:
            take(draw(compute_steps(probe)))
        take(draw(view_steps(probe)))
    if draw(st.integers(0, 4)) == 4:
        take(draw(compute_steps(probe)))
    return tuple(steps), probe


def tensor_specs(*, batched: bool) -> st.SearchStrategy[TensorSpec]:
    size = st.sampled_from([4, 1, 2, 3, 5, 0])
    min_dims = 1 if batched else 0
    shapes = st.lists(size, min_size=min_dims, max_size=4).map(tuple)
    if batched:
        shapes = shapes.map(lambda s: (EXAMPLE_BATCH,) + s[1:])
    return st.builds(TensorSpec, shapes, st.sampled_from(DTYPES))


def weight_specs() -> st.SearchStrategy[WeightSpec]:
    """Parameters (floating point) and buffers (any dtype)."""
    shapes = tensor_specs(batched=False).map(lambda t: t.shape)
    parameters = st.builds(TensorSpec, shapes, st.sampled_from(FLOAT_DTYPES)).map(lambda t: WeightSpec("parameter", t))
    buffers = tensor_specs(batched=False).map(lambda t: WeightSpec("buffer", t))
    return parameters | buffers


@st.composite
def programs(draw) -> ProgramSpec:
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
        source = draw(st.sampled_from(sources))
        steps, probe = draw(chains(probes[source]))
        probes[("value", v)] = probe
        values.append(ValueSpec(source, steps))

    value_refs = [("value", i) for i in range(len(values))]
    other_refs = [("input", i) for i in range(len(inputs))] + [("weight", i) for i in range(len(weights))]
    other_refs += [("none",), ("int", 7), ("size", 0, 0)] if inputs[0].shape else [("none",), ("int", 7)]
    # Values twice as often as inputs, weights and non-tensors.
    output = st.one_of(st.sampled_from(value_refs), st.sampled_from(value_refs), st.sampled_from(other_refs))
    outputs = draw(st.lists(output, min_size=1, max_size=6))
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
    return to_edge(program, compile_config=EdgeCompileConfig(_skip_dim_order=skip_dim_order)).exported_program()


def run(program: ExportedProgram, inputs: Sequence[torch.Tensor]) -> list:
    with torch.no_grad():
        return _leaves(program.module()(*inputs))


def _leaves(outputs: Any) -> list:
    return pytree.tree_leaves(outputs, is_leaf=lambda x: x is None)


def compiled_strides(program: ExportedProgram, inputs: Sequence[torch.Tensor]) -> list[Optional[tuple[int, ...]]]:
    """The strides AOTInductor returns for each user output of ``program`` at ``inputs`` (``None`` for non-tensors).

    AOTInductor traces the program again and gives each output the strides
    traced there, so this traces it again too (``torch.export`` of its module
    at these inputs) and reads them off. Eager kernels are not the oracle: they
    give some size-one dimensions other strides than the trace does
    (``x.expand(1)`` of a 0-dim ``x``: eager ``(0,)``, traced and compiled
    ``(1,)``; ``x.T * 2 + 1`` of a ``[3, 1]`` ``x``: eager ``(1, 1)``, traced
    and compiled ``(3, 1)``), and the runtime compares those too. A view of a
    weight comes back as AOTInductor's ``preserve_format`` copy of it.
    """
    traced = torch.export.export(program.module(), tuple(inputs))
    weight_kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    weight_names = {s.arg.name for s in traced.graph_signature.input_specs if s.kind in weight_kinds}
    weights = {
        _storage(n.meta["val"]) for n in traced.graph.find_nodes(op="placeholder")
        if n.name in weight_names and n.meta["val"].numel()
    }
    strides = []
    for node in user_output_nodes(traced):
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            strides.append(None)
        elif value.numel() and _storage(value) in weights:
            with value.fake_mode:
                strides.append(tuple(value.clone(memory_format=torch.preserve_format).stride()))
        else:
            strides.append(tuple(value.stride()))
    return strides


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
    return [returned[i] for i, s in enumerate(specs) if s.kind == OutputKind.USER_OUTPUT]


def _describe(report, index: int) -> str:
    record = report.outputs[index]
    return f"output {index} ({record.name}: {record.cause or record.reason}, planned {record.action.value})"


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
    """The nodes ``result`` adds, by the user output each is returned as; every one is a copy."""
    old = {n.name for n in original.graph.nodes}
    new = [n for n in result.graph.nodes if n.name not in old]
    assert all(n.target == copy_op for n in new), f"new nodes other than copies: {[str(n.target) for n in new]}"
    returned = user_output_nodes(result)
    copied = {i: node for i, node in enumerate(returned) if node in new}
    assert len(copied) == len(new), "a new copy is not returned as exactly one output"
    for node in new:
        value, source = node.meta["val"], node.args[0].meta["val"]
        assert value.shape == source.shape and value.dtype == source.dtype, f"metadata of {node.name}"
    return copied


def check_outputs(
    reference: ExportedProgram,
    result: ExportedProgram,
    uncopied: ExportedProgram,
    plan,
    orders: Sequence[Optional[tuple[int, ...]]],
    input_sets: Sequence[tuple],
    *,
    dynamic: bool,
) -> None:
    """Layout, semantics and cost of every user output, at every input set.

    Values come from running ``result`` eagerly, layouts from
    ``compiled_strides``. ``uncopied`` is the result without its output
    copies: an output was worth a copy exactly where it comes back mislaid
    there, or where the plan says it cannot decide (symbolic strides).
    """
    for inputs in input_sets:
        expected, got = run(reference, inputs), run(result, inputs)
        layouts, bare_layouts = compiled_strides(result, inputs), compiled_strides(uncopied, inputs)
        batch = f" at batch {inputs[0].shape[0]}" if dynamic else ""
        for i, (want, have, order) in enumerate(zip(expected, got, orders)):
            where = _describe(plan, i) + batch
            assert same_value(want, have), f"{where}: values differ from the original program's"
            if not isinstance(have, torch.Tensor):
                continue
            assert layout.has_layout(have.shape, layouts[i], order) is True, (
                f"{where}: comes back with strides {layouts[i]}, not those of dim order {order}"
            )
            mislaid = layout.has_layout(have.shape, bare_layouts[i], order) is not True
            decided = plan.outputs[i].in_target_layout is not None
            copied = plan.outputs[i].action is Action.COPY
            if decided or not copied:
                assert copied == mislaid, (
                    f"{where}: {'copied although' if copied else 'not copied although'} it comes back with "
                    f"strides {bare_layouts[i]} without a copy, target dim order {order}"
                )


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
    returned = user_output_nodes(program)
    orders = [layout.identity_order(n.meta["val"].dim()) if _is_tensor_node(n) else None for n in returned]
    check_outputs(program, fixed, program, plan, orders, input_sets, dynamic=len(input_sets) > 1)


def _is_tensor_node(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)


def promised_order(node: Any) -> Optional[tuple[int, ...]]:
    """The dim order an Edge program promises for an output: that of its metadata."""
    if not _is_tensor_node(node):
        return None
    value = node.meta["val"]
    order = layout.dim_order_of(value.shape, value.stride())
    return order if order is not None else layout.identity_order(value.dim())


def check_prepare_for_aoti(edge: ExportedProgram, input_sets: Sequence[tuple]) -> None:
    """The contract for ``prepare_for_aoti`` on an Edge program: every output comes back in its promised
    dim order. The plan to compare with is ``inspect`` under the policy ``prepare_for_aoti`` converts with."""
    dialect = dialect_of(edge)
    before = snapshot(edge)
    orders = [promised_order(n) for n in user_output_nodes(edge)]
    plan = strideguard.inspect(edge, policy=STRIDEGUARD)
    prepared = strideguard.prepare_for_aoti(edge)
    check_is_sound_rewrite(edge, prepared, before)
    copy_op, _ = copy_call(dialect, ())
    copied = new_copies(edge, prepared, copy_op)
    planned = [o.index for o in plan.copies_needed]
    assert sorted(copied) == planned, f"copies at outputs {sorted(copied)}, the plan has {planned}"
    after = strideguard.inspect(prepared)
    assert after.ok, str(after)
    detach_copy = exir_ops.edge.aten.detach_copy.default
    assert not any(n.target == detach_copy for n in prepared.graph.nodes), "a detach_copy is left"
    uncopied = strideguard.prepare_for_aoti(edge, copy_outputs=False)
    check_outputs(edge, prepared, uncopied, plan, orders, input_sets, dynamic=len(input_sets) > 1)


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
    """The contract for one generated program: ATen under ``densify_outputs``, Edge under ``prepare_for_aoti``.

    The ATen checks run before ``to_edge``, which leaves the exported program
    changed: a later ``run_decompositions`` specializes its dynamic batch.
    """
    try:
        program = export_program(spec)
    except Exception as error:  # noqa: BLE001
        raise Rejected(f"torch.export: {type(error).__name__}") from error
    sets = input_sets(spec)
    check_densify_outputs(program, sets)
    if spec.mutates_buffer:
        check_densify_outputs(program.run_decompositions({}), sets)
    for skip_dim_order in (False, True):
        try:
            edge = edge_program(program, skip_dim_order=skip_dim_order)
        except Exception as error:  # noqa: BLE001
            raise Rejected(f"to_edge: {type(error).__name__}") from error
        check_prepare_for_aoti(edge, sets if keeps_dynamic_batch(edge) or not spec.dynamic_batch else sets[:1])


# ---------------------------------------------------------------------------------------------
# The oracle, checked against AOTInductor


def _same_strides(got: torch.Tensor, predicted: Sequence[int]) -> bool:
    """Strides compared as the runtime compares them, size-one dimensions included; an empty tensor has no layout."""
    return got.numel() == 0 or tuple(got.stride()) == tuple(predicted)


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


def export_combined(specs: Sequence[ProgramSpec]) -> ExportedProgram:
    return torch.export.export(
        CombinedModule(specs).eval(), combined_inputs(specs), dynamic_shapes=combined_dynamic_shapes(specs)
    )


def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


def compile_or_blame(specs: Sequence[ProgramSpec], build, directory: str) -> tuple[Any, dict[int, str]]:
    """Compile ``build(specs)``; when that fails, compile each part alone to say which parts fail.

    Returns the loaded package (or ``None``) and the failing parts with their errors.
    """
    try:
        return compile_program(build(specs), directory), {}
    except Exception as error:  # noqa: BLE001 - which part fails is the finding
        together = _first_line(error)
    blamed = {}
    for part, spec in enumerate(specs):
        try:
            compile_program(build([spec]), f"{directory}-part-{part}")
        except Exception as error:  # noqa: BLE001
            blamed[part] = _first_line(error)
    return None, blamed or {part: f"fails only together with the others: {together}" for part in range(len(specs))}


@dataclass
class CompiledSample:
    """What compiling a sample showed: problems (part, text), and parts AOTInductor itself cannot compile."""

    problems: list[tuple[int, str]]
    uncompilable: dict[int, str]


def check_compiled_sample(specs: Sequence[ProgramSpec], directory: str) -> CompiledSample:
    """Compile several generated programs as one method and check the oracle against AOTInductor.

    The ATen program is compiled before and after ``densify_outputs``: before,
    every output must come back with the strides ``compiled_strides``
    predicts; after, contiguous, with the same values. The Edge program
    (dim-order mode) is compiled after ``prepare_for_aoti``: each output with
    the predicted strides, which are those of its promised order. Parts
    that AOTInductor cannot compile even untouched are set aside (a compiler
    limitation, not strideguard's); a part that compiles untouched but not
    after strideguard's pass is a problem.
    """
    specs = list(specs)
    plain, uncompilable = compile_or_blame(specs, export_combined, os.path.join(directory, "aten"))
    if uncompilable:
        kept = [s for part, s in enumerate(specs) if part not in uncompilable]
        result = check_compiled_sample(kept, os.path.join(directory, "kept")) if kept else CompiledSample([], {})
        index = [part for part in range(len(specs)) if part not in uncompilable]
        return CompiledSample([(index[p], text) for p, text in result.problems], uncompilable)

    owner = [(part, j) for part, spec in enumerate(specs) for j in range(len(spec.outputs))]
    problems: list[tuple[int, str]] = []

    def expect(condition: bool, index: int, text: str) -> None:
        if not condition:
            part, j = owner[index]
            problems.append((part, f"part {part} output {j} ({specs[part].outputs[j]}): {text}"))

    def densified(parts):
        return strideguard.densify_outputs(export_combined(parts))

    def prepared(parts):
        return strideguard.prepare_for_aoti(edge_program(export_combined(parts), skip_dim_order=False))

    dense, failed = compile_or_blame(specs, densified, os.path.join(directory, "aten-densified"))
    problems += [(part, f"compiles untouched, not after densify_outputs: {text}") for part, text in failed.items()]
    program = export_combined(specs)
    batches = [EXAMPLE_BATCH] + ([OTHER_BATCH] if any(s.dynamic_batch for s in specs) else [])
    for batch in batches if dense is not None else []:
        inputs = combined_inputs(specs, batch)
        expected, predictions = run(program, inputs), compiled_strides(program, inputs)
        with torch.no_grad():
            got_plain, got_dense = _leaves(plain(*inputs)), _leaves(dense(*inputs))
        for i, (want, predicted, before, after) in enumerate(zip(expected, predictions, got_plain, got_dense)):
            before, after = _plain(before, want), _plain(after, want)
            if not isinstance(want, torch.Tensor):
                expect(before == want and after == want, i, f"values {before}, {after}, expected {want}")
                continue
            expect(
                _same_strides(before, predicted), i,
                f"batch {batch}: AOTInductor returns strides {before.stride()}, the oracle predicts {predicted}",
            )
            expect(layout.has_layout(after.shape, after.stride(), layout.identity_order(after.dim())) is True, i,
                   f"batch {batch}: densified, AOTInductor returns strides {after.stride()}")
            expect(torch.equal(before, after) and _close(after, want), i, f"batch {batch}: values differ")

    compiled, failed = compile_or_blame(specs, prepared, os.path.join(directory, "edge-prepared"))
    problems += [(part, f"compiles untouched, not after prepare_for_aoti: {text}") for part, text in failed.items()]
    if compiled is None:
        return CompiledSample(problems, {})
    edge = edge_program(program, skip_dim_order=False)
    inputs = combined_inputs(specs)
    expected, predictions = run(edge, inputs), compiled_strides(strideguard.prepare_for_aoti(edge), inputs)
    with torch.no_grad():
        got = _leaves(compiled(*inputs))
    orders = [promised_order(n) for n in user_output_nodes(edge)]
    for i, (want, predicted, value, order) in enumerate(zip(expected, predictions, got, orders)):
        value = _plain(value, want)
        if not isinstance(want, torch.Tensor):
            expect(value == want, i, f"Edge: value {value}, expected {want}")
            continue
        expect(
            _same_strides(value, predicted), i,
            f"Edge prepared: AOTInductor returns strides {value.stride()}, the oracle predicts {predicted}",
        )
        expect(layout.has_layout(value.shape, value.stride(), order) is True, i,
               f"Edge prepared: AOTInductor returns strides {value.stride()}, not those of dim order {order}")
        expect(_close(value, want), i, "Edge prepared: values differ")
    return CompiledSample(problems, {})


# ---------------------------------------------------------------------------------------------
# Kept failures


REGRESSIONS = Path(__file__).parent / "regressions"
"""One JSON file per shrunk failure: ``spec``, ``failure``, ``compiled`` (found by the compile
check), and, while the library bug it shows is open, ``xfail`` with the reason."""


def save_regression(spec: ProgramSpec, failure: str, *, compiled: bool = False) -> Path:
    """Write a failing program where ``test_generated_regressions`` replays it, unless it is kept already;
    a new file is named by its spec's hash (rename it to say what it shows)."""
    REGRESSIONS.mkdir(exist_ok=True)
    for path in REGRESSIONS.glob("*.json"):
        record = json.loads(path.read_text())
        if ProgramSpec.from_json(record["spec"]) == spec and record.get("compiled", False) == compiled:
            return path
    text = spec.dumps()
    path = REGRESSIONS / f"{'compiled-' if compiled else ''}{hashlib.sha1(text.encode()).hexdigest()[:12]}.json"
    path.write_text(format_record({"spec": spec.to_json(), "failure": failure[:1000], "compiled": compiled}))
    return path


def format_record(record: dict[str, Any]) -> str:
    """One key per line, the spec on one line: short files, readable diffs."""
    lines = [f" {json.dumps(key)}: {json.dumps(value, sort_keys=True)}" for key, value in sorted(record.items())]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def replay(record: dict[str, Any], directory: str) -> None:
    """Run the check that found a kept failure; raises while the failure is there."""
    spec = ProgramSpec.from_json(record["spec"])
    if record.get("compiled"):
        result = check_compiled_sample([spec], directory)
        assert not result.uncompilable, result.uncompilable
        assert not result.problems, "\n".join(text for _, text in result.problems)
        return
    check_program(spec)

"""CUDA graphs around an AOTInductor-compiled method, with the layout check as a guard.

ExecuTorch's CUDA runtime runs a method eagerly for three warm-up calls,
captures a CUDA graph on the fourth and replays it after, copying each output
device to device from the graph's static buffers into the method's output
tensor (its ETensor). A byte copy is right only when the compiled method's
output is laid out like that tensor, so the runtime compares the two: an output
that is not is copied through host memory with a stream synchronization on
every call, and CUDA graphs are turned off for the method. That per-step cost
is what strideguard removes. ``GraphedMethod`` reproduces the policy so that it
can be measured (``bench/gpu.py``), and is a runner in its own right for Python
deployments that want CUDA graphs around an AOTInductor model.

The policy (warm up, capture, replay, or fall back, and the message saying why)
is ``GraphPolicy``, a small state machine that knows nothing of CUDA. The
mechanics (capture, replay, the host round trip) are injected: ``CudaGraphs``
on a GPU, ``EmulatedGraphs`` to rehearse the same calls on the CPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional, Protocol, Sequence

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from strideguard.program import density
from strideguard.program.exported import require_exported_program
from strideguard.program.promises import target_dim_orders

log = logging.getLogger(__name__)

WARMUP_CALLS = 3
"""Eager calls before the capture, as in ExecuTorch's CUDA runtime: lazy kernel
loading, cuBLAS handles and the allocator's first blocks all happen outside the graph."""

DimOrder = tuple[int, ...]


def disabled_message(method: str, output_index: int) -> str:
    """The runtime's message, word for word, so logs from both read the same."""
    return f"CUDA graph: disabled for '{method}', output {output_index} is not laid out like its ETensor"


class Step(str, Enum):
    """What one call of a method does."""

    WARMUP = "warmup"
    CAPTURE = "capture"
    REPLAY = "replay"
    EAGER = "eager"
    """Graphs are off for the method: every call runs the compiled code."""


@dataclass(frozen=True)
class OutputVerdict:
    """One output compared with its promised layout (its ETensor's)."""

    index: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    promised_strides: tuple[int, ...]
    in_target_layout: bool
    """A plain device copy of its bytes lands in the ETensor correctly."""


def check_output(index: int, value: torch.Tensor, dim_order: DimOrder, *, exact: bool = True) -> OutputVerdict:
    """Whether ``value`` is laid out like its ETensor, dense in ``dim_order``.

    ``exact`` compares every stride, as the runtime does (``_strides_match``
    in ExecuTorch's CUDA backend): a ``[1, 512]`` row with strides
    ``(4096, 1)`` takes the host path there, although a byte copy of it would
    be right. With ``exact=False`` the comparison is the one that matters for
    a byte copy: size-one dimensions may carry any stride. Either way a
    storage offset does not matter (copies start at the data pointer), and an
    empty output is never copied.
    """
    shape = tuple(value.shape)
    if sorted(dim_order) != list(range(len(shape))):
        raise ValueError(f"output {index}: dim order {tuple(dim_order)} does not fit its {len(shape)} dimensions")
    promised = tuple(density.strides_for_order(shape, dim_order))
    if value.numel() == 0:
        in_target_layout = True
    elif exact:
        in_target_layout = density.has_layout(shape, value.stride(), dim_order) is True
    else:
        in_target_layout = density.is_dense_in_order(shape, value.stride(), dim_order) is True
    return OutputVerdict(index, shape, tuple(value.stride()), promised, in_target_layout)


class GraphPolicy:
    """When a method warms up, captures, replays or runs eagerly, and why graphs went off.

    Graphs go off at the first call (warm-up or capture) with an output not laid
    out as promised: replaying would only move the host round trip into every
    step. Replays are not checked again: a captured graph writes the same
    static buffers, with the same strides, every time.
    """

    def __init__(self, method: str, warmup_calls: int = WARMUP_CALLS):
        self.method = method
        self.warmup_calls = warmup_calls
        self.calls = 0
        self.captured = False
        self.disabled_reason: Optional[str] = None

    def next_step(self) -> Step:
        if self.disabled_reason is not None:
            return Step.EAGER
        if self.captured:
            return Step.REPLAY
        return Step.CAPTURE if self.calls >= self.warmup_calls else Step.WARMUP

    def record(self, step: Step, verdicts: Sequence[OutputVerdict]) -> Optional[str]:
        """Account for a finished call; returns the message if this call turned graphs off."""
        self.calls += 1
        if self.disabled_reason is not None:
            return None
        strided = next((v for v in verdicts if not v.in_target_layout), None)
        if strided is not None:
            self.captured = False
            self.disabled_reason = disabled_message(self.method, strided.index)
            return self.disabled_reason
        if step is Step.CAPTURE:
            self.captured = True
        return None


class Graph(Protocol):
    def replay(self) -> None: ...


class Mechanics(Protocol):
    """The device side of the policy: capturing, and the host round trip."""

    def capture(self, run: Callable[[], Any]) -> tuple[Graph, Any]:
        """Record ``run()`` into a graph; returns it and the outputs it will write on replay.

        As with CUDA, the capture need not compute anything: the caller
        replays once before reading the outputs.
        """
        ...

    def copy_through_host(self, destination: torch.Tensor, source: torch.Tensor) -> None: ...


class CudaGraphs:
    """``torch.cuda.CUDAGraph`` capture and replay, and a synchronizing host round trip.

    Capture runs in relaxed mode, as ExecuTorch's runtime does: a model
    container loaded thread-safe queries or waits on its previous run's event
    at the start of each run, which the default (global) mode forbids while
    capturing.
    """

    def capture(self, run: Callable[[], Any]) -> tuple[Graph, Any]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="relaxed"):
            outputs = run()
        return graph, outputs

    def copy_through_host(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        host = source.to("cpu")
        torch.cuda.current_stream(source.device).synchronize()
        destination.copy_(host)


class _EmulatedGraph:
    def __init__(self, run: Callable[[], Any], outputs: list[torch.Tensor]):
        self._run = run
        self._outputs = outputs

    def replay(self) -> None:
        for static, fresh in zip(self._outputs, pytree.tree_leaves(self._run())):
            static.copy_(fresh)


class EmulatedGraphs:
    """A CPU stand-in for ``CudaGraphs``, to rehearse the policy and a deployment without a GPU.

    Capture runs once and then poisons the outputs, because a real capture
    computes nothing; replay runs again and writes into those same outputs,
    keeping their strides, as a replayed graph writes its static buffers.
    """

    def capture(self, run: Callable[[], Any]) -> tuple[Graph, Any]:
        outputs = run()
        leaves = [leaf for leaf in pytree.tree_leaves(outputs) if isinstance(leaf, torch.Tensor)]
        for leaf in leaves:
            leaf.fill_(_poison(leaf.dtype))
        return _EmulatedGraph(run, leaves), outputs

    def copy_through_host(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        destination.copy_(source.to("cpu"))


def _poison(dtype: torch.dtype) -> Any:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return True if dtype == torch.bool else -1


@dataclass
class RunnerStats:
    """Counters over all calls; per-step costs are differences between two readings."""

    calls: int = 0
    graph_calls: int = 0
    """Calls answered by the graph: the capture (which replays once) and each replay."""
    eager_calls: int = 0
    device_copies: int = 0
    """Outputs copied device to device into their ETensor."""
    host_copies: int = 0
    """Outputs copied through host memory with a stream synchronization."""


class GraphedMethod:
    """A compiled method run as ExecuTorch's CUDA runtime runs it, CUDA graphs included.

    ``run`` takes tensors and returns a tensor or a pytree of tensors (a loaded
    AOTInductor package; see ``load``). ``dim_orders`` gives each output's
    promised layout (its ETensor's), outermost dimension first; by default
    every output is promised contiguous, as for an ATen program
    (``promised_dim_orders`` reads them from a program). ``exact_strides``
    chooses the layout check (see ``check_output``): the runtime's literal
    comparison by default.

    Every call writes each output into the same tensor (its ETensor),
    allocated at the first call in the promised layout, and returns those
    tensors: copy what must outlive the next call. Inputs of a replayed call
    are copied into the graph's static inputs, so they must keep the shapes
    and dtypes of the captured call.
    """

    def __init__(
        self,
        run: Callable[..., Any],
        dim_orders: Optional[Sequence[DimOrder]] = None,
        *,
        method: str = "forward",
        mechanics: Optional[Mechanics] = None,
        warmup_calls: int = WARMUP_CALLS,
        exact_strides: bool = True,
    ):
        self.run = run
        self.method = method
        self.exact_strides = exact_strides
        self.policy = GraphPolicy(method, warmup_calls)
        self.mechanics = mechanics if mechanics is not None else CudaGraphs()
        self.stats = RunnerStats()
        self._dim_orders = None if dim_orders is None else [tuple(order) for order in dim_orders]
        self._etensors: Optional[list[torch.Tensor]] = None
        self._out_spec: Optional[pytree.TreeSpec] = None
        self._graph: Optional[Graph] = None
        self._static_inputs: list[torch.Tensor] = []
        self._static_outputs: list[torch.Tensor] = []
        self._static_verdicts: tuple[OutputVerdict, ...] = ()

    @classmethod
    def load(
        cls,
        package_path: str,
        dim_orders: Optional[Sequence[DimOrder]] = None,
        *,
        method: str = "forward",
        device_index: int = 0,
        **options: Any,
    ) -> "GraphedMethod":
        """Load an AOTInductor package compiled for CUDA and wrap it.

        The package is loaded single-threaded, as torch advises for CUDA
        graphs: the thread-safe model container records a CUDA event after
        each run and queries or waits on it before the next, so during a
        capture that record becomes part of the graph and an eager call after
        the capture (the fallback) would look at an event no run completes.
        """
        compiled = torch._inductor.aoti_load_package(package_path, run_single_threaded=True, device_index=device_index)
        return cls(compiled, dim_orders, method=method, **options)

    @property
    def graph_captured(self) -> bool:
        return self.policy.captured

    def __call__(self, *inputs: torch.Tensor) -> Any:
        step = self.policy.next_step()
        if step is Step.REPLAY:
            self._stage(inputs)
            self._graph.replay()
            outputs, verdicts = self._static_outputs, self._static_verdicts
        elif step is Step.CAPTURE:
            outputs, verdicts = self._capture(inputs)
        else:
            outputs = self._flatten(self.run(*inputs))
            verdicts = self._check(outputs)
        self.stats.calls += 1
        if step in (Step.CAPTURE, Step.REPLAY):
            self.stats.graph_calls += 1
        else:
            self.stats.eager_calls += 1
        message = self.policy.record(step, verdicts)
        if message is not None:
            log.warning(message)
            self._release_graph()
        elif step is Step.CAPTURE:
            log.info("CUDA graph: captured for '%s'", self.method)
        self._copy_out(outputs, verdicts)
        return pytree.tree_unflatten(self._etensors, self._out_spec)

    def _capture(self, inputs: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], tuple[OutputVerdict, ...]]:
        # Static inputs are allocated before the capture, outside the graph's memory pool.
        self._static_inputs = [x.clone() for x in inputs]
        graph, captured = self.mechanics.capture(lambda: self.run(*self._static_inputs))
        graph.replay()
        self._graph = graph
        self._static_outputs = self._flatten(captured)
        self._static_verdicts = self._check(self._static_outputs)
        return self._static_outputs, self._static_verdicts

    def _stage(self, inputs: Sequence[torch.Tensor]) -> None:
        if len(inputs) != len(self._static_inputs):
            raise ValueError(f"CUDA graph replay: {len(inputs)} inputs, the graph was captured with {len(self._static_inputs)}")
        for index, (static, value) in enumerate(zip(self._static_inputs, inputs)):
            if value.shape != static.shape or value.dtype != static.dtype:
                raise ValueError(
                    f"CUDA graph replay: input {index} is {list(value.shape)} {value.dtype}, "
                    f"the graph was captured with {list(static.shape)} {static.dtype}"
                )
            static.copy_(value)

    def _release_graph(self) -> None:
        self._graph = None
        self._static_inputs, self._static_outputs, self._static_verdicts = [], [], ()

    def _flatten(self, result: Any) -> list[torch.Tensor]:
        leaves, spec = pytree.tree_flatten(result)
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(f"'{self.method}' output {index} is a {type(leaf).__name__}; only tensor outputs are supported")
        if self._out_spec is None:
            self._out_spec = spec
        return leaves

    def _check(self, outputs: Sequence[torch.Tensor]) -> tuple[OutputVerdict, ...]:
        if self._dim_orders is None:
            self._dim_orders = [density.identity_order(out.dim()) for out in outputs]
        if len(self._dim_orders) != len(outputs):
            raise ValueError(f"'{self.method}' returned {len(outputs)} outputs for {len(self._dim_orders)} promised layouts")
        return tuple(
            check_output(i, out, order, exact=self.exact_strides)
            for i, (out, order) in enumerate(zip(outputs, self._dim_orders))
        )

    def _copy_out(self, outputs: Sequence[torch.Tensor], verdicts: Sequence[OutputVerdict]) -> None:
        if self._etensors is None:
            self._etensors = [
                torch.empty_strided(out.shape, verdict.promised_strides, dtype=out.dtype, device=out.device)
                for out, verdict in zip(outputs, verdicts)
            ]
        for out, verdict, etensor in zip(outputs, verdicts, self._etensors):
            if out.shape != etensor.shape or out.dtype != etensor.dtype:
                raise ValueError(
                    f"'{self.method}' output {verdict.index} is {list(out.shape)} {out.dtype}, "
                    f"its ETensor {list(etensor.shape)} {etensor.dtype}"
                )
            if verdict.in_target_layout:
                etensor.copy_(out)
                self.stats.device_copies += 1
            else:
                self.mechanics.copy_through_host(etensor, out)
                self.stats.host_copies += 1


def promised_dim_orders(program: ExportedProgram) -> tuple[DimOrder, ...]:
    """Each user output's promised layout: contiguous for an ATen program, the recorded dim order for an Edge one."""
    program = require_exported_program(program, "cuda_graphs.promised_dim_orders")
    orders = target_dim_orders(program)
    for index, order in enumerate(orders):
        if order is None:
            raise TypeError(f"user output {index} is not a tensor; GraphedMethod supports tensor outputs only")
    return orders

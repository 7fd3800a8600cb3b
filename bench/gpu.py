"""CUDA graphs around AOTInductor, each method as exported and fixed: the GPU measurement behind strideguard.

ExecuTorch's CUDA runtime captures a CUDA graph for a method only while every
output comes back laid out like its ETensor; otherwise it copies that output
through host memory with a stream synchronization on every call and turns
graphs off for the method. This script shows what that costs and what
``strideguard.densify_outputs`` wins back. For each method (the example
policy, an LLM decode-like step, and a transposed projection whose strided
output checks the fallback's values) and each variant (``unfixed``: as
exported; ``fixed``: after ``densify_outputs``) it compiles with AOTInductor
for CUDA, runs the package through ``bench.cuda_graphs.GraphedMethod``
(the runtime's policy) and records per-step latency (median, p99), whether
the graph was captured, and the host copies per step.

Run it through ``bench/gpu.sh``. Without a CUDA device it writes a JSON saying
it skipped and exits 0. ``--rehearse-on-cpu`` runs the same flow on the CPU
with emulated graphs, to check the script before spending GPU time; its
timings say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

import strideguard
from bench.aoti_loader import LOADER_VARIABLE, install_from_environment
from bench.cuda_graphs import WARMUP_CALLS, CudaGraphs, EmulatedGraphs, GraphedMethod, promised_dim_orders
from strideguard.examples import export_decode_step, export_policy

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
VARIANTS = ("unfixed", "fixed")
INPUT_SETS = 8
"""Inputs rotate among this many sets, so each step stages new data into the graph's static inputs."""
POLICY_RATIO_TARGET = 0.5


class TransposedProjection(nn.Module):
    """Per-position features returned as [batch, features, positions]: a full-size transposed output.

    Left unfixed on purpose, it takes the runtime's host path on every step;
    its values are checked like every other output's.
    """

    def __init__(self, dim: int = 64):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x)).transpose(1, 2)


def export_transposed(batch: int = 1, positions: int = 16, seed: int = 0) -> ExportedProgram:
    torch.manual_seed(seed)
    with torch.no_grad():
        return torch.export.export(TransposedProjection().eval(), (torch.randn(batch, positions, 64),))


@dataclass(frozen=True)
class Case:
    export: Callable[[], ExportedProgram]
    inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    returns: str


CASES = {
    "policy": Case(export_policy, lambda g: (torch.randn(1, 64, generator=g),), "sample[..., :action_dim]"),
    "decode": Case(export_decode_step, lambda g: (torch.randint(0, 512, (1, 8), generator=g),), "logits[:, -1, :]"),
    "transposed": Case(export_transposed, lambda g: (torch.randn(1, 16, 64, generator=g),), "tanh(proj(x)).transpose(1, 2)"),
}


def program_for(case: str, variant: str) -> ExportedProgram:
    program = CASES[case].export()
    return strideguard.densify_outputs(program) if variant == "fixed" else program


def quiet() -> None:
    """Drop a warning torch 2.13 gives for every copied program (strideguard copies each one it fixes).

    The device machine returns only the end of the output: keep it for the results.
    """
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


def compile_variant(case: str, variant: str, directory: str, device: str) -> dict:
    """Export ``case`` on ``device`` and compile it with AOTInductor; runs in a worker process."""
    quiet()
    started = time.perf_counter()
    program = program_for(case, variant)
    args = tuple(a.to(device) for a in program.example_inputs[0])
    on_device = torch.export.export(program.module().to(device), args)
    package = torch._inductor.aoti_compile_and_package(
        on_device, package_path=os.path.join(directory, f"{case}-{variant}.pt2")
    )
    return {"package": package, "compile_seconds": round(time.perf_counter() - started, 1)}


def compile_all(variants: list[tuple[str, str]], directory: str, device: str, jobs: int) -> dict:
    """Each variant's package, or the exception its compile raised; compiles run in parallel processes."""
    # Share the cores among the compiles rather than let each start a pool of its own size.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    packages = {}
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {key: pool.submit(compile_variant, *key, directory, device) for key in variants}
        for key, future in futures.items():
            try:
                packages[key] = future.result()
            except Exception as error:
                packages[key] = error
    return packages


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[max(0, math.ceil(fraction * len(sorted_values)) - 1)]


def timed_calls(call: Callable, input_sets: list, steps: int, synchronize: Callable[[], None]) -> list[float]:
    """Per-step latency in microseconds, each step ending when its results are ready on the device."""
    times = []
    for step in range(steps):
        inputs = input_sets[step % len(input_sets)]
        started = time.perf_counter_ns()
        call(*inputs)
        synchronize()
        times.append((time.perf_counter_ns() - started) / 1e3)
    return times


def summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_us": round(statistics.median(ordered), 2), "p99_us": round(percentile(ordered, 0.99), 2)}


def measure(case: str, variant: str, package: str, device: str, steps: int) -> dict:
    """Run one compiled variant directly and through GraphedMethod; time it and check its values."""
    on_gpu = device == "cuda"
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    program = program_for(case, variant)
    reference = program.module().to(device)
    runner = GraphedMethod.load(
        package,
        promised_dim_orders(program),
        method=case,
        device_index=0 if on_gpu else -1,
        mechanics=CudaGraphs() if on_gpu else EmulatedGraphs(),
    )
    generator = torch.Generator().manual_seed(1)
    input_sets = [tuple(t.to(device) for t in CASES[case].inputs(generator)) for _ in range(INPUT_SETS)]

    with torch.no_grad():
        direct = timed_calls(runner.run, input_sets, steps, synchronize)
        aoti_strides = [list(t.stride()) for t in pytree.tree_leaves(runner.run(*input_sets[0]))]
        first_calls = timed_calls(runner, input_sets, WARMUP_CALLS + 1, synchronize)
        before = runner.stats.host_copies, runner.stats.device_copies
        graphed = timed_calls(runner, input_sets, steps, synchronize)
        host_copies = (runner.stats.host_copies - before[0]) / steps
        device_copies = (runner.stats.device_copies - before[1]) / steps
        correct, bitwise, error = check_values(runner, reference, input_sets)

    return {
        "case": case,
        "variant": variant,
        "returns": CASES[case].returns,
        "graph_captured": runner.graph_captured,
        "disabled_message": runner.policy.disabled_reason,
        "host_copies_per_step": host_copies,
        "device_copies_per_step": device_copies,
        **summary(graphed),
        "steps": steps,
        "first_calls_us": [round(t, 1) for t in first_calls],
        "direct_call": summary(direct),
        "aoti_strides": aoti_strides,
        "promised_strides": [list(t.stride()) for t in pytree.tree_leaves(runner(*input_sets[0]))],
        "correct": correct,
        "bitwise_equal_to_direct_call": bitwise,
        "max_abs_error_vs_eager": error,
    }


def check_values(runner: GraphedMethod, reference: nn.Module, input_sets: list) -> tuple[bool, bool, float]:
    """Every output against eager and against the compiled method called directly.

    The runner's output tensors are poisoned before each call, so an element
    it fails to write shows up as NaN.
    """
    correct, bitwise, error = True, True, 0.0
    for inputs in input_sets:
        for stale in pytree.tree_leaves(runner(*inputs)):
            if stale.is_floating_point():
                stale.fill_(float("nan"))
        got = pytree.tree_leaves(runner(*inputs))
        direct = pytree.tree_leaves(runner.run(*inputs))
        expected = pytree.tree_leaves(reference(*inputs))
        for value, same_kernels, eager in zip(got, direct, expected):
            bitwise &= torch.equal(value, same_kernels)
            correct &= torch.allclose(value, eager, rtol=1e-3, atol=1e-4)
            error = max(error, float((value.double() - eager.double()).abs().max().nan_to_num(nan=math.inf)))
    return correct, bitwise, error


def targets(rows: list[dict]) -> dict:
    by_key = {(r["case"], r["variant"]): r for r in rows if "error" not in r}
    fixed = [r for r in by_key.values() if r["variant"] == "fixed"]
    policy = by_key.get(("policy", "unfixed")), by_key.get(("policy", "fixed"))
    ratio = round(policy[1]["median_us"] / policy[0]["median_us"], 3) if all(policy) else None
    return {
        "fixed_keeps_graph": bool(fixed) and all(r["graph_captured"] for r in fixed),
        "policy_fixed_over_unfixed_median": ratio,
        "policy_ratio_target": POLICY_RATIO_TARGET,
        "policy_ratio_met": ratio is not None and ratio <= POLICY_RATIO_TARGET,
        "all_correct": len(by_key) == len(rows) and all(r["correct"] for r in rows),
    }


def write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def plot(path: Path, result: dict) -> Optional[str]:
    """A PNG of median and p99 step latency per method; None (and a note) when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("bench/gpu.py: matplotlib is not available here; no plot")
        return None
    rows = {(r["case"], r["variant"]): r for r in result["results"] if "error" not in r}
    cases = [c for c in CASES if any((c, v) in rows for v in VARIANTS)]
    figure = Figure(figsize=(10, 4.5), constrained_layout=True)
    FigureCanvasAgg(figure)
    for axes, statistic in zip(figure.subplots(1, 2), ("median_us", "p99_us")):
        for offset, variant in ((-0.2, "unfixed"), (0.2, "fixed")):
            present = [(i, rows[(c, variant)]) for i, c in enumerate(cases) if (c, variant) in rows]
            bars = axes.bar([i + offset for i, _ in present], [r[statistic] for _, r in present], width=0.4, label=variant)
            for bar, (_, row) in zip(bars, present):
                note = "graph" if row["graph_captured"] else f"no graph\n{row['host_copies_per_step']:g} host/step"
                axes.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
        axes.set_yscale("log")
        axes.set_xticks(range(len(cases)), cases)
        axes.set_ylabel(f"step latency, {statistic.removesuffix('_us')} (us)")
        axes.legend()
    figure.suptitle(f"CUDA graphs around AOTInductor: {result['device']}, {result['steps']} steps")
    figure.savefig(path, dpi=120)
    return str(path)


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="JSON results (default bench/results/gpu.json)")
    parser.add_argument("--plot", type=Path, help="PNG plot (default beside the JSON)")
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per variant (at least 1000 on a GPU)")
    parser.add_argument("--jobs", type=int, default=min(len(CASES) * len(VARIANTS), os.cpu_count() or 1),
                        help="compiles run in parallel")
    parser.add_argument("--rehearse-on-cpu", action="store_true", help="run the flow on the CPU with emulated graphs")
    args = parser.parse_args(argv)
    default_name = "gpu-cpu-rehearsal" if args.rehearse_on_cpu else "gpu"
    args.out = args.out or RESULTS / f"{default_name}.json"
    args.plot = args.plot or args.out.with_suffix(".png")
    return args


def environment(device: str) -> dict:
    return {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (rehearsal: emulated graphs, timings meaningless)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "aoti_loader": os.environ.get(LOADER_VARIABLE, "package"),
    }


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(argv)
    quiet()
    print(f"bench/gpu.py: AOTInductor packages load through torch's {install_from_environment()} loader", flush=True)
    if not args.rehearse_on_cpu and not torch.cuda.is_available():
        reason = f"no CUDA device (torch {torch.__version__}, built with CUDA {torch.version.cuda})"
        write(args.out, {"skipped": True, "reason": reason, "torch": torch.__version__, "python": platform.python_version()})
        print(f"bench/gpu.py: skipped: {reason}; wrote {args.out}")
        return 0
    device = "cpu" if args.rehearse_on_cpu else "cuda"
    started = time.perf_counter()
    result = {"skipped": False, "complete": False, **environment(device), "steps": args.steps, "results": []}
    variants = [(case, variant) for case in CASES for variant in VARIANTS]
    write(args.out, result)
    with tempfile.TemporaryDirectory(prefix="strideguard-gpu-") as directory:
        packages = compile_all(variants, directory, device, args.jobs)
        # Every compile has finished: none competes with the timings for the host's cores.
        for case, variant in variants:
            row = {"case": case, "variant": variant}
            try:
                compiled = packages[(case, variant)]
                if isinstance(compiled, Exception):
                    raise compiled
                row = {**measure(case, variant, compiled["package"], device, args.steps), "compile_seconds": compiled["compile_seconds"]}
            except Exception as error:  # one variant failing must not lose the others' numbers
                traceback.print_exception(error)
                row["error"] = f"{type(error).__name__}: {error}"
            result["results"].append(row)
            write(args.out, result)
            print(format_row(row), flush=True)
    result.update(targets=targets(result["results"]), complete=True, total_seconds=round(time.perf_counter() - started, 1))
    result["plot"] = plot(args.plot, result)
    write(args.out, result)
    print(f"targets: {json.dumps(result['targets'])}\nwrote {args.out}" + (f" and {result['plot']}" if result["plot"] else ""))
    return 0 if result["targets"]["all_correct"] else 1


def format_row(row: dict) -> str:
    if "error" in row:
        return f"{row['case']:>10} {row['variant']:>7}  ERROR {row['error']}"
    graph = "graph" if row["graph_captured"] else "no graph"
    return (
        f"{row['case']:>10} {row['variant']:>7}  median {row['median_us']:8.1f} us  p99 {row['p99_us']:8.1f} us  "
        f"{graph:>8}  host copies/step {row['host_copies_per_step']:g}  correct {row['correct']}  "
        f"(direct call median {row['direct_call']['median_us']:.1f} us, compiled in {row['compile_seconds']} s)"
    )


if __name__ == "__main__":
    sys.exit(main())

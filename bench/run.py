"""`make bench`: what strideguard's passes cost, and what a fixed output costs per call.

Writes bench/results/core.json, bench/results/executorch.json and
bench/results/summary.md (the table the README quotes). Timings are medians
of repeated runs taken in one process; ratios are taken within one run, since
these machines are noisy.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import strideguard  # noqa: E402
from bench.synthetic import export_blocks  # noqa: E402
from strideguard.examples import export_policy  # noqa: E402
from strideguard.prove.verification import compile_program  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def median_seconds(function, repeats: int) -> float:
    return median_seconds_over(lambda _: function(), range(repeats))


def median_seconds_over(function, arguments) -> float:
    """The median time of ``function(argument)`` over ``arguments`` (fresh inputs a pass may consume)."""
    times = []
    for argument in arguments:
        gc.collect()
        started = time.perf_counter()
        function(argument)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def interleaved_seconds(calls: dict, repeats: int) -> dict[str, list[float]]:
    """Each of ``calls`` (name -> a function making ``(function, argument)`` afresh, for a pass that consumes
    its input) timed once per repeat, the calls interleaved: seconds by name, one per repeat. Ratios taken
    repeat by repeat (``median_ratio``) cancel the machine's drift between blocks of calls, which moved
    ExecuTorch's pass alone by a factor of 1.8 in one run here."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, make in calls.items():
            function, argument = make()
            gc.collect()
            started = time.perf_counter()
            function(argument)
            times[name].append(time.perf_counter() - started)
    return times


def median_ratio(times: dict[str, list[float]], name: str, over: str) -> float:
    """The median over repeats of ``name``'s time over ``over``'s in the same repeat."""
    return statistics.median(a / b for a, b in zip(times[name], times[over]))


def peak_bytes(function) -> int:
    gc.collect()
    tracemalloc.start()
    function()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def core_pass_cost(sizes: list[int]) -> list[dict]:
    rows = []
    for size in sizes:
        program = export_blocks(size)
        nodes = len(program.graph.nodes)
        strideguard.densify_outputs(program)
        seconds = median_seconds(lambda: strideguard.densify_outputs(program), 5 if nodes < 20000 else 3)
        rows.append({
            "nodes": nodes,
            "outputs": len(program.graph_signature.output_specs),
            "densify_seconds": seconds,
            "us_per_node": seconds / nodes * 1e6,
            "peak_python_mib": peak_bytes(lambda: strideguard.densify_outputs(program)) / 2**20,
        })
        print(f"densify_outputs: {nodes} nodes, {rows[-1]['us_per_node']:.1f} us/node", flush=True)
    return rows


def policy_call_time(calls: int, rounds: int) -> dict:
    program = export_policy(batch=1)
    fixed = strideguard.densify_outputs(program)
    observation = program.example_inputs[0][0]
    with tempfile.TemporaryDirectory() as directory:
        unfixed_run = compile_program(program, os.path.join(directory, "unfixed"))
        fixed_run = compile_program(fixed, os.path.join(directory, "fixed"))
        variants = {
            "unfixed": lambda: unfixed_run(observation),
            "fixed": lambda: fixed_run(observation),
            "unfixed_then_contiguous": lambda: unfixed_run(observation).contiguous(),
        }
        assert not unfixed_run(observation).is_contiguous() and fixed_run(observation).is_contiguous()
        per_call = {name: [] for name in variants}
        with torch.no_grad():
            for name, call in variants.items():
                for _ in range(200):
                    call()
            for _ in range(rounds):
                for name, call in variants.items():
                    started = time.perf_counter()
                    for _ in range(calls):
                        call()
                    per_call[name].append((time.perf_counter() - started) / calls)
    medians = {name: statistics.median(values) for name, values in per_call.items()}
    result = {
        "calls_per_round": calls,
        "rounds": rounds,
        "median_us_per_call": {name: value * 1e6 for name, value in medians.items()},
        "fixed_over_unfixed": medians["fixed"] / medians["unfixed"],
        "contiguous_after_over_unfixed": medians["unfixed_then_contiguous"] / medians["unfixed"],
    }
    print(f"policy per call: {result['median_us_per_call']}", flush=True)
    return result


def executorch_pass_cost(sizes: list[int]) -> list[dict]:
    """strideguard's passes beside ExecuTorch's ``ReplaceViewCopyWithViewPass``, on the Edge programs an AOTI
    backend gets, each called as ``AotiBackend.preprocess`` calls it: ExecuTorch's on the graph module, the
    drop-in on the program (it sets ``requires_exported_program``). Two kinds of graph: ``bench/synthetic.py``'s
    blocks, and view-heavy blocks that slice, select, expand and unsqueeze."""
    from executorch.backends.aoti.passes.replace_view_copy_with_view import (
        ReplaceViewCopyWithViewPass as ExecuTorchPass,
    )

    from bench.synthetic import export_view_heavy
    from strideguard.executorch import ReplaceViewCopyWithViewPass as StrideguardPass
    from strideguard.testing.executorch_cpu import aoti_edge_program

    def fresh(edge):
        program = copy.copy(edge)
        program._graph_module = copy.deepcopy(edge.graph_module)
        return program

    rows = []
    for graphs, export in (("blocks", export_blocks), ("view-heavy", export_view_heavy)):
        for size in sizes:
            edge = aoti_edge_program(export(size))
            nodes = len(edge.graph.nodes)
            repeats = 5 if nodes < 20000 else 3
            StrideguardPass()(fresh(edge))  # warm: first calls import and trace once
            times = interleaved_seconds({
                "executorch": lambda: (ExecuTorchPass(), copy.deepcopy(edge.graph_module)),
                "drop_in": lambda: (StrideguardPass(), fresh(edge)),
                "prepare": lambda: (strideguard.prepare_for_aoti, edge),
            }, repeats)
            executorch_seconds, dropin_seconds, prepare_seconds = (
                statistics.median(times[name]) for name in ("executorch", "drop_in", "prepare")
            )
            rows.append({
                "graphs": graphs,
                "nodes": nodes,
                "executorch_pass_us_per_node": executorch_seconds / nodes * 1e6,
                "strideguard_pass_us_per_node": dropin_seconds / nodes * 1e6,
                "prepare_for_aoti_us_per_node": prepare_seconds / nodes * 1e6,
                "strideguard_pass_over_executorch": median_ratio(times, "drop_in", "executorch"),
                "prepare_for_aoti_over_executorch": median_ratio(times, "prepare", "executorch"),
                "prepare_for_aoti_peak_python_mib": peak_bytes(lambda: strideguard.prepare_for_aoti(edge)) / 2**20,
            })
            print(f"edge {graphs} {nodes} nodes: {rows[-1]}", flush=True)
    return rows


def summary(core: dict, executorch: list[dict]) -> str:
    lines = [
        f"Measured with `make bench` on {core['machine']}, torch {torch.__version__}.",
        "",
        "| ATen nodes | densify_outputs | per node | peak Python memory |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for row in core["pass_cost"]:
        lines.append(
            f"| {row['nodes']:,} | {row['densify_seconds'] * 1e3:.1f} ms | {row['us_per_node']:.1f} us | {row['peak_python_mib']:.1f} MiB |"
        )
    call = core["policy_call"]
    us = call["median_us_per_call"]
    lines += [
        "",
        f"Policy head, AOTInductor CPU, batch 1, median of {call['rounds']} rounds x {call['calls_per_round']} calls:",
        "",
        "| returned | us per call | ratio to unfixed |",
        "| --- | ---: | ---: |",
        f"| view, as exported (strided) | {us['unfixed']:.1f} | 1.00 |",
        f"| `densify_outputs` (copy inside the graph) | {us['fixed']:.1f} | {call['fixed_over_unfixed']:.2f} |",
        f"| view, then the caller's `.contiguous()` | {us['unfixed_then_contiguous']:.1f} | {call['contiguous_after_over_unfixed']:.2f} |",
    ]
    if executorch:
        lines += [
            "",
            "| graphs | Edge nodes | ExecuTorch's ReplaceViewCopyWithViewPass | strideguard's drop-in | ratio | prepare_for_aoti (copying) | ratio |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in executorch:
            lines.append(
                f"| {row['graphs']} | {row['nodes']:,} | {row['executorch_pass_us_per_node']:.1f} us/node | {row['strideguard_pass_us_per_node']:.1f} us/node"
                f" | {row['strideguard_pass_over_executorch']:.2f} | {row['prepare_for_aoti_us_per_node']:.1f} us/node"
                f" | {row['prepare_for_aoti_over_executorch']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def _stored(name: str) -> list[dict]:
    """The pass-cost rows an earlier run wrote to ``bench/results/<name>`` (none where there is no such file)."""
    try:
        return json.loads((RESULTS / name).read_text()).get("pass_cost", [])
    except (OSError, ValueError, AttributeError):
        return []


def _merged(stored: list[dict], measured: list[dict], key: tuple[str, ...]) -> list[dict]:
    """The rows just measured, and each stored row of a size not measured again: a run of some sizes
    (``--sizes ""``) keeps the others' figures rather than writing empty tables."""
    remeasured = {tuple(row.get(k) for k in key) for row in measured}
    kept = [row for row in stored if tuple(row.get(k) for k in key) not in remeasured]
    return sorted([*kept, *measured], key=lambda row: tuple(row.get(k) for k in key))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,50000", help="ATen graph sizes, in nodes")
    parser.add_argument("--edge-sizes", default="500,2000,10000,50000", help="Edge graph sizes, in nodes")
    parser.add_argument("--calls", type=int, default=2000, help="compiled calls per round")
    parser.add_argument("--rounds", type=int, default=7)
    arguments = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    core = {
        "machine": machine,
        "torch": torch.__version__,
        "pass_cost": _merged(
            _stored("core.json"), core_pass_cost([int(s) for s in arguments.sizes.split(",") if s]), ("nodes",)
        ),
        "policy_call": policy_call_time(arguments.calls, arguments.rounds),
    }
    (RESULTS / "core.json").write_text(json.dumps(core, indent=2))
    executorch = _merged(
        _stored("executorch.json"), executorch_pass_cost([int(s) for s in arguments.edge_sizes.split(",") if s]),
        ("graphs", "nodes"),
    )
    (RESULTS / "executorch.json").write_text(json.dumps({"machine": machine, "pass_cost": executorch}, indent=2))
    (RESULTS / "summary.md").write_text(summary(core, executorch))
    print((RESULTS / "summary.md").read_text())


if __name__ == "__main__":
    main()

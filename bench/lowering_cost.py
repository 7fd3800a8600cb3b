"""What the lowering oracle and the closed loop cost against a full AOTInductor compile.

``strideguard.compiler.oracle.lowering`` runs AOTInductor's own path up to the lowered graph
and stops; a full compile goes on to generate C++, compile and link it. For
each program: the quick ``inspect``, ``inspect(exact=True)`` (the analysis
and one lowering), ``densify_outputs(exact=True)`` (the fix and the closed
loop: the fixed program lowered and checked, again for each repair round),
and a full compile with Inductor's caches off (a cached compile measures the
cache); then the same lowering and closed loop for CUDA (``device="cuda"``:
Inductor's CUDA lowering on fake tensors, sm90, no GPU needed), with its
ratio to the CPU lowering. Medians of ``--repeats`` runs, taken in one
process; ``--no-compile`` leaves the full compile out. Writes
bench/results/lowering.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import strideguard  # noqa: E402
from strideguard.examples import export_policy  # noqa: E402
from strideguard.compiler.oracle.lowering import lower_outputs  # noqa: E402
from strideguard.prove.proof import PROOF_KEY  # noqa: E402
from strideguard.compiler.targets import resolve_target  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def programs(every: bool = False) -> list[tuple[str, torch.export.ExportedProgram]]:
    from tests import programs as test_programs, zoo

    found = [("policy head", export_policy(batch=1)), ("41-output test program", test_programs.export_every_output())]
    for model in zoo.MODELS + zoo.LOW_PRECISION:
        if every or model.name in ("llama-prefill-b2", "llama-decode-b1", "t5", "vit", "unet", "llama-prefill-b2-bfloat16"):
            found.append((f"{model.name} (transformers/diffusers, small config)", model.export()))
    return found


def seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def compile_cold(program: torch.export.ExportedProgram) -> None:
    with tempfile.TemporaryDirectory() as directory:
        torch._inductor.aoti_compile_and_package(
            program, package_path=f"{directory}/program.pt2", inductor_configs={"force_disable_caches": True}
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="leave the full compile out (the CUDA figures only)")
    parser.add_argument("--zoo", action="store_true", help="every model of the zoo, not six of them")
    parser.add_argument("--out", default="lowering.json", help="file name under bench/results")
    arguments = parser.parse_args()
    cuda = resolve_target("cuda", function="bench")
    rows = []
    for name, program in programs(arguments.zoo):
        lower_outputs(program)  # the first lowering in a process also imports and warms Inductor
        quick = seconds(lambda: strideguard.inspect(program), arguments.repeats)
        lowering = seconds(lambda: lower_outputs(program), arguments.repeats)
        exact = seconds(lambda: strideguard.inspect(program, exact=True), arguments.repeats)
        loop = seconds(lambda: strideguard.densify_outputs(program, exact=True), arguments.repeats)
        proof = strideguard.densify_outputs(program, exact=True).graph_module.meta[PROOF_KEY]
        compiling = float("nan") if arguments.no_compile else seconds(lambda: compile_cold(program), arguments.repeats)
        lower_outputs(program, target=cuda)  # the first CUDA lowering imports Triton's scheduling
        cuda_lowering = seconds(lambda: lower_outputs(program, target=cuda), arguments.repeats)
        cuda_loop = seconds(lambda: strideguard.densify_outputs(program, exact=True, device=cuda), arguments.repeats)
        row = {"program": name, "nodes": len(program.graph.nodes), "inspect_s": round(quick, 3),
               "lowering_s": round(lowering, 2), "inspect_exact_s": round(exact, 2), "closed_loop_s": round(loop, 2),
               "loop_rounds": proof.rounds, "compile_s": round(compiling, 2),
               "ratio": round(lowering / compiling, 3), "loop_ratio": round(loop / compiling, 3),
               "cuda_lowering_s": round(cuda_lowering, 2), "cuda_closed_loop_s": round(cuda_loop, 2),
               "cuda_to_cpu_lowering": round(cuda_lowering / lowering, 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / arguments.out).write_text(json.dumps(rows, indent=1) + "\n")
    print("| program | graph nodes | inspect | lowering oracle | inspect(exact=True) | densify_outputs(exact=True) "
          "(rounds) | full AOTInductor compile (no cache) | loop / compile |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['program']} | {row['nodes']} | {row['inspect_s']:.3f} s | {row['lowering_s']:.2f} s | "
              f"{row['inspect_exact_s']:.2f} s | {row['closed_loop_s']:.2f} s ({row['loop_rounds']}) | "
              f"{row['compile_s']:.2f} s | {row['loop_ratio']:.2f} |")
    print("\n| program | CPU lowering | CUDA lowering (fake, sm90) | CUDA / CPU | CUDA closed loop | CUDA loop / compile |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['program']} | {row['lowering_s']:.2f} s | {row['cuda_lowering_s']:.2f} s | "
              f"{row['cuda_to_cpu_lowering']:.2f} | {row['cuda_closed_loop_s']:.2f} s | "
              f"{row['cuda_closed_loop_s'] / row['compile_s']:.2f} |")
    ratios = [row["cuda_to_cpu_lowering"] for row in rows]
    print(f"CUDA / CPU lowering: median {statistics.median(ratios):.2f} ({min(ratios):.2f} to {max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

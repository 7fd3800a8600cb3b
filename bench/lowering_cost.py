"""What the lowering oracle costs against a full AOTInductor compile of the same programs.

``strideguard.lowering`` runs AOTInductor's own path up to the lowered graph
and stops; a full compile goes on to generate C++, compile and link it. Both
run here on the same programs, the compile with Inductor's caches off (a
cached compile measures the cache). Medians of ``--repeats`` runs, taken in
one process. Writes bench/results/lowering.json and prints a table.
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

from strideguard.examples import export_policy  # noqa: E402
from strideguard.lowering import lower_outputs  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def programs() -> list[tuple[str, torch.export.ExportedProgram]]:
    from tests import programs as test_programs, zoo

    found = [("policy head", export_policy(batch=1)), ("41-output test zoo", test_programs.export_zoo())]
    for name in ("llama-prefill-b2", "t5", "unet"):
        model = next(m for m in zoo.MODELS if m.name == name)
        found.append((f"{name} (transformers/diffusers, small config)", model.export()))
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
    arguments = parser.parse_args()
    rows = []
    for name, program in programs():
        lower_outputs(program)  # the first lowering in a process also imports and warms Inductor
        lowering = seconds(lambda: lower_outputs(program), arguments.repeats)
        compiling = seconds(lambda: compile_cold(program), arguments.repeats)
        row = {"program": name, "nodes": len(program.graph.nodes), "lowering_s": round(lowering, 2),
               "compile_s": round(compiling, 2), "ratio": round(lowering / compiling, 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lowering.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("| program | graph nodes | lowering oracle | full AOTInductor compile (no cache) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['program']} | {row['nodes']} | {row['lowering_s']:.2f} s | {row['compile_s']:.2f} s | {row['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

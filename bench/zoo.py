"""`make zoo`: every model of the zoo (tests/zoo.py) compiled fully, on both paths.

ATen path: AOTInductor compiles the exported program and the program after
``densify_outputs``; each is run and its outputs measured. Edge path: ExecuTorch's
real AOTI lowering (``to_edge_transform_and_lower`` with a CPU twin of its CUDA
backend, its own view pass inside) with and without ``DenseOutputsPass``; each
delegate is run with torch's AOTI runner. For each model and path it records
what was needed, copied, left undecided and mispredicted, what is still strided
after the fix, and whether the fixed values equal the unfixed compiled ones
bitwise. The decoder prefills are then compiled with ``pushdown=True`` on both
paths (``--no-pushdown`` skips it): FLOPs saved, layouts, and the largest
difference from the unfixed compiled values. Last, the bfloat16 models are fixed
with the closed loop (``exact=True``) on both paths, compiled, run and held to
their layouts and to ``verify``'s bfloat16 tolerance against eager
(``--no-low-precision`` skips it). Writes bench/results/zoo.json and
bench/results/zoo.md (``--output`` names them otherwise).

``--cuda`` runs no compile: each unfixed program is lowered by Inductor for the
CPU and for CUDA (fake tensors, sm90, no GPU needed), the outputs where the two
differ are listed, and the program fixed with ``exact=True, device="cuda"`` is
held to the CUDA lowering's proof (bench/results/zoo-cuda.json and .md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import zoo  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--paths", default="aten,edge")
    parser.add_argument("--no-pushdown", dest="pushdown", action="store_false",
                        help="skip compiling the decoder LMs with pushdown=True")
    parser.add_argument("--output", default="zoo", help="results file name under bench/results (without suffix)")
    parser.add_argument("--no-low-precision", dest="low_precision", action="store_false",
                        help="skip the bfloat16 models fixed with the closed loop")
    parser.add_argument("--cuda", action="store_true",
                        help="compare the CPU and CUDA lowerings of every unfixed program, and prove the CUDA fix")
    arguments = parser.parse_args()
    names = arguments.models.split(",") if arguments.models else [m.name for m in zoo.MODELS]
    models = [m for m in zoo.MODELS if m.name in names]
    if arguments.cuda:
        return cuda_comparison(models, arguments.paths, "zoo-cuda" if arguments.output == "zoo" else arguments.output)
    rows, failures = [], []
    with tempfile.TemporaryDirectory(prefix="strideguard-zoo-") as directory:
        for model in models:
            for path in arguments.paths.split(","):
                judge = zoo.judge_aten if path == "aten" else zoo.judge_edge
                started = time.perf_counter()
                try:
                    judgement = judge(model, compile=True, directory=directory)
                except Exception as error:  # noqa: BLE001 - one model's failure is a row, not the end of the run
                    traceback.print_exc()
                    rows.append({"model": model.name, "path": path, "error": f"{type(error).__name__}: {error}"[:300]})
                    failures.append(f"{model.name} ({path}): {type(error).__name__}")
                    continue
                row = {**judgement.row(), "what": model.what, "seconds": round(time.perf_counter() - started, 1)}
                detail = judgement.mispredicted + judgement.after + judgement.values
                if detail:
                    row["detail"] = detail
                rows.append(row)
                if not judgement.ok:
                    failures.append(f"{model.name} ({path})")
                print(json.dumps(row), flush=True)
        pushdown_rows = judged_rows(
            [m for m in zoo.DECODERS if m.name in names] if arguments.pushdown else [], arguments.paths, "pushdown",
            lambda model, path: zoo.judge_pushdown(model, path, compile=True, directory=directory), failures,
        )
        proven_rows = judged_rows(
            [m for m in zoo.LOW_PRECISION if m.name in names or not arguments.models] if arguments.low_precision else [],
            arguments.paths, "closed loop", lambda model, path: zoo.judge_proven(model, path, directory=directory),
            failures,
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    tables = table(rows) + pushdown_table(pushdown_rows) + proven_table(proven_rows)
    (RESULTS / f"{arguments.output}.json").write_text(
        json.dumps({"models": rows, "pushdown": pushdown_rows, "low_precision": proven_rows}, indent=1) + "\n")
    (RESULTS / f"{arguments.output}.md").write_text(tables)
    print(tables)
    if failures:
        print("NOT OK:", ", ".join(failures))
    return 1 if failures else 0


def cuda_comparison(models: list, paths: str, output: str) -> int:
    """Each model on each path: where the CPU and CUDA lowerings of the unfixed program differ, and whether the
    program fixed for CUDA is proven in layout by the CUDA lowering."""
    failures: list[str] = []
    rows = judged_rows(models, paths, "cuda", lambda model, path: zoo.judge_cuda(model, path, compare=True), failures)
    lines = [
        "| model | path | outputs where the CPU and CUDA lowerings differ (index: CPU, CUDA strides) "
        "| out of layout after the CUDA fix | seconds |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for row in rows:
        differs = "; ".join(f"{i}: {cpu}, {gpu}" for i, cpu, gpu in row["differs"]) or "none"
        lines.append(f"| {row['model']} | {row['path']} | {differs} | {len(row['after'])} | {row['seconds']} |")
    tables = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{output}.json").write_text(json.dumps({"models": rows}, indent=1) + "\n")
    (RESULTS / f"{output}.md").write_text(tables)
    print(tables)
    if failures:
        print("NOT OK:", ", ".join(failures))
    return 1 if failures else 0


def judged_rows(models: list, paths: str, what: str, judge, failures: list[str]) -> list[dict]:
    """``judge(model, path)`` for each model and path, as table rows; failures and exceptions noted."""
    rows = []
    for model in models:
        for path in paths.split(","):
            started = time.perf_counter()
            try:
                judgement = judge(model, path)
            except Exception as error:  # noqa: BLE001 - one model's failure is a row, not the end of the run
                traceback.print_exc()
                failures.append(f"{model.name} ({path}, {what}): {type(error).__name__}")
                continue
            rows.append({**judgement.row(), "seconds": round(time.perf_counter() - started, 1)})
            if not judgement.ok:
                failures.append(f"{model.name} ({path}, {what})")
            print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| model | returns | path | outputs | strided without fix | copies | left to Inductor | mispredicted | strided after fix | fixed values = unfixed |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | | {row['path']} | error: {row['error'][:80]} | | | | | | |")
            continue
        lines.append(
            f"| {row['model']} | {row['what']} | {row['path']} | {row['outputs']} | {row['needed']} | {row['copied']} | "
            f"{row['undecided']} | {row['mispredicted']} | {row['strided_after_fix']} | "
            f"{'bitwise' if not row['values_differ'] else 'DIFFER'} |"
        )
    return "\n".join(lines) + "\n"


def pushdown_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    lines = [
        "",
        "With `pushdown=True` (decoder prefills, compiled and run; error against the unfixed compiled method):",
        "",
        "| model | path | pushed-down producers' FLOPs saved | method FLOPs after / before | strided after fix | max error |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(f"| {row['model']} | {row['path']} | {row['saved']:.0%} | {row['method_flops_ratio']:.2f} | "
                     f"{row['strided_after_fix']} | {row['max_error']:.1e} |")
    return "\n".join(lines) + "\n"


def proven_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    lines = [
        "",
        "In bfloat16, fixed with the closed loop (`exact=True`), compiled and run (values against eager within "
        "`verify`'s bfloat16 tolerance):",
        "",
        "| model | path | loop rounds | loop time | copies strengthened | strided after fix | values outside tolerance |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(f"| {row['model']} | {row['path']} | {row['rounds']} | {row['loop_s']:.2f} s | "
                     f"{row['strengthened']} | {row['strided_after_fix']} | {row['values_wrong']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

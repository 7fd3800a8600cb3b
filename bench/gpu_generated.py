"""On a GPU: does strideguard's CUDA prediction hold on generated programs, the fuzz's hardest cases first?

``bench/gpu_oracle.py`` checks the fake-device CUDA lowering on attention; this
checks it on the view chains the fuzz generates. The programs are the fuzz's
kept failures (``tests/regressions``: each a case that once broke a promise)
and then a seeded draw of generated programs, several as one method per
compile, exported on the CPU as a user exports them. For each batch:

- every output's strides as strideguard predicts them for CUDA without
  touching the GPU (``lower_outputs`` with a fake-device target) against what
  AOTInductor's real CUDA compile returns;
- the program fixed with ``densify_outputs(exact=True, device="cuda")`` and
  compiled for CUDA: every output dense, with the untouched compile's values.

Each batch's two compiles (untouched and fixed) run in worker processes
(``--jobs``), all batches queued at once: a compile takes about a minute on a
GPU machine, and no compile starts after ``--minutes``. The predictions,
loads and comparisons run in this process. A batch AOTInductor cannot
compile untouched is split here, part by part, and the parts it refuses set
aside (not a finding); after ``--minutes`` it is set aside whole. Mismatches
print first; a batch that fails makes the exit status 1, as a mismatch does. Writes
``bench/results/gpu_generated.json`` after each batch. ``--rehearse-on-cpu``
runs the same flow for the CPU, to check the script before spending GPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
import warnings
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import strideguard  # noqa: E402
from strideguard.program import density  # noqa: E402
from strideguard.compiler.oracle.lowering import lower_outputs  # noqa: E402
from strideguard.compiler.targets import CPU, Target  # noqa: E402
from strideguard.prove.verification import aoti_program, compile_program  # noqa: E402
from bench.aoti_loader import install_from_environment  # noqa: E402
from bench.gpu_oracle import lower_on_this_torch  # noqa: E402
from tests import generated  # noqa: E402
from tests.generated import ProgramSpec  # noqa: E402

OUT = REPO / "bench" / "results" / "gpu_generated.json"
BATCH = 16


def kept_failures() -> list[tuple[str, ProgramSpec]]:
    found = []
    for path in sorted((REPO / "tests" / "regressions").glob("*.json")):
        found.append((path.stem, ProgramSpec.from_json(json.loads(path.read_text())["spec"])))
    return found


def drawn(seed: int, count: int) -> list[tuple[str, ProgramSpec]]:
    """``count`` generated programs from ``seed``, half of them shaped for pushdown; those torch.export
    refuses on the CPU are left out."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    found: list[tuple[str, ProgramSpec]] = []
    for offset, strategy in enumerate((generated.programs(), generated.pushdown_programs())):

        @with_seed(seed + offset)
        @settings(max_examples=count // 2, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(spec=strategy)
        def record(spec: ProgramSpec):
            try:
                generated.export_program(spec)
            except Exception:  # noqa: BLE001 - what export refuses is not a program to check
                return
            found.append((f"drawn-{seed + offset}-{len(found)}", spec))

        record()
    return found


def compared(kept: list[str], parts: list[ProgramSpec], program, predicted, plain, dense, device: str) -> list[dict]:
    """Each output of ``parts`` (compiled as one method) untouched and fixed, against the prediction."""
    owners = generated._owners(parts)
    inputs = tuple(t.to(device) for t in generated.combined_inputs(parts))
    with torch.no_grad():
        before, after = generated._leaves(plain(*inputs)), generated._leaves(dense(*inputs))
    rows = []
    for index, (guess, untouched, densified) in enumerate(zip(predicted, before, after)):
        part, j = owners[index]
        if guess is None or not isinstance(untouched, torch.Tensor) or untouched.numel() == 0:
            continue
        every = [list(generated._at_batch(s, program, generated.EXAMPLE_BATCH)) for s in guess.every_strides]
        row = {"program": kept[part], "output": j, "shape": list(untouched.shape),
               "predicted": every, "returned": list(untouched.stride()),
               "fixed_returned": list(densified.stride()),
               "fixed_dense": density.has_layout(densified.shape, densified.stride(),
                                                density.identity_order(densified.dim())) is True,
               "fixed_values_equal": untouched.shape == densified.shape and torch.allclose(
                   untouched.double(), densified.double(), rtol=1e-3, atol=1e-3, equal_nan=True)}
        row["matched"] = row["returned"] in every
        rows.append(row)
    return rows


def check_batch(named: list[tuple[str, ProgramSpec]], device: str, target: Target, directory: str) -> dict:
    """The whole check of one batch in this process, splitting it where AOTInductor refuses it untouched."""
    names, specs = [n for n, _ in named], [s for _, s in named]
    counter = iter(range(1_000_000))
    rows: list[dict] = []

    def compiled(parts):
        return compile_program(generated.export_combined(parts), f"{directory}/c{next(counter)}", device=device)

    def check(parts, plain):
        program = generated.export_combined(parts)
        predicted = lower_outputs(program, target=target).outputs
        fixed = strideguard.densify_outputs(program, exact=True, device=device)
        dense = compile_program(fixed, f"{directory}/c{next(counter)}", device=device)
        rows.extend(compared([names[specs.index(p)] for p in parts], parts, program, predicted, plain, dense, device))
        return generated.Sample([], {})

    sample = generated._without_refused(specs, compiled, check)
    return {"rows": rows, "refused": {names[part]: why for part, why in sample.refused.items()}}


def compile_batch(specs: list[ProgramSpec], fixed: bool, device: str, package: str, deadline: float):
    """In a worker: the batch as one method, untouched or fixed with ``densify_outputs``, compiled for
    ``device``; the package's path, or None where ``deadline`` (``time.time()``) passed before it started."""
    if time.time() > deadline:
        return None
    warnings.filterwarnings("ignore", category=FutureWarning)
    if device == "cuda":
        with contextlib.redirect_stdout(io.StringIO()):  # the parent has said so
            lower_on_this_torch("gpu_generated")
    program = generated.export_combined(specs)
    if fixed:
        program = strideguard.densify_outputs(program, exact=True, device=device)
    os.makedirs(os.path.dirname(package), exist_ok=True)
    return torch._inductor.aoti_compile_and_package(aoti_program(program, device), package_path=package)


def batch_result(named, futures: tuple[Future, Future], device: str, target: Target, directory: str,
                 deadline: float) -> dict | None:
    """One batch's rows from its two compiles; None where they did not start before the deadline."""
    names, specs = [n for n, _ in named], [s for _, s in named]
    try:
        program = generated.export_combined(specs)
        predicted = lower_outputs(program, target=target).outputs  # while the workers compile
    except Exception as error:  # noqa: BLE001 - reported below, where the compile went through
        program = predicted = error
    untouched, fixed = futures
    try:
        plain_package = untouched.result()
    except Exception as refused:  # noqa: BLE001 - which parts AOTInductor refuses untouched is not a finding
        if time.time() > deadline:
            why = f"refused untouched as a batch, not split after the deadline: {generated.first_line(refused)}"
            return {"rows": [], "refused": {name: why for name in names}}
        try:
            return check_batch(named, device, target, f"{directory}/split")
        except Exception as error:  # noqa: BLE001 - one batch failing must not lose the others
            return {"rows": [], "refused": {}, "error": generated.first_line(error)}
    try:
        dense_package = fixed.result()
        if plain_package is None or dense_package is None:
            return None
        if isinstance(predicted, Exception):
            raise predicted
        plain, dense = (torch._inductor.aoti_load_package(p) for p in (plain_package, dense_package))
        return {"rows": compared(names, specs, program, predicted, plain, dense, device), "refused": {}}
    except Exception as error:  # noqa: BLE001 - one batch failing must not lose the others
        return {"rows": [], "refused": {}, "error": generated.first_line(error)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="no compile is started after this")
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument("--drawn", type=int, default=64, help="generated programs drawn after the kept failures")
    parser.add_argument("--batch", type=int, default=BATCH, help="programs compiled as one method")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles run in parallel")
    parser.add_argument("--rehearse-on-cpu", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    print(f"gpu_generated: AOTInductor packages load through torch's {install_from_environment()} loader", flush=True)
    if args.rehearse_on_cpu:
        device, target = "cpu", CPU
    elif torch.cuda.is_available():
        lower_on_this_torch("gpu_generated")
        device, target = "cuda", Target("cuda", tuple(torch.cuda.get_device_capability(0)), present=False)
    else:
        print("gpu_generated: no CUDA device; nothing compared")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"skipped": "no CUDA device"}))
        return 0
    started = time.monotonic()
    deadline = time.time() + args.minutes * 60
    result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (rehearsal)",
              "torch": torch.__version__, "target": repr(target), "seed": args.seed, "batches": [], "rows": [],
              "refused": {}, "not_started": []}
    with tempfile.TemporaryDirectory(prefix="strideguard-gpu-generated-") as directory, \
            ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        batches, futures = [], []

        def submit(programs: list) -> None:  # each batch's two compiles, queued as soon as it is known
            for start in range(0, len(programs), args.batch):
                batch = programs[start:start + args.batch]
                folder = f"{directory}/b{len(batches)}"
                specs = [spec for _, spec in batch]
                batches.append(batch)
                futures.append(tuple(pool.submit(compile_batch, specs, fixed, device, f"{folder}/{variant}.pt2", deadline)
                                     for fixed, variant in ((False, "untouched"), (True, "fixed"))))

        submit(kept_failures())  # the workers start on the kept failures while the others are drawn
        others = drawn(args.seed, args.drawn)
        random.Random(args.seed).shuffle(others)
        submit(others)
        for number, (batch, pair) in enumerate(zip(batches, futures)):
            batch_started = time.monotonic()
            checked = batch_result(batch, pair, device, target, f"{directory}/b{number}", deadline)
            if checked is None:
                result["not_started"] += [n for n, _ in batch]
                continue
            result["rows"] += checked["rows"]
            result["refused"].update(checked["refused"])
            result["batches"].append({"programs": [n for n, _ in batch], "seconds": round(time.monotonic() - batch_started, 1),
                                      "error": checked.get("error")})
            mismatched = [r for r in checked["rows"] if not r["matched"]]
            print(f"gpu_generated: batch {number}: {len(batch)} programs, {len(checked['rows'])} outputs, "
                  f"{len(mismatched)} mismatched, {len(checked['refused'])} refused, "
                  f"{sum(not r['fixed_dense'] for r in checked['rows'])} not dense after the fix"
                  + (f", error {checked['error']}" if checked.get("error") else "")
                  + f" ({time.monotonic() - started:.0f} s)", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))
        pool.shutdown(cancel_futures=True)
    rows = result["rows"]
    bad = [r for r in rows if not r["matched"] or not r["fixed_dense"] or not r["fixed_values_equal"]]
    for row in bad:
        print(f"MISMATCH {row['program']} output {row['output']} {row['shape']}: predicted {row['predicted']}, "
              f"returned {row['returned']}; fixed {row['fixed_returned']} dense {row['fixed_dense']} "
              f"values {row['fixed_values_equal']}")
    programs_checked = len({r["program"] for r in rows})
    summary = (f"gpu_generated: {result['device']}: {programs_checked} programs, {len(rows)} outputs in "
               f"{len(result['batches'])} batches, {sum(not r['matched'] for r in rows)} predicted wrong, "
               f"{sum(not r['fixed_dense'] for r in rows)} not dense after densify_outputs, "
               f"{sum(not r['fixed_values_equal'] for r in rows)} values differing, {len(result['refused'])} refused "
               f"untouched, {len(result['not_started'])} not started by the deadline, "
               f"{sum(bool(b['error']) for b in result['batches'])} batches failed, {time.monotonic() - started:.0f} s")
    result["summary"] = summary
    args.out.write_text(json.dumps(result, indent=1))
    print(summary)
    return 1 if bad or any(b["error"] for b in result["batches"]) else 0


if __name__ == "__main__":
    sys.exit(main())

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

A batch AOTInductor cannot compile untouched is split and the parts it refuses
set aside (not a finding). Mismatches print first. Writes
``bench/results/gpu_generated.json`` after each batch. ``--rehearse-on-cpu``
runs the same flow for the CPU, to check the script before spending GPU time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import strideguard  # noqa: E402
from strideguard.program import density  # noqa: E402
from strideguard.compiler.lowering import lower_outputs  # noqa: E402
from strideguard.compiler.targets import CPU, Target  # noqa: E402
from strideguard.prove.verification import compile_program  # noqa: E402
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


def check_batch(named: list[tuple[str, ProgramSpec]], device: str, target: Target, directory: str) -> dict:
    names, specs = [n for n, _ in named], [s for _, s in named]
    counter = iter(range(1_000_000))
    rows: list[dict] = []

    def compiled(parts):
        return compile_program(generated.export_combined(parts), f"{directory}/c{next(counter)}", device=device)

    def check(parts, plain):
        kept = [names[specs.index(p)] for p in parts]
        owners = generated._owners(parts)
        program = generated.export_combined(parts)
        predicted = lower_outputs(program, target=target).outputs
        fixed = strideguard.densify_outputs(program, exact=True, device=device)
        dense = compile_program(fixed, f"{directory}/c{next(counter)}", device=device)
        inputs = tuple(t.to(device) for t in generated.combined_inputs(parts))
        with torch.no_grad():
            before, after = generated._leaves(plain(*inputs)), generated._leaves(dense(*inputs))
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
        return generated.Sample([], {})

    sample = generated._without_refused(specs, compiled, check)
    return {"rows": rows, "refused": {names[part]: why for part, why in sample.refused.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="no batch is started after this")
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument("--drawn", type=int, default=64, help="generated programs drawn after the kept failures")
    parser.add_argument("--batch", type=int, default=BATCH, help="programs compiled as one method")
    parser.add_argument("--out", type=Path, default=OUT)
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
    programs = kept_failures() + drawn(args.seed, args.drawn)
    random.Random(args.seed).shuffle(programs[len(kept_failures()):])
    result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (rehearsal)",
              "torch": torch.__version__, "target": repr(target), "seed": args.seed, "batches": [], "rows": [],
              "refused": {}}
    with tempfile.TemporaryDirectory(prefix="strideguard-gpu-generated-") as directory:
        for start in range(0, len(programs), args.batch):
            if time.monotonic() - started > args.minutes * 60:
                break
            batch = programs[start:start + args.batch]
            batch_started = time.monotonic()
            try:
                checked = check_batch(batch, device, target, f"{directory}/b{start}")
            except Exception as error:  # noqa: BLE001 - one batch failing must not lose the others
                checked = {"rows": [], "refused": {}, "error": generated.first_line(error)}
            result["rows"] += checked["rows"]
            result["refused"].update(checked["refused"])
            result["batches"].append({"programs": [n for n, _ in batch], "seconds": round(time.monotonic() - batch_started, 1),
                                      "error": checked.get("error")})
            mismatched = [r for r in checked["rows"] if not r["matched"]]
            print(f"batch {start // args.batch}: {len(batch)} programs, {len(checked['rows'])} outputs, "
                  f"{len(mismatched)} mismatched, {len(checked['refused'])} refused, "
                  f"{sum(not r['fixed_dense'] for r in checked['rows'])} not dense after the fix"
                  + (f", error {checked['error']}" if "error" in checked else ""), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))
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
               f"untouched, {time.monotonic() - started:.0f} s")
    result["summary"] = summary
    args.out.write_text(json.dumps(result, indent=1))
    print(summary)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

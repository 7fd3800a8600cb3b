"""On a GPU: does the fake-device CUDA lowering predict what the real compile returns?

strideguard lowers for CUDA on fake tensors where no GPU is present
(``strideguard.compiler.oracle.fake_device``, with CUDA's SDPA kernel chosen by torch's rules in
``strideguard.compiler.oracle.attention_kernels``). Here a GPU is present: each program is
exported on it, its outputs predicted by that same fake-device lowering (the
device's own capability, but lowered as if absent), then compiled for real with
AOTInductor and run, and every output's strides compared. Then each program is fixed with ``densify_outputs(exact=True,
device="cuda")`` (on the real device now), compiled and run, and every output
checked row-major to the letter (strides and offset 0). Mismatches print as found. The heads of
``tests/padding.py`` (an LM prefill head over GPT-2's vocabulary and a small action head, bfloat16) are matmuls
Inductor's ``pad_mm`` pads where the device's own benchmark says so: their rows record which branch the real
benchmark took (``branch``: padded or unpadded) and whether the fixed program came back dense. Writes ``bench/results/gpu_oracle.json`` after each program.
The compiles run in worker processes (``--jobs``), all at once, while this process predicts: each takes
about a minute on a GPU machine.

Run through ``bench/gpu.sh``; without a CUDA device it says so and exits 0. ``--rehearse-on-cpu`` runs
the same flow on the CPU, to check the script before spending GPU time: each program is predicted for
CUDA on fake tensors as above (an sm90 device's capability), recorded, not compared; then compiled and
run for the CPU, its strides compared with strideguard's prediction for the CPU, and fixed for the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import pickle
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strideguard  # noqa: E402
from bench.aoti_loader import install_from_environment  # noqa: E402
from strideguard.compiler.oracle import fake_device  # noqa: E402
from strideguard.compiler.oracle.lowering import lower_outputs  # noqa: E402
from strideguard.compiler.targets import CPU, Target  # noqa: E402
from tests.padding import Heads, heads_inputs  # noqa: E402
from tests.test_device_lowering import ExecuTorchSdpaCases, SdpaVariants, executorch_inputs, variant_inputs  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "gpu_oracle.json"
REHEARSAL_CAPABILITY = (9, 0)
"""The capability the CPU rehearsal predicts for: the H100's and H200's."""


def cases():
    for dtype in (torch.float32, torch.bfloat16):
        yield f"executorch-sdpa-{str(dtype)[6:]}", ExecuTorchSdpaCases(), executorch_inputs(dtype)
    yield "sdpa-variants-bfloat16", SdpaVariants("math"), variant_inputs()
    torch.manual_seed(0)
    yield "pad-mm-heads-bfloat16", Heads().to(torch.bfloat16), heads_inputs()


def leaves(returned) -> list:
    """A method's returned tensors in the order its program lists them (a dict's values, not its keys)."""
    return torch.utils._pytree.tree_leaves(returned)


def row_major(value: torch.Tensor) -> bool:
    """Dense in row-major order to the letter: the strides ``contiguous()`` gives, size-one dimensions included,
    at offset 0."""
    from torch._prims_common import make_contiguous_strides_for

    return value.storage_offset() == 0 and tuple(value.stride()) == tuple(make_contiguous_strides_for(value.shape))


def lower_on_this_torch(script: str) -> None:
    """strideguard lowers for CUDA without a GPU only on the torch versions the suite checks
    (``compiler.oracle.fake_device.CHECKED_ON``) and copies on any other. A GPU machine may hold another torch; the oracle is
    the check of it there, so it lets that version lower, and says so."""
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if version not in fake_device.CHECKED_ON:
        print(f"{script}: torch {torch.__version__} is not among {', '.join(fake_device.CHECKED_ON)}; "
              "its fake-device CUDA lowering is checked here, not by the suite", flush=True)
        fake_device.CHECKED_ON = (*fake_device.CHECKED_ON, version)


def write(out, capability, mismatches, rows, complete=False) -> None:
    """After each program, so that a run stopped at its time limit keeps what it compared."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"capability": capability, "torch": torch.__version__, "complete": complete,
                               "mismatches": mismatches, "rows": rows}, indent=1))


def compile_case(case: bytes, fixed: bool, device: str, package: str) -> str:
    """In a worker: a case (module and inputs, pickled) exported on ``device``, fixed with ``densify_outputs``
    where ``fixed``, compiled with AOTInductor; the package's path."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's, for each program strideguard copies
    if device == "cuda":
        with contextlib.redirect_stdout(io.StringIO()):  # the parent has said so
            lower_on_this_torch("gpu_oracle")
    module, inputs = pickle.loads(case)
    inputs = tuple(t.to(device) for t in inputs)
    program = torch.export.export(module.eval().to(device), inputs)
    if fixed:
        program = strideguard.densify_outputs(program, exact=True, device=device)
    return torch._inductor.aoti_compile_and_package(program, package_path=package)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles run in parallel")
    parser.add_argument("--rehearse-on-cpu", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's, for each program strideguard copies
    print(f"gpu_oracle: AOTInductor packages load through torch's {install_from_environment()} loader", flush=True)
    if not args.rehearse_on_cpu and not torch.cuda.is_available():
        print("gpu_oracle: no CUDA device; nothing compared")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"skipped": "no CUDA device"}))
        return 0
    lower_on_this_torch("gpu_oracle")
    device = "cpu" if args.rehearse_on_cpu else "cuda"
    capability = REHEARSAL_CAPABILITY if args.rehearse_on_cpu else tuple(torch.cuda.get_device_capability(0))
    fake = Target("cuda", capability, present=False)
    rows, mismatches, strided_after_fix = [], [], 0
    with tempfile.TemporaryDirectory() as directory, \
            ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        programs = list(cases())
        packages = {(name, fixed): pool.submit(compile_case, pickle.dumps((module, inputs)), fixed, device,
                                               os.path.join(directory, f"{name}{'-fixed' if fixed else ''}.pt2"))
                    for fixed in (False, True) for name, module, inputs in programs}
        for name, module, inputs in programs:
            inputs = tuple(t.to(device) for t in inputs)
            program = torch.export.export(module.eval().to(device), inputs)
            started = time.perf_counter()
            predicted = lower_outputs(program, target=fake)
            seconds = time.perf_counter() - started
            # In the rehearsal the CUDA prediction is recorded; the CPU compile is compared with the CPU's.
            compared = lower_outputs(program, target=CPU) if args.rehearse_on_cpu else predicted
            package = packages[(name, False)].result()
            with torch.no_grad():
                returned = torch._inductor.aoti_load_package(package)(*inputs)
            for index, (guess, value) in enumerate(zip(compared.outputs, leaves(returned))):
                row = {"program": name, "output": index, "predicted": [list(map(int, s)) for s in guess.every_strides],
                       "returned": list(value.stride())}
                if predicted.outputs[index].benchmark_decides:
                    # which branch the device's own benchmark took when it compiled
                    row["branch"] = "unpadded" if tuple(value.stride()) == tuple(predicted.outputs[index].strides) else "padded"
                if args.rehearse_on_cpu:
                    row["predicted_for_cuda"] = [list(map(int, s)) for s in predicted.outputs[index].every_strides]
                rows.append(row)
                if list(value.stride()) not in row["predicted"]:
                    mismatches.append(row)
                    print(f"MISMATCH {name} output {index}: predicted {row['predicted']}, returned {row['returned']}", flush=True)
            fixed_package = packages[(name, True)].result()
            with torch.no_grad():
                dense = torch._inductor.aoti_load_package(fixed_package)(*inputs)
            strided = [index for index, value in enumerate(leaves(dense)) if not row_major(value)]
            strided_after_fix += len(strided)
            print(f"{name}: predicted in {seconds:.2f} s; fixed program strided outputs: {strided or 'none'}")
            rows.append({"program": name, "fixed_strided_outputs": strided, "prediction_seconds": seconds})
            write(args.out, capability, mismatches, rows)
    where = "cpu rehearsal, predicted for " if args.rehearse_on_cpu else ""
    print(f"gpu_oracle: {where}sm{capability[0]}{capability[1]}, {len(mismatches)} mismatched outputs, "
          f"{strided_after_fix} strided after the fix")
    write(args.out, capability, mismatches, rows, complete=True)
    return 1 if mismatches or strided_after_fix else 0


if __name__ == "__main__":
    sys.exit(main())

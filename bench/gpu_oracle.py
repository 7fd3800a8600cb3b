"""On a GPU: does the fake-device CUDA lowering predict what the real compile returns?

strideguard lowers for CUDA on fake tensors where no GPU is present
(``strideguard.compiler.fake_device``, with CUDA's SDPA kernel chosen by torch's rules in
``strideguard.compiler.attention_kernels``). Here a GPU is present: each program is
exported on it, its outputs predicted by that same fake-device lowering (the
device's own capability, but lowered as if absent), then compiled for real with
AOTInductor and run, and every output's strides compared. Then each program is fixed with ``densify_outputs(exact=True,
device="cuda")`` (on the real device now), compiled and run, and every output
checked contiguous. Mismatches print as found. Writes ``bench/results/gpu_oracle.json`` after each program.

Run through ``bench/gpu.sh``; without a CUDA device it says so and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strideguard  # noqa: E402
from bench.aoti_loader import install_from_environment  # noqa: E402
from strideguard.compiler import fake_device  # noqa: E402
from strideguard.compiler.lowering import lower_outputs  # noqa: E402
from strideguard.compiler.targets import Target  # noqa: E402
from tests.test_device_lowering import ExecuTorchSdpaCases, SdpaVariants, executorch_inputs, variant_inputs  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "gpu_oracle.json"


def cases():
    for dtype in (torch.float32, torch.bfloat16):
        yield f"executorch-sdpa-{str(dtype)[6:]}", ExecuTorchSdpaCases(), executorch_inputs(dtype)
    yield "sdpa-variants-bfloat16", SdpaVariants("math"), variant_inputs()


def lower_on_this_torch(script: str) -> None:
    """strideguard lowers for CUDA without a GPU only on the torch versions the suite checks
    (``compiler.fake_device.CHECKED_ON``) and copies on any other. A GPU machine may hold another torch; the oracle is
    the check of it there, so it lets that version lower, and says so."""
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if version not in fake_device.CHECKED_ON:
        print(f"{script}: torch {torch.__version__} is not among {', '.join(fake_device.CHECKED_ON)}; "
              "its fake-device CUDA lowering is checked here, not by the suite", flush=True)
        fake_device.CHECKED_ON = (*fake_device.CHECKED_ON, version)


def write(capability, mismatches, rows, complete=False) -> None:
    """After each program, so that a run stopped at its time limit keeps what it compared."""
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"capability": capability, "torch": torch.__version__, "complete": complete,
                               "mismatches": mismatches, "rows": rows}, indent=1))


def main() -> int:
    print(f"gpu_oracle: AOTInductor packages load through torch's {install_from_environment()} loader", flush=True)
    if not torch.cuda.is_available():
        print("gpu_oracle: no CUDA device; nothing compared")
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps({"skipped": "no CUDA device"}))
        return 0
    lower_on_this_torch("gpu_oracle")
    capability = tuple(torch.cuda.get_device_capability(0))
    fake = Target("cuda", capability, present=False)
    rows, mismatches = [], []
    with tempfile.TemporaryDirectory() as directory:
        for name, module, inputs in cases():
            inputs = tuple(t.cuda() for t in inputs)
            program = torch.export.export(module.eval().cuda(), inputs)
            started = time.perf_counter()
            predicted = lower_outputs(program, target=fake)
            seconds = time.perf_counter() - started
            package = torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(directory, f"{name}.pt2"))
            with torch.no_grad():
                returned = torch._inductor.aoti_load_package(package)(*inputs)
            for index, (guess, value) in enumerate(zip(predicted.outputs, returned)):
                row = {"program": name, "output": index, "predicted": [list(map(int, s)) for s in guess.every_strides],
                       "returned": list(value.stride())}
                rows.append(row)
                if list(value.stride()) not in row["predicted"]:
                    mismatches.append(row)
                    print(f"MISMATCH {name} output {index}: predicted {row['predicted']}, returned {row['returned']}", flush=True)
            fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
            fixed_package = torch._inductor.aoti_compile_and_package(fixed, package_path=os.path.join(directory, f"{name}-fixed.pt2"))
            with torch.no_grad():
                dense = torch._inductor.aoti_load_package(fixed_package)(*inputs)
            strided = [index for index, value in enumerate(dense) if not value.is_contiguous()]
            print(f"{name}: predicted in {seconds:.2f} s; fixed program strided outputs: {strided or 'none'}")
            rows.append({"program": name, "fixed_strided_outputs": strided, "prediction_seconds": seconds})
            write(capability, mismatches, rows)
    print(f"gpu_oracle: sm{capability[0]}{capability[1]}, {len(mismatches)} mismatched outputs")
    write(capability, mismatches, rows, complete=True)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

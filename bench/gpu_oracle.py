"""On a GPU: does the fake-device CUDA lowering predict what the real compile returns?

strideguard lowers for CUDA on fake tensors where no GPU is present
(``strideguard.fake_device``, with CUDA's SDPA kernel chosen by torch's rules in
``strideguard.attention_kernels``). Here a GPU is present: each program is
exported on it, its outputs predicted by that same fake-device lowering (the
device's own capability, but lowered as if absent), then compiled for real with
AOTInductor and run, and every output's strides compared. Mismatches print
first. Then each program is fixed with ``densify_outputs(exact=True,
device="cuda")`` (on the real device now), compiled and run, and every output
checked contiguous. Writes ``bench/results/gpu_oracle.json``.

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
from strideguard.lowering import lower_outputs  # noqa: E402
from strideguard.targets import Target  # noqa: E402
from tests.test_device_lowering import ExecuTorchSdpaCases, SdpaVariants, executorch_inputs, variant_inputs  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "gpu_oracle.json"


def cases():
    for dtype in (torch.float32, torch.bfloat16):
        yield f"executorch-sdpa-{str(dtype)[6:]}", ExecuTorchSdpaCases(), executorch_inputs(dtype)
    yield "sdpa-variants-bfloat16", SdpaVariants("math"), variant_inputs()


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_oracle: no CUDA device; nothing compared")
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps({"skipped": "no CUDA device"}))
        return 0
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
            fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
            fixed_package = torch._inductor.aoti_compile_and_package(fixed, package_path=os.path.join(directory, f"{name}-fixed.pt2"))
            with torch.no_grad():
                dense = torch._inductor.aoti_load_package(fixed_package)(*inputs)
            strided = [index for index, value in enumerate(dense) if not value.is_contiguous()]
            print(f"{name}: predicted in {seconds:.2f} s; fixed program strided outputs: {strided or 'none'}")
            rows.append({"program": name, "fixed_strided_outputs": strided, "prediction_seconds": seconds})
    for row in mismatches:
        print(f"MISMATCH {row['program']} output {row['output']}: predicted {row['predicted']}, returned {row['returned']}")
    print(f"gpu_oracle: sm{capability[0]}{capability[1]}, {len(mismatches)} mismatched outputs")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"capability": capability, "mismatches": mismatches, "rows": rows}, indent=1))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

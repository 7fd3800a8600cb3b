"""On a GPU machine, before anything else: can AOTInductor compile, load and run a CUDA program here at all?

A linear layer exported on the GPU, compiled with AOTInductor, loaded both ways ``GraphedMethod`` and torch
load packages (single-threaded and not) and run, each step printed as it passes; ``--with-strideguard``
imports strideguard first. Run with ``PYTHONFAULTHANDLER=1``: a crash then prints where it happened, so
the steps of ``bench/gpu.sh`` that follow can be read against it.
"""

from __future__ import annotations

import sys
import tempfile
import time

import torch

started = time.perf_counter()


def step(text: str) -> None:
    print(f"gpu_smoke{' (strideguard imported)' if '--with-strideguard' in sys.argv else ''}: "
          f"{text} ({time.perf_counter() - started:.1f} s)", flush=True)


if "--with-strideguard" in sys.argv:
    sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
    import strideguard  # noqa: F401

if not torch.cuda.is_available():
    step("no CUDA device")
    sys.exit(0)
model = torch.nn.Linear(64, 32).cuda().eval()
inputs = (torch.randn(4, 64, device="cuda"),)
program = torch.export.export(model, inputs)
step("exported")
with tempfile.TemporaryDirectory() as directory:
    package = torch._inductor.aoti_compile_and_package(program, package_path=f"{directory}/smoke.pt2")
    step("compiled")
    for single in (False, True):
        loaded = torch._inductor.aoti_load_package(package, run_single_threaded=single, device_index=0)
        step(f"loaded (run_single_threaded={single})")
        with torch.no_grad():
            out = loaded(*inputs)
        torch.cuda.synchronize()
        step(f"ran: max error {(out - model(*inputs)).abs().max().item():.2e}")

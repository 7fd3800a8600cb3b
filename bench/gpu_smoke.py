"""On a GPU machine, before anything else: can AOTInductor compile, load and run a CUDA program here at all?

A linear layer exported on the GPU is compiled with AOTInductor once; then ways of loading it are tried,
each in a child process of its own, so that a crash in one (a segmentation fault, seen on one image)
neither hides the others nor stops the run: torch's package loader and torch's container runner on the
library inside the package (``bench/aoti_loader.py``), each as the process stands and then with the C++
compiler's own libstdc++ preloaded. On one image (torch 2.11.0+cu130) the compiled library's
``std::regex`` crashed in the locale's facets unless that libstdc++ was preloaded: the library does not
link libstdc++ itself and bound to another copy of its symbols. The children run at once (one after
another, each importing torch, four would take four times as long), and the first way in that order that
ran is chosen. Writes
``bench/results/gpu_smoke.json``: what each way did and the chosen one, which ``bench/gpu.sh`` exports for
the later GPU scripts. ``--with-strideguard`` imports strideguard before compiling. Without a CUDA device
it rehearses the same steps on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.aoti_loader import LOADER_VARIABLE, LOADERS  # noqa: E402

started = time.perf_counter()


def step(text: str) -> None:
    print(f"gpu_smoke: {text} ({time.perf_counter() - started:.1f} s)", flush=True)


def model_and_inputs(device: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return torch.nn.Linear(64, 32).to(device).eval(), (torch.randn(4, 64, device=device),)


def load_and_run(package: str, device: str) -> None:
    """The child: load the package with the loader its environment names, run it, compare with eager."""
    from bench.aoti_loader import install_from_environment

    loader = install_from_environment()
    model, inputs = model_and_inputs(device)
    loaded = torch._inductor.aoti_load_package(package, run_single_threaded=True, device_index=0 if device == "cuda" else -1)
    step(f"{loader}: loaded")
    with torch.no_grad():
        out = loaded(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        error = (out - model(*inputs)).abs().max().item()
    step(f"{loader}: ran, max error {error:.2e}")
    if error > 1e-3:
        raise SystemExit(f"{loader}: wrong values")


def compilers_libstdcxx() -> str | None:
    """The libstdc++ the C++ compiler Inductor uses links against, where it names one."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    compiler = get_cpp_compiler()
    try:
        found = subprocess.run([compiler, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return os.path.realpath(found) if os.path.isabs(found) and os.path.exists(found) else None


def ways_to_load() -> list[tuple[str, str | None]]:
    preload = compilers_libstdcxx()
    return [(loader, None) for loader in LOADERS] + ([(loader, preload) for loader in LOADERS] if preload else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--with-strideguard", action="store_true")
    parser.add_argument("--child", metavar="PACKAGE", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds each loader's child may take")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu_smoke.json")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        load_and_run(args.child, device)
        return 0
    if args.with_strideguard:
        import strideguard  # noqa: F401
    step(f"torch {torch.__version__} on {device}; TORCHINDUCTOR_COMPILE_THREADS="
         f"{os.environ.get('TORCHINDUCTOR_COMPILE_THREADS', 'unset')}")
    model, inputs = model_and_inputs(device)
    program = torch.export.export(model, inputs)
    step("exported")
    result: dict = {"torch": torch.__version__, "device": device, "ways": [], "chosen": None}
    with tempfile.TemporaryDirectory() as directory:
        package = torch._inductor.aoti_compile_and_package(program, package_path=f"{directory}/smoke.pt2")
        result["compile_s"] = round(time.perf_counter() - started, 1)
        step("compiled")
        ways = ways_to_load()
        children = []
        for loader, preload in ways:  # all at once; the first in this order that runs is chosen
            environment = {**os.environ, LOADER_VARIABLE: loader, "PYTHONFAULTHANDLER": "1"}
            if preload:
                environment["LD_PRELOAD"] = preload
            children.append(subprocess.Popen([sys.executable, __file__, "--child", package], env=environment,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        deadline = time.monotonic() + args.timeout
        for (loader, preload), child in zip(ways, children):
            way = loader + (f" with {preload} preloaded" if preload else "")
            try:
                seen, _ = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
                outcome = "ran" if child.returncode == 0 else f"exit {child.returncode}"
            except subprocess.TimeoutExpired:
                child.kill()
                seen, _ = child.communicate()
                outcome = f"no answer in {args.timeout:.0f} s"
            tail = (seen or "").strip().splitlines()[-6:]
            result["ways"].append({"loader": loader, "preload": preload, "outcome": outcome, "output_tail": tail})
            step(f"{way}: {outcome}")
            for line in tail:
                print(f"    {line}", flush=True)
            if outcome == "ran" and result["chosen"] is None:
                result["chosen"] = {"loader": loader, "preload": preload}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    step(f"chosen: {result['chosen']}; wrote {args.out}")
    return 0 if result["chosen"] else 1


if __name__ == "__main__":
    sys.exit(main())

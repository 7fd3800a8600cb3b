"""A second way to load an AOTInductor package, for GPU images whose package loader cannot.

On one GPU image (torch 2.11.0+cu130), torch's package loader (``torch._C._aoti.AOTIModelPackageLoader``)
crashed with a segmentation fault on every package after compiles that had succeeded. The package is a zip
holding the model's shared library (its weights inside) and, for CUDA, its kernels' cubins; torch's
container runner loads that library directly, without the package loader. ``bench/gpu_smoke.py`` tries
both ways in child processes and ``bench/gpu.sh`` sets ``STRIDEGUARD_BENCH_AOTI_LOADER=runner`` when only
the runner works; each GPU script then calls :func:`install_from_environment` first, which puts the
runner behind ``torch._inductor.aoti_load_package`` for that process, so that the library's own call
sites (``GraphedMethod.load``, ``prove.verification.compile_program``) load through it unchanged.

The runner has no single-threaded mode in its Python binding, so a CUDA graph captured around it also
records the container's end-of-run event; the scripts print which loader ran.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

LOADER_VARIABLE = "STRIDEGUARD_BENCH_AOTI_LOADER"
LOADERS = ("package", "runner")


class RunnerModel:
    """An AOTInductor package's model, run by torch's container runner on the library it holds."""

    def __init__(self, package: str | os.PathLike, device_index: int = -1):
        self._directory = tempfile.TemporaryDirectory(prefix="aoti-runner-")
        with zipfile.ZipFile(package) as archive:
            archive.extractall(self._directory.name)
        libraries = sorted(Path(self._directory.name).rglob("data/aotinductor/*/*.so"))
        if len(libraries) != 1:
            raise RuntimeError(f"{package}: expected one model library in the package, found {len(libraries)}")
        library = libraries[0]
        device = self._device_of(library)
        if device == "cuda":
            device_text = "cuda" if device_index < 0 else f"cuda:{device_index}"
            self.runner = torch._C._aoti.AOTIModelContainerRunnerCuda(str(library), 1, device_text, str(library.parent))
        elif device == "cpu":
            self.runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1)
        else:
            raise RuntimeError(f"{package}: the runner loader handles CPU and CUDA packages, not {device!r}")
        self._out_spec = pytree.treespec_loads(self.runner.get_call_spec()[1])

    @staticmethod
    def _device_of(library: Path) -> str:
        for metadata in library.parent.glob("*metadata.json"):
            device = json.loads(metadata.read_text()).get("AOTI_DEVICE_KEY")
            if device:
                return device
        return "cuda" if any(library.parent.glob("*.cubin")) else "cpu"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = pytree.tree_flatten((args, kwargs))[0]
        outputs = self.runner.run([value for value in flat if isinstance(value, torch.Tensor)])
        return pytree.tree_unflatten(outputs, self._out_spec)


def load(package: str | os.PathLike, model_name: str = "model", run_single_threaded: bool = False,
         num_runners: int = 1, device_index: int = -1) -> Any:
    """``torch._inductor.aoti_load_package``'s signature, loading through :class:`RunnerModel`."""
    del model_name, run_single_threaded, num_runners
    return RunnerModel(package, device_index)


def install_from_environment() -> str:
    """Make ``torch._inductor.aoti_load_package`` load as ``STRIDEGUARD_BENCH_AOTI_LOADER`` says; returns which."""
    loader = os.environ.get(LOADER_VARIABLE, "package")
    if loader not in LOADERS:
        raise SystemExit(f"{LOADER_VARIABLE}={loader!r}: expected one of {', '.join(LOADERS)}")
    if loader == "runner":
        torch._inductor.aoti_load_package = load
    return loader

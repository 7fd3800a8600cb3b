"""The device a program is compiled for: what every proof of layout is a proof for.

Inductor lays some outputs out per device: CUDA's efficient attention
returns memory in ``(B, M, H, K)`` order where the CPU's kernels keep the
query's; its CUDA lowering chooses kernels by compute capability. So an
answer about layouts names its target: the device kind, and for CUDA the
compute capability assumed (``sm90``, the H100/H200 class, unless a GPU is
present; Jetson Orin is ``sm87``), and whether a device of that kind is on
this machine or the lowering ran on fake tensors.

A target is named as ``"cpu"`` (the default), ``"cuda"``, ``"cuda:sm87"``
(a capability), ``"cuda:0"``, a ``torch.device``, or a ``Target``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import torch

DEFAULT_CUDA_CAPABILITY = (9, 0)
"""The compute capability assumed for ``device="cuda"`` where no GPU is present: sm90 (H100, H200)."""

KINDS = ("cpu", "cuda", "mps")

_CAPABILITY = re.compile(r"^sm_?(\d+)(\d)$")

CUDA_CAPABILITIES = (
    (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1),
)
"""The compute capabilities a lowering can be for: NVIDIA's GPUs from Volta on (Inductor's CUDA path needs
Triton, which needs sm70 or newer), as CUDA 12.8 and 13 name them."""
"""``sm87``, ``sm_90``, ``sm100``: the last digit is the minor version (NVIDIA's spelling)."""


@dataclass(frozen=True)
class Target:
    """A device kind to lower for; for CUDA, the compute capability assumed, and whether a GPU is present."""

    kind: str = "cpu"
    capability: Optional[tuple[int, int]] = None
    present: bool = True
    """A device of this kind is on this machine (the CPU always is); otherwise lowering runs on fake tensors."""

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu") if self.is_cpu else torch.device(self.kind, 0)

    @property
    def sm(self) -> Optional[str]:
        return None if self.capability is None else f"sm{self.capability[0]}{self.capability[1]}"

    def __str__(self) -> str:
        if self.is_cpu:
            return "cpu"
        name = f"{self.kind} {self.sm}" if self.sm else self.kind
        return name + (" (this machine's device)" if self.present else " (assumed: no device here, lowered on fake tensors)")


CPU = Target()


def resolve_target(device: Any, *, function: str) -> Target:
    """A ``Target`` for what a user named (``None``: the CPU); a clear error for anything else."""
    if device is None:
        return CPU
    if isinstance(device, Target):
        if device.kind not in KINDS:
            raise ValueError(f"strideguard.{function}: device kind must be one of {', '.join(KINDS)}, got {device.kind!r}")
        if device.kind == "cuda" and device.capability not in CUDA_CAPABILITIES:
            raise ValueError(f"strideguard.{function}: {device.capability} is not a CUDA capability Inductor compiles for")
        return device
    if isinstance(device, torch.device):
        kind, detail = device.type, None
    elif isinstance(device, str):
        kind, _, detail = device.strip().lower().partition(":")
    else:
        raise TypeError(
            f"strideguard.{function}: device must be 'cpu', 'cuda', 'cuda:sm87', a torch.device or a "
            f"strideguard.Target, got {type(device).__name__}"
        )
    if kind not in KINDS:
        raise ValueError(f"strideguard.{function}: device must be one of {', '.join(KINDS)} (or 'cuda:smXY'), got {device!r}")
    if kind == "cpu":
        return CPU
    capability = None
    if detail:
        match = _CAPABILITY.match(detail)
        if kind == "cuda" and match:
            capability = (int(match.group(1)), int(match.group(2)))
            if capability not in CUDA_CAPABILITIES:
                raise ValueError(
                    f"strideguard.{function}: {device!r} names no CUDA GPU Inductor compiles for; the capabilities "
                    f"are {', '.join(f'sm{a}{b}' for a, b in CUDA_CAPABILITIES)}"
                )
        elif not detail.isdigit():
            raise ValueError(
                f"strideguard.{function}: {device!r} names no device index nor compute capability (e.g. 'cuda:sm87')"
            )
    present = _present(kind)
    if kind == "cuda":
        capability = capability or (_real_capability() if present else DEFAULT_CUDA_CAPABILITY)
        if present and capability != _real_capability():
            # A capability other than the GPU's own is lowered for on fake tensors, as without a GPU.
            present = False
    return Target(kind, capability, present)


def target_for(program: Any, device: Any, backend: Any, function: str) -> Target:
    """The device ``program`` is compiled for: as named; else the backend's (``CudaBackend``: CUDA; a
    ``strideguard.compiler.backends.Backend``); else that of the program's tensors (exported on a GPU); else the CPU."""
    if device is None and backend is not None and backend.device_kind not in (None, "cpu"):
        device = backend.device_kind
    if device is None:
        devices = {
            node.meta["val"].device.type for node in program.graph.find_nodes(op="placeholder")
            if isinstance(node.meta.get("val"), torch.Tensor)
        }
        device = next((kind for kind in ("cuda", "mps") if kind in devices), None)
    return resolve_target(device, function=function)


def _present(kind: str) -> bool:
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return torch.backends.mps.is_available()
    return True


def _real_capability() -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(0))


class LoweringUnavailable(RuntimeError):
    """Inductor's lowering for the target cannot run here (this torch lacks the hook, or the device's lowering
    was not checked on it); what it would have decided is copied instead, and reported."""

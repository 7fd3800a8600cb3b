"""What strideguard knows about each output, as plain typed records.

The analysis computes these once; the passes, the reports, the command line
and the JSON output all read them. Field names here are the public, stable
names (the command line's ``--json`` writes them as they are).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Optional


class AliasKind(str, Enum):
    INPUT = "input"
    PARAMETER = "parameter"
    BUFFER = "buffer"
    CONSTANT = "constant"
    OUTPUT = "output"


@dataclass(frozen=True)
class Alias:
    """Something an output shares memory with: an input, a weight or another output."""

    kind: AliasKind
    name: str

    def __str__(self) -> str:
        return f"{self.kind.value} {self.name}"


class Action(str, Enum):
    NONE = "none"
    COPY = "copy"


@dataclass(frozen=True)
class OutputLayout:
    """One user output of a method, as the compiled method will return it.

    ``strides`` are those AOTInductor returns for this output (for an Edge
    program: after its AOTI backend turns view copies into views);
    ``target_dim_order`` is the layout it must come back in (contiguous for an
    ATen program, the promised dim order for an Edge program). ``action`` is
    what ``densify_outputs``/``prepare_for_aoti`` insert for it, ``reason`` why.
    """

    index: int
    name: Optional[str]
    kind: str
    shape: Optional[tuple]
    dtype: Optional[str]
    strides: Optional[tuple]
    contiguous: Optional[bool]
    dense: Optional[bool]
    target_dim_order: Optional[tuple]
    in_target_layout: Optional[bool]
    aliases: tuple[Alias, ...]
    view_of: Optional[str]
    cause: Optional[str]
    action: Action
    reason: str

    @property
    def ok(self) -> bool:
        """Comes back dense in its target layout (non-tensor outputs always do)."""
        return self.kind != "tensor" or self.in_target_layout is True

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["aliases"] = [str(a) for a in self.aliases]
        data["action"] = self.action.value
        data["shape"] = list(self.shape) if self.shape is not None else None
        data["strides"] = list(self.strides) if self.strides is not None else None
        data["target_dim_order"] = list(self.target_dim_order) if self.target_dim_order is not None else None
        data["ok"] = self.ok
        return data


@dataclass(frozen=True)
class LayoutReport:
    """Every user output of one method, in return order."""

    dialect: str
    outputs: tuple[OutputLayout, ...]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def copies_needed(self) -> tuple[OutputLayout, ...]:
        return tuple(o for o in self.outputs if o.action is Action.COPY)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "dialect": self.dialect, "outputs": [o.to_dict() for o in self.outputs]}

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        lines = [f"{'ok' if self.ok else 'NOT OK'}: {len(self.outputs)} user outputs ({self.dialect})"]
        for o in self.outputs:
            if o.kind != "tensor":
                lines.append(f"  [{o.index}] {o.name or o.kind}: {o.kind}")
                continue
            mark = "dense" if o.ok else "STRIDED"
            alias = f", aliases {', '.join(map(str, o.aliases))}" if o.aliases else ""
            cause = f", {o.cause}" if o.cause else ""
            lines.append(
                f"  [{o.index}] {o.name}: {list(o.shape)} {o.dtype} strides {list(o.strides)} {mark}"
                f"{cause}{alias} -> {o.action.value}"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class OutputCheck:
    """One output of a compiled and run method, measured."""

    index: int
    name: Optional[str]
    kind: str
    shape: Optional[tuple]
    dtype: Optional[str]
    strides: Optional[tuple]
    storage_offset: Optional[int]
    contiguous: Optional[bool]
    dense: Optional[bool]
    in_target_layout: Optional[bool]
    aliases: tuple[str, ...]
    max_abs_error: Optional[float]
    match: bool

    @property
    def ok(self) -> bool:
        return self.match and (self.kind != "tensor" or bool(self.in_target_layout))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("shape", "strides"):
            data[key] = list(data[key]) if data[key] is not None else None
        data["aliases"] = list(self.aliases)
        data["ok"] = self.ok
        return data


@dataclass(frozen=True)
class VerifyReport:
    """A method compiled with AOTInductor, run, and compared with eager."""

    device: str
    compile_seconds: float
    outputs: tuple[OutputCheck, ...]
    runs: tuple[tuple[str, tuple[OutputCheck, ...]], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs) and all(o.ok for _, checks in self.runs for o in checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "device": self.device,
            "compile_seconds": round(self.compile_seconds, 3),
            "outputs": [o.to_dict() for o in self.outputs],
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        lines = [f"{'ok' if self.ok else 'NOT OK'}: compiled in {self.compile_seconds:.1f} s on {self.device}"]
        for o in self.outputs:
            if o.kind != "tensor":
                lines.append(f"  [{o.index}] {o.name or o.kind}: {o.kind}, match={o.match}")
                continue
            alias = f", aliases {', '.join(o.aliases)}" if o.aliases else ""
            lines.append(
                f"  [{o.index}] {o.name}: strides {list(o.strides)} "
                f"{'dense' if o.in_target_layout else 'STRIDED'}{alias}, max|err| {o.max_abs_error:g}, "
                f"{'match' if o.match else 'MISMATCH'}"
            )
        return "\n".join(lines)

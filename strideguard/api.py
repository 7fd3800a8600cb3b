"""The public entry points: inspect, densify_outputs, prepare_for_aoti. The engine is ``rewrite``."""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from torch.export import ExportedProgram

from .compiler.oracle.lowering import ExternKernelMemory
from .compiler.oracle.padded_matmuls import options_of_the_compile
from .compiler.targets import target_for
from .decide.facts import OutputFacts, report
from .decide.subject import Subject, subject_of
from .decide.view_conversion import ConversionPolicy, EXECUTORCH, STRIDEGUARD
from .fix.engine import AsCompiled, Choices, program_plan, Pushdowns, transformed
from .program.exported import require_flag
from .program.naming import symbol_meanings
from .program.quiet import quietly
from .program.reports import LayoutReport
from .prove.proof import fixed_and_proven, Proof


@quietly
def output_facts(
    program: ExportedProgram,
    *,
    policy: ConversionPolicy = EXECUTORCH,
    exact: bool = False,
    backend: Any = None,
    device: Any = None,
) -> list[OutputFacts]:
    """The facts ``inspect`` reports, with what they were read from: each output's view chain, base and
    fake value as compiled. For tools that draw or explain outputs (the storage plot)."""
    return _inspected(program, policy, exact, backend, device)[0]


def _inspected(program: Any, policy: Any, exact: Any, backend: Any, device: Any) -> tuple[list[OutputFacts], Subject]:
    """``inspect``'s arguments checked, and the facts it reports with the subject they are about."""
    subject = subject_of(program, "inspect", device=device, backend=backend)
    require_flag(exact, "exact", "inspect")
    if not isinstance(policy, ConversionPolicy):
        raise TypeError(f"strideguard.inspect: policy must be a ConversionPolicy, got {type(policy).__name__}")
    plan = program_plan(
        subject, policy, as_compiled=AsCompiled(policy) if exact else None, choices=Choices(pushdowns=Pushdowns.DESCRIBED)
    )
    return list(plan.outputs), subject


@quietly
def inspect(
    program: ExportedProgram,
    *,
    policy: ConversionPolicy = EXECUTORCH,
    exact: bool = False,
    backend: Any = None,
    device: Any = None,
) -> LayoutReport:
    """What each user output of ``program`` will look like once compiled with AOTInductor.

    For an Edge program, "compiled" means after the AOTI backend has turned
    view copies into views as ``policy`` says (the installed ExecuTorch's own by
    default); each output's target is the dim order the program promised.

    By default the answer comes from the graph alone (milliseconds), and an
    output whose layout Inductor decides for itself is reported undecided and
    copied. With ``exact=True`` Inductor's own lowering is run and read
    (``strideguard.compiler.oracle.lowering``; no code is generated or compiled: a tenth to
    a quarter of a full compile, 0.1 s for a policy head, several seconds for
    a UNet, measured in ``docs/benchmarks.md``) and every output is decided by it.

    ``backend`` names the AOTI backend an Edge program is delegated to (a class
    deriving from ExecuTorch's ``AotiBackend``, or its name: ``"CudaBackend"``,
    ``"MetalBackend"``): its own passes and decomposition table run after
    ExecuTorch's view pass, as its ``preprocess`` runs them
    (``strideguard.compiler.backends``). Without ``exact``, an output computed from
    something they rewrite is reported undecided and copied; where they
    cannot run here, every output is.

    ``device`` is the device the program is compiled for: ``"cpu"``,
    ``"cuda"`` (compute capability sm90 assumed where no GPU is here),
    ``"cuda:sm87"`` (Jetson Orin), a ``torch.device`` or a
    ``strideguard.Target``. By default it follows ``backend`` (``CudaBackend``
    compiles for CUDA) and else the device of the program's tensors. For a
    device other than the CPU, ``exact`` lowers on fake tensors of that device
    (answering for it where it is not here: ``strideguard.compiler.oracle.fake_device``),
    and, without a GPU, CUDA's attention kernel is chosen by
    torch's rules (``strideguard.compiler.oracle.attention_kernels``); an output whose
    layout depends on a choice not decidable here is undecided and copied.
    The report says which device it is for (``LayoutReport.device``).
    """
    facts, subject = _inspected(program, policy, exact, backend, device)
    return report(
        facts, subject.dialect, source="lowering" if exact else "analysis", device=str(subject.target),
        symbols=symbol_meanings(subject.program),
    )


@quietly
def densify_outputs(
    program: ExportedProgram,
    *,
    break_aliases: bool = False,
    exact: bool = False,
    pushdown: bool = False,
    backend: Any = None,
    inductor_configs: Optional[dict] = None,
    device: Any = None,
    layouts: Optional[dict] = None,
) -> ExportedProgram:
    """A new program whose every user output comes back dense in its target layout.

    Exactly one copy is inserted per user output that would otherwise come back
    strided (for an Edge program: once its AOTI backend turns view copies into
    views, as the installed ExecuTorch does), and per output whose layout Inductor
    decides for itself (a copy fused into it where it is computed afresh);
    nothing else is added. Each copy is in a form Inductor keeps
    (``program.copies.CopyForm``). With ``break_aliases``, an
    output sharing memory with an input, a weight or an earlier output gets its
    own copy too. ``program`` is not modified and its weights are shared, not
    copied.

    With ``exact=True`` Inductor's lowering decides every output, so only those
    that would come back strided are copied, and then the loop is closed
    (``strideguard.prove.proof``): the fixed program is lowered again through the same
    pipeline (``backend``'s for an Edge program, with ``inductor_configs`` for an
    ATen one), any output still out of layout gets its copy in the strongest
    form, and ``LayoutNotReached`` is raised if even that does not hold. The
    proof is in ``result.graph_module.meta["strideguard_proof"]``.

    With ``pushdown``, a returned slice, select, narrow or split piece is
    first computed from pieces of its producers' inputs wherever that is
    exact (``strideguard.decide.pushdown``): dense by construction, with less
    compute. Values may then differ from the original's by rounding (a
    smaller GEMM); ``verify(..., reference=program)`` measures by how much.

    ``device`` is the device the program is compiled for, as in ``inspect``:
    the decisions and the proof are Inductor's lowering for that device (on
    fake tensors where it is not here), and the proof names it
    (``Proof.target``). Where that lowering cannot run here, every tensor
    output is copied and the proof lists them all as unproven, with why.

    ``layouts`` gives some outputs a target of the user's choosing, keyed by
    the output's name (``LayoutReport.outputs[i].name``: ``"image"``,
    ``"cache.key_cache[0]"``) or index: a ``torch.memory_format``
    (``torch.channels_last``), its name, a dim order (``(0, 2, 3, 1)``), or
    ``"keep"`` to leave it as the compiler lays it out (reported, never
    copied). The fixed program records it, so ``inspect``, the proof and
    ``verify`` judge the output against it (``strideguard.decide.user_layouts``).
    """
    for name, value in (("break_aliases", break_aliases), ("exact", exact), ("pushdown", pushdown)):
        require_flag(value, name, "densify_outputs")
    _require_configs(inductor_configs, "densify_outputs")
    subject = subject_of(program, "densify_outputs", device=device, backend=backend, layouts=layouts)
    return _densified(subject, _choices(pushdown, break_aliases=break_aliases), exact, inductor_configs)


def _choices(pushdown: bool, **chosen) -> Choices:
    return Choices(pushdowns=Pushdowns.APPLIED if pushdown else Pushdowns.NONE, **chosen)


def _densified(subject: Subject, choices: Choices, exact: bool, inductor_configs: Optional[dict]) -> ExportedProgram:
    """``densify_outputs``' work on a subject whose arguments are checked."""
    if not exact:
        with options_of_the_compile(inductor_configs):
            return transformed(subject, EXECUTORCH, choices=choices)[0]
    as_compiled = AsCompiled(EXECUTORCH, inductor_configs)
    return fixed_and_proven(subject, EXECUTORCH, as_compiled, choices=choices, falls_back=True)[0]


@quietly
def prepare_for_aoti(
    program: ExportedProgram,
    *,
    copy_outputs: bool = True,
    break_aliases: bool = False,
    exact: bool = False,
    pushdown: bool = False,
    backend: Any = None,
    device: Any = None,
    layouts: Optional[dict] = None,
) -> ExportedProgram:
    """Make an ATen or Edge program ready for AOTInductor.

    For an ATen program this is ``densify_outputs``. For an Edge program it
    turns view copies into views wherever that is safe (a wider set than
    ExecuTorch's), then inserts one copy into the promised dim order for each
    output that would now come back in another layout (skipped with
    ``copy_outputs=False``, for a runtime such as Metal's that copies every
    output anyway), and leaves no ``detach_copy`` behind. ``exact`` asks
    Inductor's lowering which outputs need the copy and closes the loop on the
    result, ``backend`` names the AOTI backend whose own passes run after these,
    and ``pushdown`` moves returned pieces into their producers first, as in
    ``densify_outputs``; ``device`` and ``layouts`` as in ``densify_outputs``
    (for an Edge program, an output asked in another dim order than the one
    it promises is copied into it, and the program then promises that).
    """
    flags = (("copy_outputs", copy_outputs), ("break_aliases", break_aliases), ("exact", exact), ("pushdown", pushdown))
    for name, value in flags:
        require_flag(value, name, "prepare_for_aoti")
    subject = subject_of(program, "prepare_for_aoti", device=device, backend=backend, layouts=layouts)
    if not subject.dialect.is_edge:
        return _densified(subject, _choices(pushdown, break_aliases=break_aliases), exact, None)
    choices = _choices(pushdown, break_aliases=break_aliases, copy_outputs=copy_outputs, update_values=False)
    if not (exact and copy_outputs):
        return transformed(subject, STRIDEGUARD, choices=choices)[0]
    # preprocess runs ExecuTorch's own view pass on what prepare_for_aoti converted, then the backend's.
    return fixed_and_proven(
        subject, STRIDEGUARD, AsCompiled(STRIDEGUARD), fixed_as=AsCompiled(EXECUTORCH), choices=choices, falls_back=True
    )[0]


@quietly
def aoti_compile_and_package(
    program: ExportedProgram,
    package_path: Optional[str] = None,
    inductor_configs: Optional[dict] = None,
    *,
    layouts: Optional[dict] = None,
) -> str:
    """``torch._inductor.aoti_compile_and_package`` with every user output proven dense first.

    Same signature and return value (the package's path). The program is
    fixed with ``densify_outputs(exact=True)``: copies decided by Inductor's own
    lowering under ``inductor_configs``, then the fixed program lowered again
    and repaired until every output is in its layout (``strideguard.prove.proof``),
    then compiled. ``program`` is not modified. Edge programs are compiled by
    ExecuTorch's AOTI backends: use ``strideguard.executorch.DenseOutputsPass``.
    ``layouts`` as in ``densify_outputs``.
    """
    subject = subject_of(program, "aoti_compile_and_package", layouts=layouts)
    if subject.dialect.is_edge:
        raise ValueError(
            "strideguard.aoti_compile_and_package compiles ATen programs; an Edge program is compiled by an "
            "ExecuTorch AOTI backend: add strideguard.executorch.DenseOutputsPass(exact=True) to its transform passes"
        )
    if package_path is not None and not isinstance(package_path, (str, os.PathLike)):
        raise TypeError(f"strideguard.aoti_compile_and_package: package_path must be a path, got {type(package_path).__name__}")
    _require_configs(inductor_configs, "aoti_compile_and_package")
    return _compiled_proven(subject, package_path, inductor_configs)[0]


@quietly
def compile_proven(
    program: ExportedProgram,
    package_path: Optional[str] = None,
    inductor_configs: Optional[dict] = None,
    *,
    layouts: Optional[dict] = None,
    device: Any = None,
) -> tuple[str, Proof]:
    """``aoti_compile_and_package``'s work, returning the package's path and how its layouts were proven.

    ``device`` names the device compiled for (as ``densify_outputs`` takes it); AOTInductor compiles natively,
    for the device of the program's tensors, on a machine that has it, so any other device is refused before
    any work: prove the fix for it with ``densify_outputs(exact=True, device=...)`` and compile there."""
    subject = subject_of(program, "aoti_compile_and_package", device=device, layouts=layouts)
    compiled_for = target_for(subject.program, None, None, subject.function) if device is not None else subject.target
    target = subject.target
    if target.kind != compiled_for.kind:
        raise ValueError(
            f"strideguard.aoti_compile_and_package: the program's tensors are on {compiled_for.kind}, so "
            f"AOTInductor compiles it for {compiled_for.kind}, not {target.kind} (it compiles natively, not across "
            f"devices): export it on {target.kind}, or prove the fix here with "
            f"densify_outputs(program, exact=True, device={device!r}) and compile the fixed program there"
        )
    return _compiled_proven(subject, package_path, inductor_configs)


def _compiled_proven(subject: Subject, package_path: Optional[str], inductor_configs: Optional[dict]) -> tuple[str, Proof]:
    """``compile_proven``'s work on a subject whose arguments are checked."""
    configs = dict(inductor_configs or {})
    user_pass = configs.get("_pre_fusion_custom_pass")
    if user_pass is not None:
        raise ValueError(
            "strideguard.aoti_compile_and_package: inductor_configs sets _pre_fusion_custom_pass, which strideguard "
            "needs for its own ExternKernelMemory pass"
        )
    configs["_pre_fusion_custom_pass"] = ExternKernelMemory()
    target = subject.target
    if not target.present:
        raise ValueError(
            f"strideguard.aoti_compile_and_package: compiling for {target.kind} needs a {target.kind} device on this "
            f"machine (AOTInductor compiles natively); prove the fix here with "
            f"densify_outputs(program, exact=True, device={target.kind!r}) and compile the fixed program there"
        )
    fixed, _, proof = fixed_and_proven(
        subject, EXECUTORCH, AsCompiled(EXECUTORCH, inductor_configs), keeps_kernel_memory=True
    )
    path = torch._inductor.aoti_compile_and_package(fixed, package_path=package_path, inductor_configs=configs)
    return path, proof


def _require_configs(inductor_configs: Any, function: str) -> None:
    if inductor_configs is not None and not (
        isinstance(inductor_configs, dict) and all(isinstance(key, str) for key in inductor_configs)
    ):
        raise TypeError(f"strideguard.{function}: inductor_configs must be a dict of Inductor option names to values")

"""The closed loop: lower the *fixed* program through the real pipeline, and repair what still breaks.

``densify_outputs(exact=True)`` and its siblings decide their copies from
Inductor's lowering of the program as handed, which is a prediction about the
fixed one. Two things can still break it: Inductor may drop a copy (its
``remove_noop_ops`` removes a ``clone`` traced like its source, however it then
lays the source out), and an AOTI backend's own passes, which run after
strideguard's, may re-lay an output. So the fixed program is lowered again,
through the same pipeline its compile will run (``aoti_compile_and_package``'s
for ATen; ``AotiBackend.preprocess``'s view pass, custom passes and
decomposition table for Edge), and every user output is checked against its
target layout. An output still out of layout gets its copy in the next stronger
form (``program.copies.stronger_form``: ``CopyForm.KEPT``, which holds whatever
layout its source is traced in, then ``CopyForm.PINNED``, which holds where
Inductor re-lays the source after removing no-ops, at the cost of a second copy), replacing any weaker copy,
and the program is lowered again. If the strongest form does not reach the
layout either, ``LayoutNotReached`` names the output and the cause: strideguard
never returns a program that silently breaks the promise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.export import ExportedProgram

from ..compiler.oracle.lowering import LoweredOutput, Lowering
from ..compiler.targets import LoweringUnavailable
from ..decide.subject import Subject
from ..decide.view_conversion import ConversionPolicy
from ..fix.engine import AsCompiled, Choices, lower_as_compiled, transformed, with_stronger_copies
from ..program import density
from ..program.copies import copy_form_of, CopyForm, stronger_form
from ..program.exported import output_values
from ..program.promises import KEEP

logger = logging.getLogger(__name__)

MAX_ROUNDS = 4
"""Lowerings of the fixed program at most: one to check, one after each strengthening of a copy, one spare."""


@dataclass(frozen=True)
class Proof:
    """How a fixed program was shown to return every user output in its target layout."""

    rounds: int
    """Lowerings of the fixed program it took (1: the fix held as planned)."""
    seconds: float
    """Time spent lowering the fixed program, all rounds."""
    strengthened: tuple[int, ...]
    """User outputs whose copy the loop had to insert or strengthen."""
    backend: Optional[str] = None
    unproven: tuple[int, ...] = ()
    """User outputs in layout in Inductor's lowering that a compile may still write into memory an extern
    kernel allocated, with the kernel's own strides in size-one dimensions (``LoweredOutput.kernel_memory``).
    ``strideguard.aoti_compile_and_package`` compiles with ``compiler.oracle.lowering.ExternKernelMemory``, which rules that
    out; a compile strideguard does not run cannot be told to, and these are then left unproven (logged).
    Where part of the pipeline could not run (a backend's own passes), every output is unproven."""
    target: str = "cpu"
    """The device the lowering was for (``strideguard.compiler.targets.Target``, in words)."""
    unproven_reason: Optional[str] = None
    """Why ``unproven`` are not proven, in words."""
    names: tuple[str, ...] = ()
    """Every user output's name (``program.naming.output_names``), by index: what ``strengthened``, ``unproven`` and
    ``copied`` say in the user's words (``named``)."""
    copied: tuple[int, ...] = ()
    """The user outputs the proven program returns a copy of strideguard's for."""
    source_lines: tuple[Optional[str], ...] = ()
    """Every user output's source line (``program.naming.source_line``), by index."""

    def named(self, indices) -> list[str]:
        """``indices`` as the user's output names."""
        return [self.names[i] if i < len(self.names) else f"#{i}" for i in indices]


@dataclass(frozen=True)
class Unreached:
    index: int
    name: Optional[str]
    strides: tuple
    target_order: tuple
    cause: str

    def __str__(self) -> str:
        named = f" ({self.name})" if self.name else ""
        return (
            f"output {self.index}{named} comes back with strides {list(density.format_strides(self.strides))}, "
            f"not those of dim order {list(self.target_order)}: {self.cause}"
        )


class LayoutNotReached(RuntimeError):
    """The fixed program still returns an output out of its target layout, with a copy in every form."""

    def __init__(self, outputs: tuple[Unreached, ...]):
        self.outputs = outputs
        super().__init__("strideguard: cannot reach the promised layout: " + "; ".join(map(str, outputs)))


PROOF_KEY = "strideguard_proof"
"""``graph_module.meta`` key under which a proven program carries its ``Proof``."""


@dataclass(frozen=True)
class Judged:
    """One user output of a fixed program, judged against one lowering of it: read once per round, so that the
    proof, the repair and the refusal all read the same answer."""

    index: int
    node: Any
    """What the fixed program returns for it (a node, or a constant)."""
    order: Optional[tuple[int, ...]]
    """Its target dim order (``None``: not a tensor)."""
    lowered: Optional[LoweredOutput]
    out_of_layout: bool
    copy_form: Optional[str]
    """The form of strideguard's copy it is (``program.copies.copy_form_of``), if it is one."""
    stronger: Optional[CopyForm]
    """The copy form to try next where it is out of layout (``None``: none stronger, or in layout)."""

    @property
    def is_tensor(self) -> bool:
        return isinstance(getattr(self.node, "meta", {}).get("val"), torch.Tensor)


def judged_outputs(fixed: ExportedProgram, subject: Subject, lowering: Optional[Lowering]) -> list[Judged]:
    """Every user output of ``fixed`` (the subject's program, fixed) against ``lowering`` (``None``: none ran)."""
    values = output_values(fixed.graph)
    returned = [values[out.position] for out in subject.outputs]
    requested, orders = subject.requested, subject.target_orders
    # a lowering of the subject's outputs (``fix.engine.lower_as_compiled`` refuses any other)
    lowered_outputs = lowering.outputs if lowering is not None else (None,) * len(orders)
    judged = []
    for index, (node, order, lowered) in enumerate(zip(returned, orders, lowered_outputs)):
        checked = order is not None and lowered is not None and requested.get(index) != KEEP
        wrong = checked and any(
            density.has_layout(lowered.shape, strides, order) is not True for strides in lowered.every_strides
        )
        form = copy_form_of(node)
        stronger = stronger_form(form, node.meta["val"]) if wrong else None
        judged.append(Judged(index, node, order, lowered, wrong, form, stronger))
    return judged


def prove_layouts(
    fixed: ExportedProgram,
    subject: Subject,
    as_compiled: AsCompiled,
    *,
    keeps_kernel_memory: bool = False,
    max_rounds: int = MAX_ROUNDS,
) -> tuple[ExportedProgram, Proof]:
    """Lower ``fixed`` (the subject's program, fixed) ``as_compiled`` until every user output is in its target
    layout, strengthening copies.

    Returns the program that was proven (``fixed`` itself when its copies held) and how.
    Raises ``LayoutNotReached`` when an output is out of layout with the strongest copy in place.
    ``keeps_kernel_memory``: the compile that follows runs ``compiler.oracle.lowering.ExternKernelMemory``.
    """
    lowered_seconds = 0.0
    strengthened: list[int] = []
    for round_number in range(1, max_rounds + 1):
        lowering = lower_as_compiled(fixed, subject, as_compiled)
        lowered_seconds += lowering.seconds
        judged = judged_outputs(fixed, subject, lowering)
        wrong = [output for output in judged if output.out_of_layout]
        if not wrong:
            unproven, why = _unproven(lowering, keeps_kernel_memory)
            proof = _proof(subject, judged, round_number, lowered_seconds, strengthened, lowering.backend, unproven, why)
            if unproven:
                logger.warning(
                    "strideguard: outputs %s are not proven in their layout: %s", ", ".join(proof.named(unproven)), why
                )
            fixed.graph_module.meta[PROOF_KEY] = proof
            return fixed, proof
        unreachable = [_unreached(subject, output, lowering) for output in wrong if output.stronger is None]
        if unreachable or round_number == max_rounds:
            raise LayoutNotReached(tuple(unreachable) or tuple(_unreached(subject, output, lowering) for output in wrong))
        fixed = with_stronger_copies(fixed, subject, {output.index: output.stronger for output in wrong})
        strengthened += [output.index for output in wrong if output.index not in strengthened]
    raise AssertionError("unreachable")  # pragma: no cover


def fixed_and_proven(
    subject: Subject,
    policy: ConversionPolicy,
    as_compiled: AsCompiled,
    *,
    fixed_as: Optional[AsCompiled] = None,
    choices: Choices = Choices(),
    keeps_kernel_memory: bool = False,
    falls_back: bool = False,
) -> tuple[ExportedProgram, int, Proof]:
    """``transformed`` with its copies decided by Inductor's lowering (``as_compiled``) of the program planned on
    (the subject's, or its working copy with the pushdowns applied), then the loop closed on the result,
    lowered ``fixed_as`` (by default ``as_compiled``): the fixed program, the nodes the fix changed, and its
    ``Proof``. With ``falls_back``, where the lowering cannot run here (``LoweringUnavailable``), every tensor
    output is copied instead and the ``Proof`` lists them all as unproven, with why (logged); otherwise it
    raises."""
    try:
        fixed, changed = transformed(subject, policy, as_compiled=as_compiled, choices=choices)
    except LoweringUnavailable as error:
        if not falls_back:
            raise
        # Where the target's lowering cannot run here: every tensor output copied, and none claimed proven.
        why = str(error)
        fixed, changed = transformed(subject, policy, choices=choices, unavailable=why)
        judged = judged_outputs(fixed, subject, None)
        tensors = tuple(output.index for output in judged if output.is_tensor)
        proof = _proof(subject, judged, 0, 0.0, [], getattr(subject.backend, "name", None), tensors, why)
        logger.warning(
            "strideguard: outputs %s are copied but not proven in their layout: %s", ", ".join(proof.named(tensors)), why
        )
        fixed.graph_module.meta[PROOF_KEY] = proof
        return fixed, changed, proof
    fixed, proof = prove_layouts(fixed, subject, fixed_as or as_compiled, keeps_kernel_memory=keeps_kernel_memory)
    return fixed, changed, proof


def _proof(subject: Subject, judged: list[Judged], rounds, seconds, strengthened, backend, unproven, why) -> Proof:
    return Proof(
        rounds, seconds, tuple(strengthened), backend, tuple(unproven), str(subject.target), why, subject.names,
        tuple(output.index for output in judged if output.copy_form is not None),
        subject.lines,
    )


def _unproven(lowering: Lowering, keeps_kernel_memory: bool) -> tuple[tuple[int, ...], Optional[str]]:
    """The outputs a lowering in layout still does not prove, and why."""
    tensors = [index for index, lowered in enumerate(lowering.outputs) if lowered is not None]
    if lowering.unavailable:
        return tuple(tensors), f"{lowering.unavailable}; each is copied in a form that holds whatever they do"
    if keeps_kernel_memory:
        return (), None
    at_risk = tuple(index for index in tensors if lowering.outputs[index].kernel_memory)
    if not at_risk:
        return (), None
    return at_risk, (
        "they may be computed into memory an extern kernel allocated, with its own strides in size-one "
        "dimensions; strideguard.aoti_compile_and_package compiles so that they are not"
    )


def _unreached(subject: Subject, output: Judged, lowering: Lowering) -> Unreached:
    if output.copy_form is not None and output.stronger is None:
        by = f"{lowering.backend}'s own passes or Inductor" if lowering.backend else "Inductor"
        cause = f"{by} re-lay it after strideguard's strongest copy"
    elif output.copy_form is not None:
        cause = "strideguard's copy did not hold"
    else:
        cause = "it is not copied"
    if lowering.unavailable:
        cause += f" ({lowering.unavailable})"
    return Unreached(
        output.index, subject.names[output.index], tuple(output.lowered.strides), tuple(output.order), cause
    )

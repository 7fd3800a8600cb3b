"""Retarget every remaining ``detach_copy`` to ``alias_copy``.

Inductor has no C shim for ``detach_copy`` and falls back to its proxy
executor, which ExecuTorch's AOTI runtime does not provide: a method holding
one compiles and then cannot run. ``alias_copy`` means the same (a fresh copy
of the same values) and Inductor lowers it natively. Where a ``detach_copy``
could become a plain view, ``view_copies_to_views`` has already made it an
``alias``; this pass handles the rest.
"""

from __future__ import annotations

import torch

from ...program.dialect import detach_replacement


def detach_copy_to_alias_copy(graph: torch.fx.Graph) -> int:
    changed = 0
    for node in graph.nodes:
        if node.op == "call_function" and (replacement := detach_replacement(node.target)) is not None:
            node.target = replacement
            changed += 1
    return changed

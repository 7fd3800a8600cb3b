"""Retarget the ``detach_copy`` nodes a plan lists to ``alias_copy``.

Inductor has no C shim for ``detach_copy`` and falls back to its proxy
executor, which ExecuTorch's AOTI runtime does not provide: a method holding
one compiles and then cannot run. ``alias_copy`` means the same (a fresh copy
of the same values) and Inductor lowers it natively. Where a ``detach_copy``
could become a plain view, ``view_copies_to_views`` has already made it an
``alias``; the plan (``fix.engine.make_plan``) lists the rest.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch.fx import Node


def detach_copy_to_alias_copy(retargets: Mapping[Node, Any]) -> int:
    for node, alias_copy in retargets.items():
        node.target = alias_copy
    return len(retargets)

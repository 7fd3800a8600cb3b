"""Record in the program the layout the user asked for each output, where it is returned.

A requested layout (``layouts={"image": torch.channels_last}``) is part of
what the fixed program promises: ``inspect``, the closed loop and ``verify``
of the fixed program, in this process or after ``torch.export.save`` and a
load, must judge the output against it rather than against the default
(contiguous for ATen). So it is written into the returned node's
``meta["custom"]`` (``program.promises.LAYOUT_TAG``), which torch's serializer and
ExecuTorch keep, keyed by the user output's index: one node may be returned
as several outputs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ...program.exported import output_values, UserOutput
from ...program.promises import KEEP, LAYOUT_TAG


def record_requested_layouts(graph: torch.fx.Graph, outputs: Sequence[UserOutput], requested: Mapping[int, Any]) -> int:
    """Tag each node ``graph`` returns with the layouts asked of the user ``outputs`` it is returned as; returns
    how many nodes' tags changed."""
    if not requested:
        return 0
    returned = output_values(graph)
    tags: dict[torch.fx.Node, dict[str, Any]] = {}
    for out in outputs:
        wanted = requested.get(out.index)
        node = returned[out.position]
        if wanted is None or not isinstance(node, torch.fx.Node):
            continue
        tags.setdefault(node, {})[str(out.index)] = KEEP if wanted == KEEP else list(wanted)
    changed = 0
    for node, tag in tags.items():
        custom = node.meta.get("custom")
        earlier = custom.get(LAYOUT_TAG, {}) if isinstance(custom, dict) else {}
        if {**earlier, **tag} == earlier:
            continue
        # A new dict: the node's ``custom`` may be the very one of the caller's program.
        node.meta["custom"] = {**(custom or {}), LAYOUT_TAG: {**earlier, **tag}}
        changed += 1
    return changed

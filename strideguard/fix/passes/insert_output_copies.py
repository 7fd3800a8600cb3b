"""Insert exactly one copy for each user output that would not come back dense.

The copy goes right after the node it copies and the output node is rewired
to it; which outputs are copied, and into which dim order, the facts say
(``strideguard.decide.facts``). The copy itself, its form and why Inductor
keeps it, is built in ``strideguard.program.copies``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.fx import Node

from ...decide.facts import OutputFacts
from ...program.copies import insert_copy
from ...program.dialect import Dialect


def insert_output_copies(
    graph: torch.fx.Graph,
    facts: Sequence[OutputFacts],
    dialect: Dialect,
    value: Callable[[Node], Any],
) -> list[Node]:
    """Copy each output whose facts say ``Action.COPY`` and return the copy instead; returns the new nodes."""
    output_node = graph.output_node()
    returned = list(output_node.args[0])
    inserted = []
    for fact in facts:
        if fact.copied:
            copy = insert_copy(
                graph, returned[fact.output.position], dialect, fact.target_order, value, serves=fact.reported.name
            )
            returned[fact.output.position] = copy
            inserted.append(copy)
    if inserted:
        output_node.args = (type(output_node.args[0])(returned),)
    return inserted

"""Return only what is returned: where a returned slice or select can move into its producers.

A method that returns ``lm_head(h)[:, -1, :]`` computes logits for every
position and keeps one; one that returns ``linear(h)[..., :14]`` computes 16
columns and keeps 14. Cutting the producers' inputs instead, as
``lm_head(h[:, -1:, :])`` or ``linear(h, W[:14], b[:14])``, gives the output
dense by construction, with no copy and less compute.

The plan is found from the graph alone, as data (``Pushdown`` records): for
each returned ``slice``, ``select``, ``narrow`` or ``split``/``chunk``/
``unbind`` piece, a demand (a ``Narrowing`` of a value's output) moves from
each node to its inputs through the ops where the narrowed result is exactly
the op applied to narrowed inputs (``rules``), in reverse graph order. A node
joins the pushed region only when every one of its users is in the region and
wants the same narrowing of it: a value that also feeds something else is
computed in full anyway, so recomputing a piece of it would add work. Where
the walk stops (an input, a weight, a reduction over the narrowed dimension,
attention over keys, a value with other users, an op not known to commute),
the narrowing is taken as a slice of that value, in the graph: a weight is
never copied into a new parameter.

``strideguard.fix.passes.push_pieces_into_producers`` applies the plan; the costs
are counted in ``flops``: torch's own counter for GEMMs and convolutions
(``2·M·N·K`` for a GEMM), any other op as one per output element, a view as
nothing.

One module per job: ``pieces`` recognises a returned piece, ``rules`` says how
each op commutes with a narrowing, ``regions`` walks from the cut into the
producers, ``flops`` weighs the result, and ``nodes`` reads what they share
off a node.
"""

from __future__ import annotations

from .flops import flops, graph_flops
from .nodes import checks_only_its_type
from .pieces import FULL, Narrowing, returned_piece, ReturnedPiece
from .regions import plan_pushdown, plan_pushdowns, Pushdown
from .rules import is_identity_dropout, passes_through, rule_for

__all__ = [
    "FULL", "Narrowing", "ReturnedPiece", "returned_piece", "flops", "graph_flops", "checks_only_its_type", "Pushdown",
    "plan_pushdown", "plan_pushdowns", "is_identity_dropout", "passes_through", "rule_for",
]

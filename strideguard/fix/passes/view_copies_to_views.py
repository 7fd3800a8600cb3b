"""Turn the view copies a plan chose (``strideguard.decide.view_conversion``) back into views.

ExecuTorch's ``to_edge`` makes every view a fresh copy; turning one back into
a view lets Inductor treat it as free. Which ones is the plan's decision; this
pass only carries it out.
"""

from __future__ import annotations

import operator

from ...decide.view_conversion import ViewConversion


def convert_views(conversion: ViewConversion, *, update_values: bool = True) -> int:
    """Retarget the planned nodes and give them their view values; returns how many.

    ``update_values=False`` leaves each converted node the value of the copy
    it was, as ExecuTorch's own pass does inside ``preprocess``, where
    Inductor traces the graph again; recomputing every view costs more than the
    rest of the pass.
    """
    for node, view_op in conversion.targets.items():
        node.target = view_op
    if update_values:
        chunks = [u for n in conversion.targets for u in n.users if u.target is operator.getitem]
        for node in [*conversion.targets, *chunks]:
            node.meta["val"] = conversion.view_values.value(node)
    return len(conversion.targets)

"""The predictor: what AOTInductor will hand back for an output, read from the graph alone, in milliseconds.

``inductor`` holds what Inductor does that the graph does not show (its
decompositions, its no-op removal), ``relayout`` which nodes it may lay out
anew, ``compiled_layout`` the answer for one output: ``Settled`` strides or
``LeftToInductor``. It never runs Inductor; the oracle (``compiler.oracle``)
does, and the two never import each other.
"""

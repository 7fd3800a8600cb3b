"""Stage 4, what strideguard does: the one plan and its apply.

``engine`` makes one plan from the decisions and carries it out with the
``passes``, one graph transform each; outside this folder only the engine's
``__all__`` is used.

May import: program, compiler and decide.
"""

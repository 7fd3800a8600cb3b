"""Stage 5, how strideguard proves what it did.

``proof`` is the closed loop at fix time: Inductor's lowering of the fixed
program for the target device, copies strengthened until every output is in
its layout; ``verification`` compiles, runs and checks layouts and values;
``isolation`` runs a handed program in a child process under time and memory
limits.

May import: program, compiler, decide and fix.
"""

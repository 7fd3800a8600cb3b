"""Stage 2, what the compiler will do to a program, asked of the compiler for the device it ships to.

Two wings that never import each other. ``oracle`` asks: Inductor's own
lowering up to where output layouts are fixed (``oracle.lowering``; on fake
tensors of a device this machine lacks: ``oracle.fake_device``), CUDA's
attention kernel chosen by torch's rules (``oracle.attention_kernels``), the
matmuls whose padding the device's own benchmark decides, lowered both ways
(``oracle.padded_matmuls``). ``predictor`` reads the graph alone: what
Inductor does that the graph does not show (``predictor.inductor``,
``predictor.relayout``) and what it hands back for one output
(``predictor.compiled_layout``). Beside them, ``targets`` names the device a
program is compiled for and ``backends`` reads what an ExecuTorch AOTI backend
runs before Inductor.

May import: program.
"""

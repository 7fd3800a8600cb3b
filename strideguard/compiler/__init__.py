"""Stage 2, what the compiler will do to a program, asked of the compiler for the device it ships to.

``targets`` names the device a program is compiled for; ``lowering`` runs
Inductor's own lowering up to where output layouts are fixed (on fake
tensors of a device this machine lacks: ``fake_device``); ``backends``
reads what an ExecuTorch AOTI backend runs before Inductor;
``attention_kernels`` chooses CUDA's attention kernel by torch's rules;
``padded_matmuls`` names the matmuls whose padding the device's own
benchmark decides (``pad_mm``), lowered both ways;
``inductor`` and ``relayout`` say what Inductor does that the graph does not
show, and ``compiled_layout`` what it hands back for one output.

May import: program.
"""

"""The oracle: Inductor's own lowering asked for the target device, and the choices the device makes.

``lowering`` runs Inductor up to where output layouts are fixed, with no code
generated; ``fake_device`` lowers for a device this machine lacks and holds
every private torch entry point that needs; ``attention_kernels`` chooses
CUDA's SDPA kernel by torch's rules; ``padded_matmuls`` names the matmuls the
device's benchmark may pad (``pad_mm``) and lowers them both ways. It never
imports the predictor (``compiler.predictor``).
"""

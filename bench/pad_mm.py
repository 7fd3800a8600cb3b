"""What the fix for a matmul the device may pad costs: the copy after a padded matmul, against the matmul itself.

An LM prefill head (GPT-2's vocabulary, 50,257, odd; hidden 768; 128 tokens; bfloat16), exported, fixed with
``densify_outputs(exact=True, device="cuda")`` (its logits are copied: the device's benchmark decides whether
``pad_mm`` pads them), then compiled with AOTInductor on the CPU twice: with ``pad_mm`` forced (the branch a
GPU takes when its benchmark says "pad", ``tests.padding.forced_pad_mm``) and without (the branch it takes when
it says no). Each of the four packages (unfixed and fixed, padded and not) is called in turn, round after
round, and the median of each is reported with the ratio of fixed to unfixed in each branch: the copy's cost
where it is needed (padded) and where it is not (unpadded). The CPU's matmul is far slower than a GPU's, so
the ratios bound the copy's share from below; the bytes it moves are printed beside them.

    python bench/pad_mm.py [--rounds N] [--tokens N] [--hidden N] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strideguard  # noqa: E402
from tests.padding import VOCAB, forced_pad_mm  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "pad_mm.json"


class PrefillHead(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, hidden_states):
        return self.lm_head(hidden_states)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.manual_seed(0)
    x = torch.randn(1, args.tokens, args.hidden).to(torch.bfloat16)
    program = torch.export.export(PrefillHead(args.hidden).to(torch.bfloat16).eval(), (x,))
    report = strideguard.inspect(program, exact=True, device="cuda")
    print(f"before the fix, for CUDA: {report.outputs[0].verdict}", flush=True)
    fixed = strideguard.densify_outputs(program, exact=True, device="cuda")
    runs, strides = {}, {}
    with tempfile.TemporaryDirectory() as directory:
        for name, each in (("unfixed", program), ("fixed", fixed)):
            for branch in ("padded", "unpadded"):
                started = time.perf_counter()
                with forced_pad_mm() if branch == "padded" else contextlib.nullcontext():
                    path = torch._inductor.aoti_compile_and_package(each, package_path=os.path.join(directory, f"{name}-{branch}.pt2"))
                run = torch._inductor.aoti_load_package(path)
                out = run(x)
                runs[name, branch], strides[name, branch] = run, (list(out.stride()), out.storage_offset())
                print(f"{name}, {branch}: strides {list(out.stride())}, compiled in {time.perf_counter() - started:.1f} s", flush=True)
        times = {key: [] for key in runs}
        for _ in range(args.rounds):
            for key, run in runs.items():
                started = time.perf_counter()
                run(x)
                times[key].append(time.perf_counter() - started)
    medians = {key: statistics.median(values) for key, values in times.items()}
    result = {
        "tokens": args.tokens, "hidden": args.hidden, "vocab": VOCAB, "rounds": args.rounds, "torch": torch.__version__,
        "strides": {f"{name} {branch}": value for (name, branch), value in strides.items()},
        "median_ms": {f"{name} {branch}": 1000 * value for (name, branch), value in medians.items()},
        "fixed_over_unfixed": {branch: medians["fixed", branch] / medians["unfixed", branch] for branch in ("padded", "unpadded")},
        "copy_bytes": 2 * args.tokens * VOCAB * x.element_size(),
        "matmul_flops": 2 * args.tokens * args.hidden * VOCAB,
    }
    for (name, branch), value in medians.items():
        print(f"{name:8} {branch:9} median {1000 * value:8.2f} ms over {args.rounds} rounds")
    for branch, ratio in result["fixed_over_unfixed"].items():
        print(f"fixed / unfixed, {branch}: {ratio:.3f}")
    print(f"the copy moves {result['copy_bytes'] / 1e6:.1f} MB; the matmul does {result['matmul_flops'] / 1e9:.2f} GFLOP")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

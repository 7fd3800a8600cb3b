"""`make bench`, pushdown: per call on AOTInductor CPU, unfixed vs fixed vs fixed with pushdown.

Three methods, each compiled three times (as exported; ``densify_outputs``;
``densify_outputs(pushdown=True)``) and called in interleaved rounds, so that
the ratios are taken in one run on one machine state:

* an LM prefill head (vocabulary 32,000, hidden size 256, 128 positions,
  batch 1) returning ``logits[:, -1, :]``;
* the demo policy head returning ``sample[..., :14]``;
* the zoo's Llama prefill (batch 2, 8 positions) returning the last position's
  logits and its KV cache.

Also records the FLOPs the pushdown saves (``inspect``'s ``flops_saved``, and
the whole method's count) and the largest difference from the unfixed compiled
outputs. Writes bench/results/pushdown.json and bench/results/pushdown.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import strideguard  # noqa: E402
from strideguard.examples import export_policy  # noqa: E402
from strideguard.decide.pushdown import graph_flops  # noqa: E402
from strideguard.decide.subject import subject_of  # noqa: E402
from strideguard.fix.engine import Choices, Pushdowns, program_plan  # noqa: E402
from strideguard.prove.verification import compile_program  # noqa: E402

RESULTS = ROOT / "bench" / "results"


class PrefillHead(torch.nn.Module):
    """The last step of an LM prefill: every position's logits, of which the method keeps the last."""

    def __init__(self, hidden: int = 256, vocabulary: int = 32_000):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocabulary, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(hidden_states))[:, -1, :]


def _pushed_down_graph(program):
    """The program's graph with its pushdowns applied and nothing else (no copies): the FLOPs pushdown moves."""
    only_pushed = Choices(pushdowns=Pushdowns.APPLIED, copy_outputs=False)
    return program_plan(subject_of(program, "bench"), strideguard.STRIDEGUARD, choices=only_pushed).graph


def export_prefill_head() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    with torch.no_grad():
        return torch.export.export(PrefillHead().eval(), (torch.randn(1, 128, 256),))


def export_llama_prefill() -> torch.export.ExportedProgram:
    from tests import zoo

    return next(m for m in zoo.MODELS if m.name == "llama-prefill-b2").export()


def _leaves(values):
    return torch.utils._pytree.tree_leaves(values)


def measure(name: str, program: torch.export.ExportedProgram, rounds: int, round_seconds: float, directory: str) -> dict:
    inputs = tuple(program.example_inputs[0])
    variants = {
        "unfixed": program,
        "fixed": strideguard.densify_outputs(program),
        "pushdown": strideguard.densify_outputs(program, pushdown=True),
    }
    compiled = {key: compile_program(value, os.path.join(directory, key)) for key, value in variants.items()}
    with torch.no_grad():
        reference = _leaves(compiled["unfixed"](*inputs))
        error = max(
            float((got.double() - want.double()).abs().max())
            for got, want in zip(_leaves(compiled["pushdown"](*inputs)), reference)
        )
        dense = all(t.is_contiguous() for t in _leaves(compiled["pushdown"](*inputs)))
        started = time.perf_counter()
        for _ in range(5):
            compiled["unfixed"](*inputs)
        calls = max(5, int(round_seconds / ((time.perf_counter() - started) / 5)))
        for call in compiled.values():
            for _ in range(calls):
                call(*inputs)
        per_call = {key: [] for key in compiled}
        for _ in range(rounds):
            for key, call in compiled.items():
                started = time.perf_counter()
                for _ in range(calls):
                    call(*inputs)
                per_call[key].append((time.perf_counter() - started) / calls)
    medians = {key: statistics.median(values) for key, values in per_call.items()}
    report = strideguard.inspect(program)
    pushed = next((o for o in report.outputs if o.pushdown), None)
    row = {
        "method": name,
        "calls_per_round": calls,
        "rounds": rounds,
        "median_us_per_call": {key: value * 1e6 for key, value in medians.items()},
        "fixed_over_unfixed": medians["fixed"] / medians["unfixed"],
        "pushdown_over_unfixed": medians["pushdown"] / medians["unfixed"],
        "pushdown": pushed.pushdown if pushed else None,
        "producers_flops_saved": pushed.flops_saved if pushed else None,
        "method_flops_ratio": graph_flops(_pushed_down_graph(program)) / graph_flops(program.graph),
        "max_error_vs_unfixed": error,
        "all_outputs_dense": dense,
    }
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict], machine: str) -> str:
    lines = [
        f"Measured with `make bench` (`bench/pushdown.py`) on {machine}, torch {torch.__version__}: AOTInductor CPU, "
        "median per call of interleaved rounds, ratios to the unfixed method in the same run.",
        "",
        "| method | unfixed | fixed (copy) | fixed with pushdown | pushed-down producers' FLOPs saved | method FLOPs | max error vs unfixed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        us = row["median_us_per_call"]
        saved = "-" if row["producers_flops_saved"] is None else f"{row['producers_flops_saved']:.0%}"
        lines.append(
            f"| {row['method']} | {us['unfixed']:.1f} us (1.00) | {us['fixed']:.1f} us ({row['fixed_over_unfixed']:.2f}) | "
            f"{us['pushdown']:.1f} us ({row['pushdown_over_unfixed']:.2f}) | {saved} | "
            f"{row['method_flops_ratio']:.2f}x | {row['max_error_vs_unfixed']:.1e} |"
        )
    lines += ["", "Pushdowns: " + "; ".join(f"{r['method']}: {r['pushdown']}" for r in rows if r["pushdown"])]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--round-seconds", type=float, default=0.3)
    arguments = parser.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    methods = {
        "LM prefill head, logits[:, -1, :] (32,000 x 256, 128 positions)": export_prefill_head,
        "policy head, sample[..., :14]": lambda: export_policy(batch=1),
        "Llama prefill (zoo, batch 2), last logits and KV cache": export_llama_prefill,
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="strideguard-pushdown-") as directory:
        for number, (name, export) in enumerate(methods.items()):
            rows.append(measure(name, export(), arguments.rounds, arguments.round_seconds, os.path.join(directory, str(number))))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pushdown.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    (RESULTS / "pushdown.md").write_text(table(rows, machine))
    print(table(rows, machine))
    head, policy = rows[0], rows[1]
    met = head["pushdown_over_unfixed"] <= 0.5 and policy["pushdown_over_unfixed"] < 1.0
    print("targets (LM head <= 0.5x, policy head < 1.00x):", "met" if met else "NOT met")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

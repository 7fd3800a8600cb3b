"""What ``make demo`` shows: the policy head's action output strided before, dense after."""

from __future__ import annotations

import torch
from rich.console import Console
from rich.table import Table

from . import densify_outputs, inspect, verify
from .examples import export_decode_step, export_policy


def _layout_table(title: str, report) -> Table:
    """The report's own cells (``OutputLayout.cells``), the columns a first look needs."""
    table = Table(title=title)
    columns = ("output", "shape", "strides", "layout", "cause", "fix")
    for column in columns:
        table.add_column(column)
    for o in report.outputs:
        cells = o.cells()
        cells["output"] = f"[{cells['#']}] {cells['name']}"
        cells["layout"] = f"[{'green' if o.ok else 'red'}]{cells['layout']}[/]"
        table.add_row(*(cells[column] for column in columns))
    return table


class _WarmUp(torch.nn.Module):
    def forward(self, x):
        return x + 1


def run_demo(console: Console | None = None) -> bool:
    """Export, inspect, fix, compile and run the example policy; True when the fix held."""
    console = console or Console()
    program = export_policy(batch=1)
    console.rule("strideguard demo: a policy head returning sample[..., :action_dim]")
    before = inspect(program)
    console.print(_layout_table("inspect(program): before", before))

    fixed = densify_outputs(program)
    console.print(_layout_table("inspect(densify_outputs(program)): after", inspect(fixed)))

    with console.status("compiling both programs with AOTInductor on the CPU..."):
        # Both timed warm: the first compile in a process pays the compiler's start (23 s against 6.5 s here),
        # which would read as if the fix made compiling faster.
        verify(torch.export.export(_WarmUp(), (torch.ones(2),)))
        unfixed_run = verify(program)
        fixed_run = verify(fixed)
    observation = program.example_inputs[0][0]
    original = program.module()(observation)
    transformed = fixed.module()(observation)
    results = Table(title="compiled with AOTInductor and run", caption="compile s: each after one small compile warmed the compiler")
    for column in ("program", "strides returned", "contiguous", "storage", "equal to eager", "compile s"):
        results.add_column(column)
    for label, run in (("as exported", unfixed_run), ("densify_outputs", fixed_run)):
        check = run.outputs[0]
        results.add_row(
            label,
            str(list(check.strides)),
            "[green]yes[/]" if check.contiguous else "[red]no[/]",
            f"offset {check.storage_offset}",
            "yes" if check.match else "[red]NO[/]",
            f"{run.compile_seconds:.1f}",
        )
    console.print(results)
    same = torch.equal(original, transformed)
    console.print(f"values of the fixed program equal the original's, bitwise: {same}")
    _print_pushdown(console, before)
    held = (not before.ok) and fixed_run.ok and same
    console.print("[green]fixed: the action output now comes back dense[/]" if held else "[red]the fix did not hold[/]")
    return held


def _print_pushdown(console: Console, policy) -> None:
    """The saving ``pushdown=True`` offers, read off ``inspect``: none for the policy (its slice cuts the inner
    factor of a reshape, not the linear's columns), most of the work for a head returning the last logits."""
    action = policy.outputs[0]
    if action.pushdown:
        console.print(f"pushdown=True: {action.pushdown}, {action.flops_saved:.0%} of those ops' FLOPs saved")
    else:
        console.print("pushdown=True leaves the policy as it is: its slice cuts each row of view(-1, 8, 16), "
                      "not the linear's columns, so the one copy stays")
    logits = inspect(export_decode_step(batch=1, length=8)).outputs[0]
    console.print(f"pushdown=True on a head returning logits[:, -1, :] (examples.export_decode_step): "
                  f"{logits.pushdown}, {logits.flops_saved:.0%} of those ops' FLOPs saved, no copy")

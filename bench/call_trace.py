"""Which of strideguard's modules one ``densify_outputs`` passes through, and whether a call climbs the stages.

The package is laid out as the pipeline (``program``, ``compiler``, ``decide``,
``fix``, ``prove``, then the callers at the top). Imports already respect that
order (``tests/test_architecture.py``), but a callback can still carry control
from an earlier stage back into a later one at run time. This script traces one
call of ``densify_outputs`` on the quick start's robot policy with
``sys.setprofile`` and counts, for every Python call from one strideguard
module into another: the calls, the module pairs, the calls that climb (an
earlier stage calling into a later one), the calls into ``program.dialect``,
and the modules entered. It also follows which strideguard module is running
(the innermost strideguard frame, on every call and return): each unbroken
run of one module is a stay, and a stay in a module the call had already
left is a return to it. Beside the trace, the longest parameter lists in the
tree, read with ``ast``. ``--stage-map`` reads a module-to-stage map for an
older tree whose modules sat side by side; ``--source`` puts that tree first on
the path. Prints a table and writes ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ["program", "compiler", "decide", "fix", "prove", "callers"]


def stage_of(module: str, stage_map: dict[str, str]) -> str:
    """The stage a module under ``strideguard.`` belongs to: its first folder, or the callers at the top."""
    name = module.removeprefix("strideguard.")
    if name in stage_map:
        return stage_map[name]
    first = name.split(".")[0]
    return first if first in STAGES else "callers"


def trace(stage_map: dict[str, str]) -> dict:
    import strideguard
    from strideguard.examples import export_robot_policy

    program = export_robot_policy()
    calls: Counter = Counter()
    stays: list[str] = []

    def running(frame) -> str:
        """The innermost strideguard module on the stack at ``frame``."""
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name.startswith("strideguard."):
                return name
            frame = frame.f_back
        return ""

    def profile(frame, event, _arg):
        if event in ("return", "c_return", "c_exception"):
            module = running(frame.f_back if event == "return" else frame)
            if module and (not stays or stays[-1] != module):
                stays.append(module)
            return
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        module = running(frame)
        if module and (not stays or stays[-1] != module):
            stays.append(module)
        if callee.startswith("strideguard.") and caller.startswith("strideguard.") and callee != caller:
            calls[(caller, callee)] += 1

    sys.setprofile(profile)
    try:
        strideguard.densify_outputs(program)
    finally:
        sys.setprofile(None)

    rank = {stage: index for index, stage in enumerate(STAGES)}
    climbing = {
        f"{caller} -> {callee}": count for (caller, callee), count in calls.items()
        if rank[stage_of(caller, stage_map)] < rank[stage_of(callee, stage_map)]
    }
    entered = {callee for _, callee in calls} | {caller for caller, _ in calls}
    return {
        "stays": len(stays),
        "returns_to_a_module_left": len(stays) - len(set(stays)),
        "stays_by_module": dict(Counter(stays).most_common()),
        "calls_between_modules": sum(calls.values()),
        "module_pairs": len(calls),
        "modules_entered": len(entered),
        "calls_that_climb": sum(climbing.values()),
        "climbing": climbing,
        "calls_into_dialect": sum(count for (_, callee), count in calls.items() if callee.endswith(".dialect")),
        "pairs": {f"{caller} -> {callee}": count for (caller, callee), count in calls.most_common()},
    }


def longest_parameter_lists(source: Path, shown: int = 5) -> list[tuple[int, str]]:
    """The functions of ``source``'s ``strideguard`` with the most parameters (``self`` and ``cls`` not
    counted), read with ``ast``: the longest first."""
    import ast

    found = []
    for path in sorted((source / "strideguard").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
                names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
                count = len([name for name in names if name not in ("self", "cls")])
                found.append((count, f"{path.relative_to(source).as_posix()}:{node.name}"))
    return sorted(found, key=lambda item: -item[0])[:shown]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree whose strideguard is traced")
    parser.add_argument("--stage-map", type=Path, help="JSON: module name under strideguard -> stage")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "call_trace.json")
    args = parser.parse_args()
    sys.path.insert(0, str(args.source.resolve()))
    stage_map = json.loads(args.stage_map.read_text()) if args.stage_map else {}
    result = trace(stage_map)
    result["longest_parameter_lists"] = longest_parameter_lists(args.source.resolve())
    keys = ("stays", "returns_to_a_module_left", "calls_between_modules", "module_pairs", "modules_entered",
            "calls_that_climb", "calls_into_dialect")
    for key in keys:
        print(f"{key.replace('_', ' '):>22}: {result[key]}")
    for count, function in result["longest_parameter_lists"]:
        print(f"{'parameters':>22}: {count} {function}")
    for pair, count in result["climbing"].items():
        print(f"{'climbs':>22}: {pair} ({count})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

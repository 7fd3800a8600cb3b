"""The tree is the pipeline: each stage folder imports only the stages before it, and says so.

``strideguard/`` holds five stage folders, in the order a program goes through
them, and at its top the modules users call. Read off the source with ``ast``,
so a new import that breaks the layering fails here before it tangles the code;
each folder's ``__init__`` states what it may import, and this test holds it to
that statement.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "strideguard"

STAGES = ["program", "compiler", "decide", "fix", "prove"]
"""In pipeline order: what a program is, what the compiler will do to it, what strideguard decides, what it
does, how it proves it. A stage imports itself and the stages before it, never one after."""

CALLERS = {"__init__", "__main__", "api", "cli", "demo", "examples", "executorch", "files", "plot", "tables", "testing"}
"""Who calls it, at the top of the package: the API, the ExecuTorch integration, the command line, its
tables and its file reader (``files``), the plot, the demo and its examples, the test helpers for users."""

ENGINE = "fix.engine"
"""The one plan and its apply: outside ``fix``, the fix stage is reached only through its ``__all__``."""

BEHIND_THE_PLAN = ("fix.passes", "decide.pushdown", "program.view_values")
"""What the one plan holds and applies: a caller that reached one of them would plan or apply on its own,
beside the plan (the side doors ``pushed_down``, ``recomputation.Geometry`` once were)."""


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name under ``strideguard`` (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = module_files()


def imports_of(module: str) -> list[tuple[str, str]]:
    """What ``module`` imports from the package: (module, name) for each name of each ``from`` import, the
    module resolved from relative imports as Python resolves them."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            source = ".".join([*base, *([node.module] if node.module else [])])
        elif (node.module or "").split(".")[0] == "strideguard":
            source = node.module.removeprefix("strideguard").lstrip(".")
        else:
            continue
        for alias in node.names:
            whole = f"{source}.{alias.name}".strip(".")
            found.append((whole, "") if whole in MODULES else (source, alias.name))
    return found


def stage_of(module: str) -> str:
    first = module.split(".")[0]
    return first if first in STAGES else "callers"


def test_every_module_is_in_a_stage_or_calls_it():
    top = {module.split(".")[0] for module in MODULES}
    assert top - set(STAGES) == CALLERS, "a module at the top of strideguard/ that is not a caller: put it in its stage"
    assert all((PACKAGE / stage / "__init__.py").exists() for stage in STAGES)


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_only_the_stages_before_it(stage):
    allowed = set(STAGES[: STAGES.index(stage) + 1])
    wrong = sorted(
        f"{module} imports {source}"
        for module in MODULES if stage_of(module) == stage
        for source, _ in imports_of(module) if stage_of(source) not in allowed
    )
    assert not wrong, wrong


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_says_what_it_holds_and_what_it_may_import(stage):
    import importlib

    doc = importlib.import_module(f"strideguard.{stage}").__doc__ or ""
    stated = re.search(r"May import: ([^.]*)\.", doc)
    assert stated, f"strideguard/{stage}/__init__.py does not say what it may import ('May import: ...')"
    said = {word.strip() for word in stated.group(1).replace(" and ", ",").split(",") if word.strip()}
    before = set(STAGES[: STAGES.index(stage)])
    assert said == (before or {"torch only"}), f"{stage} says it may import {sorted(said)}; it may import {sorted(before)}"
    for module in (m for m in MODULES if m.startswith(f"{stage}.") and "." not in m.removeprefix(f"{stage}.")):
        assert module.split(".")[-1] in doc, f"strideguard/{stage}/__init__.py does not name {module}"


def test_outside_the_fix_stage_only_the_engines_public_surface_is_used():
    import strideguard.fix.engine as engine

    reached = sorted(
        f"{module} imports {source}{'.' + name if name else ''}"
        for module in MODULES if stage_of(module) != "fix"
        for source, name in imports_of(module)
        if stage_of(source) == "fix" and (source != ENGINE or name not in engine.__all__)
    )
    assert not reached, reached
    assert all(hasattr(engine, name) for name in engine.__all__)


def test_callers_never_reach_behind_the_plan():
    reached = sorted(
        f"{module} imports {source}"
        for module in MODULES if stage_of(module) == "callers"
        for source, _ in imports_of(module) if source.startswith(BEHIND_THE_PLAN)
    )
    assert not reached, reached


def test_the_engine_is_what_applies_passes():
    users = {module for module in MODULES for source, _ in imports_of(module) if source.startswith("fix.passes")}
    assert ENGINE in users
    assert users <= {ENGINE} | {m for m in MODULES if m.startswith("fix.passes")}, sorted(users)


COPIES = "program.copies"
"""Where the copy strideguard inserts is built and recognised: everything else asks it."""


def test_the_copy_is_built_and_recognised_in_one_place():
    """No other module spells the copy's tag: each recognises a copy through ``copy_form_of`` (and its
    neighbours), and only the fix stage builds one, through ``insert_copy``; so the copy cannot change in one
    place and not another."""
    import strideguard.program.copies as copies

    spelling = sorted(
        module for module, path in MODULES.items() if module != COPIES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == copies.COPY_TAG
    )
    assert not spelling, spelling
    builders = {"COPY_TAG", "insert_copy", "copy_form_for"}
    building = sorted(
        module for module in MODULES
        for source, name in imports_of(module) if source == COPIES and name in builders
    )
    assert building and all(stage_of(module) == "fix" for module in building), building


WINGS = ("compiler.predictor", "compiler.oracle")
"""The compiler stage's two wings: the predictor reads the graph alone, the oracle asks Inductor's lowering. A
wing that imported the other would mix a prediction into an answer (or an answer into a prediction)."""


def test_the_predictor_and_the_oracle_never_import_each_other():
    crossing = sorted(
        f"{module} imports {source}"
        for module in MODULES for wing in WINGS if module.startswith(wing)
        for source, _ in imports_of(module) for other in WINGS if other != wing and source.startswith(other)
    )
    assert not crossing, crossing
    assert all(any(module.startswith(wing + ".") for module in MODULES) for wing in WINGS)

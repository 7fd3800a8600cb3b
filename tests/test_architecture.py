"""Data flows one way: analysis never imports a transform, and integrations use the engine, not a pass's insides.

Read off the source with ``ast``, so a new import that breaks the layering
fails here before it tangles the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "strideguard"

ANALYSIS = ["analysis", "compiled_layout", "revisions", "replay", "view_conversion", "relayout", "pushdown", "inductor", "lowering", "layout", "dialect", "ops", "records", "fake_values", "program", "naming", "user_layouts"]
"""What is decided about a graph; the passes read it, never the other way round."""

INTEGRATIONS = ["executorch", "cuda_graphs", "verification", "cli", "tables", "plot", "demo", "api"]
"""What users call: they reach the passes only through ``rewrite`` (one plan, one apply)."""


def sources(module: str) -> list[Path]:
    """A module's file, or every file of a package."""
    package = PACKAGE / module
    return sorted(package.glob("*.py")) if package.is_dir() else [PACKAGE / f"{module}.py"]


def imported_modules(module: str) -> set[str]:
    found = set()
    for node in (node for path in sources(module) for node in ast.walk(ast.parse(path.read_text()))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = (node.module or "").split(".")
            found.add(".".join(base))
            found.update(f"{'.'.join(base)}.{alias.name}".strip(".") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("strideguard"):
            found.add(node.module.removeprefix("strideguard."))
    return found


@pytest.mark.parametrize("module", ANALYSIS)
def test_analysis_never_imports_a_pass(module):
    assert not any(name.startswith("passes") for name in imported_modules(module)), imported_modules(module)


@pytest.mark.parametrize("module", INTEGRATIONS)
def test_integrations_reach_passes_only_through_the_engine(module):
    assert not any(name.startswith("passes") for name in imported_modules(module)), imported_modules(module)


def test_the_engine_is_what_applies_passes():
    assert any(name.startswith("passes") for name in imported_modules("rewrite"))


ENGINE_PARTS = ("passes", "replay", "pushdown")
"""What the one plan holds and applies: an integration that reached one of them would plan or apply on
its own, beside the plan (the side doors ``pushed_down``, ``replay.Geometry`` once were)."""


def names_imported_from(module: str, source: str) -> set[str]:
    return {
        alias.name
        for path in sources(module)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level and (node.module or "") == source
        for alias in node.names
    }


@pytest.mark.parametrize("module", INTEGRATIONS)
def test_integrations_use_the_engine_only_through_its_public_surface(module):
    import strideguard.rewrite

    reached = sorted(name for name in imported_modules(module) if name.split(".")[0] in ENGINE_PARTS)
    assert not reached, f"{module} reaches into the engine's parts: {reached}"
    private = names_imported_from(module, "rewrite") - set(strideguard.rewrite.__all__)
    assert not private, f"{module} imports from rewrite what its __all__ does not offer: {sorted(private)}"


def test_the_public_surface_of_the_engine_exists():
    import strideguard.rewrite

    assert all(hasattr(strideguard.rewrite, name) for name in strideguard.rewrite.__all__)

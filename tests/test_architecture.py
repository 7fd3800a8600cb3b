"""Data flows one way: analysis never imports a transform, and integrations use the engine, not a pass's insides.

Read off the source with ``ast``, so a new import that breaks the layering
fails here before it tangles the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "strideguard"

ANALYSIS = ["analysis", "replay", "plan", "pushdown", "inductor", "lowering", "layout", "dialect", "ops", "records", "fake_values", "program"]
"""What is decided about a graph; the passes read it, never the other way round."""

INTEGRATIONS = ["executorch", "cuda_graphs", "verification", "cli", "plot", "demo", "api"]
"""What users call: they reach the passes only through ``rewrite`` (one plan, one apply)."""


def imported_modules(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
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

"""The docs name only what exists: every ``strideguard.…`` path written in README.md and docs/ resolves."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
DOCS = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
DOTTED = re.compile(r"`(strideguard(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
NEEDS_EXECUTORCH = ("strideguard.executorch", "strideguard.testing.executorch_cpu")


def _paths() -> list[str]:
    return sorted({m.group(1) for doc in DOCS for m in DOTTED.finditer(doc.read_text())})


def resolve(path: str) -> object:
    """Import every module prefix of ``path`` that is one, then read the path through the package as a user
    would (``strideguard.verify`` is what the package binds, not a module)."""
    parts = path.split(".")
    for cut in range(2, len(parts) + 1):
        try:
            importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            break
    value = importlib.import_module(parts[0])
    for part in parts[1:]:
        value = getattr(value, part)
    return value


def test_the_docs_name_paths():
    assert len(_paths()) >= 20


@pytest.mark.parametrize("path", _paths())
def test_each_path_the_docs_name_exists(path):
    if path.startswith(NEEDS_EXECUTORCH):
        pytest.importorskip("executorch")
    resolve(path)

"""The docs name only what exists, and name what users meet.

Every ``strideguard.…`` path written in README.md and docs/ resolves; every
public name of the package is documented in docs/api.md; every command of the
command line in docs/command-line.md; every folder and module of the tree in
the table of stages of docs/architecture.md.
"""

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


def test_every_public_name_is_documented_in_the_api_reference():
    import strideguard

    api = (REPOSITORY / "docs" / "api.md").read_text()
    missing = [name for name in strideguard.__all__ if name != "__version__" and not re.search(rf"`(strideguard\.)?{name}\b", api)]
    assert not missing, f"docs/api.md does not document {missing}"


def test_every_command_is_documented_in_the_command_line_reference():
    import strideguard.cli

    reference = (REPOSITORY / "docs" / "command-line.md").read_text()
    commands = [command.name or command.callback.__name__ for command in strideguard.cli.app.registered_commands]
    assert len(commands) >= 5
    missing = [name for name in commands if f"`strideguard {name}" not in reference]
    assert not missing, f"docs/command-line.md does not document the commands {missing}"


def test_the_architecture_doc_names_every_folder_and_module_of_the_tree():
    architecture = (REPOSITORY / "docs" / "architecture.md").read_text()
    table = architecture[architecture.index("| folder | stage |"):]
    table = table[: table.index("\n\n")]
    package = REPOSITORY / "strideguard"
    for folder in sorted(path for path in package.iterdir() if (path / "__init__.py").exists() and path.name != "testing"):
        assert f"`{folder.name}/`" in table, f"docs/architecture.md's table of stages does not name {folder.name}/"
        for module in sorted(folder.glob("*.py")):
            if module.name != "__init__.py":
                assert f"`{module.name}`" in table, f"docs/architecture.md's table of stages does not name {folder.name}/{module.name}"
        for subpackage in sorted(path for path in folder.iterdir() if (path / "__init__.py").exists()):
            assert f"`{subpackage.name}/`" in table, f"docs/architecture.md's table of stages does not name {folder.name}/{subpackage.name}/"
            for module in sorted(subpackage.glob("*.py")):
                if module.name != "__init__.py":
                    where = f"{folder.name}/{subpackage.name}/{module.name}"
                    assert f"`{module.name}`" in table, f"docs/architecture.md's table of stages does not name {where}"
    for module in sorted(package.glob("*.py")):
        if not module.name.startswith("__"):
            assert f"`{module.name}`" in table, f"docs/architecture.md's table of stages does not name {module.name}"


@pytest.mark.parametrize("path", _paths())
def test_each_path_the_docs_name_exists(path):
    if path.startswith(NEEDS_EXECUTORCH):
        pytest.importorskip("executorch")
    resolve(path)

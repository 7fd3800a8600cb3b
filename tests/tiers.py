"""The test tiers, and the watch that keeps every test in its tier.

``compiles``: the test (or a fixture it uses) builds a program with
AOTInductor. ``lowers``: it runs Inductor's lowering and stops before code
generation (``strideguard.compiler.oracle.lowering``). ``commands``: it starts Python child
processes (the command line as users run it), each paying torch's import,
some seconds. ``long``: it replays whole fuzz batches. ``make check``
deselects all four and stays under two minutes.

Compiling and lowering both enter Inductor through ``compile_fx_aot``, and a
child process starts through ``subprocess.Popen``: the watch wraps both once
per run and attributes each call to the test being set up or run, so a test
outside its tier fails, naming the marker it needs. What a child process
does is not seen: a test whose child compiles or lowers carries those
markers by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable

import pytest

TIERS = ("compiles", "lowers", "commands", "long")

_FIXTURE_TIERS: dict[str, tuple[str, ...]] = {}
_used: set[str] = set()


def needs(*tiers: str) -> Callable:
    """Declare that a fixture compiles or lowers (here or in a child process): every test using it, directly
    or not, gets the markers. Put it under ``@pytest.fixture``."""
    assert tiers and set(tiers) <= set(TIERS), tiers

    def declare(function: Callable) -> Callable:
        known = _FIXTURE_TIERS.setdefault(function.__name__, tiers)
        assert known == tiers, f"fixture {function.__name__} declared {known} and {tiers}"
        return function

    return declare


def mark_by_fixtures(items: list) -> None:
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            for tier in _FIXTURE_TIERS.get(name, ()):
                if not item.get_closest_marker(tier):
                    item.add_marker(getattr(pytest.mark, tier))


def watch() -> None:
    """Wrap Inductor's one entry for AOT compiles; a lowering is a compile stopped by strideguard's hook."""
    import torch
    from torch._inductor import compile_fx

    from strideguard.compiler.oracle import lowering

    original = compile_fx.compile_fx_aot
    if getattr(original, "_strideguard_watch", False):
        return

    def watched(*args, **kwargs):
        patches = kwargs.get("config_patches") or (args[3] if len(args) > 3 else None) or {}
        _used.add("lowers" if patches.get(lowering._HOOK) is not None else "compiles")
        return original(*args, **kwargs)

    watched._strideguard_watch = True
    compile_fx.compile_fx_aot = watched

    starting = subprocess.Popen.__init__

    torch_folder = os.path.dirname(torch.__file__)

    def started(self, args, *rest, **kwargs):
        program = args[0] if isinstance(args, (list, tuple)) and args else args
        # Python children torch starts itself (Inductor probing the CPU, its compile workers) are part of
        # compiling, not of this tier.
        if isinstance(program, (str, os.PathLike)) and os.path.basename(os.fspath(program)).startswith("python"):
            if not _started_by(torch_folder):
                _used.add("commands")
        starting(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = started


def _started_by(folder: str) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(folder):
            return True
        frame = frame.f_back
    return False


def begin() -> None:
    _used.clear()


def require_marks(item) -> None:
    """Fail a test that passed but compiled or lowered outside its tier (setup included)."""
    missing = sorted(tier for tier in _used if not item.get_closest_marker(tier))
    survey = os.environ.get("STRIDEGUARD_TIERS_SURVEY")
    if survey:
        # A survey run lists what each test used instead of failing: the way to mark a new suite at once.
        with open(survey, "a") as out:
            out.write(f"{item.nodeid}\t{','.join(sorted(_used))}\t{','.join(missing)}\n")
        return
    if missing:
        pytest.fail(
            f"{item.nodeid} {' and '.join(missing)} but is not marked: add "
            + ", ".join(f"@pytest.mark.{tier}" for tier in missing)
            + " (or tiers.needs on the fixture that does)",
            pytrace=False,
        )

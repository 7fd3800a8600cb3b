"""Shared, session-scoped compiled programs (each AOTInductor compile happens once per run), and the test tiers.

Tiers are markers: ``compiles`` (builds a program with AOTInductor),
``lowers`` (runs Inductor's lowering, ``strideguard.compiler.oracle.lowering``, without
building) and ``long`` (replays whole fuzz batches; ``make test-long``).
``make check`` runs what is in none of them. A test that compiles or lowers
in this process, its fixtures included, without its tier's marker fails
(``tiers.watch``), so that ``make check`` stays fast by construction.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import settings

import strideguard
from strideguard.prove.verification import compile_program

from . import programs, tiers

settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")
"""``make check`` and ``make test`` draw the same property-test examples every run (a failure found once is
found again); ``make fuzz`` sets its own settings and searches afresh."""

HAS_EXECUTORCH = importlib.util.find_spec("executorch") is not None
needs_executorch = pytest.mark.skipif(not HAS_EXECUTORCH, reason="needs ExecuTorch: pip install '.[executorch]'")
"""Marks a test of the ExecuTorch path; the ATen path is tested without ExecuTorch installed (a plain
AOTInductor user's setup)."""


@dataclass
class Compiled:
    program: Any
    run: Any
    """The loaded AOTInductor package: call it like the module."""


@pytest.fixture(scope="session")
def compile_dir():
    with tempfile.TemporaryDirectory(prefix="strideguard-tests-") as directory:
        yield directory


def _compile(program, directory, name) -> Compiled:
    return Compiled(program, compile_program(program, os.path.join(directory, name)))


@pytest.fixture(scope="session")
def every_output():
    return programs.export_every_output()


@pytest.fixture(scope="session")
@tiers.needs("compiles")
def every_output_compiled(every_output, compile_dir):
    return _compile(every_output, compile_dir, "every-output")


@pytest.fixture(scope="session")
def every_output_fixed(every_output):
    return strideguard.densify_outputs(every_output)


@pytest.fixture(scope="session")
@tiers.needs("compiles")
def every_output_fixed_compiled(every_output_fixed, compile_dir):
    return _compile(every_output_fixed, compile_dir, "every-output-fixed")


@pytest.fixture(scope="session")
@tiers.needs("compiles")
def every_output_unaliased_compiled(every_output, compile_dir):
    return _compile(strideguard.densify_outputs(every_output, break_aliases=True), compile_dir, "every-output-unaliased")


def run_compiled(compiled: Compiled, inputs) -> list:
    with torch.no_grad():
        return torch.utils._pytree.tree_leaves(compiled.run(*inputs), is_leaf=lambda x: x is None)


def run_eager(program, inputs) -> list:
    with torch.no_grad():
        return torch.utils._pytree.tree_leaves(program.module()(*inputs), is_leaf=lambda x: x is None)


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-minutes",
        type=float,
        default=0.0,
        help="run tests/test_generated.py for this many minutes of random programs (0: the bounded, repeatable CI run)",
    )
    parser.addoption(
        "--fuzz-seed",
        type=int,
        default=None,
        help="the seed of a --fuzz-minutes run, as its first and last lines print it (default: a fresh one)",
    )


def pytest_configure(config):
    tiers.watch()


SPREAD_FILES = ("test_zoo.py", "test_generated_regressions.py")
"""Files whose tests share nothing costly across parameters: each zoo model on each path (its CPU, CUDA and
pushdown judgements one after another on one worker, sharing its programs: ``zoo.program_of``), each kept
failure on its own."""


GROUPS = {
    "test_bounded.py": {
        "test_every_verb_on_a_hostile_name_ends_within_budget": "names",
        "test_nothing_is_left_in_the_temporary_folder_by_hostile_names": "names",
        "test_names_from_files_and_arguments_print_as_themselves": "names",
        "test_outputs_sharing_one_memory_cost_linear_time_and_report_size": "sharing",
    },
    "test_generated.py": {"test_pushdown_keeps_the_contract_on_generated_programs": "pushdown"},
}
"""Tests that share no costly fixture with the rest of their file (the rest shares its module fixture, or
the generated CI set), by test function: each group goes to whichever worker is free, so that the two longest
files do not hold one worker each to the end."""


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, except for ``GROUPS``, and that the tests of ``SPREAD_FILES`` go by parameter (``[edge-unet]``: every
    test of it) to whichever worker is free: every other file's tests stay together on one worker, so that its module and session fixtures
    (compiled programs) are built once, and the zoo's models fill both workers to the end. (xdist's own
    ``loadgroup`` would say the same with markers, but its renamed node ids are not read by this pytest.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFileSpreadingTheZoo(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            file = path.rsplit("/", 1)[-1]
            function = nodeid.partition("::")[2].partition("[")[0]
            group = GROUPS.get(file, {}).get(function)
            if group is not None:
                return f"{path}::{group}"
            if file not in SPREAD_FILES:
                return path
            return path + "[" + nodeid.partition("[")[2] if "[" in nodeid else nodeid

    return ByFileSpreadingTheZoo(config, log)


def pytest_collection_modifyitems(config, items):
    tiers.mark_by_fixtures(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    tiers.begin()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    tiers.require_marks(item)
    return result

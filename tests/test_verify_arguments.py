"""What ``verify`` and every other verb are given is checked before anything runs (issue 45, round four,
findings 7 and 9).

* Every numeric option of every verb is a finite number in its range: ``verify --memory inf`` printed a
  traceback and exited 1 with no JSON, and ``nan`` passed click's ``min=`` (every comparison with ``nan``
  is false). Found by reading the verbs' own signatures, so that an option added later is checked too.
* A reference (``verify --reference``, ``strideguard.verify(reference=...)``) takes the program's inputs
  and returns its outputs: one exported at another input size read past the input's memory when run (a
  crash in the child, blamed on the program; in-process, of the caller), and one whose outputs differed
  in shape or dtype was reported equal (``reference_error`` 0).

Nothing here compiles: each refusal comes before any compile, which the time each takes shows.
"""

from __future__ import annotations

import json
import pathlib
import time
import typing

import pytest
import torch
import typer.main

import strideguard
from strideguard import cli
from strideguard.prove.verification import reference_difference

from .test_cli import command_server  # noqa: F401 - the module's one command server, as test_cli's
from .test_cli import strideguard as run_command

REFUSED_AT_ONCE = 60.0
"""Seconds within which a refusal comes: a command server's fork and the loading of a small file, where a
compile of the program would take 10 to 30 s on top and running it under the limit as long as it says."""


def strideguard_command(*args) -> tuple[object, float]:
    started = time.monotonic()
    result = run_command(*args)
    return result, time.monotonic() - started


class Head(torch.nn.Module):
    def __init__(self, keep: int = 3, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.keep, self.dtype = keep, dtype

    def forward(self, x):
        return (x * 2)[:, : self.keep].to(self.dtype)


class Named(torch.nn.Module):
    def __init__(self, *names: str):
        super().__init__()
        self.names = names

    def forward(self, x):
        return {name: x[:, :3] * (i + 1) for i, name in enumerate(self.names)}


def batch(low: int = 2, high: int = 64):
    return {0: torch.export.Dim("batch", min=low, max=high)}


def export(module: torch.nn.Module, x: torch.Tensor, dynamic: dict | None = None) -> torch.export.ExportedProgram:
    return torch.export.export(module, (x,), dynamic_shapes=(dynamic,) if dynamic else None)


PROGRAM = lambda: export(Head(), torch.randn(4, 8))  # noqa: E731
DYNAMIC = lambda: export(Head(), torch.randn(4, 8), batch())  # noqa: E731

MISMATCHES = {
    # name: (program, reference, what the one line must say)
    "another-input-size": (PROGRAM, lambda: export(Head(), torch.randn(2, 8)), "input x is a float32 tensor [2, 8] in the reference and a float32 tensor [4, 8] in the program"),
    "another-input-dtype": (PROGRAM, lambda: export(Head(), torch.randn(4, 8, dtype=torch.float64)), "input x is a float64 tensor [4, 8] in the reference"),
    "static-against-dynamic": (DYNAMIC, PROGRAM, "input x is a float32 tensor [4, 8] in the reference and a float32 tensor [s"),
    "another-range": (DYNAMIC, lambda: export(Head(), torch.randn(4, 8), batch(2, 1024)), "from 2 to 1024) in the reference"),
    "more-inputs": (PROGRAM, lambda: torch.export.export(torch.nn.Bilinear(8, 8, 3), (torch.randn(4, 8), torch.randn(4, 8))), "the reference takes 2 inputs"),
    "another-output-shape": (PROGRAM, lambda: export(Head(keep=4), torch.randn(4, 8)), "output 0 (output) is a float32 tensor [4, 4] in the reference and a float32 tensor [4, 3] in the program"),
    "another-output-dtype": (PROGRAM, lambda: export(Head(dtype=torch.float64), torch.randn(4, 8)), "output 0 (output) is a float64 tensor [4, 3] in the reference"),
    "more-outputs": (lambda: export(Named("a"), torch.randn(4, 8)), lambda: export(Named("a", "b"), torch.randn(4, 8)), "the reference returns 2 outputs (a, b) and the program 1 output (a)"),
    "other-output-names": (lambda: export(Named("a"), torch.randn(4, 8)), lambda: export(Named("b"), torch.randn(4, 8)), "the reference returns 1 output (b) and the program 1 output (a)"),
}
"""Each reference that is not one for its program, and the difference that names why."""


@pytest.mark.parametrize("name", MISMATCHES)
def test_a_reference_that_takes_or_returns_otherwise_is_refused_from_python(name):
    make_program, make_reference, says = MISMATCHES[name]
    program, reference = make_program(), make_reference()
    assert says in reference_difference(program, reference)
    for limits in ({}, {"timeout": 60.0}):  # in this process, and in the child the limits start
        started = time.monotonic()
        with pytest.raises(ValueError, match="reference= is not this program's reference") as refused:
            strideguard.verify(program, reference=reference, **limits)
        assert says in str(refused.value) and "\n" not in str(refused.value)
        assert time.monotonic() - started < 5, "refused before anything was compiled or run"


def test_a_true_reference_is_accepted():
    """The fixed program against its original (what ``fix`` then ``verify --reference`` compares), a program
    against itself, and against the same module exported again."""
    program = DYNAMIC()
    assert reference_difference(strideguard.densify_outputs(program), program) is None
    assert reference_difference(program, program) is None
    assert reference_difference(program, DYNAMIC()) is None
    assert reference_difference(PROGRAM(), PROGRAM()) is None


class Pair(torch.nn.Module):
    def forward(self, x, y):
        return x * 2, y * 3


def test_two_sizes_that_are_one_in_the_program_must_be_one_in_the_reference():
    """``x`` and ``y`` of one batch against two batches over the same range: alike one by one, not together
    (the reference could be given a ``y`` the program may not)."""
    args = (torch.randn(4, 8), torch.randn(4, 8))
    one = torch.export.Dim("batch", min=2, max=64)
    shared = torch.export.export(Pair(), args, dynamic_shapes=({0: one}, {0: one}))
    separate = torch.export.export(Pair(), args, dynamic_shapes=({0: one}, {0: torch.export.Dim("other", min=2, max=64)}))
    assert reference_difference(shared, shared) is None and reference_difference(separate, separate) is None
    assert reference_difference(shared, separate).startswith("input y is a float32 tensor [s")
    assert reference_difference(separate, shared).startswith("input y is a float32 tensor [s")


# --- the command line --------------------------------------------------------------------------------------


def numeric_options() -> list[tuple[str, str]]:
    """(verb, option) for every option of every verb whose value is a number, read off the verbs' signatures."""
    commands = typer.main.get_command(cli.app).commands
    found = []
    for registered in cli.app.registered_commands:
        verb = registered.name or registered.callback.__name__.removesuffix("_command")
        hints = typing.get_type_hints(registered.callback, include_extras=True)
        for parameter in commands[verb].params:
            hint = hints[parameter.name]
            base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
            kinds = set(typing.get_args(base)) or {base}
            if kinds & {int, float}:
                found.append((verb, max(parameter.opts, key=len)))
    return found


NUMERIC_OPTIONS = numeric_options()
BAD_NUMBERS = ["inf", "-inf", "nan", "1e999", "-1", "0", "0.0001"]
"""Infinite (``1e999`` reads as one), not a number, negative, zero, and below the smallest limit (a
millisecond, a mebibyte)."""


def test_the_verbs_numeric_options_are_found():
    assert ("verify", "--timeout") in NUMERIC_OPTIONS and ("verify", "--memory") in NUMERIC_OPTIONS


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, pathlib.Path]:
    folder = tmp_path_factory.mktemp("references")
    files = {}
    for name, (make_program, make_reference, _) in MISMATCHES.items():
        files[name] = folder / f"{name}.pt2", folder / f"{name}.reference.pt2"
        torch.export.save(make_program(), files[name][0])
        torch.export.save(make_reference(), files[name][1])
    return files


def verb_arguments(verb: str, program: pathlib.Path) -> list[str]:
    """The least each verb needs besides its numeric options."""
    return [str(program), "-o", str(program.with_name("out.pt2"))] if verb in ("fix", "compile") else [str(program)]


@pytest.mark.commands
@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("verb, option", NUMERIC_OPTIONS)
def test_every_numeric_option_is_checked_before_anything_runs(saved, verb, option, json_output):
    program = saved["another-input-size"][0]
    for value in BAD_NUMBERS:
        arguments = [verb, *verb_arguments(verb, program), f"{option}={value}", *(["--json"] if json_output else [])]
        result, seconds = strideguard_command(*arguments)
        assert result.returncode == 2, (arguments, result.stderr)
        [line] = result.stderr.splitlines()
        assert line.startswith("strideguard: error: ") and option in line and f" {value if value != '1e999' else 'inf'} " in line, line
        assert "Traceback" not in result.stderr
        assert seconds < REFUSED_AT_ONCE
        if json_output:
            assert json.loads(result.stdout) == {"ok": False, "error": line.removeprefix("strideguard: error: ")}
        else:
            assert result.stdout == ""
    assert not program.with_name("out.pt2").exists()


@pytest.mark.commands
@pytest.mark.parametrize("name", MISMATCHES)
def test_verify_refuses_a_reference_that_takes_or_returns_otherwise(saved, name):
    program, reference = saved[name]
    says = MISMATCHES[name][2]
    for json_output in (False, True):
        result, seconds = strideguard_command("verify", program, "--reference", reference, *(["--json"] if json_output else []))
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith(f"strideguard: error: {reference}: not a reference for {program}: ") and says in line, line
        assert seconds < REFUSED_AT_ONCE, "refused before anything was compiled or run"
        if json_output:
            assert json.loads(result.stdout) == {"ok": False, "error": line.removeprefix("strideguard: error: ")}


def test_the_library_takes_only_finite_positive_limits():
    """``verify(timeout=inf)`` ran with no limit at all; each is refused before anything runs."""
    program = PROGRAM()
    refused = [{"timeout": float("inf")}, {"timeout": float("nan")}, {"timeout": 0.0}, {"timeout": -1.0}, {"memory": 0}, {"memory": -1}]
    for limits in refused:
        started = time.monotonic()
        with pytest.raises(ValueError, match="limit must be a positive number"):
            strideguard.verify(program, **limits)
        assert time.monotonic() - started < 5

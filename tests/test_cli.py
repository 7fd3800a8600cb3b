"""The command line, driven as users drive it: each command a process of its own (``tests/commands.py``: forked
from one that imported the command line once; ``test_version_usage_and_flags_read_as_documented`` starts
``python -m strideguard`` itself).

Programs are exported here and saved with ``torch.export.save``; broken files
are made from them by editing the archive (the hostile ones, and the write
races and failures of ``fix``, are in ``test_loading_safety.py`` and
``test_output_safety.py``). Only ``test_verify_proves_the_fixed_program``
compiles (AOTInductor); everything else runs ``inspect`` and ``fix``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import zipfile
from typing import Callable, Optional

import pytest
import torch

from strideguard.examples import export_decode_step, export_policy, export_robot_policy

from .commands import CommandServer

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


SERVER: list[CommandServer] = []


@pytest.fixture(scope="module", autouse=True)
def command_server():
    """One server for the module's commands, started on first use (``make check`` runs none)."""
    yield
    for server in SERVER:
        server.close()
    SERVER.clear()


def strideguard(*args: str | os.PathLike, cwd: Optional[os.PathLike] = None) -> subprocess.CompletedProcess:
    if not SERVER:
        SERVER.append(CommandServer())
    return SERVER[0].run(*args, cwd=cwd)


def python_m_strideguard(*args: str | os.PathLike, **options) -> subprocess.CompletedProcess:
    """The command exactly as a user types it: a fresh interpreter, ``-m``."""
    return subprocess.run([sys.executable, "-m", "strideguard", *map(str, args)], capture_output=True, text=True,
                          timeout=300, **options)


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_archive(
    source: pathlib.Path,
    target: pathlib.Path,
    edit: Callable[[str, bytes], bytes] = lambda member, data: data,
    extra: dict[str, bytes] = {},
) -> pathlib.Path:
    """``source`` rewritten member by member (names without the archive's root folder), plus ``extra`` members."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        root = original.namelist()[0].split("/")[0]
        for info in original.infolist():
            copy.writestr(info, edit(info.filename.split("/", 1)[1], original.read(info)))
        for member, data in extra.items():
            copy.writestr(f"{root}/{member}", data)
    return target


def edit_program(source: pathlib.Path, target: pathlib.Path, change: Callable[[dict], None]) -> pathlib.Path:
    def edit(member: str, data: bytes) -> bytes:
        if member != "models/model.json":
            return data
        program = json.loads(data)
        change(program)
        return json.dumps(program).encode()

    return copy_archive(source, target, edit)


class Aliasing(torch.nn.Module):
    """Returns an input, a slice of it, and one intermediate twice."""

    def forward(self, x):
        y = x * 2
        return x, x[:, :2], y, y


class Dynamic(torch.nn.Module):
    def forward(self, x):
        return (x * 2)[:, :3]


@torch.library.custom_op("strideguard_test::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@scale.register_fake
def _(x):
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def forward(self, x):
        return scale(x)


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("programs")
    torch.export.save(export_policy(batch=1), folder / "policy.pt2")
    torch.export.save(torch.export.export(Aliasing(), (torch.randn(4, 3),)), folder / "aliasing.pt2")
    batch = torch.export.Dim("batch", min=2, max=64)
    dynamic = torch.export.export(Dynamic(), (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(dynamic, folder / "dynamic.pt2")
    torch.export.save(torch.export.export(UsesCustomOp(), (torch.randn(4),)), folder / "custom_op.pt2")
    torch.export.save(export_decode_step(batch=1, length=8), folder / "decode.pt2")
    torch.export.save(export_robot_policy(batch=2), folder / "robot.pt2")
    return folder


@pytest.mark.commands
def test_inspect_shows_the_strided_output_and_exits_1(programs):
    result = strideguard("inspect", programs / "policy.pt2")
    assert result.returncode == 1, result.stderr
    assert "output" in result.stdout and "[128, 16, 1]" in result.stdout
    assert "slice(dim=2, 0:14)" in result.stdout
    assert "1 user output: 0 in layout, 1 out of layout; fix copies it" in result.stdout


@pytest.mark.commands
def test_inspect_json_and_plot(programs, tmp_path):
    picture = tmp_path / "layout"  # written under exactly this name, no extension added
    result = strideguard("inspect", programs / "policy.pt2", "--json", "--plot", picture)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    [output] = report["outputs"]
    for field in ("index", "name", "shape", "dtype", "strides", "dense", "contiguous", "aliases", "cause", "action"):
        assert field in output
    assert output["shape"] == [1, 8, 14] and output["strides"] == [128, 16, 1]
    assert output["dense"] is False and output["contiguous"] is False
    assert output["action"] == "copy" and output["aliases"] == []
    assert picture.read_bytes().startswith(PNG_SIGNATURE)
    assert [path.name for path in tmp_path.iterdir()] == ["layout"]


@pytest.mark.lowers
@pytest.mark.commands
def test_inspect_exact_asks_inductor_what_the_graph_leaves_open(programs):
    """``(x * 2)[:, :3]``: from the graph alone, Inductor may fuse the slice into the product and write it
    afresh, so the fast report leaves it undecided; ``--exact`` runs the lowering and decides it."""
    fast = json.loads(strideguard("inspect", programs / "dynamic.pt2", "--json").stdout)
    exact = json.loads(strideguard("inspect", programs / "dynamic.pt2", "--json", "--exact").stdout)
    assert fast["source"] == "analysis" and exact["source"] == "lowering"
    [undecided], [decided] = fast["outputs"], exact["outputs"]
    assert undecided["in_target_layout"] is None and undecided["action"] == "copy"
    assert undecided["reason"] == "inductor-decides" and "--exact on the command line" in undecided["explanation"]
    assert undecided["verdict"] == "Inductor decides"
    assert decided["in_target_layout"] is False and decided["strides"] == [8, 1]
    assert decided["reason"] == "strided" and "Inductor's lowering returns strides [8, 1]" in decided["explanation"]


@pytest.mark.commands
def test_plot_never_replaces_the_input(programs, tmp_path):
    source = tmp_path / "weights.png"
    source.write_bytes((programs / "policy.pt2").read_bytes())
    before = digest(source)
    result = strideguard("inspect", source, "--plot", source, "--force")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"strideguard: error: {source}: is the input file; strideguard never overwrites its input"]
    assert digest(source) == before


@pytest.mark.commands
def test_fix_writes_a_program_that_inspects_ok_and_leaves_the_input_alone(programs, tmp_path):
    source = programs / "policy.pt2"
    before = digest(source)
    fixed = tmp_path / "fixed.pt2"
    result = strideguard("fix", source, "-o", fixed)
    assert result.returncode == 0, result.stderr
    assert digest(source) == before
    assert [p.name for p in tmp_path.iterdir()] == ["fixed.pt2"], "no temporary file is left behind"
    inspected = strideguard("inspect", fixed, "--json")
    assert inspected.returncode == 0, inspected.stderr
    report = json.loads(inspected.stdout)
    assert report["ok"] is True
    assert report["outputs"][0]["strides"] == [112, 14, 1]


@pytest.mark.commands
def test_fix_refuses_an_existing_output_without_force(programs, tmp_path):
    output = tmp_path / "taken.pt2"
    output.write_bytes(b"someone's file")
    refused = strideguard("fix", programs / "policy.pt2", "-o", output)
    assert refused.returncode == 2
    assert output.read_bytes() == b"someone's file"
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]
    assert "--force" in refused.stderr
    forced = strideguard("fix", programs / "policy.pt2", "-o", output, "--force")
    assert forced.returncode == 0, forced.stderr
    assert output.read_bytes().startswith(b"PK")


@pytest.mark.commands
def test_fix_never_overwrites_its_input(programs, tmp_path):
    source = tmp_path / "policy.pt2"
    source.write_bytes((programs / "policy.pt2").read_bytes())
    before = digest(source)
    result = strideguard("fix", source, "-o", source, "--force")
    assert result.returncode == 2
    assert "input" in result.stderr
    assert digest(source) == before


@pytest.mark.commands
def test_fix_for_executorch_breaking_aliases(programs, tmp_path):
    fixed = tmp_path / "fixed.pt2"
    result = strideguard("fix", programs / "aliasing.pt2", "-o", fixed, "--for", "executorch", "--break-aliases")
    assert result.returncode == 0, result.stderr
    report = json.loads(strideguard("inspect", fixed, "--json").stdout)
    assert report["ok"] is True
    assert all(output["aliases"] == [] for output in report["outputs"])


@pytest.mark.commands
def test_loading_restores_what_views_alias(programs):
    """A saved program loses which tensors share memory; the loader gives it back."""
    report = json.loads(strideguard("inspect", programs / "aliasing.pt2", "--json").stdout)
    aliases = [output["aliases"] for output in report["outputs"]]
    assert aliases == [["input x", "output 1"], ["input x", "output 0"], ["output 3"], ["output 2"]]
    assert report["outputs"][1]["cause"] == "slice(dim=1, 0:2) of input x"


def make_not_a_zip(programs, folder):
    path = folder / "notes.pt2"
    path.write_text("not a zip archive")
    return path


def make_other_zip(programs, folder):
    path = folder / "other.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    return path


def make_newer_schema(programs, folder):
    def change(program):
        program["schema_version"]["major"] += 1
        program["torch_version"] = "9.0.0"

    return edit_program(programs / "policy.pt2", folder / "newer.pt2", change)


def make_newer_archive(programs, folder):
    return copy_archive(
        programs / "policy.pt2",
        folder / "newer_archive.pt2",
        lambda member, data: b"1" if member == "archive_version" else data,
    )


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda programs, folder: folder / "missing.pt2", "no such file"),
        (lambda programs, folder: folder, "is a directory"),
        (make_not_a_zip, "is not a zip archive"),
        (make_other_zip, "not an exported program"),
        (make_newer_schema, "incompatible torch (9.0.0"),
        (make_newer_archive, "incompatible torch"),
        (lambda programs, folder: programs / "custom_op.pt2", "custom operator strideguard_test::scale"),
    ],
    ids=["missing", "directory", "not-a-zip", "other-zip", "newer-schema", "newer-archive", "custom-op"],
)
@pytest.mark.commands
def test_bad_input_is_one_line_and_exit_2(programs, tmp_path, make, says):
    path = make(programs, tmp_path)
    result = strideguard("inspect", path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert str(path) in lines[0] and says in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize(
    "arguments, says",
    [
        (["fix", "{policy}"], "Missing option '-o' / '--output'"),
        (["fix", "{policy}", "-o", "out.pt2", "--for", "tensorrt"], "'tensorrt' is not one of 'aoti', 'executorch'"),
        (["fix", "{policy}", "-o", "out/"], "ends with a '/'"),
        (["inspect"], "Missing argument"),
        (["explode"], "No such command 'explode'"),
    ],
    ids=["fix-without-output", "unknown-target", "output-folder", "inspect-without-file", "unknown-command"],
)
@pytest.mark.commands
def test_usage_errors_are_one_line_and_exit_2(programs, tmp_path, arguments, says):
    result = strideguard(*(a.format(policy=programs / "policy.pt2") for a in arguments), cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("strideguard: error: ") and says in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.commands
def test_errors_with_json_are_also_json_on_stdout(tmp_path):
    result = strideguard("inspect", "--json", cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert json.loads(result.stdout) == {"ok": False, "error": line.removeprefix("strideguard: error: ")}


ROBOT_KEYS = ["actions", "first_action", "gripper"]


@pytest.mark.compiles
@pytest.mark.lowers
@pytest.mark.commands
def test_verify_proves_the_fixed_program_and_names_each_output_by_its_key(programs, tmp_path):
    """The dict-returning policy, fixed and verified: every output named by its key, never by a node."""
    fixed = tmp_path / "fixed.pt2"
    assert strideguard("fix", programs / "robot.pt2", "-o", fixed).returncode == 0
    result = strideguard("verify", fixed, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["device"] == "cpu" and report["compile_seconds"] > 0
    assert [measured["name"] for measured in report["outputs"]] == ROBOT_KEYS
    assert [measured["node"] for measured in report["outputs"]] == [f"{key}_dense" for key in ROBOT_KEYS]
    assert all(measured["source_line"].startswith("examples.py:") for measured in report["outputs"])
    actions = report["outputs"][0]
    assert actions["strides"] == [112, 14, 1] and actions["storage_offset"] == 0
    assert actions["contiguous"] is True and actions["match"] is True and actions["verdict"] == "in layout"
    assert report["runs"] == []
    assert "neg" not in result.stdout and "aten_" not in result.stdout


@pytest.mark.commands
def test_a_dict_policy_is_named_by_its_keys_with_its_source_lines_before_and_after_fix(programs, tmp_path):
    source = programs / "robot.pt2"
    before = json.loads(strideguard("inspect", source, "--json").stdout)
    assert [output["name"] for output in before["outputs"]] == ROBOT_KEYS
    assert [output["node"] for output in before["outputs"]] == ["slice_1", "select", "transpose"]
    assert all(output["source_line"].startswith("examples.py:") for output in before["outputs"])
    assert before["outputs"][0]["source_line"].endswith("joints = sample[..., : self.joints]")
    assert before["outputs"][0]["verdict"] == "stride 128 for dim 0 of size 2 where 112 is promised (and 1 more)"
    fixed = tmp_path / "fixed.pt2"
    result = strideguard("fix", source, "-o", fixed)
    assert result.returncode == 0, result.stderr
    assert "copied 3 outputs: actions, first_action, gripper" in result.stdout
    assert "gripper: made at examples.py:" in result.stdout
    after = json.loads(strideguard("inspect", fixed, "--json").stdout)
    assert [output["name"] for output in after["outputs"]] == ROBOT_KEYS
    assert [output["source_line"] for output in after["outputs"]] == [output["source_line"] for output in before["outputs"]]
    assert after["outputs"][0]["cause"] == "copied: slice(dim=2, 0:14) of view([-1, 8, 16]) of linear"
    assert after["outputs"][0]["copy_of"] == "slice(dim=2, 0:14) of view([-1, 8, 16]) of linear"
    assert all(output["verdict"] == "in layout" and output["ok"] for output in after["outputs"])
    nodes = [node.name for node in torch.export.load(fixed).graph.nodes]
    assert not [name for name in nodes if "neg" in name or name.startswith("aten_")], nodes
    assert {f"{key}_dense" for key in ROBOT_KEYS} <= set(nodes)
    shown = strideguard("inspect", fixed).stdout + result.stdout
    assert all(key in shown for key in ROBOT_KEYS)
    assert "neg" not in shown and "aten_" not in shown and "_dense" not in shown


@pytest.mark.commands
def test_inspect_fits_the_terminal_it_is_given(programs):
    """80 columns: no line longer, the outputs as blocks with their source lines; COLUMNS honoured when
    piped; --wide: the whole table whatever the width."""
    run = lambda *args, columns: SERVER[0].run("inspect", programs / "robot.pt2", *args, env={"COLUMNS": str(columns)})  # noqa: E731
    strideguard("--version")  # starts the server
    narrow = run(columns=80)
    assert narrow.returncode == 1
    lines = narrow.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80, narrow.stdout
    assert all(key in narrow.stdout for key in ROBOT_KEYS) and "examples.py:" in narrow.stdout
    assert "stride 128 for dim 0 of size 2 where 112 is promised" in narrow.stdout  # never broken mid-word
    wide = run("--wide", columns=80)
    header = next(line for line in wide.stdout.splitlines() if "layout" in line and "source" in line)
    assert all(column in header for column in ("name", "strides", "layout", "fix", "cause", "source"))
    assert max(len(line.rstrip()) for line in wide.stdout.splitlines()) > 80
    roomy = run(columns=300)
    assert max(len(line.rstrip()) for line in roomy.stdout.splitlines()) <= 300
    assert any("source" in line and "cause" in line for line in roomy.stdout.splitlines())


@pytest.mark.commands
def test_fix_gives_each_output_the_layout_asked_for(programs, tmp_path):
    fixed = tmp_path / "fixed.pt2"
    result = strideguard("fix", programs / "robot.pt2", "-o", fixed, "--layout", "actions=0,2,1", "--layout", "gripper=keep")
    assert result.returncode == 0, result.stderr
    assert "copied 2 outputs: actions, first_action" in result.stdout
    report = json.loads(strideguard("inspect", fixed, "--json").stdout)
    actions, first, gripper = report["outputs"]
    assert actions["target_dim_order"] == [0, 2, 1] and actions["strides"] == [112, 1, 8] and actions["ok"]
    assert first["target_dim_order"] == [0, 1] and first["ok"]
    # inspected from the written file, the request to keep is the file's
    assert gripper["reason"] == "kept-by-file" and gripper["verdict"] == "kept as compiled, as the file asks"
    assert gripper["ok"]
    assert gripper["strides"] == [128, 1, 16] and gripper["action"] == "none"
    refused = strideguard("fix", programs / "robot.pt2", "-o", tmp_path / "no.pt2", "--layout", "first_action=channels_last")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "first_action" in refused.stderr and "4-d layout" in refused.stderr
    assert not (tmp_path / "no.pt2").exists()


@pytest.mark.commands
def test_verbose_logs_what_was_decided_and_why(programs):
    result = strideguard("-v", "inspect", programs / "robot.pt2")
    assert result.returncode == 1
    logged = [line for line in result.stderr.splitlines() if line.startswith("strideguard: ")]
    assert "strideguard: planned 3 user outputs from the graph alone" in logged
    assert any(line.startswith("strideguard: actions: copy (strided: strides [128, 16, 1]") for line in logged), logged
    assert "planned" not in strideguard("inspect", programs / "robot.pt2").stderr


@pytest.mark.compiles
@pytest.mark.lowers
@pytest.mark.commands
def test_fix_pushdown_then_verify_against_the_original(programs, tmp_path):
    source = programs / "decode.pt2"
    inspected = json.loads(strideguard("inspect", source, "--json").stdout)
    [output] = inspected["outputs"]
    assert output["pushdown"].startswith("select(dim=1, -1) pushed through linear") and output["flops_saved"] > 0.8
    lean = tmp_path / "lean.pt2"
    result = strideguard("fix", source, "-o", lean, "--pushdown")
    assert result.returncode == 0, result.stderr
    assert "fix --pushdown computes" not in result.stdout, "the written program has nothing left to push down"
    result = strideguard("verify", lean, "--reference", source, "--json")
    assert result.returncode == 0, result.stderr
    [measured] = json.loads(result.stdout)["outputs"]
    assert measured["strides"] == [512, 1] and measured["in_target_layout"] is True
    assert 0 <= measured["reference_error"] <= 1e-4


@pytest.mark.lowers
@pytest.mark.commands
def test_fix_exact_says_how_the_fixed_program_was_proven(programs, tmp_path):
    fixed = tmp_path / "fixed.pt2"
    result = strideguard("fix", programs / "policy.pt2", "-o", fixed, "--exact")
    assert result.returncode == 0, result.stderr
    assert "proven in its layout by Inductor's lowering of the fixed program for cpu (1 lowering" in result.stdout
    report = json.loads(strideguard("inspect", fixed, "--json", "--exact").stdout)
    assert report["ok"] is True and report["source"] == "lowering"
    assert report["outputs"][0]["strides"] == [112, 14, 1]


@pytest.mark.compiles
@pytest.mark.commands
def test_compile_writes_a_package_whose_outputs_come_back_dense(programs, tmp_path):
    source = programs / "robot.pt2"
    before = digest(source)
    package = tmp_path / "robot.compiled.pt2"
    across = strideguard("compile", source, "-o", package, "--device", "cuda:sm87")
    assert across.returncode == 2 and not package.exists()
    assert "tensors are on cpu" in across.stderr and "compiles natively" in across.stderr
    assert "exact=True, device='cuda:sm87'" in across.stderr
    result = strideguard("compile", source, "-o", package, "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert "copied 3 outputs: actions, first_action, gripper" in result.stdout
    assert "actions: made at examples.py:" in result.stdout and "joints = sample[..., : self.joints]" in result.stdout
    assert "proven in its layout" in result.stdout
    assert digest(source) == before
    assert [p.name for p in tmp_path.iterdir()] == ["robot.compiled.pt2"], "no temporary file is left behind"
    program = torch.export.load(source)
    runner = torch._inductor.aoti_load_package(str(package))
    args = program.example_inputs[0]
    got, want = runner(*args), program.module()(*args)
    assert sorted(got) == sorted(want) == sorted(ROBOT_KEYS)
    assert got["actions"].stride() == (112, 14, 1) and got["gripper"].stride() == (16, 8, 1)
    assert all(torch.allclose(got[key], want[key], rtol=1e-4, atol=1e-5) for key in ROBOT_KEYS)
    refused = strideguard("compile", source, "-o", package)
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert strideguard("compile", source, "-o", source, "--force").returncode == 2
    assert digest(source) == before


@pytest.mark.commands
def test_version_usage_and_flags_read_as_documented():
    """``--version`` and ``strideguard.__version__`` give the installed package's version; a bare
    ``strideguard`` prints the usage and exits 2 (a usage error, as docs/command-line.md says); a flag shows
    no ``<bool>`` value to type (``--json true`` is refused)."""
    from importlib import metadata

    import strideguard as package

    assert package.__version__ == metadata.version("strideguard")
    version = python_m_strideguard("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"strideguard {package.__version__} (torch {torch.__version__})"
    bare = strideguard()
    assert bare.returncode == 2 and "Usage: strideguard" in bare.stdout
    help_text = SERVER[0].run("fix", "--help", env={"COLUMNS": "200"}).stdout
    flags = [line for line in help_text.splitlines() if "--" in line and "--help" not in line]
    assert any("--exact" in line for line in flags)
    assert not [line for line in flags if "<bool>" in line], help_text

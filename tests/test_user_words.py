"""What a user sees is in their words: outputs named by their path in what the method returns, their source
lines, one verdict, layouts they ask for, reports that fit the terminal, and a log of what was decided.

The command line's side (a dict-returning policy through inspect, fix, verify and compile) is in
``tests/test_cli.py``; this file holds the library's side, and the one compile that proves a requested
layout comes back from AOTInductor.
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from rich.console import Console
from torch import nn

import strideguard
from strideguard.examples import export_robot_policy
from strideguard.program.density import first_wrong_stride
from strideguard.program.naming import node_stem, output_names, path_name, source_line
from strideguard.program.reports import OutputCheck, OutputKind, Reason, VerifyReport, layout_verdict
from strideguard.tables import layout_shapes, print_fitted, verify_shapes

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["actions", "first_action", "gripper"]


class Nested(nn.Module):
    """Every kind of pytree step: a dict key that is an identifier and one that is not, a tuple, a list."""

    def forward(self, x):
        h = x * 2
        return {"logits": h[:, -1], "cache": {"key_cache": [h.t(), h[1:]]}, "odd key": h + 1}, h[0]


def test_outputs_are_named_by_their_key_paths():
    program = torch.export.export(Nested(), (torch.randn(4, 6),))
    assert output_names(program, 5) == ["[0].logits", "[0].cache.key_cache[0]", "[0].cache.key_cache[1]", "[0]['odd key']", "[1]"]
    report = strideguard.inspect(program)
    assert [o.name for o in report.outputs] == output_names(program, 5)
    assert all(o.node in {n.name for n in program.graph.nodes} for o in report.outputs)


def test_key_paths_read_as_python_writes_them():
    assert path_name(()) == "output"
    assert path_name((pytree.MappingKey("actions"),)) == "actions"
    assert path_name((pytree.SequenceKey(1),)) == "[1]"
    assert path_name((pytree.MappingKey("cache"), pytree.GetAttrKey("key_cache"), pytree.SequenceKey(0))) == "cache.key_cache[0]"
    assert path_name((pytree.MappingKey("a b"),)) == "['a b']" and path_name((pytree.MappingKey(3),)) == "[3]"
    assert node_stem("cache.key_cache[0]") == "cache_key_cache_0" and node_stem("[1]") == "output_1"
    assert node_stem("['odd key']") == "odd_key"


def test_a_program_without_a_matching_output_spec_is_named_by_position():
    from types import SimpleNamespace

    spec = torch.export.export(Nested(), (torch.randn(4, 6),)).call_spec.out_spec
    assert output_names(SimpleNamespace(call_spec=SimpleNamespace(out_spec=None)), 5) == ["[0]", "[1]", "[2]", "[3]", "[4]"]
    assert output_names(SimpleNamespace(call_spec=SimpleNamespace(out_spec=spec)), 4) == ["[0]", "[1]", "[2]", "[3]"]
    assert output_names(SimpleNamespace(call_spec=SimpleNamespace(out_spec=None)), 1) == ["output"]


def test_symbolic_sizes_say_which_input_dimension_they_are_and_their_range(tmp_path):
    class Dynamic(nn.Module):
        def forward(self, x, y):
            return (x * 2)[:, :3], y.t()

    batch, n = torch.export.Dim("batch", min=2, max=64), torch.export.Dim("n", min=2)
    program = torch.export.export(Dynamic(), (torch.randn(4, 8), torch.randn(5, 3)), dynamic_shapes=({0: batch}, {0: n}))
    report = strideguard.inspect(program)
    symbols = dict(report.symbols)
    first, second = report.outputs[0].shape[0], report.outputs[1].shape[1]
    assert symbols == {first: "x.size(0), 2 to 64", second: "y.size(0), 2 or more"}
    assert report.to_dict()["symbols"] == symbols and f"  {first}: x.size(0), 2 to 64" in str(report)
    torch.export.save(program, tmp_path / "dynamic.pt2")
    assert dict(strideguard.inspect(torch.export.load(tmp_path / "dynamic.pt2")).symbols) == symbols


def test_the_source_line_is_the_users_not_torchs():
    program = export_robot_policy()
    linear = next(n for n in program.graph.nodes if n.name == "linear")
    line = source_line(linear)
    assert line.startswith("examples.py:") and "self.trunk(observation)" in line, line
    assert "functional" not in line and "linear.py" not in line
    assert source_line(next(iter(program.graph.nodes))) is None  # a placeholder has no stack trace


def test_a_fix_keeps_each_name_says_what_it_copied_and_names_its_nodes_after_the_output():
    program = export_robot_policy()
    fixed = strideguard.densify_outputs(program)
    before, after = strideguard.inspect(program), strideguard.inspect(fixed)
    assert [o.name for o in before.outputs] == [o.name for o in after.outputs] == KEYS
    assert "aliases output first_action" in str(before), "another output is named by its name, not its index"
    assert before.outputs[0].to_dict()["aliases"] == ["output 1"], "the JSON keeps the index"
    assert [o.source_line for o in before.outputs] == [o.source_line for o in after.outputs]
    assert [o.copy_of for o in after.outputs] == [o.cause for o in before.outputs]
    assert all(o.cause == f"copied: {o.copy_of}" for o in after.outputs)
    added = [n.name for n in fixed.graph.nodes if n.name not in {m.name for m in program.graph.nodes}]
    assert sorted(added) == sorted(f"{key}_{part}" for key in KEYS for part in ("copy", "copy_1", "dense")), added
    assert [o.node for o in after.outputs] == [f"{key}_dense" for key in KEYS]


def test_an_edge_program_gets_names_of_the_users_words_not_aten_ones():
    pytest.importorskip("executorch", reason="needs ExecuTorch: pip install '.[executorch]'")
    from executorch.exir import to_edge

    from strideguard.executorch import DenseOutputsPass

    edge = to_edge(export_robot_policy()).exported_program()
    fixed = DenseOutputsPass().call(edge).exported_program
    added = [n.name for n in fixed.graph.nodes if n.name not in {m.name for m in edge.graph.nodes}]
    assert added and not [name for name in added if name.startswith("aten_")], added
    report = strideguard.inspect(fixed)
    assert [o.name for o in report.outputs] == KEYS and report.ok
    assert "aten_" not in str(report) and "neg" not in str(report)


@pytest.mark.parametrize(
    ("shape", "strides", "order", "said"),
    [
        ((1, 512), (6144, 1), (0, 1), "stride 6144 for dim 0 of size 1 where 512 is promised"),
        ((4, 14), (16, 1), (0, 1), "stride 16 for dim 0 of size 4 where 14 is promised"),
        ((2, 3, 4, 5), (60, 20, 5, 1), (0, 2, 3, 1), "stride 5 for dim 2 of size 4 where 15 is promised (and 2 more)"),
        ((2, 3), (3, 1), (0, 1), None),
        ((0, 3), (7, 1), (0, 1), None),
    ],
)
def test_the_verdict_names_the_outermost_wrong_stride(shape, strides, order, said):
    assert first_wrong_stride(shape, strides, order) == said
    verdict = layout_verdict(OutputKind.TENSOR, said is None, Reason.STRIDED, shape, strides, order)
    assert verdict == (said or "in layout")


def test_an_undecided_output_says_who_decides_and_a_dense_one_is_never_strided():
    for reason, who in [
        (Reason.INDUCTOR_DECIDES, "Inductor decides"),
        (Reason.KERNEL_DECIDES, "the device's kernel choice decides"),
        (Reason.BACKEND_DECIDES, "the backend's passes decide"),
        (Reason.SYMBOLIC, "a symbolic size decides"),
        (Reason.CONTROL_FLOW, "control flow decides"),
    ]:
        assert layout_verdict(OutputKind.TENSOR, None, reason, (2, 3), (3, 1), (0, 1)) == who
    assert layout_verdict(OutputKind.INT, None, Reason.NOT_A_TENSOR, None, None, None) == "not a tensor"

    class Permuted(nn.Module):
        def forward(self, x):
            return x.permute(1, 0)

    report = strideguard.inspect(torch.export.export(Permuted(), (torch.randn(3, 5),)))
    [output] = report.outputs
    assert output.dense is True and output.in_target_layout is False
    assert output.verdict == "stride 1 for dim 0 of size 5 where 3 is promised (and 1 more)"
    assert "STRIDED" not in str(report) and output.to_dict()["verdict"] == output.verdict


class Image(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return {"image": y, "rows": y[:, :, 0].transpose(1, 2), "pooled": y.mean((2, 3))}


def _image_program():
    torch.manual_seed(0)
    return torch.export.export(Image().eval(), (torch.randn(2, 3, 8, 8),))


@pytest.mark.parametrize(
    ("layouts", "message"),
    [
        ({"pooled": torch.channels_last}, r"layouts\['pooled'\] \(output pooled, 2-d\): torch.channels_last is a 4-d layout"),
        ({"nope": "keep"}, r"no output is named 'nope'; the outputs are image, rows, pooled"),
        ({3: "keep"}, r"layouts\[3\]: the program has 3 user outputs"),
        ({"image": (0, 1, 2)}, r"dim order \[0, 1, 2\] is not a permutation of \[0, 1, 2, 3\]"),
        ({"image": "diagonal"}, r"'diagonal' is not a layout"),
        ({"image": torch.preserve_format}, r"torch.preserve_format is not a layout; give 'keep'"),
        ({"image": "keep", 0: "keep"}, r"output image is given a layout twice"),
    ],
)
def test_an_impossible_layout_is_one_error_naming_the_output(layouts, message):
    with pytest.raises(ValueError, match=message):
        strideguard.densify_outputs(_image_program(), layouts=layouts)


def test_layouts_must_be_a_dict_of_names_or_indices():
    with pytest.raises(TypeError, match="layouts must be a dict"):
        strideguard.densify_outputs(_image_program(), layouts=["image"])
    with pytest.raises(TypeError, match="keys are output names or indices"):
        strideguard.densify_outputs(_image_program(), layouts={True: "keep"})


def test_the_layout_asked_for_is_planned_recorded_and_read_back_after_a_save(tmp_path):
    program = _image_program()
    fixed = strideguard.densify_outputs(program, layouts={"image": torch.channels_last, "rows": "keep", 2: (1, 0)})
    report = strideguard.inspect(fixed)
    image, rows, pooled = report.outputs
    assert image.target_dim_order == (0, 2, 3, 1) and image.strides == (512, 1, 64, 8) and image.ok
    # read back from the saved file, the request is the file's
    assert rows.reason is Reason.KEPT_BY_FILE and rows.verdict == "kept as compiled, as the file asks"
    assert rows.strides == (512, 1, 64)
    assert pooled.target_dim_order == (1, 0) and pooled.strides == (1, 2) and pooled.ok
    assert pooled.cause.startswith("copied: "), "a copy ending in a permutation is still named a copy"
    torch.export.save(fixed, tmp_path / "fixed.pt2")
    again = strideguard.inspect(torch.export.load(tmp_path / "fixed.pt2"))
    assert [o.target_dim_order for o in again.outputs] == [o.target_dim_order for o in report.outputs]
    assert again.ok and again.outputs[1].reason is Reason.KEPT_BY_FILE
    assert strideguard.inspect(program).outputs[0].target_dim_order == (0, 1, 2, 3), "the input is untouched"
    twice = strideguard.densify_outputs(fixed)
    assert [n.name for n in twice.graph.nodes] == [n.name for n in fixed.graph.nodes], "fixing again adds nothing"


@pytest.mark.compiles
@pytest.mark.lowers
def test_a_requested_channels_last_output_comes_back_channels_last_from_aotinductor():
    """The issue's promise: ``densify_outputs(p, layouts={"image": torch.channels_last})``, proven by the
    closed loop and verified by compiling and running; ``rows``, kept, comes back as Inductor lays it out."""
    program = _image_program()
    layouts = {"image": torch.channels_last, "rows": "keep", "pooled": (1, 0)}
    fixed = strideguard.densify_outputs(program, layouts=layouts, exact=True)
    assert fixed.graph_module.meta["strideguard_proof"].unproven == ()
    measured = strideguard.verify(fixed)
    assert measured.ok, str(measured)
    image, rows, pooled = measured.outputs
    assert image.name == "image" and image.strides == (512, 1, 64, 8) and image.in_target_layout
    assert rows.kept and rows.verdict == "kept as compiled" and rows.ok
    assert pooled.strides == (1, 2) and pooled.verdict == "in layout", "an order with no memory format, by permutation"


@pytest.mark.lowers
def test_an_edge_program_promises_the_layout_asked_for():
    pytest.importorskip("executorch", reason="needs ExecuTorch: pip install '.[executorch]'")
    from executorch.exir import to_edge

    from strideguard.program.promises import target_dim_orders
    from strideguard.executorch import DenseOutputsPass
    from strideguard.compiler.oracle.lowering import lower_edge_outputs

    edge = to_edge(_image_program()).exported_program()
    dense = DenseOutputsPass(exact=True, layouts={"image": "channels_last"})
    fixed = dense.call(edge).exported_program
    assert target_dim_orders(fixed)[0] == (0, 2, 3, 1), "the promise itself changed"
    returned = fixed.graph.output_node().args[0][0]
    assert returned.meta["val"].dim_order() == (0, 2, 3, 1)
    lowered = lower_edge_outputs(fixed)
    assert lowered.outputs[0].strides == (512, 1, 64, 8)
    assert dense.proof.unproven == () and strideguard.inspect(fixed).ok


def test_the_api_logs_what_it_decided_and_why(caplog):
    with caplog.at_level(logging.INFO, logger="strideguard"):
        strideguard.inspect(export_robot_policy())
    said = [record.getMessage() for record in caplog.records if record.name.startswith("strideguard")]
    assert "planned 3 user outputs from the graph alone" in said
    assert any(line.startswith("gripper: copy (strided: strides [128, 1, 16]") for line in said), said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="strideguard"):
        strideguard.inspect(export_robot_policy())
    assert not caplog.records, "nothing is said at the default level"


def _check(index, name, strides, *, match=True, reference_error=None, shape=(2, 3)) -> OutputCheck:
    return OutputCheck(
        index=index, name=name, kind=OutputKind.TENSOR, match=match, shape=shape, dtype="float32", strides=strides,
        storage_offset=0, contiguous=strides == (3, 1), dense=True, target_dim_order=(0, 1),
        in_target_layout=strides == (3, 1), max_abs_error=0.0, reference_error=reference_error, node=f"{name}_dense",
    )


def _report() -> VerifyReport:
    first = (_check(0, "actions", (3, 1), reference_error=2.5e-7), _check(1, "gripper", (3, 1)))
    second = (_check(0, "actions", (3, 1)), _check(1, "gripper", (1, 2), match=False))
    return VerifyReport(device="cpu", compile_seconds=12.0, outputs=first, runs=(("inputs 1", second),))


def test_a_verify_report_prints_its_reference_error_and_every_run(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # each line whole: the lines are what this test reads
    text = str(_report())
    assert text.startswith("NOT OK: compiled in 12.0 s on cpu")
    assert "[0] actions: strides [3, 1]: in layout, max|err| 0, match, |err| vs reference 2.5e-07" in text
    assert "on inputs 1: NOT OK: gripper" in text
    assert "[1] gripper: strides [1, 2]: stride 1 for dim 0 of size 2 where 3 is promised (and 1 more)" in text
    data = _report().to_dict()
    assert data["runs"][0]["inputs"] == "inputs 1" and data["runs"][0]["outputs"][1]["ok"] is False
    assert data["outputs"][0]["reference_error"] == 2.5e-7 and data["outputs"][0]["verdict"] == "in layout"


def _rendered(shapes, width: int, wide: bool = False) -> str:
    out = io.StringIO()
    print_fitted(Console(file=out, width=width, emoji=False, color_system=None), shapes, wide)
    return out.getvalue()


def test_reports_fit_80_columns_without_breaking_a_word():
    report = strideguard.inspect(export_robot_policy())
    for text in (_rendered(layout_shapes("robot.pt2: 3 user outputs", report), 80), _rendered(verify_shapes("robot.pt2", _report()), 80)):
        assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    blocks = _rendered(layout_shapes("robot.pt2", report), 80)
    assert "stride 128 for dim 0 of size 2 where 112 is promised" in blocks and "source" in blocks
    table = _rendered(layout_shapes("robot.pt2", report), 80, wide=True)
    assert max(len(line.rstrip()) for line in table.splitlines()) > 80 and "source" in table.splitlines()[2]


def _documented_fields(heading: str) -> set[str]:
    """The backticked names in the first column of the field tables under ``heading`` in command-line.md."""
    text = (ROOT / "docs" / "command-line.md").read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return {name for row in section.splitlines() if row.startswith("| `") for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


def test_the_json_fields_are_those_the_docs_document():
    report = strideguard.inspect(export_robot_policy())
    inspect_fields = set(report.to_dict()) | set(report.outputs[0].to_dict())
    assert _documented_fields("### inspect --json") == inspect_fields
    verify_fields = set(_report().to_dict()) | set(_report().outputs[0].to_dict())
    assert _documented_fields("### verify --json") == verify_fields


class Drawn(nn.Module):
    """Two outputs with strides [90, 9, 1] of different views, a transposed [64, 2], a dense permuted one."""

    def forward(self, x, y, c):
        b = (x + 1)[:, :, 2:].transpose(0, 1).transpose(0, 1)  # its last view is of a [10, 2, 7] tensor
        return {"a": (x * 2)[:, :, :7], "b": b, "t": (y * 3).t(), "cache": c.permute(0, 2, 1)}


def _panels(figure) -> dict[str, tuple]:
    """Each drawn panel, by its title's first line: its pixel array (one pixel per cell) and its numbers."""
    panels = {}
    for axis in figure.axes:
        images = axis.get_images()
        if images:
            numbers = [int(text.get_text()) for text in axis.texts]
            panels[axis.get_title().splitlines()[0].split(":")[0]] = (np.asarray(images[0].get_array()), numbers)
    return panels


def _darkness(image) -> list[float]:
    """Each cell's darkness, row by row (the shading runs light to dark in element order)."""
    return [float(3 - cell.sum()) for row in image for cell in row]


def test_the_plot_draws_each_storage_at_its_row_stride_before_and_after_at_one_scale():
    from strideguard.plot import draw_copies

    program = torch.export.export(Drawn(), (torch.randn(2, 10, 9), torch.randn(2, 64), torch.randn(2, 3, 4)))
    report = strideguard.inspect(program)
    figure = draw_copies(program, report, title="drawn")
    panels = _panels(figure)
    for name in ("a", "b", "t", "cache"):
        before, after = panels[f"{name} as compiled"][0], panels[f"{name} after strideguard fix"][0]
        assert before.shape[1] == after.shape[1], f"{name}: one scale and orientation before and after"
    spans = {axis.get_title().split(":")[0]: (axis.get_xlim(), axis.get_ylim()) for axis in figure.axes if axis.get_images()}
    assert spans["a as compiled"] == spans["a after strideguard fix"], "cells of one size in both panels"
    assert panels["a as compiled"][0].shape[1] == panels["b as compiled"][0].shape[1] == 9, "rows of the stride 9"
    assert panels["t as compiled"][0].shape[:2] == (2, 64)
    before_image, before_numbers = panels["cache as compiled"]
    after_image, after_numbers = panels["cache after strideguard fix"]
    assert after_numbers == list(range(24)) and before_numbers[:4] == [0, 3, 6, 9], "numbered in element order"
    after_dark, before_dark = _darkness(after_image), _darkness(before_image)
    assert after_dark == sorted(after_dark), "after fix, the shading runs row by row"
    assert before_dark != sorted(before_dark), "a dense but permuted output does not look like the after panel"
    assert not panels["t as compiled"][1], "64 columns are too many to number"
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "numbered and shaded light to dark in its element order" in legend[0]


def test_the_legend_says_when_no_cell_is_numbered():
    from strideguard.plot import draw_copies

    class Wide(nn.Module):
        def forward(self, y):
            return (y * 3).t()

    program = torch.export.export(Wide(), (torch.randn(2, 64),))
    figure = draw_copies(program, strideguard.inspect(program), title="wide")
    assert "too many cells to number" in figure.legends[0].get_texts()[0].get_text()
    assert all(not axis.texts for axis in figure.axes)

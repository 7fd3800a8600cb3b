"""A report you can gate on: in layout, out of layout and undecided kept apart, and every line a user reads
true and fitting the terminal.

The programs here are small and new to the suite: a channels-last convolution
reduced over its spatial dimensions (undecided from the graph alone, in layout
once Inductor is asked), a head returning a slice (out of layout), a
dynamic-batch policy returning a dict, a decode step whose last row
``fix --pushdown`` moves into its producers. The command line runs as users
run it (``tests/commands.py``); the Python reports are printed at 80 columns.
"""

from __future__ import annotations

import inspect as python_inspect
import io
import json
import pathlib
import re

import pytest
import torch
from torch import nn

import strideguard
from strideguard.examples import export_decode_step
from strideguard.program.reports import (
    labelled, listed, OutputCheck, OutputKind, Reason, VerifyReport,
)
from strideguard.tables import plain_console, print_fitted, verify_shapes

from .test_cli import command_server  # noqa: F401 - the module's one command server, as test_cli's
from .test_cli import strideguard as run_command

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


class ChannelsLastPooled(nn.Module):
    """A convolution of a channels-last input, averaged over its spatial dimensions: dense whatever the
    convolution's layout, but from the graph alone Inductor decides it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


class Sliced(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 24)

    def forward(self, x):
        return (self.head(x)[:, :3],)


class Policy(nn.Module):
    """A dynamic-batch policy returning a dict of pieces of one matmul."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 24)

    def forward(self, observation):
        features = self.head(observation)
        return {"actions": features[..., :7], "value": features[:, 7]}


def _pooled():
    torch.manual_seed(0)
    image = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    return torch.export.export(ChannelsLastPooled(), (image,))


def _policy():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=2, max=64)
    return torch.export.export(Policy(), (torch.randn(4, 16),), dynamic_shapes=({0: batch},))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gate")
    saved = {}
    for name, program in (
        ("pooled", _pooled()), ("sliced", torch.export.export(Sliced(), (torch.randn(4, 16),))),
        ("policy", _policy()), ("decode", export_decode_step()),
    ):
        saved[name] = folder / f"{name}.pt2"
        torch.export.save(program, saved[name])
    return saved


@pytest.mark.lowers
def test_undecided_is_neither_in_nor_out_of_layout_in_python():
    report = strideguard.inspect(_pooled())
    (pooled,) = report.outputs
    assert pooled.in_target_layout is None and pooled.reason is Reason.INDUCTOR_DECIDES
    assert report.verdict == "undecided" and report.out_of_layout == () and report.undecided == (pooled,)
    assert "out of layout" not in report.summary and "1 undecided (Inductor decides" in report.summary
    # the why names what the graph holds: the channels-last input, not a view the graph does not have
    assert "view" not in pooled.explanation and "the input x" in pooled.explanation
    decided = strideguard.inspect(_pooled(), exact=True)
    assert decided.verdict == "in layout" and decided.ok
    assert strideguard.inspect(torch.export.export(Sliced(), (torch.randn(4, 16),))).verdict == "out of layout"


@pytest.mark.commands
@pytest.mark.lowers
def test_inspect_exits_apart_for_undecided_and_out_of_layout(files):
    undecided = run_command("inspect", files["pooled"])
    assert undecided.returncode == 3, undecided.stdout + undecided.stderr
    assert "1 undecided" in undecided.stdout and "out of layout" not in undecided.stdout
    assert "1 user output " in undecided.stdout and "1 user outputs" not in undecided.stdout
    exact = run_command("inspect", files["pooled"], "--exact")
    assert exact.returncode == 0, exact.stdout + exact.stderr
    strided = run_command("inspect", files["sliced"], "--json")
    assert strided.returncode == 1
    data = json.loads(strided.stdout)
    assert data["verdict"] == "out of layout" and data["out_of_layout"] == [0] and data["undecided"] == []


def test_print_report_fits_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for program in (_policy(), export_decode_step(), _pooled()):
        text = str(strideguard.inspect(program))
        assert max(len(line) for line in text.splitlines()) <= 80, text
    monkeypatch.setenv("COLUMNS", "200")
    wide = str(strideguard.inspect(export_decode_step()))
    assert max(len(line) for line in wide.splitlines()) > 80  # the width followed, not a fixed cut


def test_a_long_pushdown_is_printed_shortened_and_kept_whole():
    from strideguard.program.reports import shortened_pushdown

    whole = "select(dim=1, -1) pushed through linear, relu, linear, mul, mul, rsqrt, add into embedding"
    assert shortened_pushdown(whole) == (
        "select(dim=1, -1) pushed through linear, relu, linear, mul and 3 more ops into embedding"
    )
    assert shortened_pushdown("slice(dim=1, 0:3) pushed into linear") == "slice(dim=1, 0:3) pushed into linear"


def test_the_words_of_a_report():
    assert str(OutputKind.INT) == "int" and f"{OutputKind.INT}" == "int" and f"{Reason.STRIDED}" == "strided"
    assert labelled(0, "[0]") == "[0]" and labelled(2, "actions") == "[2] actions"
    report = strideguard.inspect(_policy())
    assert "[s" in str(report) and "'s" not in str(report)  # [s77, 7], not ['s77', 7]
    assert listed(("s77", 7)) == "[s77, 7]"
    tuple_report = strideguard.inspect(torch.export.export(Sliced(), (torch.randn(4, 16),)))
    assert "[0] [0]" not in str(tuple_report) and "  [0]: [4, 3] float32" in str(tuple_report)


def test_a_dynamic_programs_plot_draws_its_storages_at_the_example_sizes():
    pytest.importorskip("matplotlib")
    from strideguard.plot import draw_copies, example_sizes, NOT_DRAWN, plot_copies

    program = _policy()
    report = strideguard.inspect(program)
    (symbol,) = example_sizes(program)
    assert example_sizes(program) == {symbol: 4}
    assert plot_copies(program, report, io.BytesIO(), title="policy") == []  # every copied output drawn
    figure = draw_copies(program, report, title="policy")
    assert f"{symbol} = 4" in figure._suptitle.get_text()
    texts = [text.get_text() for axis in figure.axes for text in axis.texts]
    assert not any(NOT_DRAWN in text for text in texts)
    titles = [axis.get_title() for axis in figure.axes]
    assert any("shape [4, 7], strides [24, 1]" in title for title in titles), titles


@pytest.mark.commands
def test_the_plot_of_a_dynamic_file_is_drawn(files, tmp_path):
    result = run_command("inspect", files["policy"], "--plot", tmp_path / "policy.png")
    assert result.returncode == 1, result.stderr
    assert "is not drawn" not in result.stdout and (tmp_path / "policy.png").stat().st_size > 10_000


def _check(index, name, strides, *, kept=False, reference_error=None):
    return OutputCheck(
        index=index, name=name, kind=OutputKind.TENSOR, match=True, shape=(4, 3), dtype="float32", strides=strides,
        storage_offset=0, contiguous=strides == (3, 1), dense=True, target_dim_order=(0, 1),
        in_target_layout=strides == (3, 1), max_abs_error=0.0, kept=kept, reference_error=reference_error,
    )


def test_verify_says_what_it_measured_at_80_columns():
    measured = VerifyReport("cpu", 1.0, (
        _check(0, "actions", (3, 1), reference_error=0.00025), _check(1, "features", (16, 1), kept=True),
    ))
    console = plain_console(width=80, record=True)
    print_fitted(console, verify_shapes("verify", measured), wide=False)
    shown = console.export_text()
    assert "reference" in shown and "0.00025" in shown
    assert measured.ok and "or as asked (features kept as compiled)" in measured.summary
    assert "largest |err| vs the reference 0.00025" in measured.summary
    assert measured.summary in str(measured).replace("\n    ", " ")


@pytest.mark.commands
def test_fix_pushdown_names_what_it_pushed_down_in_the_users_indices(files, tmp_path):
    result = run_command("fix", files["decode"], "--pushdown", "-o", tmp_path / "decode-fixed.pt2")
    assert result.returncode == 0, result.stderr
    assert "pushed down output: select(dim=1, -1) pushed through" in result.stdout
    assert "FLOPs saved" in result.stdout
    fixed = strideguard.inspect(torch.export.load(tmp_path / "decode-fixed.pt2"))
    assert fixed.outputs[0].cause.startswith("pushed down: select(dim=1, -1)")  # the user's -1, not the piece's 0


@pytest.mark.commands
def test_layout_errors_and_help_speak_the_command_lines_words(files, tmp_path):
    result = run_command("fix", files["sliced"], "--layout", "nope=keep", "-o", tmp_path / "x.pt2")
    assert result.returncode == 2
    assert "--layout nope: no output is named 'nope'" in result.stderr
    assert "strideguard.densify_outputs" not in result.stderr and "ValueError" not in result.stderr
    for command in ("", "inspect", "fix", "verify", "compile"):
        shown = run_command(*([command] if command else []), "--help").stdout
        assert "<bool>" not in shown and "{" not in shown, command
    verify_help = run_command("verify", "--help").stdout
    assert "GiB (default: three quarters" in " ".join(verify_help.replace("│", " ").split())


@pytest.mark.lowers
def test_forcing_flash_attention_on_float32_says_why_nothing_runs():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    class Attention(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v)

    x = torch.randn(1, 2, 8, 16)
    program = torch.export.export(Attention(), (x, x, x))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.raises(RuntimeError, match="float16 or bfloat16, not float32"):
        strideguard.inspect(program, exact=True, device="cuda")


def test_the_api_doc_gives_inspects_whole_signature():
    text = (DOCS / "api.md").read_text()
    for function in (strideguard.inspect, strideguard.densify_outputs):
        keywords = [name for name, parameter in python_inspect.signature(function).parameters.items()
                    if parameter.kind is parameter.KEYWORD_ONLY]
        documented = re.search(rf"`strideguard\.{function.__name__}\(program, \*, ([^)]*)\)", text)
        assert documented is not None, function.__name__
        assert [part.split("=")[0] for part in documented.group(1).split(", ")] == keywords, function.__name__
    executorch = (DOCS / "executorch.md").read_text()
    assert "CudaPartitioner([...])" not in executorch and "generate_method_name_compile_spec" in executorch


@pytest.mark.lowers
def test_with_a_lowering_the_predictor_does_not_run(monkeypatch):
    """``exact=True`` decides every output by Inductor's lowering: the graph-only predictor is not asked."""
    import strideguard.decide.facts as facts

    asked = []
    predictor = facts.compiled_layout
    monkeypatch.setattr(facts, "compiled_layout", lambda *args: asked.append(args) or predictor(*args))
    program = torch.export.export(Sliced(), (torch.randn(4, 16),))
    exact = strideguard.inspect(program, exact=True)
    fixed = strideguard.densify_outputs(program, exact=True)
    assert asked == []
    assert exact.verdict == "out of layout" and strideguard.inspect(fixed, exact=True).verdict == "in layout"
    strideguard.inspect(program)
    assert len(asked) == 1  # the graph alone: the predictor, once per output

"""The CUDA graph runner's policy, driven on the CPU with plain callables and emulated graphs.

Nothing here needs a GPU or compiles with AOTInductor: the mechanics are
injected, so the decisions, the counters and the messages are those the
runner takes on a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from bench.cuda_graphs import (
    WARMUP_CALLS,
    EmulatedGraphs,
    GraphedMethod,
    GraphPolicy,
    OutputVerdict,
    Step,
    check_output,
    disabled_message,
    promised_dim_orders,
)
from strideguard.examples import export_decode_step, export_policy

REPO = Path(__file__).resolve().parent.parent
LOGGER = "bench.cuda_graphs"


def padded(x: torch.Tensor) -> torch.Tensor:
    """A policy head's padded action chunk, [batch, 8, 16]."""
    return (x.reshape(-1, 1) * torch.arange(128.0)).reshape(-1, 8, 16)


def policy_view(x: torch.Tensor) -> torch.Tensor:
    """``sample[..., :14]`` returned as a view: what AOTInductor returns unfixed."""
    return padded(x)[..., :14]


def policy_dense(x: torch.Tensor) -> torch.Tensor:
    """The same values written densely: what the fixed program returns."""
    return padded(x)[..., :14].contiguous()


class Spy(EmulatedGraphs):
    """Emulated graphs that count what the runner asks of them."""

    def __init__(self):
        self.captures = 0
        self.replays = 0
        self.host_round_trips = 0

    def capture(self, run):
        self.captures += 1
        graph, outputs = super().capture(run)
        spy = self

        class Counted:
            def replay(self):
                spy.replays += 1
                graph.replay()

        return Counted(), outputs

    def copy_through_host(self, destination, source):
        self.host_round_trips += 1
        super().copy_through_host(destination, source)


def steps_of(runner: GraphedMethod, calls: int, make_input=lambda i: torch.full((1,), float(i + 1))) -> list[Step]:
    steps = []
    for i in range(calls):
        steps.append(runner.policy.next_step())
        runner(make_input(i))
    return steps


# The layout check


def test_a_sliced_action_chunk_is_not_laid_out_like_its_etensor():
    verdict = check_output(0, policy_view(torch.ones(1)), (0, 1, 2))
    assert verdict == OutputVerdict(0, (1, 8, 14), (128, 16, 1), (112, 14, 1), in_target_layout=False)


def test_a_dense_output_is_laid_out_like_its_etensor():
    assert check_output(0, policy_dense(torch.ones(1)), (0, 1, 2)).in_target_layout


def test_a_storage_offset_and_an_empty_output_never_matter():
    chunk = torch.zeros(4, 2, 6)[2:]  # contiguous strides, with a storage offset
    assert check_output(0, chunk, (0, 1, 2)).in_target_layout
    assert check_output(0, torch.zeros(3, 0, 2).transpose(0, 2), (0, 1, 2)).in_target_layout


def test_the_last_positions_logits_at_batch_one_differ_only_by_a_size_one_stride():
    """The runtime compares strides literally; a byte copy would be right all the same."""
    logits = torch.zeros(1, 8, 512)[:, -1, :]
    exact = check_output(0, logits, (0, 1))
    assert (exact.strides, exact.promised_strides, exact.in_target_layout) == ((4096, 1), (512, 1), False)
    assert check_output(0, logits, (0, 1), exact=False).in_target_layout
    batched = torch.zeros(2, 8, 512)[:, -1, :]
    assert not check_output(0, batched, (0, 1), exact=False).in_target_layout


def test_a_transposed_output_matches_a_promised_transposed_dim_order_only():
    value = torch.zeros(2, 3, 4).transpose(1, 2)  # shape [2, 4, 3], dim order (0, 2, 1)
    assert not check_output(0, value, (0, 1, 2)).in_target_layout
    verdict = check_output(0, value, (0, 2, 1))
    assert verdict.in_target_layout and verdict.promised_strides == (12, 1, 4)


def test_a_dim_order_that_does_not_fit_is_an_error():
    with pytest.raises(ValueError, match=r"output 3: dim order \(0, 1\) does not fit its 3 dimensions"):
        check_output(3, torch.zeros(1, 2, 3), (0, 1))


# The fallback decision and the message


def test_the_message_names_the_method_and_its_first_output_out_of_layout():
    """The runtime's words ("CUDA graph: disabled for '<method>', output N is not laid out like its ETensor"),
    with N the first output out of layout, as the policy reports it."""
    policy = GraphPolicy("decode")
    verdicts = [OutputVerdict(0, (2,), (1,), (1,), True), OutputVerdict(2, (2, 3), (1, 2), (3, 1), False),
                OutputVerdict(3, (2, 3), (1, 2), (3, 1), False)]
    said = policy.record(policy.next_step(), verdicts)
    assert said == policy.disabled_reason == "CUDA graph: disabled for 'decode', output 2 is not laid out like its ETensor"
    assert said == disabled_message("decode", 2) != disabled_message("decode", 3)


def test_dense_outputs_warm_up_three_times_capture_on_the_fourth_then_replay():
    policy = GraphPolicy("forward")
    dense = [OutputVerdict(0, (2,), (1,), (1,), True)]
    steps = []
    for _ in range(6):
        steps.append(policy.next_step())
        assert policy.record(steps[-1], dense if steps[-1] is not Step.REPLAY else ()) is None
    assert steps == [Step.WARMUP] * 3 + [Step.CAPTURE, Step.REPLAY, Step.REPLAY]
    assert policy.captured and policy.disabled_reason is None


def test_the_first_output_not_as_promised_turns_graphs_off_for_good_naming_it():
    policy = GraphPolicy("decode")
    verdicts = [OutputVerdict(0, (2,), (1,), (1,), True), OutputVerdict(1, (2, 2), (3, 1), (2, 1), False)]
    assert policy.record(policy.next_step(), verdicts) == disabled_message("decode", 1)
    assert [policy.next_step() for _ in range(5)] == [Step.EAGER] * 5
    assert policy.record(Step.EAGER, verdicts) is None  # said once
    assert not policy.captured


# The runner


def test_a_dense_method_keeps_its_graph_and_copies_device_to_device(caplog):
    spy = Spy()
    runner = GraphedMethod(policy_dense, method="policy", mechanics=spy)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        steps = steps_of(runner, 10)
    assert steps == [Step.WARMUP] * 3 + [Step.CAPTURE] + [Step.REPLAY] * 6
    assert runner.graph_captured
    assert (spy.captures, spy.replays, spy.host_round_trips) == (1, 7, 0)  # the capture replays once
    assert (runner.stats.calls, runner.stats.graph_calls, runner.stats.eager_calls) == (10, 7, 3)
    assert (runner.stats.device_copies, runner.stats.host_copies) == (10, 0)
    assert [r.getMessage() for r in caplog.records] == ["CUDA graph: captured for 'policy'"]


def test_replays_see_each_new_input_and_return_the_same_etensor():
    runner = GraphedMethod(policy_dense, mechanics=EmulatedGraphs())
    returned = set()
    for i in range(8):
        x = torch.full((1,), float(i + 1))
        out = runner(x)
        returned.add(id(out))
        assert torch.equal(out, policy_dense(x))
        assert out.stride() == (112, 14, 1)
    assert len(returned) == 1


def test_the_capture_call_replays_before_reading_its_outputs():
    """A capture computes nothing (the emulated one poisons its outputs); the runner must replay once."""
    runner = GraphedMethod(policy_dense, mechanics=EmulatedGraphs())
    steps_of(runner, WARMUP_CALLS)
    x = torch.full((1,), 7.0)
    assert torch.equal(runner(x), policy_dense(x))


def test_a_strided_output_falls_back_on_the_first_call_copying_through_host_every_step(caplog):
    spy = Spy()
    runner = GraphedMethod(policy_view, method="policy", mechanics=spy)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        steps = steps_of(runner, 10)
    assert steps == [Step.WARMUP] + [Step.EAGER] * 9
    assert not runner.graph_captured and spy.captures == 0
    assert (runner.stats.host_copies, runner.stats.device_copies, runner.stats.eager_calls) == (10, 0, 10)
    assert spy.host_round_trips == 10
    assert runner.policy.disabled_reason == "CUDA graph: disabled for 'policy', output 0 is not laid out like its ETensor"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.WARNING, runner.policy.disabled_reason)]


def test_the_fallback_returns_the_right_values_in_the_promised_layout():
    runner = GraphedMethod(policy_view, mechanics=EmulatedGraphs())
    for i in range(6):
        x = torch.full((1,), float(i) - 2.5)
        out = runner(x)
        assert out.stride() == (112, 14, 1)
        assert torch.equal(out, policy_view(x))


def test_only_the_strided_outputs_go_through_host():
    def decode(x):
        logits = x.reshape(1, 1, 1) * torch.arange(24.0).reshape(1, 4, 6)
        return {"logits": logits[:, -1, :], "hidden": logits.sum(-1), "attention": logits.transpose(1, 2)}

    runner = GraphedMethod(decode, method="decode", mechanics=EmulatedGraphs())
    for i in range(5):
        x = torch.full((1,), float(i + 1))
        out = runner(x)
        expected = decode(x)
        assert out.keys() == expected.keys()
        assert all(torch.equal(out[k], expected[k]) and out[k].is_contiguous() for k in out)
    assert runner.policy.disabled_reason == disabled_message("decode", 0)  # the first in return order
    assert (runner.stats.host_copies, runner.stats.device_copies) == (5 * 2, 5 * 1)


def test_a_promised_dim_order_other_than_contiguous_is_honoured():
    def transposed(x):
        return (x.reshape(1, 1, 1) * torch.arange(24.0).reshape(2, 3, 4)).transpose(1, 2)

    runner = GraphedMethod(transposed, [(0, 2, 1)], mechanics=EmulatedGraphs())
    steps_of(runner, 6)
    assert runner.graph_captured and runner.stats.host_copies == 0
    out = runner(torch.full((1,), 2.0))
    assert out.stride() == (12, 1, 4) and torch.equal(out, transposed(torch.full((1,), 2.0)))


def test_an_output_strided_only_at_capture_turns_graphs_off_there_and_stays_correct(caplog):
    calls = []

    def strided_from_the_fourth_call(x):
        calls.append(x)
        return policy_view(x) if len(calls) >= WARMUP_CALLS + 1 else policy_dense(x)

    spy = Spy()
    runner = GraphedMethod(strided_from_the_fourth_call, method="policy", mechanics=spy)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        steps = steps_of(runner, 4)
        x = torch.full((1,), 9.0)
        assert runner.policy.next_step() is Step.EAGER
        assert torch.equal(runner(x), policy_view(x))
    assert steps == [Step.WARMUP] * 3 + [Step.CAPTURE]
    assert not runner.graph_captured
    assert (spy.captures, spy.replays) == (1, 1)  # the capture's own replay, then no more
    assert runner.stats.host_copies == 2 and runner.stats.device_copies == 3
    assert [r.getMessage() for r in caplog.records] == [disabled_message("policy", 0)]


def test_a_replay_with_another_input_shape_is_refused():
    runner = GraphedMethod(lambda x: x * 2, mechanics=EmulatedGraphs())
    steps_of(runner, 5, make_input=lambda i: torch.ones(3))
    with pytest.raises(ValueError, match=r"input 0 is \[4\] torch.float32, the graph was captured with \[3\]"):
        runner(torch.ones(4))


def test_the_number_of_promised_layouts_must_match_the_outputs():
    runner = GraphedMethod(lambda x: (x, x), [(0,)], method="pair", mechanics=EmulatedGraphs())
    with pytest.raises(ValueError, match="'pair' returned 2 outputs for 1 promised layouts"):
        runner(torch.ones(2))


def test_non_tensor_outputs_are_refused():
    runner = GraphedMethod(lambda x: (x, 3), mechanics=EmulatedGraphs())
    with pytest.raises(TypeError, match="'forward' output 1 is a int"):
        runner(torch.ones(2))


# Promised layouts read from programs


def test_promised_layouts_of_the_bundled_aten_programs_are_contiguous():
    assert promised_dim_orders(export_policy()) == ((0, 1, 2),)
    assert promised_dim_orders(export_decode_step()) == ((0, 1),)


# The GPU benchmark, where there is no GPU


def test_the_gpu_benchmark_skips_cleanly_without_a_gpu(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "bench" / "gpu.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu.json"
    assert bench.main(["--out", str(out), "--plot", str(tmp_path / "gpu.png")]) == 0
    result = json.loads(out.read_text())
    assert result["skipped"] is True and "no CUDA device" in result["reason"]
    assert "skipped" in capsys.readouterr().out
    assert not (tmp_path / "gpu.png").exists()

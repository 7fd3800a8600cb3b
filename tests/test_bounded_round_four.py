"""Bounded, round four: what a handed program asks for, and what a lowering for a missing device leaves behind.

Each finding is rebuilt here from a program made in the test: a layout request
the program records that no user could give, a forged copy tag, a pushed-down
piece inheriting its producer's request, an impossible GPU, SDPA with an empty
head dimension, the compile workers a lowering started, the patched torch
another thread saw, and an interrupt at any line of the lowering.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import strideguard
from strideguard.compiler.oracle import fake_device
from strideguard.compiler.oracle.lowering import lower_outputs
from strideguard.compiler.targets import resolve_target
from strideguard.program.copies import COPY_TAG, copy_form_of
from strideguard.program.exported import output_values
from strideguard.program.promises import LAYOUT_TAG, RecordedLayoutRefused

SM87 = resolve_target("cuda:sm87", function="test")


class Narrow(nn.Module):
    def forward(self, x):
        return (x * 2)[:, :1]


def _narrow():
    return torch.export.export(Narrow(), (torch.randn(4, 16),))


def _recording(program, request):
    """``program`` (a copy) whose returned node records ``request`` for user output 0, as a file may."""
    program = copy.deepcopy(program)
    node = output_values(program.graph)[0]
    node.meta["custom"] = {**node.meta.get("custom", {}), LAYOUT_TAG: request}
    return program


@pytest.mark.parametrize("request_", [{"0": [1, 1]}, {"0": [7, 0]}, {"0": [0, 0]}, {"0": [True, False]},
                                      {"0": [0]}, {"0": "rows"}, ["0", [1, 0]]])
def test_a_recorded_layout_request_is_checked_as_the_users_and_refused_in_one_line(request_):
    program = _recording(_narrow(), request_)
    for verb in (strideguard.inspect, strideguard.densify_outputs):
        with pytest.raises(RecordedLayoutRefused) as refused:
            verb(program)
        message = str(refused.value)
        assert "\n" not in message and LAYOUT_TAG in message or "user output 0" in message, message
        assert "refused" in message


def test_a_file_that_asks_to_keep_an_output_is_said_to_be_the_files_not_the_users():
    program = _recording(_narrow(), {"0": "keep"})
    [output] = strideguard.inspect(program).outputs
    assert output.reason.value == "kept-by-file" and output.verdict == "kept as compiled, as the file asks"
    assert "as the program file asks" in output.explanation and output.action.value == "none"
    # the user's own request now is the user's, whatever the file says
    mine = strideguard.densify_outputs(program, layouts={0: "keep"})
    [kept] = strideguard.inspect(mine).outputs  # recorded now: the fixed program's file asks it
    assert kept.reason.value == "kept-by-file"
    overruled = strideguard.densify_outputs(program, layouts={0: (0, 1)})
    [dense] = strideguard.inspect(overruled).outputs
    assert dense.in_target_layout is True and dense.reason.value != "kept-by-file"
    assert torch.equal(overruled.module()(torch.ones(4, 16)), program.module()(torch.ones(4, 16)))


def test_a_forged_copy_tag_is_not_taken_for_strideguards_copy():
    program = copy.deepcopy(_narrow())
    node = output_values(program.graph)[0]
    producer = node.args[0]  # the mul: no op a copy is made of
    producer.meta["custom"] = {COPY_TAG: "kept"}
    node.meta["custom"] = {COPY_TAG: "forged"}
    assert copy_form_of(producer) is None and copy_form_of(node) is None
    [output] = strideguard.inspect(program).outputs
    assert output.action.value == "copy" and output.copy_of is None and "strideguard" not in output.explanation
    fixed = strideguard.densify_outputs(program)
    assert copy_form_of(output_values(fixed.graph)[0]) == "kept"


class LastRow(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 12)

    def forward(self, x):
        return self.head(x)[:, -1, :]


def test_a_pushed_down_piece_carries_no_request_its_producer_recorded():
    program = torch.export.export(LastRow().eval(), (torch.randn(2, 5, 8),))
    program = copy.deepcopy(program)
    [producer] = [n for n in program.graph.nodes if n.op == "call_function" and "linear" in str(n.target)]
    producer.meta["custom"] = {LAYOUT_TAG: {"0": "keep"}}
    lean = strideguard.densify_outputs(program, pushdown=True)
    [output] = strideguard.inspect(lean).outputs
    assert output.reason.value not in ("kept", "kept-by-file"), output
    assert all(LAYOUT_TAG not in node.meta.get("custom", {}) for node in lean.graph.nodes if node.op == "call_function"
               and node is not output_values(lean.graph)[0])


@pytest.mark.parametrize("device", ["cuda:sm00", "cuda:sm999", "cuda:sm61", "cuda:sm_05"])
def test_only_gpus_inductor_compiles_for_are_targets(device):
    with pytest.raises(ValueError, match="names no CUDA GPU Inductor compiles for"):
        strideguard.inspect(_narrow(), device=device)
    assert resolve_target("cuda:sm87", function="t").sm == "sm87"
    assert resolve_target("cuda:sm100", function="t").sm == "sm100"


class EmptyHeads(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


@pytest.mark.lowers
def test_sdpa_with_an_empty_head_dimension_is_judged_for_cuda():
    q = torch.randn(1, 2, 4, 0, dtype=torch.bfloat16)
    program = torch.export.export(EmptyHeads(), (q, q.clone(), q.clone()))
    report = strideguard.inspect(program, exact=True, device="cuda")
    [output] = report.outputs
    assert output.shape == (1, 2, 4, 0) and output.kind.value == "tensor"
    assert strideguard.densify_outputs(program, exact=True, device="cuda") is not None


def _children() -> set[int]:
    """This process's child processes, from the kernel's own list."""
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        text = (task / "children").read_text().split()
        found.update(int(pid) for pid in text)
    return found


@pytest.mark.lowers
def test_a_lowering_for_cuda_starts_no_process_and_leaves_nothing_running():
    from torch._inductor import async_compile

    before, pools = _children(), len(async_compile._pool_set)
    program = torch.export.export(nn.Linear(8, 6), (torch.randn(3, 8),))
    strideguard.inspect(program, exact=True, device="cuda")
    strideguard.densify_outputs(program, exact=True, device="cuda")
    assert _children() <= before and len(async_compile._pool_set) == pools


def _untouched() -> dict:
    """Every name the lowering patches, as torch has it outside a lowering."""
    from torch._dynamo.device_interface import CudaInterface
    from torch._inductor.fx_passes import pad_mm
    from torch._inductor.runtime.hints import DeviceProperties
    from torch._subclasses.fake_tensor import FakeTensor

    import inspect

    names = [(torch.cuda, n) for n in ("get_device_properties", "get_device_capability", "is_bf16_supported",
                                       "device_count", "current_device")]
    names += [(CudaInterface, n) for n in ("get_device_properties", "get_compute_capability", "device_count")]
    names += [(FakeTensor, n) for n in ("tolist", "item", "__getitem__")]
    names += [(pad_mm, n) for n in ("_should_pad", "get_cached_should_pad", "has_triton")]
    names += [(DeviceProperties, "create"), (torch._C, "_conv_determine_backend_memory_format")]
    return {(id(obj), name): inspect.getattr_static(obj, name) for obj, name in names}


@pytest.mark.lowers
def test_another_thread_sees_torch_as_it_was_while_a_lowering_runs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    inside, release, seen = threading.Event(), threading.Event(), {}

    def pause(graph):
        inside.set()
        release.wait(60)

    program = torch.export.export(nn.Linear(8, 6), (torch.randn(3, 8),))
    lowering = threading.Thread(target=lambda: lower_outputs(
        program, target=SM87, inductor_configs={"post_grad_custom_post_pass": pause}))
    lowering.start()
    assert inside.wait(120)
    try:
        seen["count"] = torch.cuda.device_count()
        for ask in (torch.cuda.get_device_capability, lambda: torch.cuda.get_device_properties(0)):
            with pytest.raises((AssertionError, RuntimeError)):
                ask()
        with FakeTensorMode():
            fake = torch.zeros(3, device="cuda")
        with pytest.raises(Exception):
            fake.tolist()
        seen["lock_held"] = not _lowering_slot_free()
    finally:
        release.set()
        lowering.join(120)
    assert seen == {"count": 0, "lock_held": True}
    # two lowerings in two threads: the second waits for the first, both succeed
    results = []
    threads = [threading.Thread(target=lambda: results.append(lower_outputs(program, target=SM87))) for _ in range(2)]
    for each in threads:
        each.start()
    for each in threads:
        each.join(300)
    assert len(results) == 2 and results[0].outputs[0].strides == results[1].outputs[0].strides == (6, 1)


def _lowering_slot_free() -> bool:
    """Whether another thread could start a lowering now (the slot is re-entrant for its holder)."""
    free = []

    def attempt():
        if fake_device._LOCK.acquire(blocking=False):
            fake_device._LOCK.release()
            free.append(True)

    probe = threading.Thread(target=attempt)
    probe.start()
    probe.join(10)
    return bool(free)


_WATCHED = {"lowering_for", "patched", "_leave_dispatch_modes", "on_target", "_lower", "_lower_for", "one_lowering",
            "_lower_holding",
            "benchmark_answers", "convolution_formats", "inserted_attention", "_lower_once"}


def _undoing_lines() -> set:
    """The lines of ``patched``'s ``finally`` (no signal can land on a bare ``try:``, which the trace still
    reports; an interrupt inside either undo is caught by the other)."""
    import inspect

    lines, first = inspect.getsourcelines(fake_device.patched.__wrapped__)
    start = next(i for i, text in enumerate(lines) if text.strip() == "finally:" and "yield" in lines[i - 1])
    return {("patched", first + i) for i in range(start, len(lines))}


_UNDOING = _undoing_lines()


def _interrupt_at(point: int) -> tuple[int, bool]:
    """Lower with a KeyboardInterrupt raised at the ``point``-th line strideguard's lowering runs in the
    functions that patch and restore; returns how many such lines ran and whether it was interrupted."""
    count = [0]

    def trace(frame, event, arg):
        if frame.f_code.co_name not in _WATCHED:
            return None

        def line(frame, event, arg):
            if event == "line" and (frame.f_code.co_name, frame.f_lineno) not in _UNDOING:
                count[0] += 1
                if count[0] == point:
                    raise KeyboardInterrupt
            return line

        return line

    program = torch.export.export(nn.Linear(8, 6), (torch.randn(3, 8),))
    sys.settrace(trace)
    try:
        lower_outputs(program, target=SM87)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.settrace(None)
    return count[0], interrupted


@pytest.mark.lowers
def test_an_interrupt_at_any_line_of_the_lowering_leaves_torch_as_it_was():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    untouched = _untouched()
    lines, _ = _interrupt_at(0)  # counted, not interrupted
    assert lines > 20
    interrupted = 0
    for point in range(1, lines + 1, max(1, lines // 40)):
        _, was = _interrupt_at(point)
        interrupted += was
        assert _untouched() == untouched, point
        assert _get_current_dispatch_mode_stack() == [], point
        assert _lowering_slot_free(), point
        assert torch.cuda.device_count() == 0
    assert interrupted >= 20

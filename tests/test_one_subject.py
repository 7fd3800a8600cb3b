"""One subject, one path: what a call was handed is read once, and a mode with a lowering runs one path.

Each public entry point builds one ``Subject`` (``strideguard.decide.subject``)
and every stage reads it. These tests count, with ``sys.setprofile``, how often
the questions the subject answers are asked of the program during one call:
its dialect, its output names, its target device, its backend, the layouts
asked. Each is asked once, at the entry, whatever the mode; before the
subject, ``prepare_for_aoti`` resolved the backend twice and asked the
dialect twice, and ``densify_outputs`` with layouts asked the names and the
dialect twice each.
A graph's ops are normalised once per plan (``GraphOps``), not per question.
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from torch import nn

import strideguard
from strideguard.compiler.backends import resolve_backend
from strideguard.compiler.targets import target_for
from strideguard.decide.subject import Subject, subject_of
from strideguard.decide.user_layouts import resolve_layouts
from strideguard.examples import export_robot_policy
from strideguard.compiler.oracle.lowering import Lowering, LoweredOutput
from strideguard.program.dialect import aten_op, dialect_of, graph_ops
from strideguard.program.exported import placeholder_roles, verifier_accepts
from strideguard.program.naming import output_names
from strideguard.program.promises import requested_layouts

ASKED_ONCE = {function.__code__: function.__name__ for function in (
    dialect_of, output_names, target_for, resolve_backend, resolve_layouts, requested_layouts, placeholder_roles,
    verifier_accepts,
)}


@contextmanager
def counting(codes):
    """Counts the calls of each code object in ``codes`` while the block runs."""
    calls: Counter = Counter()

    def profile(frame, event, _arg):
        if event == "call" and frame.f_code in codes:
            calls[codes[frame.f_code]] += 1

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 16)

    def forward(self, x):
        hidden = self.trunk(x)
        return {"first": hidden[:, :3], "rest": hidden[:, 3:].relu()}


@pytest.fixture(scope="module")
def two_heads():
    return torch.export.export(TwoHeads().eval(), (torch.randn(4, 8),))


@pytest.mark.parametrize("call", ["inspect", "densify_outputs", "densify_outputs with layouts", "prepare_for_aoti"])
def test_each_question_the_subject_answers_is_asked_once_per_call(two_heads, call):
    entry = {
        "inspect": lambda: strideguard.inspect(two_heads),
        "densify_outputs": lambda: strideguard.densify_outputs(two_heads, pushdown=True),
        "densify_outputs with layouts": lambda: strideguard.densify_outputs(two_heads, layouts={"rest": "keep"}),
        "prepare_for_aoti": lambda: strideguard.prepare_for_aoti(two_heads),
    }[call]
    with counting(ASKED_ONCE) as calls:
        entry()
    assert calls == {name: 1 for name in ASKED_ONCE.values()}, dict(calls)


@pytest.mark.lowers
def test_with_a_lowering_the_subject_is_still_read_once():
    """The closed loop lowers the program and the fixed one again: neither lowering asks the program anything
    the subject holds."""
    program = export_robot_policy()
    asked = ASKED_ONCE
    with counting(asked) as calls:
        fixed = strideguard.densify_outputs(program, exact=True)
    assert calls == {name: 1 for name in asked.values()}, dict(calls)
    assert fixed.graph_module.meta["strideguard_proof"].names == subject_of(program, "test").names


def test_a_subject_is_frozen_and_names_the_outputs_in_the_users_words(two_heads):
    subject = subject_of(two_heads, "densify_outputs", layouts={"first": "keep"})
    assert subject.names == ("first", "rest")
    assert [out.index for out in subject.outputs] == [0, 1]
    assert subject.layouts == {0: "keep"} and str(subject.target) == "cpu" and subject.backend is None
    with pytest.raises(AttributeError):
        subject.names = ()  # type: ignore[misc]
    bare = Subject.of_graph(two_heads.graph, two_heads.graph_signature, subject.dialect, "t")
    assert bare.names == ("[0]", "[1]") and bare.program is None and bare.dialect == subject.dialect


def test_a_subjects_errors_name_the_entry_point(two_heads):
    with pytest.raises(ValueError, match=r"strideguard\.prepare_for_aoti: layouts\['nope'\]: no output is named 'nope'"):
        subject_of(two_heads, "prepare_for_aoti", layouts={"nope": "keep"})
    with pytest.raises(TypeError, match=r"strideguard\.densify_outputs"):
        subject_of("not a program", "densify_outputs")


def test_a_graphs_ops_are_normalised_once_and_agree_with_each_question():
    pytest.importorskip("executorch")
    from strideguard.testing.executorch_cpu import aoti_edge_program

    edge = aoti_edge_program(torch.export.export(TwoHeads().eval(), (torch.randn(4, 8),)))
    ops = graph_ops(edge.graph)
    calls = [node for node in edge.graph.nodes if node.op == "call_function"]
    assert set(ops.aten) == set(calls)
    assert all(ops.aten[node] is aten_op(node.target) for node in calls)
    slices = [node for node in calls if "slice_copy" in str(node.target)]
    assert slices and all(aten_op(ops.twin[node]) is torch.ops.aten.slice.Tensor for node in slices)
    assert all(ops.twin[node] is None for node in calls if "_copy" not in str(node.target))


@pytest.mark.compiles
@pytest.mark.lowers
def test_verify_reads_its_program_once(two_heads):
    """``verify`` builds one subject for the program it checks (an ATen program on the CPU is the one
    AOTInductor compiles, so it is the only one)."""
    fixed = strideguard.densify_outputs(two_heads)
    with counting(ASKED_ONCE) as calls:
        report = strideguard.verify(fixed)
    assert calls == {name: 1 for name in ASKED_ONCE.values()}, dict(calls)
    assert report.ok and [check.name for check in report.outputs] == ["first", "rest"]


def test_a_lowering_reads_only_its_own_compiles_outputs():
    """An earlier lowering's stop, left in the context of the exception a later compile raised, is not read
    as the later one's outputs: that compile's own failure is raised instead."""
    from strideguard.compiler.oracle.lowering import _find_lowered, _Lowered

    earlier = _Lowered([LoweredOutput((3, 6), (6, 1), 0, False)], lowering=1)
    try:
        try:
            raise earlier
        except _Lowered:
            raise RuntimeError("the later compile failed otherwise")
    except RuntimeError as error:
        assert _find_lowered(error, 2) is None
        assert _find_lowered(error, 1) is earlier


def test_a_lowering_of_other_outputs_is_refused_not_judged(two_heads, monkeypatch):
    """A lowering whose outputs cannot be the subject's (here a [3, 6] matrix for the [4, 3] output ``first``)
    is refused by name, before any output is judged against it."""
    from strideguard.fix import engine

    subject = subject_of(two_heads, "test")
    first, rest = (LoweredOutput(tuple(v.shape), tuple(v.stride()), 0, False) for v in subject.values)
    refused = {
        "first": (LoweredOutput((3, 6), (6, 1), 0, False), rest),
        "rest": (first, LoweredOutput((52,), (1,), 0, False)),
    }
    for name, outputs in refused.items():
        monkeypatch.setattr(engine, "_lower_as_compiled", lambda *_, outputs=outputs: Lowering(outputs, 0.0))
        with pytest.raises(RuntimeError, match=rf"for output \d \({name}\), whose shape is .*not this program's"):
            engine.lower_as_compiled(two_heads, subject)
        with pytest.raises(RuntimeError, match=rf"\({name}\), whose shape is"):
            strideguard.densify_outputs(two_heads, exact=True)
    monkeypatch.setattr(engine, "_lower_as_compiled", lambda *_: Lowering((first, rest), 0.0))
    assert engine.lower_as_compiled(two_heads, subject).outputs == (first, rest)


def test_the_drop_in_handed_a_program_speaks_of_its_outputs_by_name(caplog):
    """``AotiBackend.preprocess`` hands the drop-in the whole program: its decisions name each output as the
    user's code does; handed a bare graph module, it can only number them."""
    pytest.importorskip("executorch")
    import copy
    import logging

    from strideguard.executorch import ReplaceViewCopyWithViewPass
    from strideguard.testing.executorch_cpu import aoti_edge_program

    edge = aoti_edge_program(torch.export.export(TwoHeads().eval(), (torch.randn(4, 8),)))
    decided = {}
    for handed in ("program", "graph module"):
        program = copy.copy(edge)
        program._graph_module = copy.deepcopy(edge.graph_module)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="strideguard"):
            ReplaceViewCopyWithViewPass()(program if handed == "program" else program.graph_module)
        decided[handed] = sorted(m.split(":")[0] for m in caplog.messages if m.endswith(")") and ": " in m)
    assert decided == {"program": ["first", "rest"], "graph module": ["[0]", "[1]"]}, decided


def test_a_fixed_program_is_proven_against_the_subjects_promise(two_heads):
    """The closed loop holds a fixed program to the subject's target orders, never to what the fixed program's
    own metadata says of them: a fix records only what was asked, and a file or a pass may write anything
    there. Here the fixed program records dim order (1, 0) for ``first``; the subject promises (0, 1)."""
    from strideguard.program.exported import copy_graph, output_values, rebuild
    from strideguard.program.promises import LAYOUT_TAG, target_dim_orders
    from strideguard.prove.proof import judged_outputs

    subject = subject_of(two_heads, "test")
    graph = copy_graph(two_heads)
    first = output_values(graph)[subject.outputs[0].position]
    first.meta["custom"] = {**first.meta.get("custom", {}), LAYOUT_TAG: {"0": [1, 0]}}
    fixed = rebuild(two_heads, graph)
    assert target_dim_orders(fixed)[0] == (1, 0) and subject.target_orders[0] == (0, 1)

    shape = tuple(subject.values[0].shape)
    rest = LoweredOutput(tuple(subject.values[1].shape), tuple(subject.values[1].stride()), 0, False)
    dense = LoweredOutput(shape, (shape[1], 1), 0, False)
    transposed = LoweredOutput(shape, (1, shape[0]), 0, False)
    judged = judged_outputs(fixed, subject, Lowering((dense, rest), 0.0))
    assert judged[0].order == (0, 1) and not judged[0].out_of_layout
    judged = judged_outputs(fixed, subject, Lowering((transposed, rest), 0.0))
    assert judged[0].out_of_layout and judged[0].order == (0, 1)
    assert "strideguard_layout" not in (two_heads.graph.output_node().args[0][0].meta.get("custom") or {})

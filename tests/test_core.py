"""The core contract on ATen programs, proven by compiling with AOTInductor and running."""

from __future__ import annotations

import os
import re

import pytest
import sympy
import torch

import strideguard
from strideguard import Action, Alias, AliasKind, Reason
from strideguard.program.copies import copy_form_of, CopyForm
from strideguard.program.density import has_layout
from strideguard.program.copies import copied_source
from strideguard.program.copies import output_copies
from strideguard.prove.verification import check_compiled

from . import programs
from .conftest import run_compiled, run_eager

OUTPUT_NAMES = list(programs.EveryOutput()(*programs.every_output_inputs()).keys()) + ["twice_b", "half_0", "half_1"]


def index(name: str) -> int:
    return OUTPUT_NAMES.index(name)


def is_tensor_output(layout) -> bool:
    return layout.kind == "tensor"


def in_exact_layout(value: torch.Tensor) -> bool:
    """Strides exactly those a runtime derives for a contiguous tensor, size-one dimensions included."""
    return has_layout(value.shape, value.stride(), range(value.dim())) is True


def concrete(values, batch: int) -> tuple:
    """Sizes or strides from a report with the one dynamic dimension set to ``batch``."""
    return tuple(
        v if isinstance(v, int) else int(sympy.sympify(v).subs({s: batch for s in sympy.sympify(v).free_symbols}))
        for v in values
    )


def test_inspect_predicts_the_strides_aotinductor_returns(every_output, every_output_compiled):
    report = strideguard.inspect(every_output)
    compiled = run_compiled(every_output_compiled, programs.every_output_inputs(2))
    assert len(report.outputs) == len(OUTPUT_NAMES) == len(compiled)
    for layout, value in zip(report.outputs, compiled):
        if not is_tensor_output(layout):
            continue
        assert concrete(layout.shape, 2) == tuple(value.shape), OUTPUT_NAMES[layout.index]
        if value.numel() > 1:
            assert concrete(layout.strides, 2) == value.stride(), OUTPUT_NAMES[layout.index]
        assert layout.contiguous == value.is_contiguous(), OUTPUT_NAMES[layout.index]


def test_a_copy_is_planned_exactly_where_aotinductor_returns_non_contiguous(every_output, every_output_compiled):
    report = strideguard.inspect(every_output)
    compiled = run_compiled(every_output_compiled, programs.every_output_inputs(2))
    planned = {o.index for o in report.outputs if o.action is Action.COPY}
    measured = {i for i, v in enumerate(compiled) if isinstance(v, torch.Tensor) and not in_exact_layout(v)}
    assert planned == measured
    assert not report.ok
    # Views that cost nothing: dim-0 select, full slice, viewing reshape, zero-size, 0-dim.
    for name in ("select_first", "full_slice", "reshape_views", "reshape_copies", "zero_size", "zero_dim", "input"):
        assert report.outputs[index(name)].action is Action.NONE, name


def test_unfixed_program_really_returns_strided_outputs(every_output, every_output_compiled):
    compiled = run_compiled(every_output_compiled, programs.every_output_inputs(2))
    assert compiled[index("slice_last")].stride() == (48, 16, 1)
    assert compiled[index("split_1")].storage_offset() == 10
    assert compiled[index("transpose")].stride() == (48, 1, 16)


def test_the_gpu_scripts_runner_loader_returns_what_torchs_package_loader_returns(every_output_compiled, compile_dir):
    """bench/aoti_loader.py loads a package through torch's container runner where the package loader
    crashes (a GPU image); it must hand back the same outputs, strides and storage offsets included."""
    from bench.aoti_loader import RunnerModel

    inputs = programs.every_output_inputs(2)
    expected = run_compiled(every_output_compiled, inputs)
    with torch.no_grad():
        loaded = torch.utils._pytree.tree_leaves(
            RunnerModel(os.path.join(compile_dir, "every-output", "program.pt2"))(*inputs), is_leaf=lambda x: x is None)
    assert len(loaded) == len(expected)
    for name, got, want in zip(OUTPUT_NAMES, loaded, expected):
        if isinstance(want, torch.Tensor):
            assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset()), name
            assert torch.equal(got, want), name
        else:
            assert got == want, name


def test_causes_name_the_view_chain(every_output):
    report = strideguard.inspect(every_output)
    assert report.outputs[index("slice_last")].cause == "slice(dim=2, 0:14) of linear"
    assert report.outputs[index("split_1")].cause == "chunk 1 of split_with_sizes([10, 6], dim=-1) of linear"
    assert report.outputs[index("unsqueeze_strided")].cause == "unsqueeze(1) of slice(dim=2, 0:4) of linear"
    assert report.outputs[index("weight_t")].view_of == "parameter lin.weight"
    assert report.outputs[index("input_slice")].view_of == "input x"


def test_aliases_are_reported(every_output):
    report = strideguard.inspect(every_output)
    aliases = {o.index: {(a.kind, a.name) for a in o.aliases} for o in report.outputs}
    assert (AliasKind.INPUT, "x") in aliases[index("input")]
    assert (AliasKind.INPUT, "x") in aliases[index("input_slice")]
    assert (AliasKind.BUFFER, "table") in aliases[index("buffer_view")]
    assert (AliasKind.PARAMETER, "lin.weight") in aliases[index("weight_t")]
    # Outputs sharing one memory form a group: each names the group's first, the first names the second.
    group = [index("twice_a"), index("twice_b"), index("half_0"), index("half_1")]
    assert aliases[group[0]] == {(AliasKind.OUTPUT, group[1])}
    for member in group[1:]:
        assert aliases[member] == {(AliasKind.OUTPUT, group[0])}
    assert aliases[index("reshape_copies")] == set()


def copy_nodes(copy) -> list:
    """The nodes of one inserted copy, from the returned one back to what it copies (``copies.copied_source``)."""
    nodes = []
    while copy_form_of(copy) is not None:
        nodes.append(copy)
        copy = copy.args[0]
    return nodes


def test_densify_inserts_one_copy_per_flagged_output_and_nothing_else(every_output, every_output_fixed):
    report = strideguard.inspect(every_output)
    flagged = [o.index for o in report.outputs if o.action is Action.COPY]
    before = [n for n in every_output.graph.nodes]
    after = [n for n in every_output_fixed.graph.nodes]
    new_nodes = [n for n in after if n.name not in {b.name for b in before}]
    copies = output_copies(every_output_fixed.graph)
    assert len(copies) == len(flagged)
    # what a copy is made of is program/copies.py's to know: each is whole in the form Inductor keeps, and dense
    assert set(new_nodes) == {n for copy in copies for n in copy_nodes(copy)}
    assert all(copy_form_of(copy) == CopyForm.KEPT.value for copy in copies)
    assert all(copy.meta["val"].is_contiguous() for copy in copies)
    returned = list(every_output_fixed.graph.output_node().args[0])
    user = [s for s in every_output_fixed.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]
    for i in flagged:
        spec = user[i]
        node = next(n for n in copies if n.name == spec.arg.name)
        assert node in returned
        source = copied_source(node)
        assert node.meta["stack_trace"] == source.meta.get("stack_trace")
        value = node.meta["val"]
        assert tuple(value.shape) == tuple(source.meta["val"].shape)
        assert value.is_contiguous() and value.dtype == source.meta["val"].dtype
    assert strideguard.inspect(every_output_fixed).ok
    every_output_fixed.validate()


def test_input_program_is_untouched_and_weights_are_shared(every_output, every_output_fixed):
    fresh = programs.export_every_output()
    assert str(every_output.graph) == str(fresh.graph)

    def shapes(program):
        return [str(getattr(n.meta.get("val"), "shape", None)) for n in program.graph.nodes]

    # Symbolic sizes stay symbolic: no pass may specialize the program's shape environment.
    assert shapes(every_output) == shapes(fresh) and any(re.search(r"\bs\d+", s) for s in shapes(every_output))
    assert every_output.graph_signature == fresh.graph_signature
    for name, tensor in every_output.state_dict.items():
        assert every_output_fixed.state_dict[name] is tensor
    for name, value in every_output.constants.items():
        assert every_output_fixed.constants[name] is value


def test_buffer_mutation_output_is_left_alone(every_output, every_output_fixed):
    def mutation_specs(program):
        return [(s.kind, s.arg.name, s.target) for s in program.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION"]

    assert mutation_specs(every_output_fixed) == mutation_specs(every_output) != []


def test_fixed_program_is_bitwise_equal_eagerly(every_output, every_output_fixed):
    for batch in (2, 5):
        inputs = programs.every_output_inputs(batch)
        for original, fixed in zip(run_eager(every_output, inputs), run_eager(every_output_fixed, inputs)):
            if isinstance(original, torch.Tensor):
                assert torch.equal(original, fixed) or (original.numel() == 0 and fixed.numel() == 0)
            else:
                assert original == fixed


@pytest.mark.parametrize("batch", [2, 5])
def test_fixed_program_compiled_returns_every_output_dense_and_equal(every_output, every_output_compiled, every_output_fixed_compiled, batch):
    inputs = programs.every_output_inputs(batch)
    unfixed = run_compiled(every_output_compiled, inputs)
    fixed = run_compiled(every_output_fixed_compiled, inputs)
    for i, (a, b) in enumerate(zip(unfixed, fixed)):
        if isinstance(b, torch.Tensor):
            assert in_exact_layout(b), OUTPUT_NAMES[i]
            assert torch.equal(a, b), OUTPUT_NAMES[i]
    report = check_compiled(every_output_fixed_compiled.program, every_output_fixed_compiled.run, inputs)
    assert report.ok, str(report)


def test_verify_reports_strided_outputs_of_the_unfixed_program(every_output, every_output_compiled):
    report = check_compiled(every_output, every_output_compiled.run, programs.every_output_inputs(2), more_inputs=[programs.every_output_inputs(7)])
    assert not report.ok
    assert all(o.match for o in report.outputs)
    assert not report.outputs[index("slice_last")].in_target_layout
    assert Alias(AliasKind.INPUT, "x") in report.outputs[index("input")].aliases
    assert Alias(AliasKind.OUTPUT, index("twice_b")) in report.outputs[index("twice_a")].aliases
    assert report.runs and all(o.match for o in report.runs[0][1])


def test_break_aliases_gives_every_output_its_own_memory(every_output, every_output_unaliased_compiled):
    inputs = programs.every_output_inputs(3)
    outputs = run_compiled(every_output_unaliased_compiled, inputs)
    input_storages = {t.untyped_storage().data_ptr() for t in inputs}
    seen = set()
    for i, value in enumerate(outputs):
        if not isinstance(value, torch.Tensor) or value.numel() == 0:
            continue
        pointer = value.untyped_storage().data_ptr()
        assert pointer not in input_storages, OUTPUT_NAMES[i]
        assert pointer not in seen, OUTPUT_NAMES[i]
        assert value.is_contiguous()
        seen.add(pointer)
    for a, b in zip(outputs, run_eager(every_output, inputs)):
        if isinstance(b, torch.Tensor):
            assert torch.equal(a, b)


def test_break_aliases_copies_only_outputs_that_still_share(every_output):
    """The copies ``break_aliases`` adds, counted from what the densified program returns when run eagerly
    (not from ``inspect``): one for each non-empty output sharing memory with an input or a weight, and
    one for each output but the first in a group sharing memory with each other."""
    fixed = strideguard.densify_outputs(every_output)
    unaliased = strideguard.densify_outputs(every_output, break_aliases=True)
    added = len(output_copies(unaliased.graph)) - len(output_copies(fixed.graph))
    inputs = programs.every_output_inputs(3)
    held = [*inputs, *fixed.state_dict.values(), *fixed.constants.values()]
    outside = {t.untyped_storage().data_ptr() for t in held if isinstance(t, torch.Tensor)}
    groups: dict[int, int] = {}
    expected = 0
    for value in run_eager(fixed, inputs):
        if not isinstance(value, torch.Tensor) or value.numel() == 0:
            continue
        pointer = value.untyped_storage().data_ptr()
        if pointer in outside:
            expected += 1
        else:
            groups[pointer] = groups.get(pointer, 0) + 1
    expected += sum(count - 1 for count in groups.values())
    assert added == expected > 0


@pytest.mark.compiles
@pytest.mark.lowers
def test_control_flow_outputs_are_copied_and_said_so(compile_dir):
    program = programs.export_branchy()
    report = strideguard.inspect(program)
    first, second, third = report.outputs
    assert first.action is Action.COPY and first.reason is Reason.CONTROL_FLOW
    assert second.action is Action.COPY and second.reason is Reason.CONTROL_FLOW
    assert third.action is Action.COPY and third.reason is Reason.STRIDED
    fixed = strideguard.densify_outputs(program)
    result = strideguard.verify(fixed)
    assert result.ok, str(result)
    assert [o.contiguous for o in result.outputs] == [True, True, True]


def test_symbolic_strides_that_cannot_be_proven_are_copied():
    program = programs.export_data_dependent_slice()
    report = strideguard.inspect(program)
    for layout in report.outputs:
        assert layout.in_target_layout is None
        assert layout.action is Action.COPY
        assert layout.reason is Reason.SYMBOLIC
    fixed = strideguard.densify_outputs(program)
    x = torch.randn(3, 8)
    for count in (3, 8):
        for original, dense in zip(program.module()(x, torch.tensor(count)), fixed.module()(x, torch.tensor(count))):
            assert dense.is_contiguous() and torch.equal(original, dense)


@pytest.mark.parametrize("function", [strideguard.inspect, strideguard.densify_outputs, strideguard.prepare_for_aoti, strideguard.verify])
def test_non_programs_are_refused_with_a_type_error(function):
    with pytest.raises(TypeError, match="expects a torch.export.ExportedProgram.*got torch.nn.modules.linear.Linear"):
        function(torch.nn.Linear(2, 2))


def test_a_program_without_strided_outputs_is_returned_equal_with_no_new_node():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x + 1, (x * 2)[0]

    program = torch.export.export(Plain(), (torch.randn(3, 4),))
    fixed = strideguard.densify_outputs(program)
    assert fixed is not program
    assert [n.target for n in fixed.graph.nodes] == [n.target for n in program.graph.nodes]
    assert strideguard.inspect(program).ok


@pytest.mark.compiles
@pytest.mark.lowers
def test_a_size_one_dimension_with_a_foreign_stride_is_copied():
    """``logits[:, -1, :]`` at batch 1 is contiguous to torch, but its strides ``(V * L, 1)``
    are not the ``(V, 1)`` an ETensor has, and ExecuTorch's CUDA runtime compares them literally."""
    from strideguard.examples import export_decode_step

    program = export_decode_step(batch=1, length=8)
    (logits,) = strideguard.inspect(program).outputs
    assert logits.contiguous is True and logits.strides == (4096, 1)
    assert logits.in_target_layout is False and logits.action is Action.COPY
    fixed = strideguard.densify_outputs(program)
    report = strideguard.verify(fixed)
    assert report.ok and report.outputs[0].strides == (512, 1), str(report)

"""What the loader reads from declared metadata costs what the file holds: pieces, dimensions, torch's reader.

The files themselves (a weight of 2**40 declared rows, 150,000 declared
dimensions, the largest program) are in ``test_bounded``; here, in-process,
the rules behind them against torch's own answers.
"""

from __future__ import annotations

import itertools
import typing

import pytest
import sympy
import torch
from torch._export.serde import serialize

from strideguard.files import errors, limits, load_program, pieces
from strideguard.files.program import _check_tensor_meta

aten = torch.ops.aten


def _node(overload, arguments: dict, outputs: int) -> dict:
    inputs = [{"name": "self", "arg": {"as_tensor": {"name": "x"}}, "kind": 1}]
    inputs += [{"name": name, "arg": value, "kind": 1} for name, value in arguments.items()]
    return {"inputs": inputs, "outputs": [{"as_tensors": [{"name": f"p{i}"} for i in range(outputs)]}]}


def _values(sizes: list[int]) -> dict:
    return {"x": {"sizes": [{"as_int": size} for size in sizes]}}


@pytest.mark.parametrize(
    "overload, argument, values",
    [
        (aten.split.Tensor, "split_size", range(0, 7)),
        (aten.unsafe_split.Tensor, "split_size", range(0, 7)),
        (aten.chunk.default, "chunks", range(1, 8)),
        (aten.unsafe_chunk.default, "chunks", range(1, 8)),
        (aten.tensor_split.sections, "sections", range(1, 8)),
    ],
)
def test_the_pieces_counted_are_the_pieces_torch_makes(overload, argument, values):
    """For every size from 0 to 9 on either dimension and every argument: the count ``pieces`` reads off
    the file is the count torch's kernel returns, and a node listing one piece more or less is refused."""
    for size, value, dim in itertools.product(range(10), values, (0, 1)):
        shape = [size, 3] if dim == 0 else [3, size]
        try:
            made = len(overload(torch.empty(shape, device="meta"), value, dim))
        except RuntimeError:
            continue  # an argument torch refuses: no traced graph holds it
        arguments = {argument: {"as_int": value}, "dim": {"as_int": dim}}
        pieces.check_pieces(overload, _node(overload, arguments, made), _values(shape))
        for wrong in (made - 1, made + 1):
            with pytest.raises(errors.Refused, match=f"lists {wrong} pieces"):
                pieces.check_pieces(overload, _node(overload, arguments, wrong), _values(shape))


def test_unbind_counts_the_declared_rows_and_defaults_its_dimension():
    pieces.check_pieces(aten.unbind.int, _node(aten.unbind.int, {}, 4), _values([4, 16]))
    with pytest.raises(errors.Refused, match="lists 4 pieces of aten::unbind.int, which makes 1099511627776"):
        pieces.check_pieces(aten.unbind.int, _node(aten.unbind.int, {}, 4), _values([1 << 40, 16]))


def test_list_returning_operators_outside_the_allow_list_are_refused():
    unlisted = [
        op for op in (aten._foreach_add.List, aten.tensor_split.tensor_indices_or_sections) if pieces.returns_pieces(op)
    ]
    assert len(unlisted) == 2
    for op in unlisted:
        with pytest.raises(errors.Refused, match="returns a list of tensors strideguard cannot count"):
            pieces.check_pieces(op, _node(op, {}, 1), _values([4]))


def test_declared_dimensions_are_capped_before_any_arithmetic_on_them():
    many = {"layout": 7, "dtype": 7, "storage_offset": {"as_int": 0}}
    many["sizes"] = [{"as_int": (1 << 63) - 1}] * 150_000
    many["strides"] = [{"as_int": 0}] * 150_000
    with pytest.raises(errors.Refused, match=f"more than {limits.MAX_DIMS} dimensions"):
        _check_tensor_meta(many, "a weight")
    wide = dict(many, sizes=[{"as_int": 1 << 40}] * 2, strides=[{"as_int": 0}] * 2)
    with pytest.raises(errors.Refused, match="pass int64"):
        _check_tensor_meta(wide, "a weight")


def test_torchs_reader_is_left_as_found_and_reads_the_same_program(tmp_path):
    """The type hints and size expressions torch's reader asks for are answered once per class and text
    only while strideguard reads: afterwards its module's ``typing`` and ``sympy`` are the real ones, and
    the program read is the one saved."""
    from strideguard.examples import export_policy

    program = export_policy(batch=1)
    path = tmp_path / "policy.pt2"
    torch.export.save(program, path)
    loaded = load_program(path)
    assert serialize.typing is typing and serialize.sympy is sympy
    assert loaded.graph_module.code == torch.export.load(path).graph_module.code
    assert [str(n.meta["val"]) for n in loaded.graph.nodes if "val" in n.meta] == [
        str(n.meta["val"]) for n in torch.export.load(path).graph.nodes if "val" in n.meta
    ]

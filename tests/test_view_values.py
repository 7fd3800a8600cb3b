"""the view values's stride arithmetic agrees with torch's own view ops, on every geometry hypothesis can find.

Planning a conversion reads views' geometries from arithmetic, not from
dispatched fake tensors; a view torch would lay out otherwise would be a
wrong plan. Each example builds a strided base on the meta device, applies a
view op there and by arithmetic, and compares shape, strides and storage offset.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from strideguard.program.view_values import Geometry, view_geometry

aten = torch.ops.aten


@st.composite
def bases(draw) -> torch.Tensor:
    """A meta tensor with some strides: contiguous, permuted, sliced, or with an offset."""
    shape = draw(st.lists(st.integers(0, 5), min_size=1, max_size=4))
    base = torch.empty(shape, device="meta")
    if draw(st.booleans()):
        base = base.permute(draw(st.permutations(range(len(shape)))))
    if draw(st.booleans()) and base.dim():
        dim = draw(st.integers(0, base.dim() - 1))
        start = draw(st.integers(0, max(base.shape[dim] - 1, 0)))
        base = base.narrow(dim, start, base.shape[dim] - start)
    return base


@st.composite
def views(draw, base: torch.Tensor) -> tuple:
    ndim = base.dim()
    dim = draw(st.integers(-ndim, ndim - 1))
    size = base.shape[dim]
    choice = draw(st.sampled_from(
        ["slice", "select", "narrow", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze", "squeeze_dim",
         "squeeze_dims", "split", "split_with_sizes", "unbind", "diagonal", "view", "alias"]
    ))
    bound = st.none() | st.integers(-size - 2, size + 2)
    if choice == "slice":
        return aten.slice.Tensor, (dim, draw(bound), draw(bound), draw(st.integers(1, 3)))
    if choice == "select":
        return aten.select.int, (dim, draw(st.integers(-size, max(size - 1, 0))))
    if choice == "narrow":
        start = draw(st.integers(-size, size))
        return aten.narrow.default, (dim, start, draw(st.integers(0, size)))
    if choice == "permute":
        return aten.permute.default, (draw(st.permutations(range(ndim))),)
    if choice == "transpose":
        return aten.transpose.int, (dim, draw(st.integers(-ndim, ndim - 1)))
    if choice == "t":
        return aten.t.default, ()
    if choice == "expand":
        leading = draw(st.lists(st.integers(0, 3), max_size=2))
        sizes = [draw(st.sampled_from([-1, s, 3])) if s == 1 else draw(st.sampled_from([-1, s])) for s in base.shape]
        return aten.expand.default, (leading + sizes,)
    if choice == "unsqueeze":
        return aten.unsqueeze.default, (draw(st.integers(-ndim - 1, ndim)),)
    if choice == "squeeze":
        return aten.squeeze.default, ()
    if choice == "squeeze_dim":
        return aten.squeeze.dim, (dim,)
    if choice == "squeeze_dims":
        return aten.squeeze.dims, (sorted({dim % ndim, draw(st.integers(0, ndim - 1))}),)
    if choice == "split":
        return aten.split.Tensor, (draw(st.integers(1, max(size, 1))), dim)
    if choice == "split_with_sizes":
        sizes, left = [], size
        while left:
            sizes.append(draw(st.integers(1, left)))
            left -= sizes[-1]
        return aten.split_with_sizes.default, (sizes, dim)
    if choice == "unbind":
        return aten.unbind.int, (dim,)
    if choice == "diagonal":
        return aten.diagonal.default, (draw(st.integers(-3, 3)), dim, draw(st.integers(-ndim, ndim - 1)))
    if choice == "view":
        return aten.view.default, ([-1],)
    return aten.alias.default, ()


@settings(max_examples=1500, deadline=None)
@given(data=st.data())
def test_view_geometry_is_torchs(data):
    base = data.draw(bases())
    op, args = data.draw(views(base))
    try:
        expected = op(base, *args)
    except (RuntimeError, IndexError, ValueError, TypeError):
        return  # not a view torch takes: a traced graph never holds it
    found = view_geometry(op, Geometry.of(base), args, {})
    if found is None:
        return  # the view values dispatches instead; never wrong, only slower
    expected_list = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    found_list = found if isinstance(found, list) else [found]
    assert len(found_list) == len(expected_list)
    for got, want in zip(found_list, expected_list):
        assert (got.shape, got.strides, got.offset) == (tuple(want.shape), want.stride(), want.storage_offset()), (
            op, tuple(base.shape), base.stride(), base.storage_offset(), args
        )


def test_common_views_are_answered_by_arithmetic():
    """The views planning meets most are never dispatched."""
    tensor = torch.empty(4, 6, 8, device="meta")
    base = Geometry.of(tensor)
    for op, args, pick in [
        (aten.slice.Tensor, (2, 0, 5), None), (aten.select.int, (1, -1), None), (aten.permute.default, ([2, 0, 1],), None),
        (aten.expand.default, ([2, 4, 6, 8],), None), (aten.unsqueeze.default, (1,), None),
        (aten.split.Tensor, (3, 1), 1), (aten.view.default, ([24, 8],), None),
    ]:
        found = view_geometry(op, base, args, {})
        assert found is not None, op
        expected = op(tensor, *args)
        expected = expected[pick] if pick is not None else expected
        found = found[pick] if isinstance(found, (list, tuple)) else found
        assert (tuple(found.shape), tuple(found.strides), found.offset) == (
            tuple(expected.shape), expected.stride(), expected.storage_offset()
        ), op


def test_a_view_of_a_size_one_dimension_with_another_stride_is_torchs():
    """``make check`` found it unseeded: a ``[1, 1]`` base with strides ``(1, 2)`` is contiguous, yet torch's
    ``view`` carries the stride 2 of the size-one dimension; the arithmetic gave 1. It now leaves it to torch."""
    base = torch.empty(4, device="meta").as_strided((1, 1), (1, 2), 1)
    found = view_geometry(aten.view.default, Geometry.of(base), ([-1],), {})
    expected = base.view(-1)
    assert found is None or (found.shape, found.strides, found.offset) == (
        tuple(expected.shape), expected.stride(), expected.storage_offset()
    )


def test_a_chain_of_views_is_recomputed_without_a_dispatch_per_view(monkeypatch):
    """A returned view at the end of 2,000 chained views: its value is one ``as_strided`` of the memory it
    views, with the geometry torch gives, and no view of the chain is dispatched (each dispatched view of a
    fake tensor held the chain of view functions before it: quadratic memory)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from strideguard.program import view_values as view_values_module

    graph = torch.fx.Graph()
    mode = FakeTensorMode()
    with mode:
        value = torch.empty(6, 8)
    node = graph.placeholder("x")
    node.meta["val"] = value
    eager = torch.empty(6, 8)
    for index in range(2000):
        op, args = (aten.transpose.int, (0, 1)) if index % 2 else (aten.slice.Tensor, (1, 0, 8 - (index % 4)))
        node = graph.call_function(op, (node, *args))
        eager = op(eager, *args)
    graph.output(node)
    dispatched = []
    real = view_values_module.call_on_fake_values
    monkeypatch.setattr(view_values_module, "call_on_fake_values", lambda *a: dispatched.append(a) or real(*a))
    recomputed = view_values_module.ViewValues()
    result = recomputed.value(node)
    assert dispatched == []
    assert (tuple(result.shape), result.stride(), result.storage_offset()) == (
        tuple(eager.shape), eager.stride(), eager.storage_offset()
    )
    assert result.untyped_storage()._cdata == value.untyped_storage()._cdata

"""``program.density.dim_order_of`` and ``program.density.same_order`` remember their answers per tuple of static strides (a plan
asks them thousands of times of a few tuples): the remembered answer is the plain one on every stride tuple
hypothesis finds, and symbolic strides, which cannot be remembered, still take the slow path."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from strideguard.program import density

strides = st.lists(st.integers(min_value=0, max_value=6), max_size=5)


def _relations(values) -> list[int]:
    return [(a > b) - (a < b) for i, a in enumerate(values) for b in values[i + 1:]]


@settings(max_examples=500, deadline=None)
@given(first=strides, data=st.data())
def test_remembered_stride_orders_are_the_plain_ones(first, data):
    second = data.draw(st.lists(st.integers(min_value=0, max_value=6), min_size=len(first), max_size=len(first)))
    shape = (2,) * len(first)
    for _ in range(2):  # asked again: the remembered answer
        # ExecuTorch's dim order: a stable sort by decreasing stride
        assert density.dim_order_of(shape, first) == tuple(sorted(range(len(first)), key=lambda d: -first[d]))
        assert density.same_order(shape, first, second) == (_relations(first) == _relations(second))


def test_symbolic_strides_take_the_slow_path_without_a_guard():
    shape_env = ShapeEnv()
    size = shape_env.create_unbacked_symint()
    shape, symbolic = (2, size), (size, 1)
    assert density.dim_order_of(shape, symbolic) is None  # size >= 1 is not known of an unbacked size
    assert density.same_order(shape, symbolic, symbolic) is False  # unproven counts as not alike
    assert density.same_order(shape, (4, 1), (5, 1)) is True
    assert not shape_env.guards

"""``verify`` compares a compiled output with eager within a tolerance for its dtype (``EAGER_TOLERANCES``).

The judgement itself is tested without compiling; one compiled bfloat16 program checks it end to end.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.export.graph_signature import OutputKind, OutputSpec, TensorArgument

import strideguard
from strideguard.decide.subject import subject_of
from strideguard.program.exported import UserOutput
from strideguard.prove.verification import (
    EAGER_TOLERANCES,
    OutputExpectation,
    _against_reference,
    _check_one,
    _computed_on_the_way,
    _output_tolerance,
    _tolerance_table,
    _values_match,
    check_compiled,
    largest_difference,
)

LOW_PRECISION = [torch.bfloat16, torch.float16]


def next_up(values: torch.Tensor) -> torch.Tensor:
    """Each (positive) value moved up by one unit in the last place, by its bits."""
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[values.dtype]
    assert (values > 0).all()
    return (values.view(bits) + 1).view(values.dtype)


def matches(value: torch.Tensor, reference: torch.Tensor, table=EAGER_TOLERANCES) -> bool:
    return _values_match(value, reference, _output_tolerance(reference.dtype, (), table))


def magnitudes(dtype: torch.dtype) -> torch.Tensor:
    """Values of order one, 2.5 among them (where one bfloat16 ulp is 0.0156), and a few far from it."""
    return torch.tensor([2.5, 1.0, 0.3, 0.75, 1.9, 3.14159, 7.0, 100.0, 1234.5], dtype=dtype)


def test_the_table_starts_from_assert_close():
    from torch.testing._comparison import _DTYPE_PRECISIONS

    assert EAGER_TOLERANCES[torch.float64] == _DTYPE_PRECISIONS[torch.float64]
    assert EAGER_TOLERANCES[torch.complex128] == _DTYPE_PRECISIONS[torch.complex128]
    assert EAGER_TOLERANCES[torch.bfloat16][0] == _DTYPE_PRECISIONS[torch.bfloat16][0]
    for dtype in (torch.float32, torch.complex64):  # as loose as verify always was: compiled GEMMs round differently
        assert EAGER_TOLERANCES[dtype] == (1e-4, 1e-5)
    for dtype in LOW_PRECISION:
        rtol, atol = EAGER_TOLERANCES[dtype]
        eps = torch.finfo(dtype).eps
        assert eps <= rtol <= 2.1 * eps and eps <= atol <= 2.1 * eps, (dtype, rtol, atol)


@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_one_ulp_is_equal(dtype):
    reference = magnitudes(dtype)
    value = next_up(reference)
    assert not torch.equal(value, reference)
    assert matches(value, reference) and matches(reference, value)
    assert matches(-value, -reference)
    if dtype == torch.bfloat16:
        assert float(value[0]) - float(reference[0]) == 0.015625  # one ulp at 2.5
        assert not torch.allclose(value, reference, rtol=1e-4, atol=1e-5)  # what verify used to demand


@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_two_ulps_from_two_roundings_are_equal(dtype):
    reference = magnitudes(dtype)
    assert matches(next_up(next_up(reference)), reference)


@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("factor", [1.1, 0.9, 1.05])
def test_a_wrong_value_is_not_equal(dtype, factor):
    reference = magnitudes(dtype)
    for index in range(len(reference)):
        if factor == 1.05 and reference[index] < 1:
            continue  # 5% of a bfloat16 value below 1 is within two of its ulps plus atol
        wrong = reference.clone()
        wrong[index] = (wrong[index].double() * factor).to(dtype)
        assert not matches(wrong, reference), (dtype, factor, float(reference[index]))


@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_near_zero_the_allowance_is_absolute(dtype):
    """A value that cancels to nearly zero rounds against its operands: one ulp of 1 is within atol."""
    reference = torch.tensor([0.0, 1e-3, -2e-3], dtype=dtype)
    eps = torch.finfo(dtype).eps
    assert matches(reference + eps, reference)
    assert not matches(reference + 0.1, reference)


@pytest.mark.parametrize("perturbation", [0.0, 5e-5, -5e-5, 2e-4, -2e-4, 1e-3, 1e-1])
@pytest.mark.parametrize("offset", [0.0, 5e-6, 5e-5])
def test_float32_is_judged_as_before(perturbation, offset):
    """The judgement verify always made for float32: ``torch.allclose(rtol=1e-4, atol=1e-5)``."""
    generator = torch.Generator().manual_seed(0)
    reference = torch.cat([torch.randn(64, generator=generator), torch.tensor([0.0, 1e-6, -3.0, 250.0])])
    value = reference * (1 + perturbation) + offset
    before = torch.allclose(value, reference, rtol=1e-4, atol=1e-5, equal_nan=True)
    assert matches(value, reference) == before
    complex_reference = torch.complex(reference, reference.flip(0))
    assert matches(torch.complex(value, value.flip(0)), complex_reference) == before


def test_nan_equals_nan_and_infinity_only_itself():
    reference = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0], dtype=torch.bfloat16)
    assert matches(reference.clone(), reference)
    assert not matches(torch.tensor([1.0, float("inf"), -float("inf"), 1.0], dtype=torch.bfloat16), reference)
    assert not matches(torch.tensor([float("nan"), float("inf"), float("inf"), 1.0], dtype=torch.bfloat16), reference)


NAN, INF = float("nan"), float("inf")
ONE_NAN_RULE = [
    # value, reference, equal, largest difference
    ([NAN, 1.0], [NAN, 1.0], True, 0.0),
    ([INF, -INF], [INF, -INF], True, 0.0),
    ([NAN, 1.0], [1.0, 1.0], False, INF),
    ([1.0, 1.0], [NAN, 1.0], False, INF),
    ([INF, 1.0], [-INF, 1.0], False, INF),
    ([INF, 1.0], ["largest", 1.0], False, INF),
    ([NAN, 1.5], [NAN, 1.0], False, 0.5),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("value, reference, equal, difference", ONE_NAN_RULE)
def test_one_nan_rule_for_the_match_and_the_largest_error_against_eager_and_a_reference(dtype, value, reference, equal, difference):
    """A NaN equals a NaN, an infinity only itself; the largest error says the same as the match, against the
    eager run (tolerance or exact) and against a reference program (``verify(reference=...)``), where a NaN
    difference once read as 0 against a reference and as infinity against eager."""
    # "largest": the dtype's largest finite value, which an infinity once matched (``nan_to_num`` made them one)
    reference = [torch.finfo(dtype).max if item == "largest" else item for item in reference]
    value, reference = torch.tensor(value, dtype=dtype), torch.tensor(reference, dtype=dtype)
    expected = difference if difference in (0.0, INF) else float((value.double() - reference.double()).abs()[1])
    assert largest_difference(value, reference) == expected
    assert _values_match(value, reference, None) is equal
    assert _values_match(value, reference, (1e-4, 1e-5)) is (equal or expected <= 1e-5 + 1e-4 * 1.5)
    check = strideguard.OutputCheck(index=0, name="out", kind=strideguard.OutputKind.TENSOR, match=True)
    for tolerance in (None, (1e-4, 1e-5)):
        (measured,) = _against_reference((check,), (value,), (reference,), tolerance)
        assert measured.reference_error == expected
        assert measured.match is _values_match(value, reference, tolerance)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integers_and_bool_are_exact(dtype):
    assert _output_tolerance(dtype) is None
    reference = torch.tensor([1, 0, 1, 1]).to(dtype)
    value = torch.tensor([1, 0, 0, 1]).to(dtype)
    assert _values_match(reference.clone(), reference, (1.0, 10.0))
    assert not _values_match(value, reference, (1.0, 10.0)), "no tolerance reaches an integer"
    check = _check_one(_output("argmax"), value, reference, {}, {}, OutputExpectation(tolerance=(1.0, 10.0)))
    assert check.match is False and check.eager_tolerance is None


def test_shape_or_dtype_differing_never_matches():
    reference = torch.ones(2, 3)
    assert not _values_match(torch.ones(3, 2), reference, (1.0, 1.0))
    assert not _values_match(torch.ones(2, 3, dtype=torch.float64), reference, (1.0, 1.0))


def test_a_float8_output_gets_two_of_its_ulps():
    eps = torch.finfo(torch.float8_e4m3fn).eps
    assert _output_tolerance(torch.float8_e4m3fn) == (2 * eps, 2 * eps)
    reference = torch.tensor([1.0, 2.0, -0.5]).to(torch.float8_e4m3fn)
    assert matches(torch.tensor([1.125, 2.0, -0.5]).to(torch.float8_e4m3fn), reference)
    assert not matches(torch.tensor([2.0, 2.0, -0.5]).to(torch.float8_e4m3fn), reference)


def test_an_override_replaces_one_entry():
    table = _tolerance_table({torch.bfloat16: (0.0, 0.0), torch.float32: (1e-3, 1e-3)})
    assert table[torch.bfloat16] == (0.0, 0.0) and table[torch.float32] == (1e-3, 1e-3)
    assert table[torch.float16] == EAGER_TOLERANCES[torch.float16]
    assert EAGER_TOLERANCES[torch.bfloat16] == (1.6e-2, 1.6e-2), "the module's table is never changed"
    reference = magnitudes(torch.bfloat16)
    assert not matches(next_up(reference), reference, table)
    assert matches(reference.clone(), reference, table)
    assert _tolerance_table({torch.float16: [0, 1]})[torch.float16] == (0.0, 1.0)
    assert _tolerance_table(None) == EAGER_TOLERANCES


class Mixed(torch.nn.Module):
    def forward(self, x):
        return (
            (x.bfloat16() * 3).float(),  # a float32 output computed in bfloat16
            (x * 3).double(),            # float64 computed in float32
            x.double() * 3,              # float64 computed in float64: the float32 input is exact
            x.bfloat16(),                # nothing computed but a cast
            x.argmax(-1),
        )


def test_an_output_is_judged_by_the_least_precise_dtype_it_was_computed_in():
    program = torch.export.export(Mixed(), (torch.randn(2, 8),))
    computed = _computed_on_the_way(subject_of(program, "test"))
    dtypes = [torch.float32, torch.float64, torch.float64, torch.bfloat16, torch.int64]
    tolerances = [_output_tolerance(dtype, c) for dtype, c in zip(dtypes, computed)]
    assert tolerances == [
        EAGER_TOLERANCES[torch.bfloat16],
        EAGER_TOLERANCES[torch.float32],
        EAGER_TOLERANCES[torch.float64],
        EAGER_TOLERANCES[torch.bfloat16],
        None,
    ]
    strict = _tolerance_table({torch.bfloat16: (0.0, 0.0)})
    assert _output_tolerance(torch.float32, computed[0], strict) == EAGER_TOLERANCES[torch.float32]


def _output(name: str, index: int = 0) -> UserOutput:
    return UserOutput(index, index, OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=name), target=None))


def test_the_report_says_which_tolerance_was_applied():
    reference = magnitudes(torch.bfloat16)
    tolerance = _output_tolerance(torch.bfloat16)
    check = _check_one(_output("out"), next_up(reference), reference, {}, {}, OutputExpectation(tolerance=tolerance))
    assert check.match and check.eager_tolerance == tolerance and check.max_abs_error == 8.0  # one ulp at 1232
    assert check.to_dict()["eager_tolerance"] == list(tolerance)
    wrong = _check_one(_output("out"), reference * 1.1, reference, {}, {}, OutputExpectation(tolerance=tolerance))
    assert not wrong.match and not wrong.ok
    text = str(strideguard.VerifyReport(device="cpu", compile_seconds=0.0, outputs=(wrong,)))
    assert "MISMATCH (rtol 0.016, atol 0.016)" in " ".join(text.split()), text


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)[:, :5]


@pytest.fixture(scope="module")
def program():
    return torch.export.export(Linear().eval(), (torch.randn(2, 8),))


@pytest.mark.parametrize(("tolerances", "error", "message"), [
    ([(torch.bfloat16, (0.1, 0.1))], TypeError,
     "tolerances must be a dict mapping a torch.dtype to \\(rtol, atol\\), got list"),
    ({"bfloat16": (0.1, 0.1)}, TypeError, "tolerances keys must be torch dtypes .* got 'bfloat16'"),
    ({torch.int32: (0.0, 0.0)}, ValueError, "tolerances\\[torch.int32\\]: torch.int32 is compared exactly"),
    ({torch.bool: (0.0, 0.0)}, ValueError, "torch.bool is compared exactly"),
    ({torch.bfloat16: 0.01}, TypeError,
     "tolerances\\[torch.bfloat16\\] must be a tuple \\(rtol, atol\\) of two numbers, got 0.01"),
    ({torch.bfloat16: (0.01,)}, TypeError, "of two numbers, got \\(0.01,\\)"),
    ({torch.bfloat16: (0.01, "0")}, TypeError, "of two numbers"),
    ({torch.bfloat16: (True, 0.0)}, TypeError, "of two numbers"),
    ({torch.bfloat16: (-0.01, 0.0)}, ValueError, "each finite and non-negative, got \\(-0.01, 0.0\\)"),
    ({torch.bfloat16: (math.nan, 0.0)}, ValueError, "each finite and non-negative"),
    ({torch.bfloat16: (0.0, math.inf)}, ValueError, "each finite and non-negative"),
])
def test_a_bad_override_is_refused_before_compiling(program, tolerances, error, message):
    with pytest.raises(error, match="strideguard.verify: .*" + message):
        strideguard.verify(program, tolerances=tolerances)
    with pytest.raises(error, match=message):
        check_compiled(program, lambda *args: pytest.fail("ran"), tolerances=tolerances)


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        out = F.scaled_dot_product_attention(q, k, v) * 2.5 + 0.5  # eager rounds twice, the fused kernel once
        return out, out[..., :32]


def attention_inputs():
    generator = torch.Generator().manual_seed(0)
    return tuple(
        torch.randn(shape, generator=generator).to(torch.bfloat16)
        for shape in ((1, 4, 4, 64), (1, 4, 200, 64), (1, 4, 200, 64))
    )


@pytest.mark.compiles
@pytest.mark.lowers
def test_a_bfloat16_program_verifies():
    program = torch.export.export(Attention().eval(), attention_inputs())
    fixed = strideguard.densify_outputs(program)
    report = strideguard.verify(fixed)
    assert report.ok, str(report)
    assert all(o.in_target_layout for o in report.outputs), str(report)
    assert all(o.eager_tolerance == EAGER_TOLERANCES[torch.bfloat16] for o in report.outputs), str(report)
    differing = [o for o in report.outputs if o.max_abs_error > 0]
    assert differing, f"the compiled values equal eager's bitwise, so no tolerance is tested:\n{report}"

    strict = strideguard.verify(fixed, tolerances={torch.bfloat16: (0.0, 0.0)})
    assert not strict.ok, str(strict)
    assert all(o.in_target_layout for o in strict.outputs), str(strict)
    assert [o.index for o in strict.outputs if not o.match] == [o.index for o in differing], str(strict)
    assert all(o.eager_tolerance == (0.0, 0.0) for o in strict.outputs)

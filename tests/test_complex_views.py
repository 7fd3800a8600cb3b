"""Views that read their memory as another dtype are judged in their own dtype (issue 45, round four, finding 6).

``view_as_real`` reads a complex tensor's memory as float pairs, ``view_as_complex``
a float tensor's as complex numbers, each counting its strides and offset in its
own elements. A returned view is rebuilt as one ``as_strided`` of the memory it
views; rebuilt over its base with the base's dtype, ``view_as_real(z).transpose(0,
1)`` asked a complex storage for twice the bytes it has (``inspect`` and ``fix``
failed: "setStorage ... out of bounds"), and a ``view_as_complex`` of a view came
back float32. Nothing here compiles: ``inspect`` reads the graph, and the fixed
program is run eagerly against the original.
"""

from __future__ import annotations

import pytest
import torch

import strideguard


class RealOfIntermediate(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_real(torch.complex(x, x * 2)).transpose(0, 1)


class RealOfInput(torch.nn.Module):
    def forward(self, z):
        return torch.view_as_real(z).transpose(0, 1)


class RealOfSlice(torch.nn.Module):
    def forward(self, z):
        return torch.view_as_real(z[:, 1:])[..., 0]


class ComplexOfInput(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x)


class ComplexOfIntermediateTransposed(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x * 1).transpose(0, 1)


class ComplexOfSliceTransposed(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_complex((x * 1)[1:]).t()


def complex_input() -> torch.Tensor:
    return torch.complex(torch.arange(12.0).reshape(3, 4), -torch.arange(12.0).reshape(3, 4))


def pairs_input() -> torch.Tensor:
    return torch.arange(24.0).reshape(3, 4, 2)


CASES = {
    # name: (module, input, dtype, shape, strides of the view returned, copied by fix)
    "real-of-intermediate": (RealOfIntermediate(), lambda: torch.arange(12.0).reshape(3, 4), "float32", [4, 3, 2], [2, 8, 1], True),
    "real-of-input": (RealOfInput(), complex_input, "float32", [4, 3, 2], [2, 8, 1], True),
    "real-of-slice": (RealOfSlice(), complex_input, "float32", [3, 3], [8, 2], True),
    "complex-of-input": (ComplexOfInput(), pairs_input, "complex64", [3, 4], [4, 1], False),
    "complex-of-intermediate-transposed": (ComplexOfIntermediateTransposed(), pairs_input, "complex64", [4, 3], [1, 4], True),
    "complex-of-slice-transposed": (ComplexOfSliceTransposed(), pairs_input, "complex64", [4, 2], [1, 4], True),
}
"""Each module with the dtype, shape and strides its returned view has in eager PyTorch (the first three
read in float elements, the last three in complex ones), and whether it comes back strided."""


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    module, make_input, dtype, shape, strides, copied = CASES[request.param]
    inputs = (make_input(),)
    eager = module(*inputs)
    assert (str(eager.dtype).removeprefix("torch."), list(eager.shape), list(eager.stride())) == (dtype, shape, strides)
    return module, inputs, torch.export.export(module, inputs), (dtype, shape, strides, copied)


def test_inspect_reports_each_view_in_its_own_dtype(case):
    _, _, program, (dtype, shape, strides, copied) = case
    [output] = strideguard.inspect(program).outputs
    assert (output.dtype, list(output.shape), list(output.strides)) == (dtype, shape, strides)
    assert (output.action.value == "copy") is copied
    assert output.ok is not copied


def test_the_fixed_program_returns_the_originals_values_densely(case):
    module, inputs, program, (dtype, shape, _, _) = case
    fixed = strideguard.densify_outputs(program)
    [output] = strideguard.inspect(fixed).outputs
    assert output.ok and (output.dtype, list(output.shape)) == (dtype, shape)
    got, wanted = fixed.module()(*inputs), program.module()(*inputs)
    assert got.dtype == wanted.dtype == module(*inputs).dtype
    assert torch.equal(got, wanted)
    assert got.is_contiguous()

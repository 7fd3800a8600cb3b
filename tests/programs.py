"""Programs the tests share: many outputs per program, so that one compile covers many cases."""

from __future__ import annotations

import torch
from torch import nn
from torch.export import Dim


class EveryOutput(nn.Module):
    """One method returning every kind of output the core issue lists."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("table", torch.arange(48.0).reshape(6, 8))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))

    def forward(self, x, flags, ids, half, bf, cplx):
        self.steps.add_(1)
        y = self.lin(x)
        a, b = y.split([10, 6], -1)
        c0, c1 = y.chunk(2, dim=1)
        u0, u1, u2 = y.unbind(1)
        return {
            "slice_last": y[..., :14],
            "select_middle": y[:, 1],
            "select_first": y[0],
            "narrow": y.narrow(2, 2, 8),
            "transpose": y.transpose(1, 2),
            "permute": y.permute(2, 0, 1),
            "weight_t": self.lin.weight.t(),
            "T": y[0].T,
            "mT": y.mT,
            "expand": y[:, :1].expand(-1, 4, 16),
            "broadcast": torch.broadcast_to(y[0, 0], (5, 16)),
            "unsqueeze_strided": y[:, :, :4].unsqueeze(1),
            "squeeze_strided": y[:, :1, :5].squeeze(1),
            "split_0": a,
            "split_1": b,
            "chunk_0": c0,
            "chunk_1": c1,
            "unbind_0": u0,
            "unbind_2": u2,
            "diagonal": y.diagonal(0, 1, 2),
            "as_strided": y[0].as_strided((4, 4), (1, 4)),
            "reshape_copies": y.transpose(1, 2).reshape(-1, 48),
            "reshape_views": y.reshape(-1, 48),
            "full_slice": y[:, :, :],
            "input": x,
            "input_slice": x[:, :, 2:5],
            "buffer_view": self.table[:, 2:6],
            "twice_a": u1 * 2,
            "none": None,
            "int": 7,
            "symint": x.shape[0],
            "zero_size": y[:, :0],
            "zero_dim": y[0, 0, 0],
            "bool": flags[:, ::2],
            "int64": ids.t(),
            "float16": half[..., 1:],
            "bfloat16": bf.transpose(0, 1),
            "complex64": cplx[:, :2],
        }


def every_output_inputs(batch: int = 2):
    torch.manual_seed(batch)
    return (
        torch.randn(batch, 3, 16),
        torch.rand(4, 6) > 0.5,
        torch.randint(-100, 100, (3, 5)),
        torch.randn(2, 5, dtype=torch.float16),
        torch.randn(3, 4, dtype=torch.bfloat16),
        torch.randn(2, 3, dtype=torch.complex64),
    )


class EveryOutputWithTwins(EveryOutput):
    """The every-output program plus one tensor returned twice and two views of one base, as a tuple."""

    def forward(self, x, flags, ids, half, bf, cplx):
        outputs = super().forward(x, flags, ids, half, bf, cplx)
        base = outputs["twice_a"]
        return (*outputs.values(), base, base[:, :8], base[:, 8:])


def export_every_output():
    torch.manual_seed(0)
    batch = Dim("batch", min=2, max=64)
    dynamic = ({0: batch}, None, None, None, None, None)
    program = torch.export.export(EveryOutputWithTwins().eval(), every_output_inputs(2), dynamic_shapes=dynamic)
    # The functional form, where the buffer's in-place update becomes a mutation output.
    return program.run_decompositions({})


class Branchy(nn.Module):
    """``torch.cond`` whose outputs are views in each branch."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)

        def wide(t):
            return (t * 1.0, (t * 3.0).T)

        def narrow(t):
            return (t + 1.0, (t * 2.0).T)

        first, second = torch.cond(y.sum() > 0, wide, narrow, (y,))
        return first, second, y[:, ::2]


def export_branchy():
    torch.manual_seed(0)
    return torch.export.export(Branchy().eval(), (torch.randn(3, 8),))


class DataDependentSlice(nn.Module):
    """``x[:, :k]`` with ``k`` read from a tensor: dense exactly when ``k`` is the full width."""

    def forward(self, x, count):
        k = count.item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[1])
        return x[:, :k], (x * 1.0)[:, :k]


def export_data_dependent_slice():
    return torch.export.export(DataDependentSlice(), (torch.randn(3, 8), torch.tensor(4)))


class AttentionHead(nn.Module):
    """An attention block returning what ExecuTorch users return: a slice, a select, a split
    chunk, the transposed attention output, scores from sliced operands, and a ``detach``."""

    def __init__(self, with_detach: bool = True):
        super().__init__()
        self.with_detach = with_detach
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        qkv = self.qkv(x)
        q, k, v = qkv.split(16, -1)

        def heads(t):
            return t.view(2, 4, 2, 8).transpose(1, 2)

        weights = (heads(q) @ heads(k).transpose(-2, -1) * 8**-0.5).softmax(-1)
        attention = (weights @ heads(v)).transpose(1, 2)
        scores = q[:, :, :8] @ k[:, :, :8].transpose(1, 2)
        outputs = (qkv[..., :14], qkv[:, 1], qkv[0], v, attention, scores)
        return outputs + (qkv.detach(),) if self.with_detach else outputs


def export_attention_head(with_detach: bool = True):
    torch.manual_seed(0)
    return torch.export.export(AttentionHead(with_detach).eval(), (torch.randn(2, 4, 16),))


class TwoStages(nn.Module):
    """A linear whose sliced result feeds a second stage: the slice crosses a partition boundary."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        sliced = self.lin(x)[:, :, :8]
        return sliced * 2.0 + 1.0


def export_two_stages():
    torch.manual_seed(0)
    return torch.export.export(TwoStages().eval(), (torch.randn(2, 3, 16),))

"""Real third-party models, built from small configs with random weights (nothing is downloaded).

Each entry returns what its users export: decoder LMs returning the last
position's logits (a prefill whose KV cache starts empty, so its first update
is ``cat([empty, k])``, and a decode step with a cache passed in), an encoder's
CLS state and pooled output, an encoder-decoder, vision transformers, a
diffusion UNet and DiT, and a fused-QKV attention head. The model libraries
(transformers, diffusers) are the project's ``zoo`` test extra, never a
runtime dependency.

``judge_aten`` and ``judge_edge`` check strideguard on one model against
Inductor's own lowering (``make test``) or, with ``compile=True``, against
what AOTInductor and ExecuTorch's AOTI path really return (``make zoo``).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

import strideguard
from strideguard import Action
from strideguard.program import density
from strideguard.program.promises import target_dim_orders
from strideguard.compiler.oracle.lowering import lower_edge_outputs, lower_outputs

from . import programs, robots
from .generated import computations_left_unread

VOCABULARY = 128
LLM = dict(
    vocab_size=VOCABULARY,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    attn_implementation="eager",
)
"""A small decoder LM; eager attention, which ExecuTorch's CUDA backend also decomposes SDPA into."""


@dataclass
class ZooModel:
    name: str
    what: str
    """What the method returns, in words."""
    build: Callable[[], tuple[nn.Module, tuple]]
    library: Optional[str] = "transformers"
    """The model library it is built with (the project's ``zoo`` extra), if any."""
    no_grad: bool = False
    """Exported under ``torch.no_grad()``, as a deployment exports it (a method that turns gradients off
    itself would otherwise be traced as a grad-mode region)."""
    random: bool = False
    """Its outputs are drawn at random (TD-MPC's planner): compiled runs are judged by layout alone."""
    edge_exceptions: tuple = ()
    """Ops ``to_edge`` must be told to accept although they are not core ATen (VQ-BeT's ``multinomial``,
    TD-MPC's ``randn_like`` and ``multinomial``)."""

    def export(self) -> torch.export.ExportedProgram:
        torch.manual_seed(0)
        module, inputs = self.build()
        with torch.no_grad() if self.no_grad else contextlib.nullcontext():
            return torch.export.export(module.eval(), inputs, strict=False)


class LastLogitsAndCache(nn.Module):
    """A causal LM step returning ``logits[:, -1, :]`` and every layer's keys and values.

    With no ``past`` it is a prefill, whose cache starts empty; with ``past``
    tensors (keys and values per layer) it is a decode step extending them.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, *past):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        cached = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits[:, -1, :], *cached)


class ClsAndPooled(nn.Module):
    """An encoder returning its first token's state (CLS) and its pooled output."""

    def __init__(self, model: nn.Module, input_name: str):
        super().__init__()
        self.model, self.input_name = model, input_name

    def forward(self, x):
        out = self.model(**{self.input_name: x})
        return out.last_hidden_state[:, 0], out.pooler_output


class Seq2SeqLogits(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, decoder_ids):
        out = self.model(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False)
        return out.logits[:, -1, :], out.encoder_last_hidden_state


class Sample(nn.Module):
    """A diffusers model's denoised sample."""

    def __init__(self, model: nn.Module, **names: str):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, x, timestep, condition):
        return self.model(x, timestep, **{self.names["condition"]: condition}).sample


def _llm(config_class: str, model_class: str, batch: int, decode: bool):
    def build():
        import transformers

        config = getattr(transformers, config_class)(**LLM)
        model = getattr(transformers, model_class)(config)
        ids = torch.randint(0, VOCABULARY, (batch, 1 if decode else 8))
        heads, dim = LLM["num_key_value_heads"], LLM["hidden_size"] // LLM["num_attention_heads"]
        past = tuple(torch.randn(batch, heads, 8, dim) for _ in range(2 * LLM["num_hidden_layers"])) if decode else ()
        return LastLogitsAndCache(model), (ids, *past)

    return build


def _bert():
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=VOCABULARY, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, attn_implementation="eager")
    return ClsAndPooled(BertModel(config), "input_ids"), (torch.randint(0, VOCABULARY, (2, 8)),)


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCABULARY, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                      attn_implementation="eager")
    ids, decoder_ids = torch.randint(0, VOCABULARY, (2, 8)), torch.randint(0, VOCABULARY, (2, 4))
    return Seq2SeqLogits(T5ForConditionalGeneration(config)), (ids, decoder_ids)


def _vit():
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, attn_implementation="eager")
    return ClsAndPooled(ViTModel(config), "pixel_values"), (torch.randn(2, 3, 32, 32),)


def _clip():
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=128, attn_implementation="eager")
    return ClsAndPooled(CLIPVisionModel(config), "pixel_values"), (torch.randn(2, 3, 32, 32),)


def _unet():
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
    )
    inputs = (torch.randn(2, 4, 8, 8), torch.tensor([10, 20]), torch.randn(2, 4, 32))
    return Sample(unet, condition="encoder_hidden_states"), inputs


def _dit():
    from diffusers import DiTTransformer2DModel

    dit = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
                                num_layers=2, sample_size=8, patch_size=2, norm_num_groups=8)
    inputs = (torch.randn(2, 4, 8, 8), torch.tensor([10, 20]), torch.tensor([1, 2]))
    return Sample(dit, condition="class_labels"), inputs


def _fused_qkv():
    return programs.AttentionHead(with_detach=False), (torch.randn(2, 4, 16),)


MODELS = [
    ZooModel("llama-prefill-b1", "logits[:, -1, :], KV cache from empty", _llm("LlamaConfig", "LlamaForCausalLM", 1, False)),
    ZooModel("llama-prefill-b2", "logits[:, -1, :], KV cache from empty", _llm("LlamaConfig", "LlamaForCausalLM", 2, False)),
    ZooModel("llama-decode-b1", "logits[:, -1, :], KV cache extended", _llm("LlamaConfig", "LlamaForCausalLM", 1, True)),
    ZooModel("llama-decode-b2", "logits[:, -1, :], KV cache extended", _llm("LlamaConfig", "LlamaForCausalLM", 2, True)),
    ZooModel("qwen2-prefill-b2", "logits[:, -1, :], KV cache from empty", _llm("Qwen2Config", "Qwen2ForCausalLM", 2, False)),
    ZooModel("mistral-prefill-b1", "logits[:, -1, :], sliding-window KV cache", _llm("MistralConfig", "MistralForCausalLM", 1, False)),
    ZooModel("bert", "CLS state, pooled output", _bert),
    ZooModel("t5", "decoder logits[:, -1, :], encoder states", _t5),
    ZooModel("vit", "CLS state, pooled output", _vit),
    ZooModel("clip-vision", "last hidden state, pooled output", _clip),
    ZooModel("unet", "denoised sample", _unet, "diffusers"),
    ZooModel("dit", "denoised sample", _dit, "diffusers"),
    ZooModel("fused-qkv-head", "qkv slice, select, split chunk, transposed attention, scores", _fused_qkv, None),
]

ROBOTS = [
    ZooModel("lerobot-act", "action chunk actions[:, :n_action_steps], its first action", robots.act, "lerobot", True),
    ZooModel("lerobot-diffusion", "DDIM sample[:, 1:9] (the steps executed), its first action", robots.diffusion,
             "lerobot", True),
    ZooModel("lerobot-vqbet", "decoded chunk [:, :action_chunk_size], its first action", robots.vqbet, "lerobot", True,
             edge_exceptions=("aten::multinomial",)),
    ZooModel("lerobot-tdmpc", "planned actions[:n_action_steps] batch first (batch 2), the first action",
             robots.tdmpc, "lerobot", True, random=True, edge_exceptions=("aten::randn_like", "aten::multinomial")),
]
"""LeRobot's policies (``tests/robots.py``): Python 3.12 and the ``robots`` lane only."""


@dataclass
class Judgement:
    """One model on one path: what strideguard predicted and did, against what Inductor (or the
    compiled method) returned."""

    model: str
    path: str
    outputs: int
    needed: list[int]
    """Outputs returned outside their target layout without strideguard."""
    copied: list[int]
    undecided: list[int]
    """Outputs the fast analysis left to Inductor (each copied)."""
    mispredicted: list[str]
    """Settled outputs whose predicted strides differ from those returned."""
    after: list[str]
    """Outputs still outside their target layout after the fix."""
    values: list[str] = field(default_factory=list)
    """Outputs whose fixed values differ from the unfixed compiled program's (compiled runs only)."""
    source: str = "lowering"

    @property
    def ok(self) -> bool:
        return not (self.mispredicted or self.after or self.values) and self.copied == self.needed

    def row(self) -> dict[str, Any]:
        return {
            "model": self.model, "path": self.path, "outputs": self.outputs, "needed": len(self.needed),
            "copied": len(self.copied), "undecided": len(self.undecided), "mispredicted": len(self.mispredicted),
            "strided_after_fix": len(self.after), "values_differ": len(self.values), "checked_by": self.source,
            "ok": self.ok,
        }


def _strides_of(value: Any) -> Optional[tuple]:
    return tuple(value.stride()) if isinstance(value, torch.Tensor) else None


def _judge(model: str, path: str, report, returned_before: list, returned_after: list, orders, source: str) -> Judgement:
    """``returned_*``: per user output, (shape, strides) as lowered or measured, ``None`` for non-tensors."""
    needed, mispredicted, after = [], [], []
    for record, before, fixed, order in zip(report.outputs, returned_before, returned_after, orders):
        if record.kind != "tensor" or before is None:
            continue
        shape, strides = before
        if density.has_layout(shape, strides, order) is not True:
            needed.append(record.index)
        empty = any(density.same_sizes((s,), (0,)) for s in shape)
        if record.in_target_layout is not None and not empty and _text(record.strides) != _text(strides):
            mispredicted.append(f"[{record.index}] {record.name}: predicted {_text(record.strides)}, got {_text(strides)}")
        if fixed is not None and density.has_layout(fixed[0], fixed[1], order) is not True:
            after.append(f"[{record.index}] {record.name}: {_text(fixed[1])} after the fix")
    return Judgement(
        model=model, path=path, outputs=len(report.outputs), needed=needed,
        copied=[o.index for o in report.outputs if o.action is Action.COPY],
        undecided=[o.index for o in report.outputs if o.kind == "tensor" and o.in_target_layout is None],
        mispredicted=mispredicted, after=after, source=source,
    )


def _text(values) -> list:
    return [v if isinstance(v, (int, str)) else density.format_strides([v])[0] for v in values]


def _lowered(lowering) -> list:
    return [None if o is None else (o.shape, o.strides) for o in lowering.outputs]


def _measured(values: list) -> list:
    return [(tuple(v.shape), tuple(v.stride())) if isinstance(v, torch.Tensor) else None for v in values]


_PROGRAMS: "OrderedDict[tuple[str, str], torch.export.ExportedProgram]" = OrderedDict()


def program_of(model: ZooModel, path: str) -> torch.export.ExportedProgram:
    """``model`` exported (``"aten"``) or as ExecuTorch's AOTI path hands it on (``"edge"``), built once per
    process for the judgements that only read it: a model's tests on one path run one after another on one
    worker (tests/conftest.py), so its CPU and CUDA judgements share one export and one Edge program."""
    key = (model.name, path)
    if key not in _PROGRAMS:
        program = program_of(model, "aten") if path == "edge" else model.export()
        _PROGRAMS[key] = edge_of(program, model.edge_exceptions) if path == "edge" else program
        while len(_PROGRAMS) > 4:
            _PROGRAMS.popitem(last=False)
    return _PROGRAMS[key]


def judge_aten(model: ZooModel, *, compile: bool = False, directory: Optional[str] = None) -> Judgement:
    """The ATen path: ``inspect`` against what AOTInductor returns, ``densify_outputs`` after."""
    program = model.export() if compile else program_of(model, "aten")
    report = strideguard.inspect(program)
    fixed = strideguard.densify_outputs(program)
    orders = target_dim_orders(program)
    if not compile:
        return _judge(model.name, "aten", report, _lowered(lower_outputs(program)), _lowered(lower_outputs(fixed)),
                      orders, "lowering")
    from strideguard.prove.verification import compile_program

    inputs = program.example_inputs[0]
    with torch.no_grad():
        before = _leaves(compile_program(program, os.path.join(directory, model.name, "aten"))(*inputs))
        after = _leaves(compile_program(fixed, os.path.join(directory, model.name, "aten-fixed"))(*inputs))
    judgement = _judge(model.name, "aten", report, _measured(before), _measured(after), orders, "compiled")
    judgement.values = [] if model.random else _differing(report, before, after)
    return judgement


def edge_of(program: torch.export.ExportedProgram, exceptions: tuple = ()) -> torch.export.ExportedProgram:
    """The Edge program ExecuTorch's AOTI path builds, the one ``DenseOutputsPass`` sees there."""
    from strideguard.testing.executorch_cpu import aoti_edge_program

    return aoti_edge_program(program, core_aten_exceptions=exceptions)


def judge_edge(model: ZooModel, *, compile: bool = False, directory: Optional[str] = None) -> Judgement:
    """The Edge path (dim-order mode) through ExecuTorch's AOTI backend, its own view pass included:
    ``inspect`` against what the delegate returns, ``DenseOutputsPass`` after."""
    from strideguard.executorch import DenseOutputsPass

    edge = edge_of(model.export(), model.edge_exceptions) if compile else program_of(model, "edge")
    report = strideguard.inspect(edge)
    orders = target_dim_orders(edge)
    if not compile:
        dense = DenseOutputsPass().call(edge).exported_program
        return _judge(model.name, "edge", report, _lowered(lower_edge_outputs(edge)),
                      _lowered(lower_edge_outputs(dense)), orders, "lowering")
    from strideguard.testing.executorch_cpu import lower_and_run

    program = model.export()
    inputs = tuple(program.example_inputs[0])
    workdir = os.path.join(directory, model.name, "edge")
    exceptions = model.edge_exceptions
    before = lower_and_run(model.export(), inputs, workdir=workdir, core_aten_exceptions=exceptions).outputs
    after = lower_and_run(model.export(), inputs, transform_passes=[DenseOutputsPass()], workdir=workdir + "-fixed",
                          core_aten_exceptions=exceptions).outputs
    judgement = _judge(model.name, "edge", report, _measured(before), _measured(after), orders, "compiled")
    judgement.values = [] if model.random else _differing(report, before, after)
    return judgement


def _leaves(values: Any) -> list:
    return torch.utils._pytree.tree_leaves(values, is_leaf=lambda x: x is None)


def _differing(report, before: list, after: list) -> list[str]:
    return [
        f"[{record.index}] {record.name}"
        for record, b, a in zip(report.outputs, before, after)
        if isinstance(b, torch.Tensor) and not (isinstance(a, torch.Tensor) and torch.equal(a, b))
    ]


# ---------------------------------------------------------------------------------------------
# Pushdown on the decoder LMs


def in_dtype(model: ZooModel, dtype: torch.dtype) -> ZooModel:
    """``model`` with its weights and floating inputs in ``dtype`` (what GPU deployments run)."""

    def build():
        module, inputs = model.build()
        return module.to(dtype), tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)

    return ZooModel(f"{model.name}-{str(dtype).removeprefix('torch.')}", model.what, build, model.library)


LOW_PRECISION = [
    in_dtype(model, torch.bfloat16)
    for model in MODELS
    if model.name in ("llama-prefill-b2", "llama-decode-b1", "vit", "unet")
]
"""A decoder's prefill and decode step, a vision transformer and a UNet in bfloat16."""


@dataclass
class ProvenJudgement:
    """One model fixed with the closed loop (``exact=True``) on one path, then compiled and run."""

    model: str
    path: str
    rounds: int
    """Lowerings the closed loop took (1: the first fix was proven)."""
    loop_seconds: float
    strengthened: list[int]
    """Outputs whose copy the loop had to strengthen."""
    after: list[str]
    """Outputs the compiled method returns outside their target layout."""
    wrong: list[str]
    """Outputs whose values are outside ``verify``'s tolerance for their dtype."""

    @property
    def ok(self) -> bool:
        return not (self.after or self.wrong)

    def row(self) -> dict[str, Any]:
        return {"model": self.model, "path": self.path, "rounds": self.rounds, "loop_s": round(self.loop_seconds, 2),
                "strengthened": len(self.strengthened), "strided_after_fix": len(self.after),
                "values_wrong": len(self.wrong), "ok": self.ok}


def judge_proven(model: ZooModel, path: str, *, directory: str) -> ProvenJudgement:
    """ATen: ``densify_outputs(exact=True)``, then ``strideguard.verify`` (AOTInductor against eager, per-dtype
    tolerances, layouts). Edge: ``DenseOutputsPass(exact=True)`` for the CPU twin of the CUDA backend inside
    ExecuTorch's lowering, the delegate run and held to the same layouts and tolerances."""
    from strideguard.prove.proof import PROOF_KEY
    from strideguard.prove.verification import _output_tolerance, _values_match

    program = model.export()
    inputs = tuple(program.example_inputs[0])
    if path == "aten":
        fixed = strideguard.densify_outputs(program, exact=True)
        proof = fixed.graph_module.meta[PROOF_KEY]
        report = strideguard.verify(fixed)
        after = [f"[{c.index}] strides {c.strides}, not dim order {c.target_dim_order}"
                 for c in report.outputs if c.kind == "tensor" and not c.in_target_layout]
        wrong = [f"[{c.index}] differs from eager by {c.max_abs_error} (tolerance {c.eager_tolerance})"
                 for c in report.outputs if not c.match]
        return ProvenJudgement(model.name, path, proof.rounds, proof.seconds, list(proof.strengthened), after, wrong)
    from strideguard.executorch import DenseOutputsPass
    from strideguard.testing.executorch_cpu import StrideguardCpuAotiBackend, lower_and_run

    dense = DenseOutputsPass(exact=True, backend=StrideguardCpuAotiBackend)
    run = lower_and_run(program, inputs, transform_passes=[dense], workdir=os.path.join(directory, model.name, "edge-proven"))
    orders = target_dim_orders(edge_of(program))
    with torch.no_grad():
        expected = _leaves(program.module()(*inputs))
    after, wrong = [], []
    for index, (got, want, order) in enumerate(zip(run.outputs, expected, orders)):
        if not isinstance(want, torch.Tensor):
            continue
        if order is not None and density.has_layout(tuple(got.shape), tuple(got.stride()), order) is not True:
            after.append(f"[{index}] strides {tuple(got.stride())}, not dim order {list(order)}")
        tolerance = _output_tolerance(want.dtype)
        if not _values_match(got, want, tolerance):
            wrong.append(f"[{index}] differs from eager beyond {tolerance} (rtol, atol)")
    proof = dense.proof
    return ProvenJudgement(model.name, path, proof.rounds, proof.seconds, list(proof.strengthened), after, wrong)


DECODERS = [model for model in MODELS if model.what.startswith("logits[:, -1, :]") and "decode" not in model.name]
"""The prefills: a decode step has one position, so its last one is all there is and nothing moves."""


@dataclass
class PushdownJudgement:
    """One decoder LM with ``pushdown=True`` on one path."""

    model: str
    path: str
    pushed: list[str]
    """Each pushed output, as ``inspect`` describes it."""
    saved: Optional[float]
    """The fraction of the pushed producers' FLOPs saved (the logits' pushdown)."""
    flops_before: int
    flops_after: int
    """The whole method's FLOPs, before and after the pushdown."""
    after: list[str]
    """Outputs outside their target layout after the fix."""
    max_error: float
    """The largest difference from the unfixed program's outputs (eager, or compiled with ``compile=True``)."""
    source: str = "lowering"
    left_unread: list[str] = field(default_factory=list)
    """Computing nodes the fixed program keeps that feed no output, beyond those the unfixed one had."""

    @property
    def ok(self) -> bool:
        return (bool(self.pushed) and not self.after and not self.left_unread and self.flops_after < self.flops_before
                and self.max_error <= 1e-4)

    def row(self) -> dict[str, Any]:
        return {
            "model": self.model, "path": self.path, "pushdown": self.pushed[0] if self.pushed else None,
            "saved": None if self.saved is None else round(self.saved, 3),
            "method_flops_ratio": round(self.flops_after / self.flops_before, 3), "strided_after_fix": len(self.after),
            "max_error": self.max_error, "left_unread": len(self.left_unread), "checked_by": self.source, "ok": self.ok,
        }


def _largest_difference(before: list, after: list) -> float:
    errors = [
        float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        for b, a in zip(before, after)
        if isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor) and a.is_floating_point()
    ]
    return max(errors, default=0.0)


def judge_pushdown(model: ZooModel, path: str, *, compile: bool = False, directory: Optional[str] = None) -> PushdownJudgement:
    """``densify_outputs(pushdown=True)`` (ATen) or ``DenseOutputsPass(pushdown=True)`` (Edge, ExecuTorch's AOTI
    path): the logits pushed into the model, fewer FLOPs, every output in its target layout, and values within
    the pushdown tolerance of the unfixed program's."""
    from strideguard.decide.pushdown import graph_flops

    program = model.export()
    original = program if path == "aten" else edge_of(program)
    if path == "aten":
        fixed = strideguard.densify_outputs(original, pushdown=True)
    else:
        from strideguard.executorch import DenseOutputsPass

        fixed = DenseOutputsPass(pushdown=True).call(original).exported_program
    report = strideguard.inspect(original)
    pushed = [f"[{o.index}] {o.pushdown}" for o in report.outputs if o.pushdown]
    saved = next((o.flops_saved for o in report.outputs if o.pushdown), None)
    inputs = tuple(program.example_inputs[0])
    orders = target_dim_orders(original)
    if not compile:
        lowering = (lower_outputs if path == "aten" else lower_edge_outputs)(fixed)
        returned = _lowered(lowering)
        with torch.no_grad():
            error = _largest_difference(_leaves(original.module()(*inputs)), _leaves(fixed.module()(*inputs)))
        source = "lowering"
    else:
        from strideguard.testing.executorch_cpu import lower_and_run
        from strideguard.prove.verification import compile_program

        workdir = os.path.join(directory, model.name, f"{path}-pushdown")
        with torch.no_grad():
            if path == "aten":
                before = _leaves(compile_program(program, workdir + "-unfixed")(*inputs))
                after = _leaves(compile_program(fixed, workdir)(*inputs))
            else:
                before = lower_and_run(model.export(), inputs, workdir=workdir + "-unfixed").outputs
                after = lower_and_run(model.export(), inputs, transform_passes=[DenseOutputsPass(pushdown=True)],
                                      workdir=workdir).outputs
        returned, error, source = _measured(after), _largest_difference(before, after), "compiled"
    strided = [
        f"[{i}] {_text(r[1])}" for i, (r, order) in enumerate(zip(returned, orders))
        if r is not None and order is not None and density.has_layout(r[0], r[1], order) is not True
    ]
    return PushdownJudgement(
        model=model.name, path=path, pushed=pushed, saved=saved, flops_before=graph_flops(original.graph),
        flops_after=graph_flops(fixed.graph), after=strided, max_error=error, source=source,
        left_unread=computations_left_unread(original.graph, fixed.graph),
    )


@dataclass
class CudaJudgement:
    """One model on one path judged by Inductor's CUDA lowering (fake tensors, sm90, no GPU needed)."""

    model: str
    path: str
    differs: list[tuple[int, tuple, tuple]]
    """Outputs of the unfixed program whose CPU and CUDA lowerings disagree: (index, CPU strides, CUDA strides)."""
    after: list[str]
    """Outputs of the program fixed for CUDA that its CUDA lowering still returns out of layout (must be empty)."""
    proof_target: str

    @property
    def ok(self) -> bool:
        return not self.after

    def row(self) -> dict[str, Any]:
        return {"model": self.model, "path": self.path, "differs": [list(d) for d in self.differs],
                "after": self.after, "proof_target": self.proof_target}


def judge_cuda(model: ZooModel, path: str, *, compare: bool = False) -> CudaJudgement:
    """The program fixed for CUDA (``exact=True, device="cuda"``): its proof is the CUDA lowering of the fixed
    program, every output in its target layout under every kernel choice (``after`` lists those that are not:
    what ``LayoutNotReached`` would have named). With ``compare``, also lower the unfixed program for the CPU
    and for CUDA and list where they differ (``make zoo``, docs/benchmarks.md)."""
    from strideguard.prove.proof import PROOF_KEY
    from strideguard.compiler.targets import resolve_target

    cuda = resolve_target("cuda", function="zoo")
    program = program_of(model, path)
    lower = lower_edge_outputs if path == "edge" else lower_outputs
    differs = []
    if compare:  # the unfixed program, before the fix sees it
        before_cpu, before_cuda = lower(program), lower(program, target=cuda)
        differs = [
            (index, tuple(cpu.strides), tuple(gpu.strides))
            for index, (cpu, gpu) in enumerate(zip(before_cpu.outputs, before_cuda.outputs))
            if cpu is not None and (tuple(cpu.strides) != tuple(gpu.strides) or gpu.alternatives)
        ]
    if path == "edge":
        from strideguard.executorch import DenseOutputsPass

        dense = DenseOutputsPass(exact=True, device="cuda")
        dense.call(program)
        proof = dense.proof
    else:
        proof = strideguard.densify_outputs(program, exact=True, device="cuda").graph_module.meta[PROOF_KEY]
    after = [f"output {index} unproven: {proof.unproven_reason}" for index in proof.unproven]
    return CudaJudgement(model.name, path, differs, after, proof.target)

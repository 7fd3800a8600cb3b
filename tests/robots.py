"""LeRobot's policies, the problem's own origin: a robot policy returning ``sample[..., :action_dim]``.

Built from LeRobot's own config classes with random weights and small
dimensions (no pretrained backbone, nothing downloaded), and exported as a
deployment exports them, under ``torch.no_grad()``: each method returns the
action chunk the policy hands its action queue and the first action of it,
which ``select_action`` returns. LeRobot 0.6 needs Python 3.12; it is the
``robots`` lane's extra (``make test-robots``), installed without its
dependency pins beside the project's torch and ExecuTorch.

What each needed to export:

* ACT: nothing; its chunk is ``actions[:, :n_action_steps]`` of the decoder.
* Diffusion Policy: DDIM with its timesteps as Python ints (DDPM's step, and
  a timestep read from a tensor, branch on data), and the initial noise
  passed in (``predict_action_chunk(noise=...)``), so that eager and
  compiled runs are comparable.
* VQ-BeT: it samples its codes with ``torch.multinomial``; a temperature of
  1e-4 makes the sampling deterministic in effect (ExecuTorch's ``to_edge``
  rejects the op unless excepted: this zoo's Edge path excepts it).
* TD-MPC: its planner draws random numbers (``randn_like`` and
  ``multinomial``, which ``to_edge`` also rejects unless excepted) and wants a
  batch above one, and its encoder reads the camera under
  ``observation.image``. Its outputs are random, so they are judged by
  layout, not compared by value.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

STATE, ACTION = 6, 6
IMAGE = (3, 64, 64)


def _features(*, camera: str = "observation.images.top") -> dict[str, Any]:
    """A state, one camera and an action, as LeRobot's configs declare them."""
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (STATE,)), camera: PolicyFeature(FeatureType.VISUAL, IMAGE)}
    return dict(input_features=inputs, output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION,))})


class ActionChunk(nn.Module):
    """What a policy's ``select_action`` computes when its action queue is empty, on one observation: the
    chunk of actions it queues, and the first of them, which it returns. ``chunk`` is the policy's own
    method for it, called on the observation as the policy's queue would hand it over."""

    def __init__(self, policy: nn.Module, chunk: Callable[..., torch.Tensor]):
        super().__init__()
        self.policy, self.chunk = policy, chunk

    def forward(self, *observation):
        actions = self.chunk(self.policy, *observation)
        return actions, actions[:, 0]


def act():
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    config = ACTConfig(
        **_features(), chunk_size=10, n_action_steps=6, dim_model=32, n_heads=2, dim_feedforward=64,
        n_encoder_layers=1, n_decoder_layers=1, n_vae_encoder_layers=1, latent_dim=8,
        pretrained_backbone_weights=None, device="cpu",
    )
    policy = ACTPolicy(config).eval()

    def chunk(policy, state, image):
        actions = policy.predict_action_chunk({"observation.state": state, "observation.images.top": image})
        return actions[:, : policy.config.n_action_steps]

    return ActionChunk(policy, chunk), (torch.randn(1, STATE), torch.randn(1, *IMAGE))


def _integer_timesteps(scheduler: Any, steps: int) -> None:
    """DDIM's ``set_timesteps`` makes a tensor, whose elements the step would read as data: set them once,
    before export, as Python ints, which are traced as constants."""
    scheduler.set_timesteps(steps)
    timesteps = [int(t) for t in scheduler.timesteps]

    def as_ints(*args, **kwargs):
        scheduler.timesteps = list(timesteps)

    scheduler.set_timesteps = as_ints


def diffusion():
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    config = DiffusionConfig(
        **_features(), n_obs_steps=2, horizon=16, n_action_steps=8, down_dims=(16, 32), kernel_size=3, n_groups=4,
        diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8, use_group_norm=True,
        pretrained_backbone_weights=None, noise_scheduler_type="DDIM", num_train_timesteps=10,
        num_inference_steps=2, crop_shape=None, device="cpu",
    )
    policy = DiffusionPolicy(config).eval()
    _integer_timesteps(policy.diffusion.noise_scheduler, config.num_inference_steps)
    inputs = (torch.randn(1, 2, STATE), torch.randn(1, 2, *IMAGE), torch.randn(1, config.horizon, ACTION))

    def chunk(policy, state, image, noise):
        return policy.predict_action_chunk({"observation.state": state, "observation.images.top": image}, noise=noise)

    return ActionChunk(policy, chunk), inputs


def vqbet():
    from lerobot.policies.vqbet.configuration_vqbet import VQBeTConfig
    from lerobot.policies.vqbet.modeling_vqbet import VQBeTPolicy

    config = VQBeTConfig(
        **_features(), n_obs_steps=2, n_action_pred_token=2, action_chunk_size=3, crop_shape=None,
        pretrained_backbone_weights=None, use_group_norm=True, spatial_softmax_num_keypoints=8,
        vqvae_n_embed=8, vqvae_embedding_dim=16, vqvae_enc_hidden_dim=16, gpt_block_size=16,
        gpt_input_dim=32, gpt_output_dim=32, gpt_n_layer=1, gpt_n_head=2, gpt_hidden_dim=32,
        bet_softmax_temperature=1e-4, device="cpu",
    )
    policy = VQBeTPolicy(config).eval()

    def chunk(policy, state, image):
        # predict_action_chunk reads the policy's observation queues; this is what it runs on them.
        batch = {"observation.state": state, "observation.images": image.unsqueeze(-4)}
        return policy.vqbet(batch, rollout=True)[:, : policy.config.action_chunk_size]

    return ActionChunk(policy, chunk), (torch.randn(1, 2, STATE), torch.randn(1, 2, *IMAGE))


def tdmpc():
    from lerobot.policies.tdmpc.configuration_tdmpc import TDMPCConfig
    from lerobot.policies.tdmpc.modeling_tdmpc import TDMPCPolicy

    config = TDMPCConfig(
        **_features(camera="observation.image"), horizon=3, n_action_steps=1, image_encoder_hidden_dim=8,
        state_encoder_hidden_dim=16, latent_dim=8, q_ensemble_size=2, mlp_dim=16, cem_iterations=1,
        n_gaussian_samples=8, n_pi_samples=2, n_elites=4, device="cpu",
    )
    policy = TDMPCPolicy(config).eval()

    def chunk(policy, state, image):
        # predict_action_chunk reads the policy's observation queues; this is what it runs on them. The plan
        # is (horizon, batch, action): the queue takes its first n_action_steps, batch first here.
        z = policy.model.encode({"observation.image": image, "observation.state": state})
        actions = torch.clamp(policy.plan(z), -1, +1)
        return actions[: policy.config.n_action_steps].transpose(0, 1)

    return ActionChunk(policy, chunk), (torch.randn(2, STATE), torch.randn(2, *IMAGE))

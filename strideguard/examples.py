"""Bundled example programs: the models the demo, the benchmarks and the tests share."""

from __future__ import annotations

import torch
from torch import nn
from torch.export import ExportedProgram


class PolicyHead(nn.Module):
    """A robot policy's action head: a padded action chunk, sliced to the robot's action size.

    Policies trained across robots predict actions padded to the largest action
    dimension and return ``sample[..., :action_dim]``: a view whose rows keep
    the padded stride. Compiled with AOTInductor, that view is what the method
    returns.
    """

    def __init__(self, obs_dim: int = 64, hidden: int = 256, horizon: int = 8, padded_action_dim: int = 16, action_dim: int = 14):
        super().__init__()
        self.horizon, self.padded_action_dim, self.action_dim = horizon, padded_action_dim, action_dim
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, horizon * padded_action_dim),
        )

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        sample = self.net(observation).view(-1, self.horizon, self.padded_action_dim)
        return sample[..., : self.action_dim]


def export_policy(batch: int = 1, seed: int = 0) -> ExportedProgram:
    """The policy head exported with ``torch.export`` for one batch size, with example inputs stored."""
    torch.manual_seed(seed)
    model = PolicyHead().eval()
    observation = torch.randn(batch, 64)
    with torch.no_grad():
        return torch.export.export(model, (observation,))


class DecodeStep(nn.Module):
    """An LLM decode-like step: returns the last position's logits, ``logits[:, -1, :]``."""

    def __init__(self, vocab: int = 512, dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.proj(self.embed(tokens)))
        logits = self.head(hidden)
        return logits[:, -1, :]


def export_decode_step(batch: int = 1, length: int = 8, seed: int = 0) -> ExportedProgram:
    torch.manual_seed(seed)
    tokens = torch.randint(0, 512, (batch, length))
    with torch.no_grad():
        return torch.export.export(DecodeStep().eval(), (tokens,))


class RobotPolicy(nn.Module):
    """A robot policy returning a dict, as robot-learning code does: the action chunk sliced to the arm's
    joints, its first step, and the gripper's channel transposed to time-major. Every one is a view of the
    head's output, each strided in another way."""

    def __init__(self, obs_dim: int = 32, hidden: int = 64, horizon: int = 8, padded_action_dim: int = 16, joints: int = 14):
        super().__init__()
        self.horizon, self.padded_action_dim, self.joints = horizon, padded_action_dim, joints
        self.trunk = nn.Linear(obs_dim, hidden)
        self.head = nn.Linear(hidden, horizon * padded_action_dim)

    def forward(self, observation: torch.Tensor) -> dict[str, torch.Tensor]:
        sample = self.head(torch.relu(self.trunk(observation))).view(-1, self.horizon, self.padded_action_dim)
        joints = sample[..., : self.joints]
        return {"actions": joints, "first_action": joints[:, 0], "gripper": sample[..., self.joints :].transpose(1, 2)}


def export_robot_policy(batch: int = 2, seed: int = 0) -> ExportedProgram:
    torch.manual_seed(seed)
    observation = torch.randn(batch, 32)
    with torch.no_grad():
        return torch.export.export(RobotPolicy().eval(), (observation,))

"""Gaussian policies on a Box action space: TorchRL's ``ProbabilisticActor`` over a normal or a tanh-normal
distribution, the action the environment receives, and the deterministic action evaluation and export take.

Two distributions (the ``distribution`` option):

- ``normal``: ``a ~ N(centre + half_range · μ(s), half_range · σ)``, the Gaussian of the PPO papers, Stable-Baselines3
  and CleanRL. Its log-probability and entropy are exact and closed-form. A sample can fall outside the box: the
  environment receives it clipped to the box (:class:`ClipAction`, an inverse transform of the environment), while the
  rollout keeps the sample itself, whose log-probability PPO's ratio compares — CleanRL's ``ClipAction`` wrapper. An
  unbounded Box is the same Gaussian about 0 with unit half-range, nothing clipped.
- ``tanh_normal``: ``a = centre + half_range · tanh(u)``, ``u ~ N(μ(s), σ)`` (TorchRL's ``TanhNormal``, SAC's form):
  every action is inside the box, and the log-probability carries the squashing's Jacobian. Its entropy has no closed
  form: TorchRL's PPO loss estimates it from a sample of the distribution. It needs a bounded box.

Either way the network's outputs live in units of the box's half-range about its centre, so a unit σ explores the whole
box whatever the action's physical units (Stable-Baselines3's advice to rescale actions to [−1, 1], done inside the
policy). The scale σ (the ``scale`` option) is ``state_independent``, one learned log-σ per action dimension starting
at σ = 1 (TorchRL's ``AddStateIndependentNormalScale``; CleanRL's and Stable-Baselines3's default for PPO), or
``state_dependent``, a second head of the network (``NormalParamExtractor``: σ = 1 where the head outputs 0).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tensordict.nn import AddStateIndependentNormalScale, NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs import Transform
from torchrl.modules import ProbabilisticActor, TanhNormal

from modules.actors import NormalActor
from modules.spaces import box_bounds

DISTRIBUTIONS = ("normal", "tanh_normal")
SCALES = ("state_independent", "state_dependent")


def gaussian_outputs(action_spec: TensorSpec, scale: str) -> int:
    """How many outputs the policy network has: μ per action dimension, and σ too when it depends on the state."""
    (action_dim,) = action_spec.shape
    return action_dim * (2 if scale == "state_dependent" else 1)


class BoxUnits(nn.Module):
    """``(μ, σ)`` in half-range units about the box's centre → ``(centre + half_range · μ, half_range · σ)``: the
    normal distribution's parameters in the action's own units."""

    def __init__(self, low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("centre", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def forward(self, loc: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.centre + self.half_range * loc, self.half_range * scale


def gaussian_actor(
    network: nn.Module, action_spec: TensorSpec, distribution: str, scale: str, init_scale: float = 1.0
) -> ProbabilisticActor:
    """A policy sampling Box actions from the Gaussian ``network`` parameterises (the module docstring), recording each
    action's log-probability (PPO's ratio needs it); under ``ExplorationType.DETERMINISTIC`` its deterministic action
    (the mean; for ``tanh_normal`` the squashed mean). σ starts at ``init_scale`` (half-range units; before tanh for
    ``tanh_normal``): the learned log-σ's start, or the state-dependent head's σ where it outputs 0."""
    (action_dim,) = action_spec.shape
    parameters = (
        AddStateIndependentNormalScale(action_dim, scale_mapping="exp", init_value=math.log(init_scale))
        if scale == "state_independent"
        else NormalParamExtractor(scale_mapping=f"biased_softplus_{init_scale}")
    )
    module = TensorDictModule(nn.Sequential(network, parameters), in_keys=["observation"], out_keys=["loc", "scale"])
    bounds = box_bounds(action_spec)
    if distribution == "normal":  # TorchRL's IndependentNormal, acting without building it (modules/actors.py)
        if bounds is not None:
            units = TensorDictModule(BoxUnits(*bounds), in_keys=["loc", "scale"], out_keys=["loc", "scale"])
            module = TensorDictSequential(module, units)
        return NormalActor(module, action_spec)
    # safe_tanh: PPO scores the stored actions through tanh's inverse, which it keeps finite at the box's edges.
    low, high = bounds
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        spec=action_spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": low, "high": high, "safe_tanh": True},
        return_log_prob=True,
    )


class DeterministicAction(nn.Module):
    """``observation → action``: a Gaussian policy's deterministic action as the environment receives it —
    ``clamp(centre + half_range · μ, low, high)`` for ``normal`` (unclamped on an unbounded box), ``centre +
    half_range · tanh(μ)`` for ``tanh_normal``. What ``python -m app export`` traces for a continuous PPO policy."""

    def __init__(self, network: nn.Module, action_spec: TensorSpec, distribution: str) -> None:
        super().__init__()
        self.network, self.squash = network, distribution == "tanh_normal"
        (self.action_dim,) = action_spec.shape
        bounds = box_bounds(action_spec)
        self.bounded = bounds is not None
        low, high = bounds if self.bounded else (-torch.ones(self.action_dim), torch.ones(self.action_dim))
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.register_buffer("centre", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        mean = self.network(observation)[..., : self.action_dim]  # μ: the first outputs (σ's head after, if any)
        if self.squash:
            return self.centre + self.half_range * torch.tanh(mean)
        action = self.centre + self.half_range * mean
        return torch.clamp(action, self.low, self.high) if self.bounded else action


class ClipAction(Transform):
    """Clips the action the environment receives into the box ``[low, high]`` (an inverse transform: the policy's own
    action, which the rollout stores and PPO scores, is left as sampled). CleanRL's ``ClipAction`` as a TorchRL
    transform; TorchRL's ``ClipTransform`` takes one scalar bound for every dimension."""

    def __init__(self, low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__(in_keys_inv=["action"], out_keys_inv=["action"])
        self.register_buffer("low", low)
        self.register_buffer("high", high)

    def _inv_apply_transform(self, action: torch.Tensor) -> torch.Tensor:
        return torch.clamp(action, self.low.to(action.device), self.high.to(action.device))


def tanh_gaussian_sample(
    location: torch.Tensor, scale: torch.Tensor, noise: torch.Tensor, centre: torch.Tensor, half_range: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reparametrised action ``centre + half_range · tanh(location + scale · noise)`` and its log-density:
    ``log N(u) − log|d tanh(u)/du| − log|d action/d tanh|``, with ``log(1 − tanh²u) = 2(log 2 − u − softplus(−2u))``."""
    pre_tanh = location + scale * noise
    log_normal = -0.5 * noise.pow(2) - scale.log() - 0.5 * math.log(2 * math.pi)
    log_tanh = 2 * (math.log(2) - pre_tanh - F.softplus(-2 * pre_tanh))
    log_prob = (log_normal - log_tanh).sum(-1) - half_range.log().sum()
    return centre + half_range * torch.tanh(pre_tanh), log_prob

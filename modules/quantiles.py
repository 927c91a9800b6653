"""Quantile regression (Dabney et al. 2018): the quantile Huber loss, which QR-DQN and TQC train their critics with,
and QR-DQN's network head (its quantiles per action, and their mean: the Q-values it acts on).

Predicted quantiles sit at the midpoints τ_i = (2i + 1) / 2N of [0, 1]; each is regressed on every target sample
``j`` with the Huber loss (κ = 1) weighted by ``|τ_i − 1{target_j < predicted_i}|``, so that it settles at the
τ_i-quantile of the targets. How the pairs are reduced is each algorithm's: QR-DQN sums over ``i`` and averages over
``j``, TQC averages over both (Stable-Baselines3 contrib's ``sum_over_quantiles`` true and false).

The head acts in collector worker processes too (in the acting policy), so this file imports no Lightning.
"""

from __future__ import annotations

import torch
from torch import nn


def quantile_huber(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The weighted Huber loss of each pair ``[..., N, N']``: ``predicted`` quantiles ``[..., N]`` against each of
    the ``target`` samples ``[..., N']`` (the leading dimensions broadcast)."""
    count = predicted.shape[-1]
    tau = (torch.arange(count, device=predicted.device, dtype=predicted.dtype) + 0.5) / count
    delta = target.unsqueeze(-2) - predicted.unsqueeze(-1)  # target j minus prediction i
    huber = torch.where(delta.abs() > 1, delta.abs() - 0.5, 0.5 * delta.pow(2))
    return (tau.unsqueeze(-1) - (delta.detach() < 0).to(delta.dtype)).abs() * huber


class QuantileNetwork(nn.Module):
    """``network``'s ``actions × quantiles`` outputs as ``[..., actions, quantiles]``."""

    def __init__(self, network: nn.Module, actions: int, quantiles: int) -> None:
        super().__init__()
        self.network, self.actions, self.quantiles = network, actions, quantiles

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.network(observation).unflatten(-1, (self.actions, self.quantiles))


class MeanOfQuantiles(nn.Module):
    """The Q-values: the mean of each action's quantiles (what acting, evaluation and export read)."""

    def __init__(self, quantiles: QuantileNetwork) -> None:
        super().__init__()
        self.quantiles = quantiles

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.quantiles(observation).mean(-1)

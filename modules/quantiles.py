"""The quantile Huber loss of quantile regression (Dabney et al. 2018), which QR-DQN and TQC train their critics with.

Predicted quantiles sit at the midpoints τ_i = (2i + 1) / 2N of [0, 1]; each is regressed on every target sample
``j`` with the Huber loss (κ = 1) weighted by ``|τ_i − 1{target_j < predicted_i}|``, so that it settles at the
τ_i-quantile of the targets. How the pairs are reduced is each algorithm's: QR-DQN sums over ``i`` and averages over
``j``, TQC averages over both (Stable-Baselines3 contrib's ``sum_over_quantiles`` true and false).
"""

from __future__ import annotations

import torch


def quantile_huber(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The weighted Huber loss of each pair ``[..., N, N']``: ``predicted`` quantiles ``[..., N]`` against each of
    the ``target`` samples ``[..., N']`` (the leading dimensions broadcast)."""
    count = predicted.shape[-1]
    tau = (torch.arange(count, device=predicted.device, dtype=predicted.dtype) + 0.5) / count
    delta = target.unsqueeze(-2) - predicted.unsqueeze(-1)  # target j minus prediction i
    huber = torch.where(delta.abs() > 1, delta.abs() - 0.5, 0.5 * delta.pow(2))
    return (tau.unsqueeze(-1) - (delta.detach() < 0).to(delta.dtype)).abs() * huber

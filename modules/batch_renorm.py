"""Batch renormalisation (Ioffe 2017), as CrossQ's networks use it (Bhatt et al. 2024; Stable-Baselines3 contrib's
``BatchRenorm1d``, which the RL Zoo's CrossQ entries run).

In training mode a layer normalises with the batch's statistics and moves running averages towards them; after
``warmup_steps`` training batches it corrects the batch's statistics towards the running ones (``r``, ``d`` clipped to
``max_r`` and ``max_d``), so that an unusual batch cannot throw a long run off. In eval mode it normalises with the
running averages and leaves them alone. The phase is a tensor comparison, not a Python branch: one graph for the whole
run, no host read.

Not TorchRL's ``BatchRenorm1d``: its warm-up factor, ``num_batches_tracked // warmup_steps``, keeps growing past 1
(its ``clamp_max`` result is discarded), so after twice the warm-up it doubles ``r − 1`` and ``d``; and it differs
from SB3 contrib's in ``eps`` and in how the correction enters. This one computes SB3 contrib's outputs and statistics
to the bit and its gradients to within 1e-6 (``tests/agents/test_crossq.py``), the comparison's partner, with one
difference: a feature constant over a batch (a dead ReLU's) sends a NaN gradient back through SB3 contrib's
correction once it renormalises, and a finite one here.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tensordict import TensorDictBase
from torch import nn

#: A layer's parameters and statistics, in :func:`batch_renorm`'s order.
STATE = ("weight", "bias", "running_mean", "running_var", "steps")


def batch_renorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    steps: torch.Tensor,
    training: bool,
    momentum: float,
    eps: float,
    warmup_steps: int,
    max_r: float = 3.0,
    max_d: float = 5.0,
) -> torch.Tensor:
    """Batch renormalisation of ``x`` ``[..., batch, features]`` over its batch dimension; any leading dimensions
    index independent layers (an ensemble of critics), whose parameters and statistics ``[..., features]`` and
    ``steps`` ``[...]`` lead with the same. In training, updates the statistics and ``steps`` in place."""
    if training:
        batch_mean, batch_var = x.mean(-2), x.var(-2)  # the unbiased variance, as SB3 contrib's
        running_std = (running_var + eps).sqrt()
        renormalises = (steps > warmup_steps).unsqueeze(-1)
        r = ((batch_var + eps).sqrt() / running_std).detach().clamp(1 / max_r, max_r)
        d = ((batch_mean - running_mean) / running_std).detach().clamp(-max_d, max_d)
        r, d = torch.where(renormalises, r, 1.0), torch.where(renormalises, d, 0.0)
        # The batch's statistics corrected towards the running ones; with r = 1 and d = 0 (warm-up), the batch's own,
        # to the bit. The floor under the variance keeps a feature constant over the batch (a dead ReLU's) from
        # sending 0 · ∞ = NaN back through the square root; it changes no value but a zero or subnormal variance's.
        mean = batch_mean - d * batch_var.clamp_min(torch.finfo(x.dtype).tiny).sqrt() / r
        var = batch_var / r**2
        with torch.no_grad():
            running_mean.add_(momentum * (batch_mean - running_mean))
            running_var.add_(momentum * (batch_var - running_var))
            steps.add_(1)
    else:
        mean, var = running_mean, running_var
    return weight.unsqueeze(-2) * ((x - mean.unsqueeze(-2)) / (var.unsqueeze(-2) + eps).sqrt()) + bias.unsqueeze(-2)


class BatchRenorm(nn.Module):
    """A batch renormalisation layer over ``features`` (:func:`batch_renorm`), inputs ``[..., batch, features]``.

    Args:
        features: the width it normalises.
        momentum: the running averages' step towards each training batch's statistics.
        eps: added to the variances.
        warmup_steps: training batches normalised with their own statistics before the correction starts.
    """

    def __init__(self, features: int, momentum: float = 0.01, eps: float = 1e-3, warmup_steps: int = 100_000):
        super().__init__()
        self.momentum, self.eps, self.warmup_steps = momentum, eps, warmup_steps
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))
        self.register_buffer("steps", torch.tensor(0))

    def forward(self, x: torch.Tensor, training: bool | None = None) -> torch.Tensor:
        """``training``: normalise with the batch's statistics and update the running ones; None: the module's
        mode."""
        state = (getattr(self, name) for name in STATE)
        return self._normalize(x, state, self.training if training is None else training)

    def ensemble(self, x: torch.Tensor, parameters: TensorDictBase, training: bool) -> torch.Tensor:
        """This layer with ``parameters``' entries instead of its own: each stacked over an ensemble of critics
        (``SACLoss``'s ``qvalue_network_params``), ``x`` ``[critics, batch, features]``."""
        return self._normalize(x, (parameters[name] for name in STATE), training)

    def _normalize(self, x: torch.Tensor, state: Iterable[torch.Tensor], training: bool) -> torch.Tensor:
        return batch_renorm(x, *state, training, self.momentum, self.eps, self.warmup_steps)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, momentum={self.momentum}, eps={self.eps}, warmup_steps={self.warmup_steps}"

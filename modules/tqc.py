"""Truncated Quantile Critics (TQC): SAC whose critics predict the return's quantiles, with the highest of the pooled
target quantiles dropped.

Kuznetsov et al., "Controlling Overestimation Bias with Truncated Mixture of Continuous Distributional Quantile
Critics", ICML 2020 (Stable-Baselines3 contrib's TQC, which the RL Zoo tunes).

Each of the ``critics.count`` critics maps ``(observation, action)`` to ``quantiles`` values, the return's quantiles
at the midpoints τ_i = (2i + 1) / 2N. The target pools every target critic's quantiles at a fresh action of the next
state, sorts them and drops the ``dropped_per_critic × critics.count`` highest — the control of overestimation that
SAC gets from the minimum of two critics — and each critic regresses on what remains, less α·log π and discounted,
with the quantile Huber loss (:mod:`modules.quantiles`). The actor climbs the mean of all quantiles of all critics.
Everything else — the tanh-Gaussian actor, α's tuning, the target critics' Polyak step, the start from behaviour
cloning — is :class:`~modules.sac.SAC`'s. TorchRL's ``TQCLoss`` defines the losses; the update computes the same
numbers from its parameters (``tests/agents/test_tqc.py``).

Usage::

    python -m app fit --config configs/gym/pendulum_tqc.yaml
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torchrl.data import TensorSpec
from torchrl.objectives import TQCLoss

from modules.networks import CriticOptions, map_tree, parameter_tree, q_critic
from modules.optim import OptimizerOptions
from modules.quantiles import quantile_huber
from modules.sac import SAC, ActorOptions, BCTermOptions


class TQC(SAC):
    """SAC with distributional critics and a truncated target.

    Args:
        observation_spec, action_spec, actor, critics, gamma, alpha_init, learn_alpha, target_entropy, actor_init,
            bc_term: as :class:`~modules.sac.SAC`'s.
        quantiles: quantiles each critic predicts (Stable-Baselines3 contrib's ``n_quantiles``, default 25).
        dropped_per_critic: the highest target quantiles dropped from the pool, per critic
            (``top_quantiles_to_drop_per_net``, default 2): with 2 critics of 25, the target keeps the lowest 46 of 50.
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule`.
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        actor: ActorOptions = ActorOptions(),
        critics: CriticOptions = CriticOptions(),
        quantiles: int = 25,
        dropped_per_critic: int = 2,
        gamma: float = 0.99,
        alpha_init: float = 1.0,
        learn_alpha: bool = True,
        target_entropy: float | str = "auto",
        actor_init: str | None = None,
        bc_term: BCTermOptions = BCTermOptions(),
        optimizer: OptimizerOptions = OptimizerOptions(lr=3e-4),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        if quantiles < 1:
            raise ValueError(f"model.quantiles must be >= 1, got {quantiles}")
        if not 0 <= dropped_per_critic < quantiles:
            raise ValueError(
                f"model.dropped_per_critic must be in [0, quantiles = {quantiles}), got {dropped_per_critic}"
            )
        self.quantile_count, self.dropped_per_critic = quantiles, dropped_per_critic
        # The target's quantiles: the pool of every critic's, less the highest dropped_per_critic of each.
        self.kept_quantiles = (quantiles - dropped_per_critic) * critics.count
        super().__init__(
            observation_spec, action_spec, actor, critics, gamma, alpha_init, learn_alpha, target_entropy, actor_init,
            bc_term, optimizer, compile, check_finite_every,
        )  # fmt: skip

    def make_critic(
        self, observation_dim: int, hidden_sizes: Sequence[int], low: torch.Tensor, high: torch.Tensor
    ) -> TensorDictModule:
        return q_critic(observation_dim, hidden_sizes, low, high, outputs=self.quantile_count)

    def make_loss_module(self, **options: Any) -> TQCLoss:
        return TQCLoss(
            self.actor, self.qvalue, top_quantiles_to_drop_per_net=self.dropped_per_critic, delay_qvalue=True, **options
        )

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """TQC's losses as TorchRL's ``TQCLoss`` defines them, from the parameters it holds: each critic's quantile
        Huber loss against the truncated pool of the target critics' quantiles (at a fresh action of the next state,
        less α·log π, discounted unless terminated), averaged over quantile pairs and the batch and summed over the
        critics; the actor's ``α·log π − mean quantile``; α's loss towards the target entropy. Every critic runs in one
        batched matmul a layer, as in :meth:`SAC.loss <modules.sac.SAC.loss>`."""
        loss_module, critic = self.loss_module, self.qvalue.module
        critics = parameter_tree(loss_module.qvalue_network_params["module"])  # read once, for both passes below
        targets = loss_module.target_qvalue_network_params["module"]
        alpha = loss_module.log_alpha.detach().exp()
        observation, action, following = batch["observation"], batch["action"], batch["next"]
        with torch.no_grad():
            next_action, next_log_prob = self.sample(following["observation"])
            pooled = critic.ensemble_outputs(targets, following["observation"], next_action)  # [critics, batch, N]
            pooled = pooled.movedim(0, -2).flatten(-2)  # [batch, critics · N]
            kept = pooled.sort(-1).values[..., : self.kept_quantiles]
            continues = ~following["terminated"]  # [batch, 1], beside the kept quantiles
            target = following["reward"] + self.gamma * continues * (kept - alpha * next_log_prob.unsqueeze(-1))
        quantiles = critic.ensemble_outputs(critics, observation, action)  # [critics, batch, N]
        # Critic by critic: one [critics, batch, N, kept] tensor of pairs (2.4 MB at the defaults) made the update
        # 1.25x its bare arithmetic on a CPU; a [batch, N, kept] one at a time, level with it.
        loss_qvalue = sum(quantile_huber(q, target).mean() for q in quantiles.unbind(0))
        new_action, log_prob = self.sample(observation)
        # The actor's gradient only: the mean of every critic's quantiles, the critics held fixed.
        held = map_tree(torch.Tensor.detach, critics)
        q = critic.ensemble_outputs(held, observation, new_action).mean((0, -1))
        return self.soft_losses(loss_qvalue, log_prob, q, alpha)

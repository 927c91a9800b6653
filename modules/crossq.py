"""CrossQ: SAC without target networks, its networks batch-renormalised, the current and next state-action pairs
through the critics in one batch.

Bhatt et al., "CrossQ: Batch Normalization in Deep Reinforcement Learning for Greater Sample Efficiency and
Simplicity", ICLR 2024 (Stable-Baselines3 contrib's CrossQ, which the RL Zoo tunes).

Batch normalisation in a critic breaks the usual target: the next state-action pairs, drawn from the current policy,
are not distributed as the replay's pairs, so a critic normalising each batch by its own statistics sees them out of
distribution. CrossQ passes both through the critics together, ``[(s, a); (s′, a′)]`` in one training-mode forward,
so that one set of statistics covers both, and takes the target from the same forward, detached: no target
networks, no Polyak step. Each layer is a batch renormalisation (:mod:`modules.batch_renorm`): batch statistics
during ``batch_renorm.warmup_steps`` updates, then corrected towards the running ones. The actor (also
renormalised) acts, and draws the next action a′, with its running statistics; its loss — SAC's ``α·log π − min Q``
through the critics in evaluation mode — and α's, every ``policy_delay``-th update, as are its statistics' updates.
Everything else is :class:`~modules.sac.SAC`'s. TorchRL's ``CrossQLoss`` defines the losses; the update computes the
same numbers from its parameters (``tests/agents/test_crossq.py``).

Where it differs from Stable-Baselines3 contrib on purpose: the actor's loss reads the critics as they were before
this update's step (one backward for both, as SAC and TD3 here), where it steps the critics first; the critics' loss
is the sum of their squared errors (SAC's here; ``0.5 ×`` that there, which Adam does not see); the scale of the
actor's Gaussian is a softplus of its output, not ``exp`` of a clipped log (SAC's here).

Usage::

    python -m app fit --config configs/gym/pendulum_crossq.yaml
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn
from torchrl.data import TensorSpec
from torchrl.objectives import CrossQLoss

from modules.batch_renorm import BatchRenorm
from modules.gaussian import tanh_gaussian_sample
from modules.networks import CriticOptions, EvalModeActor, map_tree, mlp, parameter_tree, q_critic
from modules.optim import OptimizerOptions
from modules.sac import SAC, ActorOptions


@dataclass(frozen=True)
class BatchRenormOptions:
    """The batch renormalisation layers of the actor and the critics: ``batch_renorm:`` in a CrossQ's ``init_args``
    (Stable-Baselines3 contrib's ``batch_norm_momentum`` and ``renorm_warmup_steps``).

    Args:
        momentum: the running statistics' step towards each training batch's.
        warmup_steps: training batches normalised by their own statistics before the correction towards the running
            ones starts (counted per layer: the critics' every update, the actor's every ``policy_delay``-th).
    """

    momentum: float = 0.01
    warmup_steps: int = 100_000

    def __post_init__(self) -> None:
        if not 0 < self.momentum <= 1:
            raise ValueError(f"model.batch_renorm.momentum must be in (0, 1], got {self.momentum}")
        if self.warmup_steps < 0:
            raise ValueError(f"model.batch_renorm.warmup_steps must be >= 0, got {self.warmup_steps}")

    def layer(self, features: int) -> BatchRenorm:
        return BatchRenorm(features, momentum=self.momentum, warmup_steps=self.warmup_steps)


class CrossQ(SAC):
    """SAC with batch-renormalised networks and no target critics.

    Args:
        observation_spec, action_spec, gamma, alpha_init, learn_alpha, target_entropy: as :class:`~modules.sac.SAC`'s.
        actor: the actor (Stable-Baselines3 contrib's ``net_arch pi``: 256, 256); ``correction_bound`` is SAC's start
            from behaviour cloning, which CrossQ does not take.
        critics: the critics (``net_arch qf``: 1024, 1024; ``n_critics``); ``tau`` is unused: there are no targets.
        policy_delay: updates per update of the actor and α (``policy_delay``, default 3).
        batch_renorm: the normalisation layers (:class:`BatchRenormOptions`).
        optimizer: Adam's (Stable-Baselines3 contrib's: lr 1e-3, β₁ 0.5); ``compile``, ``check_finite_every``: see
            :class:`~modules.base.RLModule`.
    """

    target_networks = ()
    # torch 2.13's Inductor writes a C++ wrapper for the backward of CrossQ's update that does not compile (a
    # generated variable declared twice, `conflicting declaration 'auto var_1'`); its Python wrapper builds and runs it.
    cpp_wrapper = False

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        actor: ActorOptions = ActorOptions(hidden_sizes=(256, 256)),
        critics: CriticOptions = CriticOptions(hidden_sizes=(1024, 1024)),
        policy_delay: int = 3,
        batch_renorm: BatchRenormOptions = BatchRenormOptions(),
        gamma: float = 0.99,
        alpha_init: float = 1.0,
        learn_alpha: bool = True,
        target_entropy: float | str = "auto",
        optimizer: OptimizerOptions = OptimizerOptions(lr=1e-3, betas=(0.5, 0.999)),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        if policy_delay < 1:
            raise ValueError(f"model.policy_delay must be >= 1, got {policy_delay}")
        if actor.correction_bound is not None:
            raise ValueError("model.actor.correction_bound corrects a behaviour-cloning start: CrossQ takes none")
        self.policy_delay, self.batch_renorm = policy_delay, batch_renorm
        super().__init__(
            observation_spec, action_spec, actor, critics, gamma, alpha_init, learn_alpha, target_entropy,
            optimizer=optimizer, compile=compile, check_finite_every=check_finite_every,
        )  # fmt: skip

    def make_actor_network(self, observation_dim: int, hidden_sizes: Sequence[int], outputs: int) -> nn.Module:
        return mlp(observation_dim, hidden_sizes, outputs, normalization=self.batch_renorm.layer)

    def make_critic(
        self, observation_dim: int, hidden_sizes: Sequence[int], low: torch.Tensor, high: torch.Tensor
    ) -> TensorDictModule:
        return q_critic(observation_dim, hidden_sizes, low, high, normalization=self.batch_renorm.layer)

    def make_loss_module(self, **options: Any) -> CrossQLoss:
        return CrossQLoss(self.actor, self.qvalue, loss_function="l2", **options)

    def policy(self) -> TensorDictModuleBase:
        # Acting reads the running statistics and leaves them alone: an acting batch is no training batch.
        return EvalModeActor(self.actor, self.actor_network)

    def greedy_policy(self) -> TensorDictModuleBase:
        return self.policy()

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self._compiled_critic_loss = self.compiled(self.critic_loss)

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        """One CrossQ update: the critics' loss and, every ``policy_delay``-th update (after ``actor.warmup_updates``),
        the actor's and α's; their backward, gradient clip and Adam step. On the others the actor and α get no
        gradient, and Adam leaves them alone."""
        # From the restored update counter, so a resumed run keeps the same rhythm.
        delayed = self.updates_actor(self.global_step)
        loss, losses, _ = self.loss_backward(batches, loss=None if delayed else self._compiled_critic_loss)
        self.optimizer_step()
        self.datamodule.after_update(None)
        return loss, losses

    def updates_actor(self, update: int) -> bool:
        """Whether update ``update`` (counted from 0) trains the actor and α: every ``policy_delay``-th (sb3-contrib:
        its 3rd, 6th, …) once ``actor.warmup_updates`` have passed; the others train the critics alone."""
        return (update + 1) % self.policy_delay == 0 and update >= self.actor_warmup_updates

    def sample(self, observation: torch.Tensor, training: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparametrised action of the actor's tanh-Gaussian for each observation, and its log-probability;
        ``training``: the actor's layers normalise with the batch's statistics and update their running ones."""
        x = observation
        for layer in self.actor_network:
            x = layer(x, training) if isinstance(layer, BatchRenorm) else layer(x)
        location, scale = self.actor.module[0].module[1](x)  # the scale's mapping
        noise = torch.randn_like(location)
        return tanh_gaussian_sample(location, scale, noise, self.action_centre, self.action_half_range)

    def critic_terms(self, batch: TensorDictBase, alpha: torch.Tensor) -> torch.Tensor:
        """The critics' squared error to the soft target: ``(s, a)`` and ``(s′, a′)`` through the critics in one
        training-mode forward (a′ drawn by the actor with its running statistics), the target from the second half,
        its minimum over the critics less α·log π, discounted unless terminated, held fixed — ``CrossQLoss``'s
        ``qvalue_loss``."""
        critic, critics = self.qvalue.module, self.loss_module.qvalue_network_params["module"]
        observation, following = batch["observation"], batch["next"]
        with torch.no_grad():
            next_action, next_log_prob = self.sample(following["observation"])
        both = critic.ensemble(
            critics,
            torch.cat([observation, following["observation"]]),
            torch.cat([batch["action"], next_action]),
            training=True,
        )
        value, next_value = both.split(observation.shape[0], -1)  # [critics, batch] each
        with torch.no_grad():
            continues = ~following["terminated"].squeeze(-1)
            soft_value = next_value.amin(0) - alpha * next_log_prob
            target = following["reward"].squeeze(-1) + self.gamma * continues * soft_value
        return (value - target).pow(2).sum(0).mean()

    def critic_loss(self, batch: TensorDictBase) -> TensorDictBase:
        """The critics' loss alone (:meth:`critic_terms`): the updates between two of the actor's."""
        alpha = self.loss_module.log_alpha.detach().exp()
        return TensorDict({"loss_qvalue": self.critic_terms(batch, alpha), "alpha": alpha}, batch_size=[])

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """CrossQ's losses as TorchRL's ``CrossQLoss`` defines them, from the parameters it holds: the critics'
        (:meth:`critic_terms`), the actor's ``α·log π − min Q`` — its action drawn with the batch's statistics, the
        critics held fixed and reading their running statistics — and α's loss towards the target entropy."""
        crossq, critic = self.loss_module, self.qvalue.module
        alpha = crossq.log_alpha.detach().exp()
        loss_qvalue = self.critic_terms(batch, alpha)
        observation = batch["observation"]
        new_action, log_prob = self.sample(observation, training=True)
        critics = map_tree(torch.Tensor.detach, parameter_tree(crossq.qvalue_network_params["module"]))
        q = critic.ensemble(critics, observation, new_action).amin(0)  # the actor's gradient only
        return self.soft_losses(loss_qvalue, log_prob, q, alpha)

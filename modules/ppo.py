"""Proximal Policy Optimization on TorchRL's ``ClipPPOLoss`` and ``GAE``.

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347, 2017; GAE: Schulman et al.,
"High-Dimensional Continuous Control Using Generalized Advantage Estimation", ICLR 2016.

Usage::

    python -m app fit --config configs/snake_ppo.yaml
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn
from torchrl.data import TensorSpec
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from modules.bare import POOL, optimizer_step, transitions
from modules.base import RLModule
from modules.networks import observation_mlp
from modules.optim import OptimizerOptions


def check_ppo_options(gamma: float, gae_lambda: float, clip_epsilon: float) -> None:
    for name, value in (("gamma", gamma), ("gae_lambda", gae_lambda)):
        if not 0 <= value <= 1:
            raise ValueError(f"--model.init_args.{name} must be in [0, 1], got {value}")
    if clip_epsilon <= 0:
        raise ValueError(f"--model.init_args.clip_epsilon must be > 0, got {clip_epsilon}")


def categorical_actor(logits: TensorDictModuleBase, action_spec: TensorSpec) -> ProbabilisticActor:
    """A policy sampling discrete actions from the ``logits`` that module writes, recording each action's
    log-probability (PPO's ratio needs it); its mode under ``ExplorationType.DETERMINISTIC``."""
    return ProbabilisticActor(
        logits,
        in_keys=["logits"],
        spec=action_spec,
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )


def clip_ppo_loss(
    actor: TensorDictModuleBase,
    critic: TensorDictModuleBase,
    clip_epsilon: float,
    entropy_coef: float,
    critic_coef: float,
    normalize_advantage: bool,
) -> ClipPPOLoss:
    """TorchRL's clipped PPO loss with this project's choices (a Huber value loss)."""
    return ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=clip_epsilon,
        entropy_coeff=entropy_coef,
        critic_coeff=critic_coef,
        loss_critic_type="smooth_l1",
        normalize_advantage=normalize_advantage,
    )


def ppo_batch_keys(loss: ClipPPOLoss) -> list:
    """What a PPO update reads: the networks' stored inputs, the action taken and its log-probability, and the
    advantage and value target written by the agent's ``postprocess`` (so a rollout need not keep the next
    observations). Entries the actor computes itself (its LSTM output, which the critic head reads) are left out."""
    keys = loss.tensor_keys
    computed = set(loss.actor_network.out_keys) - {keys.action, keys.sample_log_prob}
    inputs = [key for key in (*loss.actor_network.in_keys, *loss.critic_network.in_keys) if key not in computed]
    return list(dict.fromkeys([*inputs, keys.action, keys.sample_log_prob, keys.advantage, keys.value_target]))


class PPO(RLModule):
    """Clipped-objective PPO with a separate actor and critic, advantages from GAE on each fresh rollout.

    Args:
        observation_spec: linked from the data module.
        action_spec: linked from the data module (a discrete ``Categorical`` spec).
        hidden_sizes: hidden widths of both the actor and the critic.
        gamma: discount.
        gae_lambda: GAE's λ.
        clip_epsilon: PPO's ratio clip.
        entropy_coef: weight of the entropy bonus.
        critic_coef: weight of the value loss.
        normalize_advantage: standardise advantages within each minibatch.
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule` (PPO usually clips the gradient's
            norm at 0.5: ``optimizer: {max_grad_norm: 0.5}``).
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        hidden_sizes: Sequence[int] = (256, 256),
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_epsilon: float = 0.2,
        entropy_coef: float = 0.01,
        critic_coef: float = 0.5,
        normalize_advantage: bool = True,
        optimizer: OptimizerOptions = OptimizerOptions(lr=3e-4),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__(observation_spec, action_spec, optimizer, compile, check_finite_every)
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        check_ppo_options(gamma, gae_lambda, clip_epsilon)

        observation_shape = observation_spec["observation"].shape
        self.actor_network = observation_mlp(observation_shape, hidden_sizes, action_spec.space.n)
        self.critic_network = observation_mlp(observation_shape, hidden_sizes, 1)
        self.actor = categorical_actor(
            TensorDictModule(self.actor_network, in_keys=["observation"], out_keys=["logits"]), action_spec
        )
        self.critic = ValueOperator(self.critic_network, in_keys=["observation"])
        self.loss_module = clip_ppo_loss(
            self.actor, self.critic, clip_epsilon, entropy_coef, critic_coef, normalize_advantage
        )
        self.advantage = GAE(gamma=gamma, lmbda=gae_lambda, value_network=self.critic, average_gae=False)

    def policy(self) -> TensorDictModuleBase:
        return self.actor

    def greedy_policy(self) -> TensorDictModuleBase:
        # Under ExplorationType.DETERMINISTIC (set by evaluation and export) the actor takes the distribution's mode.
        return self.actor

    def export_network(self) -> nn.Module:
        """The actor's logits: their argmax is the mode the greedy policy takes."""
        return self.actor_network

    def batch_keys(self) -> list:
        return ppo_batch_keys(self.loss_module)

    @torch.no_grad()
    def postprocess(self, rollout: TensorDictBase) -> None:
        """GAE over the ``[num_envs, steps]`` rollout, writing ``advantage`` and ``value_target`` in place."""
        self.advantage(rollout)

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        return ppo_update(self, batches)

    def reference_update(self, data: Any) -> Callable[[int], torch.Tensor]:
        """This update in plain eager PyTorch, the yardstick of its cost (:mod:`modules.bare`)."""
        return reference_ppo_update(self, data)


def ppo_update(model: RLModule, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
    """One PPO update on a minibatch: the clipped surrogate, entropy bonus and value loss, backward, gradient clip
    and Adam step (or all of it as one replayed CUDA graph). The advantages were computed when the rollout came in
    (``postprocess``)."""
    if model.graphed:
        losses = model.replay_graph(batches[0])
        loss = losses["loss"]
    else:
        loss, losses, _ = model.loss_backward(batches)
        model.optimizer_step()
    model.datamodule.after_update(None)
    return loss, losses


def ppo_batch(data: Any, size: int, seed: int) -> dict[str, torch.Tensor]:
    """Real transitions with stand-in rollout statistics (behaviour log-probability, advantages, value targets)."""
    batch = transitions(data, size, seed)
    generator = torch.Generator().manual_seed(seed)
    batch["log_prob"] = torch.full_like(batch["reward"], -1.386)  # log(1/4): a uniform behaviour policy's
    batch["advantage"] = torch.randn(size, generator=generator)
    batch["value_target"] = torch.randn(size, generator=generator)
    return batch


def reference_ppo_update(model: PPO, data: Any) -> Callable[[int], torch.Tensor]:
    """Clipped surrogate + entropy bonus + smooth-L1 value loss on one minibatch, backward, clip, fused Adam."""
    actor, critic = (
        copy.deepcopy(model.actor_network).to(data.device),
        copy.deepcopy(model.critic_network).to(data.device),
    )
    parameters = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=model.optim.lr, fused=True)
    hp = model.hparams
    batches = [ppo_batch(data, data.minibatch_size, seed) for seed in range(POOL)]

    def step(i: int) -> torch.Tensor:
        batch = batches[i % POOL]
        log_probs = F.log_softmax(actor(batch["observation"]), -1)
        log_prob = log_probs.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
        advantage = batch["advantage"]
        if hp.normalize_advantage:
            advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-6)
        ratio = (log_prob - batch["log_prob"]).exp()
        clipped = ratio.clamp(1 - hp.clip_epsilon, 1 + hp.clip_epsilon)
        objective = -torch.min(ratio * advantage, clipped * advantage).mean()
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        value_loss = F.smooth_l1_loss(critic(batch["observation"]).squeeze(-1), batch["value_target"])
        loss = objective - hp.entropy_coef * entropy + hp.critic_coef * value_loss
        loss.backward()
        optimizer_step(parameters, optimizer, model.optim.max_grad_norm)
        return loss.detach()

    return step

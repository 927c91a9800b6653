"""Soft actor-critic for discrete actions on TorchRL's ``DiscreteSACLoss``.

Christodoulou, "Soft Actor-Critic for Discrete Action Settings", 2019. The actor maps the observation through an MLP to
the logits of a categorical distribution over the actions; acting samples it, evaluation and export take its most
probable action. Twin (``critics.count``) Q-networks map the observation to a value per action, with Polyak-averaged
target copies. Where continuous SAC samples an action to estimate expectations over the policy, here they are exact
sums over the actions, weighted by their probabilities:

- the critics' target: ``r + γ (1 − terminated) Σₐ′ π(a′|s′) (minᵢ Q̄ᵢ(s′, a′) − α log π(a′|s′))``;
- the actor's loss: ``Σₐ π(a|s) (α log π(a|s) − minᵢ Qᵢ(s, a))``, the critics held fixed;
- α's loss towards a target entropy, by default ``target_entropy_weight × log(actions)`` (0.98 of the uniform
  policy's entropy, as the paper).

So the update draws no random numbers. TorchRL's ``DiscreteSACLoss`` defines the losses; the update computes the same
numbers from its parameters (``tests/agents/test_discrete_sac.py``). Stable-Baselines3 has no discrete SAC (its SAC
takes a Box only), and the RL Zoo tunes none: the shipped config is ours (``configs/gym/cartpole_discrete_sac.yaml``).

Usage::

    python -m app fit --config configs/gym/cartpole_discrete_sac.yaml
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs.utils import ExplorationType
from torchrl.modules import ProbabilisticActor
from torchrl.objectives import DiscreteSACLoss, SoftUpdate

from datamodules.source import DataSource
from modules.base import RLModule
from modules.networks import ActorOptions, CriticOptions, ensemble_mlp, observation_mlp, parameter_tree
from modules.optim import OptimizerOptions
from modules.spaces import DISCRETE, check_action_space, check_flat_observation, observation_entry


class DiscreteSAC(RLModule):
    """Discrete SAC with twin (or ``critics.count``) Q-networks, Polyak target critics and automatic entropy tuning
    (or a fixed α).

    Args:
        observation_spec: linked from the data module (``observation`` is a flat vector).
        action_spec: linked from the data module: a discrete space (``Categorical``); any other is one error line.
        actor: the actor's network and learning rate (:class:`~modules.networks.ActorOptions`; α's is
            ``optimizer.lr``, the critics').
        critics: the Q-networks, a value per action each, and their targets' Polyak rate
            (:class:`~modules.networks.CriticOptions`).
        gamma: discount.
        alpha_init: the entropy coefficient α at the start.
        learn_alpha: tune α towards the target entropy; false: α stays ``alpha_init``.
        target_entropy: the entropy α steers the policy towards; ``auto``: ``target_entropy_weight × log(actions)``.
        target_entropy_weight: the share of the uniform policy's entropy that ``auto`` targets.
        loss_function: the critics' regression loss, ``l2`` or ``smooth_l1`` (TorchRL's default for this loss).
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule`.
    """

    target_networks = ("qvalue_network",)

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        actor: ActorOptions = ActorOptions(),
        critics: CriticOptions = CriticOptions(hidden_sizes=(256, 256)),
        gamma: float = 0.99,
        alpha_init: float = 1.0,
        learn_alpha: bool = True,
        target_entropy: float | str = "auto",
        target_entropy_weight: float = 0.98,
        loss_function: str = "l2",
        optimizer: OptimizerOptions = OptimizerOptions(lr=3e-4),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__(observation_spec, action_spec, optimizer, compile, check_finite_every)
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        if not 0 <= gamma <= 1:
            raise ValueError(f"model.gamma must be in [0, 1], got {gamma}")
        if not alpha_init > 0:
            raise ValueError(f"model.alpha_init must be > 0, got {alpha_init}")
        if target_entropy != "auto" and not isinstance(target_entropy, int | float):
            raise ValueError(f"model.target_entropy must be a number or auto, got {target_entropy!r}")
        if not 0 < target_entropy_weight <= 1:
            raise ValueError(f"model.target_entropy_weight must be in (0, 1], got {target_entropy_weight}")
        if loss_function not in ("l2", "smooth_l1"):
            raise ValueError(f"model.loss_function must be l2 or smooth_l1, got {loss_function!r}")
        self.tau, self.loss_function = critics.tau, loss_function
        self.actor_lr = optimizer.lr if actor.lr is None else actor.lr
        observation = observation_entry(self, observation_spec)
        check_flat_observation(self, observation)
        check_action_space(self, action_spec, (DISCRETE,))
        actions = action_spec.space.n

        # TorchRL's ProbabilisticActor over a categorical distribution of the actor network's logits: it samples under
        # the RANDOM exploration type (collection) and takes the mode under DETERMINISTIC (evaluation).
        self.actor_network = observation_mlp(observation.shape, actor.hidden_sizes, actions)
        self.actor = ProbabilisticActor(
            TensorDictModule(self.actor_network, in_keys=["observation"], out_keys=["logits"]),
            in_keys=["logits"],
            spec=action_spec,
            distribution_class=torch.distributions.Categorical,
            default_interaction_type=ExplorationType.RANDOM,
        )
        # One critic, observation → a value per action; the loss module stacks critics.count copies of it.
        self.qvalue = TensorDictModule(
            observation_mlp(observation.shape, critics.hidden_sizes, actions),
            in_keys=["observation"],
            out_keys=["action_value"],
        )
        self.loss_module = DiscreteSACLoss(
            self.actor,
            self.qvalue,
            action_space=action_spec,
            num_actions=actions,
            num_qvalue_nets=critics.count,
            loss_function=loss_function,
            alpha_init=alpha_init,
            fixed_alpha=not learn_alpha,
            target_entropy=target_entropy,
            target_entropy_weight=target_entropy_weight,
            delay_qvalue=True,
        )
        self.loss_module.make_value_estimator(gamma=gamma)
        self.target_updater = SoftUpdate(self.loss_module, tau=critics.tau)  # TorchRL's; applied fused (soft_update)

    def policy(self) -> TensorDictModuleBase:
        return self.actor  # samples: the collector runs under the RANDOM exploration type

    def greedy_policy(self) -> TensorDictModuleBase:
        return self.actor  # evaluation sets the DETERMINISTIC exploration type: the most probable action

    def export_network(self) -> nn.Module:
        return self.actor_network  # the logits; the greedy action is their argmax

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.actor_critic_optimizer(self.actor_lr)

    def check_datamodule(self, datamodule: DataSource, cannot_capture: tuple[str, ...] = ()) -> None:
        if datamodule.prioritized:
            raise ValueError(f"data.priority.alpha: {type(self).__name__} gives the replay buffer no priorities; use 0")
        # A captured update (as DQN's) is not written for this agent: nothing here has run on a GPU yet.
        super().check_datamodule(datamodule, (*cannot_capture, f"{type(self).__name__}'s update"))

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """Discrete SAC's losses as TorchRL's ``DiscreteSACLoss`` defines them, from the parameters it holds: each
        critic's error at the taken action to ``r + γ (1 − terminated) Σₐ′ π(a′|s′) (minᵢ Q̄ᵢ(s′, a′) − α log π(a′|s′))``
        (summed over the critics), the actor's ``Σₐ π(a|s) (α log π(a|s) − minᵢ Qᵢ(s, a))`` through the critics' values
        held fixed, and α's loss towards the target entropy. ``DiscreteSACLoss.forward`` returns the same values and
        gradients (tests/agents/test_discrete_sac.py); here every critic runs in one batched matmul a layer, where its
        forward runs them through ``vmap`` and TensorDict plumbing that cost more than a small network's arithmetic."""
        sac = self.loss_module
        critics, targets = sac.qvalue_network_params["module"], sac.target_qvalue_network_params["module"]
        alpha = sac.log_alpha.detach().exp()
        observation, following = batch["observation"], batch["next"]
        with torch.no_grad():
            next_prob = self.actor_network(following["observation"]).softmax(-1)
            next_log_prob = torch.log(torch.where(next_prob == 0, 1e-8, next_prob))  # as DiscreteSACLoss guards it
            next_q = self.critic_values(targets, following["observation"]).amin(0)
            next_value = (next_prob * (next_q - alpha * next_log_prob)).sum(-1)
            continues = ~following["terminated"].squeeze(-1)
            target = following["reward"].squeeze(-1) + sac.value_estimator.gamma * continues * next_value
        values = self.critic_values(critics, observation)  # [critics, batch, actions]
        action = batch["action"].unsqueeze(-1).expand(values.shape[0], -1, 1)
        chosen = values.gather(-1, action).squeeze(-1)
        error = F.smooth_l1_loss if self.loss_function == "smooth_l1" else F.mse_loss
        loss_qvalue = error(chosen, target.expand_as(chosen), reduction="none").sum(0).mean()
        log_prob = self.actor_network(observation).log_softmax(-1)
        prob = log_prob.exp()
        q = values.detach().amin(0)  # the actor's gradient only: the critics' values held fixed
        expected_log_prob = (prob * log_prob).sum(-1).detach()  # −H(π(·|s))
        return TensorDict(
            {
                "loss_actor": (prob * (alpha * log_prob - q)).sum(-1).mean(),
                "loss_qvalue": loss_qvalue,
                "loss_alpha": -(sac.log_alpha * (expected_log_prob + sac.target_entropy)).mean(),
                "alpha": alpha,
                "entropy": -expected_log_prob.mean(),
            },
            batch_size=[],
        )

    def critic_values(self, parameters: TensorDictBase, observation: torch.Tensor) -> torch.Tensor:
        """Every critic's values of a batch ``[batch, ...]`` at once, ``[critics, batch, actions]``, from ``parameters``
        (the loss module's critics or their targets, stacked): :func:`~modules.networks.ensemble_mlp`."""
        flatten, network = self.qvalue.module  # observation_mlp: the flattening (and cast), then the MLP
        layers = parameter_tree(parameters)["1"]
        x = flatten(observation).expand(layers["0"]["weight"].shape[0], -1, -1)
        return ensemble_mlp(network, layers, x)

    def update(self, batches: list) -> tuple[torch.Tensor, Any]:
        """One discrete SAC update: the critics', the actor's and α's losses (:meth:`loss`), their backward, gradient
        clip and Adam step, then the Polyak step of the target critics."""
        loss, losses, _ = self.loss_backward(batches)
        self.optimizer_step()
        self.soft_update()
        self.datamodule.after_update(None)
        return loss, losses

    def extra_metrics(self) -> dict[str, torch.Tensor | float]:
        return {"train/log_alpha": self.loss_module.log_alpha.detach()}

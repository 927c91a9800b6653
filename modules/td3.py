"""Twin Delayed DDPG (TD3) on TorchRL's ``TD3Loss``.

Fujimoto et al., "Addressing Function Approximation Error in Actor-Critic Methods", ICML 2018. A deterministic actor
(an MLP whose tanh output is mapped onto the action box) and twin Q critics (the minimum of the two is the target: the
clipped double-Q), each with a Polyak-averaged target copy. The critics' target acts with the target actor plus
clipped Gaussian noise (target policy smoothing); the actor and the targets are updated every ``policy_delay``-th
update only (delayed policy updates). Acting adds Gaussian noise to the actor's action and clips it to the box; before
the first update (the warm-up frames) it draws actions uniformly from the box, as Stable-Baselines3 does during
``learning_starts``.

Noise scales are in half-range units of the box, as Stable-Baselines3 gives them (it acts in [−1, 1] and rescales):
on Pendulum's [−2, 2] an ``action_noise`` of 0.1 is a standard deviation of 0.2 torque units. The one difference from
Stable-Baselines3's update: the actor's loss reads the critics as they were before this update's step (one backward
for both, as :class:`~modules.sac.SAC` does), where Stable-Baselines3 steps the critics first.

Usage::

    python -m app fit --config configs/gym/pendulum_td3.yaml
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.data import TensorSpec
from torchrl.objectives import TD3Loss

from datamodules.source import DataSource
from modules.base import RLModule
from modules.exploration import BoxExploration
from modules.networks import ActorOptions, CriticOptions, ScaledTanhPolicy, map_tree, mlp, parameter_tree, q_critic
from modules.optim import OptimizerOptions
from modules.spaces import BOX, check_action_space, check_bounded, check_flat_observation, model_name, observation_entry


class TD3(RLModule):
    """TD3: a deterministic actor, twin (``critics.count``) Q critics, target policy smoothing and delayed updates.

    Args:
        observation_spec: linked from the data module (``observation`` is a flat vector).
        action_spec: linked from the data module: a Box whose every dimension is bounded (any bounds: asymmetric,
            per dimension), onto which the actor's tanh is mapped.
        actor: the deterministic actor's network (:class:`~modules.networks.ActorOptions`; Stable-Baselines3's TD3:
            400, 300).
        critics: the Q critics and their targets (:class:`~modules.networks.CriticOptions`).
        gamma: discount.
        action_noise: the standard deviation of the acting policy's Gaussian noise, in half-range units
            (Stable-Baselines3's ``NormalActionNoise`` sigma).
        target_noise: the standard deviation of the target policy's smoothing noise, in half-range units
            (``target_policy_noise``).
        target_noise_clip: the bound of that noise, in half-range units (``target_noise_clip``).
        policy_delay: updates per update of the actor and the target networks (``policy_delay``).
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule`.
    """

    target_networks = ("actor_network", "qvalue_network")

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        actor: ActorOptions = ActorOptions(hidden_sizes=(400, 300)),
        critics: CriticOptions = CriticOptions(hidden_sizes=(400, 300)),
        gamma: float = 0.99,
        action_noise: float = 0.1,
        target_noise: float = 0.2,
        target_noise_clip: float = 0.5,
        policy_delay: int = 2,
        optimizer: OptimizerOptions = OptimizerOptions(lr=1e-3),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__(observation_spec, action_spec, optimizer, compile, check_finite_every)
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        if not 0 <= gamma <= 1:
            raise ValueError(f"model.gamma must be in [0, 1], got {gamma}")
        for name, value in (("action_noise", action_noise), ("target_noise", target_noise)):
            if value < 0:
                raise ValueError(f"model.{name} must be >= 0, got {value}")
        if not target_noise_clip >= 0:
            raise ValueError(f"model.target_noise_clip must be >= 0, got {target_noise_clip}")
        if policy_delay < 1:
            raise ValueError(f"model.policy_delay must be >= 1, got {policy_delay}")
        self.gamma, self.tau, self.policy_delay = gamma, critics.tau, policy_delay
        self.actor_lr = optimizer.lr if actor.lr is None else actor.lr
        observation_dim = check_flat_observation(self, observation_entry(self, observation_spec))
        check_action_space(self, action_spec, (BOX,))
        bounded = f"--model {model_name(self)} maps a tanh onto a bounded box"
        low, high = check_bounded(action_spec, bounded, "use modules.ppo.PPO (gaussian.distribution normal)")
        half_range = (high - low) / 2
        (action_dim,) = action_spec.shape

        self.actor = TensorDictModule(
            ScaledTanhPolicy(mlp(observation_dim, actor.hidden_sizes, action_dim), low, high),
            in_keys=["observation"],
            out_keys=["action"],
        )
        self.exploration = BoxExploration(low, high, action_noise * half_range)
        self.qvalue = q_critic(observation_dim, critics.hidden_sizes, low, high)
        # TorchRL's TD3Loss holds the actor, the critics (their parameters stacked) and their target copies, and
        # defines the losses: the critics' squared error to the clipped double-Q target at the target actor's smoothed
        # next action, and the actor's −Q₁(s, μ(s)) through critics held fixed.
        self.loss_module = TD3Loss(
            self.actor,
            self.qvalue,
            action_spec=action_spec,
            num_qvalue_nets=critics.count,
            loss_function="l2",
            delay_actor=True,
            delay_qvalue=True,
        )
        self.loss_module.make_value_estimator(gamma=gamma)
        # The target policy's noise in the action's units, per dimension (TD3Loss multiplies and clamps by these): its
        # own numbers are one scale for every dimension. Buffers, so that they follow the model to its device.
        self.register_buffer("target_noise_scale", target_noise * half_range, persistent=False)
        self.register_buffer("target_noise_bound", target_noise_clip * half_range, persistent=False)
        self._give_loss_its_noise()

    def policy(self) -> TensorDictModuleBase:
        return TensorDictSequential(self.actor, self.exploration)

    def greedy_policy(self) -> TensorDictModuleBase:
        return self.actor

    def export_network(self) -> nn.Module:
        return self.actor.module  # observation → centre + half_range · tanh(MLP(observation))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.actor_critic_optimizer(self.actor_lr)

    def check_datamodule(self, datamodule: DataSource, cannot_capture: tuple[str, ...] = ()) -> None:
        self.check_random_update(datamodule)
        super().check_datamodule(
            datamodule,
            (*cannot_capture, f"{type(self).__name__}'s delayed actor updates and random draws inside the update"),
        )

    def _give_loss_its_noise(self) -> None:
        self.loss_module.policy_noise, self.loss_module.noise_clip = self.target_noise_scale, self.target_noise_bound

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self._give_loss_its_noise()  # the buffers on the model's device
        self._compiled_critic_loss = self.compiled(self.critic_loss)
        # Uniform actions until the first update: the warm-up frames, as Stable-Baselines3's learning_starts. A run
        # resumed from a checkpoint has updated already.
        self.exploration.uniform.fill_(self.trainer.ckpt_path is None and self.global_step == 0)

    def follow_frames(self) -> None:
        super().follow_frames()
        self.exploration.uniform.fill_(False)  # an update is due: the next collection acts with the actor

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        """One TD3 update: the critics' loss and, every ``policy_delay``-th update, the actor's, their backward,
        gradient clip and Adam step, then on those updates the Polyak step of the target actor and critics. On the
        others only the critics' loss is computed: the actor gets no gradient, and Adam leaves it alone."""
        # From the restored update counter, so a resumed run keeps the same rhythm.
        delayed = self.updates_actor(self.global_step)
        loss, losses, _ = self.loss_backward(batches, loss=None if delayed else self._compiled_critic_loss)
        self.optimizer_step()
        if delayed:
            self.soft_update()
        self.datamodule.after_update(None)
        return loss, losses

    def updates_actor(self, update: int) -> bool:
        """Whether update ``update`` (counted from 0) trains the actor and moves the targets: every ``policy_delay``-th
        (Stable-Baselines3: its 2nd, 4th, …); the others train the critics alone (:meth:`critic_loss`)."""
        return (update + 1) % self.policy_delay == 0

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """TD3's losses as TorchRL's ``TD3Loss`` defines them, from the parameters it holds: the actor's
        ``−Q₁(s, μ(s))`` through critics held fixed, and the critics' (:meth:`critic_loss`). ``TD3Loss.forward``
        returns the same numbers from the same random draw (tests/agents/test_td3.py); here the critics run in one
        batched matmul a layer (:meth:`~modules.networks.QNetwork.ensemble`) where its forward spends most of a small
        update in ``vmap`` and TensorDict plumbing."""
        critics = self.loss_module.qvalue_network_params["module"]
        first = map_tree(lambda entry: entry.detach()[:1], parameter_tree(critics))  # Q₁ only, held fixed
        q = self.qvalue.module.ensemble(first, batch["observation"], self.actor.module(batch["observation"]))
        losses = self.critic_loss(batch)
        losses["loss_actor"] = -q.mean()
        return losses

    def critic_loss(self, batch: TensorDictBase) -> TensorDictBase:
        """The critics' squared error to the clipped double-Q target: the target critics' minimum at the target
        actor's action of the next state plus Gaussian noise (clipped, then the action clipped to the box), discounted
        unless terminated — ``TD3Loss.value_loss`` from the same random draw."""
        td3, critic = self.loss_module, self.qvalue.module
        critics, targets = td3.qvalue_network_params["module"], td3.target_qvalue_network_params["module"]
        action, following = batch["action"], batch["next"]
        noise = (torch.randn_like(action) * td3.policy_noise).clamp(-td3.noise_clip, td3.noise_clip)
        with torch.no_grad():
            next_action = (self.target_action(following["observation"]) + noise).clamp(td3.min_action, td3.max_action)
            next_value = critic.ensemble(targets, following["observation"], next_action).amin(0)
            continues = ~following["terminated"].squeeze(-1)
            target = following["reward"].squeeze(-1) + self.gamma * continues * next_value
        loss_qvalue = (critic.ensemble(critics, batch["observation"], action) - target).pow(2).sum(0).mean()
        return TensorDict({"loss_qvalue": loss_qvalue}, batch_size=[])

    def target_action(self, observation: torch.Tensor) -> torch.Tensor:
        """The target actor's action: the actor's network with the target parameters ``TD3Loss`` keeps."""
        policy, parameters = self.actor.module, self.loss_module.target_actor_network_params["module"]
        x = observation
        for index, layer in enumerate(policy.network):
            if isinstance(layer, nn.Linear):
                x = F.linear(x, parameters["network", str(index), "weight"], parameters["network", str(index), "bias"])
            else:  # the activation, elementwise
                x = layer(x)
        return parameters["centre"] + parameters["half_range"] * torch.tanh(x)

"""Deep Q-Network on TorchRL's ``DQNLoss``.

Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015; Double DQN: van Hasselt et al.,
"Deep Reinforcement Learning with Double Q-learning", AAAI 2016.

Usage::

    python -m app fit --config configs/snake_dqn.yaml
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs import MultiStepTransform
from torchrl.modules import EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate, SoftUpdate

from modules.base import RLModule
from modules.exploration import GreedyRowsEGreedy
from modules.networks import (
    BatchNormCNN,
    EvalModeActor,
    NetworkOptions,
    TargetCopy,
    has_batch_norm,
    observation_network,
    orthogonal_init_,
)
from modules.optim import OptimizerOptions
from modules.spaces import DISCRETE, check_action_space, observation_entry


@dataclass(frozen=True)
class TargetOptions:
    """The target network's updates: ``target:`` in a DQN's ``init_args``.

    Args:
        update: ``hard`` (copy the online network every ``interval`` updates) or ``soft`` (Polyak, rate ``tau``).
        interval: updates between hard copies.
        tau: the soft update's rate.
    """

    update: Literal["hard", "soft"] = field(default="hard", metadata={"formerly": "target_update"})
    interval: int = field(default=1_000, metadata={"formerly": "target_update_interval"})
    tau: float = 0.005

    def __post_init__(self) -> None:
        if self.update not in ("hard", "soft"):
            raise ValueError(f"model.target.update must be hard or soft, got {self.update!r}")
        if self.interval < 1:
            raise ValueError(f"model.target.interval must be >= 1, got {self.interval}")
        if not 0 < self.tau <= 1:
            raise ValueError(f"model.target.tau must be in (0, 1], got {self.tau}")


@dataclass(frozen=True)
class ExplorationOptions:
    """ε-greedy exploration, annealed over frames: ``exploration:`` in a DQN's ``init_args``.

    Args:
        eps_start: ε at frame 0.
        eps_end: ε after ``eps_frames`` frames, and from then on.
        eps_frames: frames over which ε falls linearly.
    """

    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_frames: int = 100_000

    def __post_init__(self) -> None:
        if not (0 <= self.eps_end <= 1 and 0 <= self.eps_start <= 1):
            raise ValueError(
                f"model.exploration.eps_start/eps_end must be in [0, 1], got {self.eps_start}/{self.eps_end}"
            )
        if self.eps_frames < 1:
            raise ValueError(f"model.exploration.eps_frames must be >= 1, got {self.eps_frames}")


class DQN(RLModule):
    """DQN with a target network, optional Double-DQN targets, and ε-greedy exploration annealed over frames.

    Args:
        observation_spec: linked from the data module.
        action_spec: linked from the data module: a discrete space (``Categorical``); any other is one error line.
        network: the Q-network (:class:`~modules.networks.NetworkOptions`): ``kind`` ``mlp``, ``nature_cnn``,
            ``auto`` or ``batch_norm_cnn`` (the Mario reference's convolutional network with BatchNorm, for stacked
            frames ``[C, H, W]``; :class:`~modules.networks.BatchNormCNN`). A network with BatchNorm acts and evaluates
            in eval mode and trains in train mode.
        gamma: discount.
        double_dqn: pick the next action with the online network and evaluate it with the target network.
        loss_function: ``l2`` (the reference's MSE) or ``smooth_l1`` (Huber).
        target: the target network's updates (:class:`TargetOptions`).
        exploration: ε-greedy's schedule (:class:`ExplorationOptions`).
        n_steps: the target's reward sum: ``r_t + γ r_{t+1} + … + γ^(n−1) r_{t+n−1} + γ^n Q_target(s_{t+n})``, cut at
            an episode's end (TorchRL's ``MultiStepTransform`` on the replay writes). 1: the one-step target. Sums
            over exploring actions are biased towards the exploring policy's value: measure before raising it.
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule` (the Snake reference: Adam 1e-3,
            unclipped; Mario's clips at 10 and accumulates 4 batches).
    """

    target_networks = ("value_network",)

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        network: NetworkOptions = NetworkOptions(),
        gamma: float = 0.99,
        double_dqn: bool = False,
        loss_function: Literal["l2", "smooth_l1"] = "l2",
        target: TargetOptions = TargetOptions(),
        exploration: ExplorationOptions = ExplorationOptions(),
        n_steps: int = 1,
        optimizer: OptimizerOptions = OptimizerOptions(),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__(observation_spec, action_spec, optimizer, compile, check_finite_every)
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        if not 0 <= gamma <= 1:
            raise ValueError(f"model.gamma must be in [0, 1], got {gamma}")
        if n_steps < 1:
            raise ValueError(f"model.n_steps must be >= 1, got {n_steps}")
        self.gamma, self.n_steps = gamma, n_steps
        self.target, self.exploration, self.tau = target, exploration, target.tau

        # env → model → exploration → loss → target updater, in the order TorchRL's sota-implementations use.
        check_action_space(self, action_spec, (DISCRETE,))
        observation = observation_entry(self, observation_spec)
        self.q_network = self.make_q_network(observation, network, action_spec.space.n)
        if network.orthogonal_init:
            orthogonal_init_(self.q_network, output_gain=1.0)
        self.actor = QValueActor(self.q_network, in_keys=["observation"], spec=action_spec)
        # Acting (collection, evaluation) must not move BatchNorm's running averages or use a batch's statistics.
        self._acting_actor = EvalModeActor(self.actor, self.q_network) if has_batch_norm(self.q_network) else self.actor
        self.egreedy = EGreedyModule(
            action_spec,
            eps_init=exploration.eps_start,
            eps_end=exploration.eps_end,
            annealing_num_steps=exploration.eps_frames,
        )
        self.loss_module = DQNLoss(
            self.actor,
            loss_function=loss_function,
            delay_value=True,
            double_dqn=double_dqn,
            action_space=action_spec,
        )
        self.loss_module.make_value_estimator(gamma=gamma)
        if target.update == "soft":
            self.target_updater = SoftUpdate(self.loss_module, tau=target.tau)
        else:
            # HardUpdate(interval=0) copies on every step() call; update_target calls it every `target.interval`
            # updates, a function of the restored global step rather than of a counter checkpoints would have to carry.
            self.target_updater = HardUpdate(self.loss_module, value_network_update_interval=0)
        self._exploring_policy = GreedyRowsEGreedy(self._acting_actor, self.egreedy)
        #: the Q-network with the target parameters (``target_q_network()``), without swapping them in at each pass
        self.target_q_network = TargetCopy(self.loss_module, self.q_network)

    def make_q_network(self, observation: TensorSpec, network: NetworkOptions, num_actions: int) -> nn.Module:
        """The Q-network ``network`` describes (subclasses change the architecture here)."""
        if network.kind != "batch_norm_cnn":
            return observation_network(
                observation, network.kind, network.hidden_sizes, num_actions, network.activation_module
            )
        if len(observation.shape) != 3:
            raise ValueError(
                "model.network.kind batch_norm_cnn needs image observations [channels, height, width], got "
                f"shape {tuple(observation.shape)}"
            )
        return BatchNormCNN(observation.shape, num_actions)

    def policy(self) -> TensorDictModuleBase:
        return self._exploring_policy

    def greedy_policy(self) -> TensorDictModuleBase:
        return self._acting_actor

    def export_network(self) -> nn.Module:
        return self.q_network  # Q-values; the greedy action is their argmax

    def setup(self, stage: str) -> None:
        self.connect_datamodule(stage, store_transform=self.store_transform())

    def store_transform(self) -> MultiStepTransform | None:
        """What the replay buffer stores of the collected transitions: with ``n_steps`` > 1, TorchRL's
        ``MultiStepTransform`` turns them into n-step transitions; None: as collected."""
        if self.n_steps == 1:
            return None
        # done_keys=[]: the episode-end flags are gathered, like the next observation, from the step each sum stops at,
        # so a window that ends the episode does not bootstrap. (TorchRL's default keeps step t's flags, which would
        # bootstrap from a terminal observation.) The loss raises γ to the sum's length, `steps_to_next_obs`.
        return MultiStepTransform(self.n_steps, self.gamma, done_keys=[])

    def batch_keys(self) -> list:
        keys = super().batch_keys()
        return [*keys, "steps_to_next_obs"] if self.n_steps > 1 else keys

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """DQN's loss as TorchRL's ``DQNLoss`` defines it, from the parameters it holds: the squared (or Huber) error of
        ``Q(s, a)`` to its target (:meth:`predicted_and_target`), averaged — weighted by prioritized replay's
        importance weights when the batch has them, ``Σ w·ℓ / Σ w`` — and each sample's ``|δ|`` (a prioritized replay
        store's new priorities; a uniform one ignores them). ``DQNLoss.forward`` returns the same numbers
        (tests/agents/test_dqn.py), but most of a small network's update went to its TensorDict plumbing."""
        predicted, target = self.predicted_and_target(batch)
        if self.loss_module.loss_function == "smooth_l1":
            per_sample = F.smooth_l1_loss(predicted, target, reduction="none")
        else:
            per_sample = F.mse_loss(predicted, target, reduction="none")
        loss = self.batch_mean(per_sample, batch)
        return TensorDict({"loss": loss, "td_error": (predicted - target).detach().abs()})

    @staticmethod
    def batch_mean(per_sample: torch.Tensor, batch: TensorDictBase) -> torch.Tensor:
        """The mean of ``per_sample`` over the batch; weighted by prioritized replay's importance weights when the
        batch has them, as TorchRL's losses weigh it: ``Σ w·ℓ / Σ w``."""
        # A membership test, whose guard the compiled loss keeps: with `batch.get(key, None)` Dynamo lost it, and a
        # weighted batch replayed the graph of an unweighted one (tests/agents/test_lightning_features.py).
        if "priority_weight" not in batch.keys():  # noqa: SIM118 (a TensorDict has no `in`)
            return per_sample.mean()
        weight = batch["priority_weight"]
        return (per_sample * weight).sum() / weight.sum()

    def predicted_and_target(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """``Q(s, a)`` of each transition and its target, held fixed: ``r + γⁿ (1 − terminated) maxₐ′ Q_target(s′, a′)``
        (Double DQN: ``Q_target(s′, argmaxₐ′ Q(s′, a′))``; n is the window's length with n-step returns, else 1). The
        networks run in ``DQNLoss``'s order, so that BatchNorm's statistics move as they do there."""
        q = self.q_network(batch["observation"])
        action = batch["action"]
        predicted = q.gather(-1, action if action.ndim == q.ndim else action.unsqueeze(-1)).squeeze(-1)
        following = batch["next"]
        with torch.no_grad():
            double = self.loss_module.double_dqn
            next_action = self.q_network(following["observation"]).argmax(-1, keepdim=True) if double else None
            next_q = self.target_q_network()(following["observation"])
            next_value = next_q.max(-1, keepdim=True).values if next_action is None else next_q.gather(-1, next_action)
            reward, gamma = following["reward"], self.loss_module.value_estimator.gamma
            steps = batch.get("steps_to_next_obs", None)
            if steps is not None:  # the window's length: γ raised to it
                gamma = gamma ** steps.view_as(reward)
            # TorchRL's td0_return_estimate, to the bit.
            target = reward + gamma * (~following["terminated"]).int() * next_value
        return predicted, target.squeeze(-1)

    def epsilon(self, frames: int) -> float:
        """Linear annealing from ``eps_start`` to ``eps_end`` over ``eps_frames`` frames."""
        schedule = self.exploration
        progress = min(frames / schedule.eps_frames, 1.0)
        return schedule.eps_start + progress * (schedule.eps_end - schedule.eps_start)

    def follow_frames(self) -> None:
        super().follow_frames()
        # ε of the frames collected so far: the next collection acts with it (a checkpoint holds it).
        self.egreedy.eps.fill_(self.epsilon(self.datamodule.frames))

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        """One DQN update: the TD loss of each batch (accumulated) and its backward, gradient clip and Adam step (or
        all four as one replayed CUDA graph), the target network's update, and each sample's |TD error| back to the
        replay buffer as its new priority."""
        if self.graphed:
            losses = self.replay_graph(batches[0])
            loss, td_errors = losses["loss"], None  # prioritized replay is refused with a graph
        else:
            loss, losses, td_errors = self.loss_backward(batches)
            self.optimizer_step()
        self.update_target()
        self.datamodule.after_update(td_errors)
        return loss, losses

    def update_target(self) -> None:
        """Polyak-average the target network (``soft``), or copy it every ``target.interval`` updates."""
        # global_step already counts the step just taken.
        if self.target.update == "soft":
            self.soft_update()
        elif self.global_step % self.target.interval == 0:
            self.hard_update()  # what self.target_updater (TorchRL's HardUpdate) does

    def extra_metrics(self) -> dict[str, torch.Tensor | float]:
        return {"train/epsilon": self.egreedy.eps}

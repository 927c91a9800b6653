"""Quantile-regression DQN: DQN whose network gives, for each action, the quantiles of the return's distribution.

Dabney et al., "Distributional Reinforcement Learning with Quantile Regression", AAAI 2018 (Stable-Baselines3
contrib's QR-DQN, which the RL Zoo tunes).

The network outputs ``quantiles`` values per action, the return's quantiles at the midpoints τ_i = (2i + 1) / 2N.
It acts (ε-greedy) and is evaluated on their mean, the Q-value; the update regresses the taken action's quantiles on
the target ``r + γ θ_j(s', a*)`` of every target quantile j, where a* is the target network's greedy action, with
the quantile Huber loss (κ = 1), summed over the predicted quantiles and averaged over the targets and the batch.
Everything else — the replay data module, ε's schedule, the target network's copies, n-step returns, prioritized
replay (each sample's priority: the distance between its target's and its prediction's means) — is
:class:`~modules.dqn.DQN`'s. TorchRL has no quantile-regression loss: the loss is written out here, and
``tests/agents/test_qrdqn.py`` checks it against Stable-Baselines3 contrib's ``quantile_huber_loss``
(:mod:`modules.quantiles`).

Usage::

    python -m app fit --config configs/gym/cartpole_qrdqn.yaml
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.data import TensorSpec

from datamodules.source import DataSource
from modules.dqn import DQN, ExplorationOptions, TargetOptions
from modules.networks import NetworkOptions
from modules.optim import OptimizerOptions
from modules.quantiles import MeanOfQuantiles, QuantileNetwork, quantile_huber


class QRDQN(DQN):
    """DQN with a quantile head and the quantile-regression loss.

    Args:
        observation_spec, action_spec, network, gamma, target, exploration, n_steps: as :class:`~modules.dqn.DQN`'s.
        quantiles: quantiles per action (Stable-Baselines3 contrib's ``n_quantiles``, default 200).
        double_dqn: choose the next action with the online network's means (the target network's by default, as
            the paper and Stable-Baselines3 contrib).
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule`.
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        network: NetworkOptions = NetworkOptions(),
        quantiles: int = 200,
        gamma: float = 0.99,
        double_dqn: bool = False,
        target: TargetOptions = TargetOptions(),
        exploration: ExplorationOptions = ExplorationOptions(),
        n_steps: int = 1,
        optimizer: OptimizerOptions = OptimizerOptions(),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        if quantiles < 1:
            raise ValueError(f"model.quantiles must be >= 1, got {quantiles}")
        self.quantile_count = quantiles
        super().__init__(
            observation_spec, action_spec, network, gamma, double_dqn, "l2", target, exploration, n_steps, optimizer,
            compile, check_finite_every,
        )  # fmt: skip

    def make_q_network(self, observation: TensorSpec, network: NetworkOptions, num_actions: int) -> nn.Module:
        if network.kind == "batch_norm_cnn":
            raise ValueError("model.network.kind batch_norm_cnn is DQN's; QRDQN reads with auto, mlp or nature_cnn")
        body = super().make_q_network(observation, network, num_actions * self.quantile_count)
        return MeanOfQuantiles(QuantileNetwork(body, num_actions, self.quantile_count))

    def check_datamodule(self, datamodule: DataSource, cannot_capture: tuple[str, ...] = ()) -> None:
        # Not captured yet: no GPU sitting has replayed its update against the eager one.
        untested = f"{type(self).__name__}'s update (not tested as a graph)"
        super().check_datamodule(datamodule, (*cannot_capture, untested))

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """The quantile Huber loss of the taken actions' quantiles against the distributional Bellman target, weighted
        per sample by prioritized replay's importance weights when the batch has them, and each sample's
        |mean target − mean prediction| (its new priority)."""
        quantiles = self.q_network.quantiles
        following = batch["next"]
        action = batch["action"].reshape(-1, 1, 1).expand(-1, 1, self.quantile_count)
        predicted = quantiles(batch["observation"]).gather(-2, action).squeeze(-2)  # [batch, N]
        with torch.no_grad():
            next_quantiles = self.target_q_network().quantiles(following["observation"])  # the target network's
            chooser = quantiles(following["observation"]) if self.hparams.double_dqn else next_quantiles
            best = chooser.mean(-1).argmax(-1).reshape(-1, 1, 1).expand(-1, 1, self.quantile_count)
            next_value = next_quantiles.gather(-2, best).squeeze(-2)
            reward = following["reward"].reshape(-1, 1)
            discount = self.gamma ** batch.get("steps_to_next_obs", torch.ones_like(reward)).reshape(-1, 1)
            continues = (~following["terminated"]).reshape(-1, 1).to(next_value.dtype)
            target = reward + discount * continues * next_value
        per_sample = quantile_huber(predicted, target).sum(-2).mean(-1)  # summed over i, averaged over j
        weight = batch.get("priority_weight", None)
        loss = (per_sample * weight.reshape(-1)).mean() if weight is not None else per_sample.mean()
        td_error = (target.mean(-1) - predicted.detach().mean(-1)).abs()
        return TensorDict({"loss_quantile": loss, "td_error": td_error}, batch_size=[])

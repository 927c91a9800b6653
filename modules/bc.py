"""Behaviour cloning (docs/reference_systems.md §4): an MLP that imitates the racing expert's actions, trained in
real Lightning epochs.

The network maps the observation (the reference's 8 numbers; 11 with ``configs/racing_bc.yaml``'s curvature ahead) to
the 2 actions through hidden layers 128 and 64 (ReLU, orthogonal initialisation) and a tanh, so its output lies in
[−1, 1]; the expert's actions are scaled from the action box to [−1, 1] for the MSE, and the policy scales the output
back. Adam 3e-4 on batches of 256 from :class:`~envs.racing.demonstrations.DemonstrationDataModule`; the validation
loop reports the held-out MSE, and :class:`~envs.racing.closed_loop.ClosedLoopEvaluation` drives the cloned policy on
the track.

Usage::

    python -m app fit --config configs/racing_bc.yaml
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import TensorSpec

from modules.networks import ScaledTanhPolicy, mlp


class BehaviourCloning(pl.LightningModule):
    """Imitates demonstrated actions with an MLP.

    Args:
        observation_spec: linked from the data module (``observation`` is a flat vector).
        action_spec: linked from the data module (a bounded box).
        hidden_sizes: widths of the hidden layers (the reference's 128, 64).
        lr: Adam learning rate.
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        hidden_sizes: Sequence[int] = (128, 64),
        lr: float = 3e-4,
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"model.lr must be > 0, got {lr}")
        if not hidden_sizes or min(hidden_sizes) < 1:
            raise ValueError(f"model.hidden_sizes must be widths >= 1, got {list(hidden_sizes)}")
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        self.observation_spec, self.action_spec = observation_spec, action_spec  # the export's input and output
        (observation_dim,) = observation_spec["observation"].shape
        (action_dim,) = action_spec.shape
        network = mlp(observation_dim, hidden_sizes, action_dim)
        for layer in network:
            if isinstance(layer, nn.Linear):  # orthogonal, as the reference; a small last layer starts near the centre
                last = layer is network[-1]
                nn.init.orthogonal_(layer.weight, gain=0.01 if last else math.sqrt(2))
                nn.init.zeros_(layer.bias)
        self.actor = ScaledTanhPolicy(network, action_spec.space.low.float(), action_spec.space.high.float())
        self.lr = lr

    def policy(self) -> TensorDictModule:
        """The cloned policy as a TorchRL module: ``observation`` in, ``action`` out."""
        return TensorDictModule(self.actor, in_keys=["observation"], out_keys=["action"])

    def export_network(self) -> nn.Module:
        return self.actor

    def _loss(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        observation, action = batch
        return nn.functional.mse_loss(self.actor.unit(observation), self.actor.to_unit(action))

    def training_step(self, batch: Sequence[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, on_step=False, on_epoch=True, batch_size=batch[0].shape[0])
        return loss

    def validation_step(self, batch: Sequence[torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch), prog_bar=True, batch_size=batch[0].shape[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)

"""Physics-informed DQN (PIRL): a Q-network whose values are safety probabilities, trained with a PDE residual.

Hoshino et al., "Autonomous Drifting Based on Maximal Safety Probability Learning", ITSC 2024 (arXiv 2409.03160);
the method: arXiv 2403.16391. With reward 1 for reaching the end of the horizon τ in the safe set, 0 for leaving it,
and discount 1, ``Q(x, a)`` is the probability of staying safe, and ``V = maxₐ Q`` solves a PDE whose drift is the
system's dynamics (the environment's, :mod:`envs.safety.physics`). The loss adds to the DQN error the PDE
residual (:mod:`modules.pde`) at random interior points and the boundary conditions (``V = 1`` when τ = 0, ``V = 0``
on the unsafe boundary).

Usage::

    python -m app fit --config configs/pirl_vehicle.yaml
    python -m app fit --config configs/pirl_toy.yaml
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.data import TensorSpec

from datamodules.source import DataSource
from modules.dqn import DQN, ExplorationOptions, TargetOptions
from modules.networks import NetworkOptions, mlp
from modules.optim import OptimizerOptions
from modules.pde import physics_losses


@dataclass(frozen=True)
class PhysicsLossOptions:
    """The physics terms of the loss: ``physics_loss:`` in a PhysicsInformedDQN's ``init_args``.

    Args:
        pde_weight: weight of the mean squared PDE residual (the reference: 1e-4; 0 turns the physics term off).
        boundary_weight: weight of the boundary terms (the reference: 1).
        collocation_points: interior points per update, and as many terminal and unsafe boundary points.
        gradient: how ``∇ₓV`` is computed: ``autograd`` (``create_graph=True``) or ``func`` (``torch.func``).
    """

    pde_weight: float = 1e-4
    boundary_weight: float = 1.0
    collocation_points: int = 32
    gradient: Literal["autograd", "func"] = "autograd"

    def __post_init__(self) -> None:
        for name in ("pde_weight", "boundary_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.physics_loss.{name} must be >= 0, got {getattr(self, name)}")
        if self.collocation_points < 1:
            raise ValueError(f"model.physics_loss.collocation_points must be >= 1, got {self.collocation_points}")
        if self.gradient not in ("autograd", "func"):
            raise ValueError(f"model.physics_loss.gradient must be autograd or func, got {self.gradient!r}")


class PhysicsInformedDQN(DQN):
    """DQN on a sigmoid Q-network, plus ``pde_weight × PDE residual² + boundary_weight × boundary error²``.

    The reference's network is 16 → 32 → 32 → 32 → 25 with Tanh hidden layers and a Sigmoid output (3,481 parameters
    on the vehicle); its sizes come from the environment's specs. The dynamics ``f(x, a)`` and the collocation domain
    come from the environment (``datamodule.declared.physics``), so the loss always matches the environment it trains
    on.

    Args:
        observation_spec: linked from the data module.
        action_spec: linked from the data module.
        network: the Q-network's hidden layers (:class:`~modules.networks.NetworkOptions`: an MLP, the reference's
            three Tanh layers of 32), read by a Sigmoid output.
        target: the target network's updates (:class:`~modules.dqn.TargetOptions`; the reference: a hard copy every
            1,000 updates).
        double_dqn: pick the next action with the online network and evaluate it with the target network (the reference
            used plain DQN targets; with discount 1 the max over 25 noisy estimates compounds over the horizon).
        exploration: ε-greedy's schedule (:class:`~modules.dqn.ExplorationOptions`).
        n_steps: the target sums the rewards of ``n_steps`` steps before bootstrapping (see
            :class:`~modules.dqn.DQN`): with discount 1, a success travels back ``n_steps`` steps per target refresh.
        physics_loss: the physics terms (:class:`PhysicsLossOptions`).
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule` (the reference: Adam 5e-4).
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        network: NetworkOptions = NetworkOptions(kind="mlp", hidden_sizes=(32, 32, 32), activation="tanh"),
        target: TargetOptions = TargetOptions(),
        double_dqn: bool = False,
        exploration: ExplorationOptions = ExplorationOptions(eps_end=0.001),
        n_steps: int = 1,
        physics_loss: PhysicsLossOptions = PhysicsLossOptions(),
        optimizer: OptimizerOptions = OptimizerOptions(lr=5e-4),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        # Discount 1 and MSE: the Q-values are probabilities of success, not discounted returns.
        super().__init__(
            observation_spec,
            action_spec,
            network=network,
            gamma=1.0,
            double_dqn=double_dqn,
            loss_function="l2",
            target=target,
            exploration=exploration,
            n_steps=n_steps,
            optimizer=optimizer,
            compile=compile,
            check_finite_every=check_finite_every,
        )
        self.double_dqn = double_dqn
        self.physics_loss = physics_loss
        self.physics: Any = None  # taken from the data module in setup
        # The collocation points' own generator (see loss_draws), seeded from the global one (seed_everything) and
        # carried by checkpoints.
        self.collocation_generator = torch.Generator().manual_seed(int(torch.randint(2**62, ())))

    def make_q_network(self, observation: TensorSpec, network: NetworkOptions, num_actions: int) -> nn.Module:
        if network.kind not in ("auto", "mlp"):
            raise ValueError(
                f"model.network.kind must be mlp (or auto): PhysicsInformedDQN reads a state, got {network.kind!r}"
            )
        if len(observation.shape) != 1:
            raise ValueError(f"PhysicsInformedDQN needs a flat state vector, got observation shape {observation.shape}")
        hidden = mlp(observation.shape[0], network.hidden_sizes, num_actions, network.activation_module)
        return nn.Sequential(hidden, nn.Sigmoid())

    def setup(self, stage: str) -> None:
        super().setup(stage)
        self.physics = self.datamodule.declared.physics
        if self.physics is None:
            raise ValueError(
                "--model PhysicsInformedDQN needs an environment that exposes its dynamics (env.physics), such as "
                "envs.safety.vehicle.VehicleEnv or envs.safety.toy.ToyEnv"
            )

    def value(self, states: torch.Tensor) -> torch.Tensor:
        """Safety probability ``V(x) = maxₐ Q(x, a)``."""
        return self.q_network(states).max(-1).values

    def check_datamodule(self, datamodule: DataSource, cannot_capture: tuple[str, ...] = ()) -> None:
        reason = f"{type(self).__name__}'s loss inputs drawn each update"
        super().check_datamodule(datamodule, (*cannot_capture, reason))

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        """One PIRL update: the DQN error plus the physics terms at fresh collocation points, of each batch
        (accumulated), backward, gradient clip, Adam step, the target network's update, and each sample's |TD error|
        back to the replay buffer as its new priority."""
        loss, losses, td_errors = self.loss_backward(batches, loss_inputs=self.loss_draws)
        self.optimizer_step()
        self.update_target()
        self.datamodule.after_update(td_errors)
        return loss, losses

    def loss_draws(self, batch: TensorDictBase) -> dict[str, Any]:
        """This update's collocation points, the loss's random inputs beyond its batch, passed to it as keyword
        arguments: drawn eagerly, before the compiled loss, from the model's own generator, so that an update never
        draws from the global generator that a prefetch thread collects with."""
        count = self.physics_loss.collocation_points
        points = self.physics.collocation(count, batch["observation"], self.collocation_generator)
        return {"collocation": points}

    def loss(self, batch: TensorDictBase, collocation: dict[str, torch.Tensor] | None = None) -> TensorDictBase:
        """The DQN error and the physics terms at ``collocation`` (drawn by :meth:`loss_draws` when not given)."""
        # DQN's error with discount 1 (gamma 1.0): Q(s, a) against r + (1 − terminated) · maxₐ' Q_target(s', a')
        # (Double DQN: Q_target(s', argmaxₐ' Q(s', a'))), its mean weighted by prioritized replay's weights.
        predicted, target = self.predicted_and_target(batch)
        error = predicted - target
        dqn_error = self.batch_mean(error.pow(2), batch)
        # Each sample's |δ|, always (a prioritized replay store's new priorities; a uniform one ignores them): nothing
        # after the graph break below (physics_losses) may depend on whether the batch was weighted.
        td_error = error.detach().abs()
        physics = physics_losses(
            self.q_network,
            self.physics,
            collocation if collocation is not None else self.loss_draws(batch)["collocation"],
            self.physics_loss.pde_weight,
            self.physics_loss.boundary_weight,
            self.physics_loss.gradient,
        )
        return TensorDict({"loss": dqn_error, **physics, "td_error": td_error})

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["collocation_generator"] = self.collocation_generator.get_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if "collocation_generator" in checkpoint:  # absent from checkpoints written before it existed
            self.collocation_generator.set_state(checkpoint["collocation_generator"])

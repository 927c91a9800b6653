"""Finite-horizon safety tasks as batched TorchRL environments: stay in the safe set until the horizon τ runs out.

The shared rules of PIRL's environments (docs/reference_systems.md §2): the last state dimension is the remaining
horizon τ, drawn from U(0, ``tau_max``) at reset and lowered by ``dt`` each step; the episode ends with reward 1 when τ
reaches 0 in the safe set, and with reward 0 as soon as the state leaves it. With discount 1 the expected return from a
state is its safety probability. Subclasses give the dynamics (:meth:`SafetyEnv._advance`), the safe set and the
initial states.

Randomness is counter-based (:mod:`envs.counter_rng`): environment ``i`` of a batch seeded ``seed``
replays the episodes of a single environment seeded ``seed + i``, and :meth:`SafetyEnv.replicate` can start many
independent continuations of the same states (Monte-Carlo estimates of the safety probability).
"""

from __future__ import annotations

import abc
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite, Unbounded

from envs.base import BatchedEnv, MaskedResets
from envs.counter_rng import normal, random_bits, uniform


class SafetyEnv(MaskedResets, BatchedEnv):
    """Base class: the state vector (the observation) and the random streams live in buffers.

    Args:
        num_envs: environments stepped together.
        state_dim: length of the state vector, τ last.
        num_actions: discrete actions.
        dt: seconds per step.
        tau_max: initial horizons are drawn from U(0, tau_max).
        seed: base seed; environment ``i`` draws from stream ``seed + i``.
        device: where the batch lives.
        compile_step: the step and reset each compiled into one graph (:class:`~envs.base.BatchedEnv`).
    """

    #: buffers with one row per environment that make up an environment's state (besides ``state``).
    extra_state: tuple[str, ...] = ()

    def __init__(
        self,
        num_envs: int,
        state_dim: int,
        num_actions: int,
        dt: float,
        tau_max: float,
        seed: int,
        device: str | torch.device,
        compile_step: bool = False,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        if dt <= 0:
            raise ValueError(f"dt must be > 0, got {dt}")
        if tau_max <= 0:
            raise ValueError(f"tau_max must be > 0, got {tau_max}")
        super().__init__(batch_size=torch.Size([num_envs]), device=device, compile_step=compile_step)
        self.dt, self.tau_max = dt, tau_max
        n, dev = num_envs, self.device
        self.register_buffer("state", torch.zeros(n, state_dim, device=dev))
        self.register_buffer("stream", torch.arange(n, dtype=torch.long, device=dev) + seed)
        self.register_buffer("draws", torch.zeros(n, dtype=torch.long, device=dev))
        batch = (n,)
        self.observation_spec = Composite(
            observation=Unbounded(shape=(*batch, state_dim), device=dev), shape=batch, device=dev
        )
        self.action_spec = Categorical(num_actions, shape=batch, device=dev)
        self.reward_spec = Unbounded(shape=(*batch, 1), device=dev)

    # ----------------------------------------------------------------------------------------- subclass hooks
    @abc.abstractmethod
    def _initial_state(self, uniforms: torch.Tensor) -> dict[str, torch.Tensor]:
        """Initial states from uniforms ``[rows, initial_draws]``: ``{"state": [rows, state_dim], <extra>: [rows]}``
        (τ included in ``state``)."""
        raise NotImplementedError

    #: uniforms :meth:`_initial_state` consumes per environment.
    initial_draws: int = 1

    @abc.abstractmethod
    def _advance(self, action: torch.Tensor, noise: torch.Tensor) -> None:
        """Integrate one step of ``dt`` in place (τ excluded) given standard normals ``[num_envs, noise_dims]``."""
        raise NotImplementedError

    #: standard normals :meth:`_advance` consumes per environment and step.
    noise_dims: int = 1

    @abc.abstractmethod
    def _unsafe(self) -> torch.Tensor:
        """Boolean ``[num_envs]``: the current state is outside the safe set."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------------ rules
    def _set_seed(self, seed: int | None) -> None:
        seed = 0 if seed is None else seed
        self.stream.copy_(torch.arange(self.batch_size[0], device=self.device) + seed)
        self.draws.zero_()

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        mask = torch.ones(self.batch_size, dtype=torch.bool, device=self.device) if mask is None else mask.view(-1)
        if self.skips_idle_work:
            # Only the finished rows, a few percent of the batch per step (nonzero is free on the CPU).
            rows = mask.nonzero().squeeze(1)
            fresh = self._initial_state(uniform(random_bits(self.stream[rows], self.draws[rows], self.initial_draws)))
            for name, value in fresh.items():
                getattr(self, name)[rows] = value
        else:
            # Every row, kept where the mask holds: fixed shapes, no host sync on a GPU.
            fresh = self._initial_state(uniform(random_bits(self.stream, self.draws, self.initial_draws)))
            for name, value in fresh.items():
                buffer = getattr(self, name)
                keep = mask.view(-1, *([1] * (buffer.dim() - 1)))
                buffer.copy_(torch.where(keep, value, buffer))
        self.draws.add_(mask)
        false = torch.zeros(*self.batch_size, 1, dtype=torch.bool, device=self.device)
        return TensorDict(
            {"observation": self.state.clone(), "done": false, "terminated": false.clone(), "truncated": false.clone()},
            batch_size=self.batch_size,
            device=self.device,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        noise = normal(self.stream, self.draws, self.noise_dims, first_slot=self.initial_draws)
        self.draws.add_(1)
        self._advance(tensordict["action"].view(-1), noise)
        self.state[:, -1] -= self.dt
        unsafe = self._unsafe()
        # τ is a float counted down by dt: allow for rounding so that τ₀ = k·dt ends after exactly k steps.
        success = (self.state[:, -1] <= 1e-6) & ~unsafe
        terminated = (unsafe | success).unsqueeze(1)
        return TensorDict(
            {
                "observation": self.state.clone(),
                "reward": success.float().unsqueeze(1),
                "done": terminated,
                "terminated": terminated.clone(),
                "truncated": torch.zeros_like(terminated),
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    # ---------------------------------------------------------------------------------------- Monte Carlo
    def replicate(self, repeats: int, seed: int) -> SafetyEnv:
        """A new batch of ``num_envs × repeats`` environments: ``repeats`` copies of each current state, in order,
        each continuing on its own random stream (``seed``, ``seed + 1``, ...). Used for Monte-Carlo estimates."""
        copy = type(self)(num_envs=self.batch_size[0] * repeats, seed=seed, device=self.device, **self.init_kwargs())
        for name in ("state", *self.extra_state):
            getattr(copy, name).copy_(getattr(self, name).repeat_interleave(repeats, dim=0))
        return copy

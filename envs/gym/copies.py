"""What the Gymnasium family's two engines share: copies of one task, one row per copy in NumPy arrays.

:class:`CopyBatchEnv` holds each copy's current observation, done flags, running episode return and length, seed
stream and episode counter; it turns them into the TorchRL entries (:meth:`CopyBatchEnv._output`), restarts the
finished copies for the collectors (:meth:`CopyBatchEnv.maybe_reset`, through the engine's ``_restart``), writes a
collector's whole round as the copies step (:meth:`CopyBatchEnv.step_round`) and saves what can be restored. The
engines, each in its module, step the copies (``_advance``): ``env.py`` (Python ``gymnasium.make`` copies stepped in
a loop, any registered id and Gymnasium wrappers) and ``envpool_env.py`` (envpool's C++ implementations, stepped by
its thread pool).

**Specs.** A ``Box`` observation is float32 ``observation`` (uint8 images stay uint8, bounded by the space); a
``Discrete`` one is its one-hot float32 vector, the form an MLP reads. ``Discrete`` actions are a ``Categorical``
spec (offset by the space's ``start`` when stepping), ``Box`` actions a ``Bounded`` spec with the space's bounds
(``Unbounded`` where a bound is infinite: PPO's ``normal`` policy acts in it, the agents that need bounds say so).
Other spaces (``MultiDiscrete``, ``Dict``, ...) are one error naming ``env_id`` and the space.

**Episode metrics.** ``episode_return`` is the task's own return (its reward before any clipping) and
``episode_length`` the episode's length in the agent's steps (a frame-skipping engine or wrapper: agent steps, not
emulator frames), both 0 on every step but an episode's last: evaluation reports them as ``episode_return_mean`` and
``episode_length_mean`` beside its ``return_mean`` of the reward the agent learns from. A game with lives (an Atari
task) has one more metric, ``games``: 1 at a game over, 0 at a lost life; with ``episodic_life`` (a lost life ends
the agent's episode, not the game) the return and length are the whole game's, averaged over the episodes that ended a
game (``episode_metric_over``).

**State.** Neither engine has a snapshot of its copies, so the state holds the seed streams and the episode counters.
Loading it ends the running episodes; the next reset starts each copy's following episode ``k`` seeded
:func:`~envs.counter_rng.episode_seed` ``(seed + i, k)``, and the collection carries that reset's
observations (``exact_state = False``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.data import Bounded, Categorical, Composite, TensorSpec, Unbounded

from checkpoints.files import CheckpointMismatch
from compat.tensordict import set_unchecked, tensordict_unchecked, top_level_entries
from compat.torchrl import StepOutputComplete
from envs.base import BatchedEnv

_CPU = torch.device("cpu")


class CopyBatchEnv(StepOutputComplete, BatchedEnv):
    """``num_envs`` copies of one task, their latest results in NumPy arrays (the module docstring has the rules).

    A subclass builds its copies, calls :meth:`_init_copies` with their spaces, and defines ``_restart(envs)`` (start
    the next episode of the copies ``envs`` and write their first observations), ``_advance(actions)`` (step the
    copies: write ``_obs``, ``_terminated``, ``_truncated``, ``_return`` and ``_length``; the shared ``_step`` and
    :meth:`step_round` call it) and ``_reset``.
    """

    episode_metric_keys = ("episode_return", "episode_length")
    exact_state = False

    def _init_copies(
        self, observation_space: gymnasium.Space, action_space: gymnasium.Space, has_lives: bool, seed: int
    ) -> None:
        """The specs from the copies' spaces (after ``super().__init__``), and the per-copy arrays."""
        n, env_id = self.batch_size[0], self.env_id
        observation = observation_spec(observation_space, env_id, n)
        action = action_spec(action_space, env_id, n)
        self._observation_space, self._action_space = observation_space, action_space
        if has_lives:
            self.episode_metric_keys = (*CopyBatchEnv.episode_metric_keys, "games")
            self.episode_metric_over = {"episode_return": "games", "episode_length": "games"}
        self._one_hot = isinstance(observation_space, gymnasium.spaces.Discrete)
        if self._one_hot:
            self._obs = np.zeros(n, dtype=np.int64)  # the observation's value; the output is its one-hot
        else:
            dtype = np.uint8 if observation_space.dtype == np.uint8 else np.float32
            self._obs = np.zeros((n, *observation_space.shape), dtype=dtype)
        discrete_action = isinstance(action_space, gymnasium.spaces.Discrete)
        self._action_start = int(action_space.start) if discrete_action else 0
        # Per copy: its seed stream and next episode's number; whether it was ever started; how its episode last
        # ended; its running episode's return and length; whether its episode ended by a lost life only.
        self._stream = np.arange(n, dtype=np.int64) + seed
        self._next_episode = np.zeros(n, dtype=np.int64)
        self._started = np.zeros(n, dtype=bool)
        self._terminated, self._truncated = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        self._return, self._length = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64)
        self._life_lost = np.zeros(n, dtype=bool)

        dev, batch = self.device, (n,)
        self.observation_spec = Composite(
            observation=observation.to(dev),
            **{key: Unbounded(shape=(*batch, 1), device=dev) for key in self.episode_metric_keys},
            shape=batch,
            device=dev,
        )
        self.action_spec = action.to(dev)
        self.reward_spec = Unbounded(shape=(*batch, 1), device=dev)

    @abstractmethod
    def _restart(self, envs: list[int]) -> None:
        """Start the next episode of each copy in ``envs``, writing its first observation (the engine's own way)."""

    def _actions(self, tensordict: TensorDictBase) -> np.ndarray:
        """The step's actions as NumPy values of the action space's dtype (a ``Discrete`` space's offset added)."""
        action = tensordict.get("action").cpu()
        if self._action_start:
            action = action + self._action_start
        return action.numpy().astype(self._action_space.dtype, copy=False)

    # ---------------------------------------------------------------------------------------------- outputs
    def _observed(self) -> dict[str, torch.Tensor]:
        """Every copy's current observation and done flags, as tensors on the environment's device (copies: the
        arrays move on)."""
        observation = torch.from_numpy(self._observation())
        terminated, truncated = self._terminated[:, None].copy(), self._truncated[:, None].copy()
        observed = {  # in the order of _observed_keys
            "observation": observation,
            "terminated": torch.from_numpy(terminated),
            "truncated": torch.from_numpy(truncated),
            "done": torch.from_numpy(terminated | truncated),
        }
        if self.device != _CPU:
            observed = {key: value.to(self.device) for key, value in observed.items()}
        return observed

    #: the entries of :meth:`_observed`, in its order
    _observed_keys = ("observation", "terminated", "truncated", "done")

    def _metrics(self, ended: np.ndarray | None) -> dict[str, np.ndarray]:
        """A step's episode metrics, ``[n, 1]`` float32 each: 0 but for the copies ``ended`` (indices; None: none)
        whose episode ended at the step."""
        n = self.batch_size[0]
        episode_return, length = np.zeros((n, 1), dtype=np.float32), np.zeros((n, 1), dtype=np.float32)
        if ended is not None:
            episode_return[ended, 0], length[ended, 0] = self._return[ended], self._length[ended]
        metrics = {"episode_return": episode_return, "episode_length": length}
        if "games" in self.episode_metric_keys:  # 1 where a game ended (its length is positive)
            metrics["games"] = (length > 0).astype(np.float32)
        return metrics

    def _output(self, reward: np.ndarray | None = None, ended: np.ndarray | None = None) -> TensorDictBase:
        """:meth:`_observed` and the step's entries: its reward and the metrics of the episodes ``ended`` at it."""
        out = {key: torch.from_numpy(value) for key, value in self._metrics(ended).items()}
        if reward is not None:
            out["reward"] = torch.from_numpy(reward[:, None])
        if self.device != _CPU:
            out = {key: value.to(self.device) for key, value in out.items()}
        return tensordict_unchecked({**self._observed(), **out}, self.batch_size, self.device)

    @abstractmethod
    def _advance(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Step the copies that are not done with their ``actions`` (the engine's own way), writing their observations,
        flags, returns and lengths: the step's reward (0 for a copy not stepped) and the indices of the copies whose
        episode ended at it (None: none)."""

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        reward, ended = self._advance(self._actions(tensordict))
        return self._output(reward, ended)

    def step_round(
        self,
        policy: Callable[[TensorDictBase], TensorDictBase],
        carrier: TensorDictBase,
        steps: int,
        policy_keys: list[NestedKey],
    ) -> tuple[TensorDictBase, TensorDictBase] | None:
        """``steps`` steps of every copy from ``carrier`` (a collector's input: the copies' observations, done flags
        and metrics), ``policy`` acting on it before each (its outputs ``policy_keys`` merged in where it returns
        another tensordict): the round ``[n, steps]`` and the following carrier, as the steps of
        :meth:`step_and_maybe_reset` give them, stacked (to the bit); None where this does not apply and the caller
        steps them so (a carrier holding tensordicts, a device other than the CPU, type checks on, what
        ``step_and_maybe_reset`` itself hands to TorchRL).

        The copies' results are written into the round's arrays as they step, and the policy acts on the carrier
        itself, only what changed replaced (the observation; the metrics after an episode's end): no tensordict is
        built per step, nor stacked at the end, a noticeable share of a small update's cost on a one-copy loop
        (docs/results/gymnasium.md, "The one-copy round written as it steps"). What the carrier holds between steps
        is what :meth:`step_and_maybe_reset` gives: the step's observation (the next episode's first where a copy
        finished), done flags all false (the finished copies restarted), the step's metrics.
        """
        keys = self._plain_step_keys(carrier)
        if keys is None or self.device != _CPU or self.run_type_checks:
            return None
        dropped, from_next = keys
        state = (*self._observed_keys, *self.episode_metric_keys)
        entries = top_level_entries(carrier)
        if set(from_next) != set(state) or not set(state) <= entries.keys():
            return None
        if not all(isinstance(value, torch.Tensor) for value in entries.values()):
            return None
        n = self.batch_size[0]
        first = {key: entries[key].numpy() for key in state}
        before = {key: np.empty((n, steps, *value.shape[1:]), value.dtype) for key, value in first.items()}
        after = {key: np.zeros(array.shape, array.dtype) for key, array in before.items()}  # metrics: 0 but at ends
        for key, value in first.items():
            before[key][:, 0] = value
        reward = np.empty((n, steps, 1), dtype=np.float32)
        observations, flags = after["observation"], [after[key][..., 0] for key in ("terminated", "truncated", "done")]
        restarted = {}  # step: the observations after it, where a copy restarted
        acted: dict[str, list[Any]] | None = None  # the other entries (the policy's), step by step
        metrics_shown = True  # whether the carrier may hold metrics of episodes that ended (the round's input may)
        for t in range(steps):
            output = policy(carrier)
            if output is not carrier:
                carrier.update(output, keys_to_update=policy_keys)
            if acted is None:
                acted = {key: [] for key in entries if key not in state}
            if len(entries) != len(acted) + len(state):
                raise RuntimeError(f"the policy's entries changed within a round: {sorted(entries.keys() - state)}")
            for key, values in acted.items():
                values.append(entries[key])
            reward[:, t, 0], ended = self._advance(self._actions(carrier))
            observations[:, t] = self._observation()
            terminated, truncated, done = (flag[:, t] for flag in flags)
            terminated[:], truncated[:] = self._terminated, self._truncated
            np.logical_or(terminated, truncated, out=done)
            if ended is not None:
                for key, value in self._metrics(ended).items():
                    after[key][:, t] = value
            seen = torch.from_numpy(observations[:, t])
            if done.any():  # as maybe_reset: the finished copies restart, their observation replaced, flags cleared
                self._restart(np.flatnonzero(done).tolist())
                restarted[t] = self._observation()
                seen = torch.from_numpy(restarted[t])
            set_unchecked(carrier, "observation", seen)
            if t == 0:
                for key in ("terminated", "truncated", "done"):
                    set_unchecked(carrier, key, torch.zeros(n, 1, dtype=torch.bool))
            if ended is not None or metrics_shown:
                for key in self.episode_metric_keys:
                    set_unchecked(carrier, key, torch.from_numpy(after[key][:, t]))
                metrics_shown = ended is not None
        # The entries before each step after the first: those after the step before it (flags cleared, where a copy
        # restarted its observation).
        for key in state:
            before[key][:, 1:] = after[key][:, :-1]
        for key in ("terminated", "truncated", "done"):
            before[key][:, 1:] = False
        for t, observation in restarted.items():
            if t + 1 < steps:
                before["observation"][:, t + 1] = observation
        shape = torch.Size([n, steps])
        outputs = {key: torch.from_numpy(after[key]) for key in state}
        outputs["reward"] = torch.from_numpy(reward)
        # In the carrier's order (the policy's new entries after the others, as at its first step), as a stack keeps it.
        batch = {key: torch.stack(acted[key], 1) if key in acted else torch.from_numpy(before[key]) for key in entries}
        batch["next"] = tensordict_unchecked(outputs, shape, self.device)
        # The following carrier: its own tensors (not views of the round), its entries in step_and_maybe_reset's order.
        last = self._observed()
        last.update((key, torch.from_numpy(after[key][:, -1].copy())) for key in self.episode_metric_keys)
        following = {key: value for key, value in entries.items() if key not in dropped}
        following.update((key, last[key]) for key in from_next)
        return (
            tensordict_unchecked(batch, shape, self.device),
            tensordict_unchecked(following, carrier.batch_size, self.device),
        )

    def _observation(self) -> np.ndarray:
        """Every copy's current observation, a new array: the engine's rows, or for a ``Discrete`` space each copy's
        one-hot row."""
        if not self._one_hot:
            return self._obs.copy()
        rows = np.zeros((len(self._obs), int(self._observation_space.n)), dtype=np.float32)
        rows[np.arange(len(self._obs)), self._obs - self._observation_space.start] = 1
        return rows

    def maybe_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Restart the finished copies (those whose ``done`` this environment's last step returned: its own flags,
        read without a round trip through the tensordict); the observation and done flags are replaced by
        ``_reset``'s (current for the others), which spares TorchRL's per-key masked merge."""
        finished = self._terminated | self._truncated
        if finished.any():
            self._restart(np.flatnonzero(finished).tolist())
            tensordict.update(self._observed())
        return tensordict

    # ----------------------------------------------------------------------------------------------- state
    def get_extra_state(self) -> dict[str, Any]:
        """What can be restored (plain tensors and a string, for ``torch.load(weights_only=True)``): the copies' seed
        streams and next episode numbers."""
        return {
            "env_id": self.env_id,
            "stream": torch.from_numpy(self._stream.copy()),
            "next_episode": torch.from_numpy(self._next_episode.copy()),
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore the streams and counters; the running episodes end, and the next reset starts the following ones
        (each engine's ``_forget_episodes``)."""
        n = self.batch_size[0]
        if state["env_id"] != self.env_id:
            raise CheckpointMismatch(
                f"its environment state is for env_id {state['env_id']}; this run's is {self.env_id}"
            )
        if state["stream"].shape != (n,):
            raise CheckpointMismatch(
                f"its environment state is for {state['stream'].shape[0]} copies; this run's environment has {n}"
            )
        self._stream, self._next_episode = state["stream"].numpy().copy(), state["next_episode"].numpy().copy()
        self._started[:], self._terminated[:], self._truncated[:] = False, False, False
        self._return[:], self._length[:], self._life_lost[:] = 0.0, 0, False
        self._forget_episodes()

    @abstractmethod
    def _forget_episodes(self) -> None:
        """After a state is loaded: the next reset starts each copy's episode ``_next_episode`` of its stream."""


def observation_spec(space: gymnasium.Space, env_id: str, num_envs: int) -> TensorSpec:
    """The ``observation`` entry's spec: float32 for a ``Box`` (uint8 images kept, bounded), one-hot for a
    ``Discrete``."""
    if isinstance(space, gymnasium.spaces.Box):
        shape = (num_envs, *space.shape)
        if space.dtype == np.uint8:
            low, high = (torch.from_numpy(np.broadcast_to(bound, shape).copy()) for bound in (space.low, space.high))
            return Bounded(low, high, shape=shape, dtype=torch.uint8)
        return Unbounded(shape=shape, dtype=torch.float32)
    if isinstance(space, gymnasium.spaces.Discrete):
        return Bounded(0.0, 1.0, shape=(num_envs, int(space.n)), dtype=torch.float32)
    raise ValueError(
        f"env_id {env_id}: its observation space {space} is not supported: Box or Discrete (a wrapper such as "
        "FlattenObservation can make it a Box)"
    )


def action_spec(space: gymnasium.Space, env_id: str, num_envs: int) -> TensorSpec:
    """``Categorical`` for a ``Discrete`` action space, ``Bounded`` with the box's bounds for a ``Box`` (``Unbounded``
    if any dimension has an infinite bound)."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return Categorical(int(space.n), shape=(num_envs,))
    if isinstance(space, gymnasium.spaces.Box):
        shape = (num_envs, *space.shape)
        if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
            return Unbounded(shape=shape, dtype=torch.float32)  # the agents that need bounds say so (modules/spaces.py)
        low, high = (
            torch.from_numpy(np.broadcast_to(bound, shape).astype(np.float32)) for bound in (space.low, space.high)
        )
        return Bounded(low, high, shape=shape, dtype=torch.float32)
    raise ValueError(f"env_id {env_id}: its action space {space} is not supported: Discrete or Box")

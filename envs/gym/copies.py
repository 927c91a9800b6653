"""What the Gymnasium family's two engines share: copies of one task, one row per copy in NumPy arrays.

:class:`CopyBatchEnv` holds each copy's current observation, done flags, running episode return and length, seed
stream and episode counter; it turns them into the TorchRL entries (:meth:`CopyBatchEnv._output`), restarts the
finished copies for the collectors (:meth:`CopyBatchEnv.maybe_reset`, through the engine's ``_restart``) and saves
what can be restored. The engines, each in its module: ``env.py`` (Python ``gymnasium.make`` copies stepped in a
loop, any registered id and Gymnasium wrappers) and ``envpool_env.py`` (envpool's C++ implementations, stepped by
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
from typing import Any

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, TensorSpec, Unbounded

from checkpoints.files import CheckpointMismatch
from compat.tensordict import tensordict_unchecked
from compat.torchrl import StepOutputComplete
from envs.base import BatchedEnv

_CPU = torch.device("cpu")


class CopyBatchEnv(StepOutputComplete, BatchedEnv):
    """``num_envs`` copies of one task, their latest results in NumPy arrays (the module docstring has the rules).

    A subclass builds its copies, calls :meth:`_init_copies` with their spaces, and defines ``_restart(envs)`` (start
    the next episode of the copies ``envs`` and write their first observations), ``_step`` and ``_reset``; a step
    writes ``_obs``, ``_terminated``, ``_truncated``, ``_return`` and ``_length`` and returns :meth:`_output`.
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
        if self._one_hot:
            space = self._observation_space
            observation = F.one_hot(torch.from_numpy(self._obs - space.start), int(space.n)).float()
        else:
            observation = torch.from_numpy(self._obs.copy())
        terminated, truncated = self._terminated[:, None].copy(), self._truncated[:, None].copy()
        observed = {
            "observation": observation,
            "terminated": torch.from_numpy(terminated),
            "truncated": torch.from_numpy(truncated),
            "done": torch.from_numpy(terminated | truncated),
        }
        if self.device != _CPU:
            observed = {key: value.to(self.device) for key, value in observed.items()}
        return observed

    def _output(
        self,
        reward: np.ndarray | None = None,
        episode_return: np.ndarray | None = None,
        length: np.ndarray | None = None,
    ) -> TensorDictBase:
        """:meth:`_observed` and the step's entries: its reward and the metrics of the episodes it ended."""
        n = self.batch_size[0]
        zero = np.zeros((n, 1), dtype=np.float32)
        out = {
            "episode_return": torch.from_numpy(zero if episode_return is None else episode_return[:, None]),
            "episode_length": torch.from_numpy(zero.copy() if length is None else length[:, None]),
        }
        if "games" in self.episode_metric_keys:  # 1 where a game ended (its length is positive)
            out["games"] = torch.from_numpy(zero.copy() if length is None else (length[:, None] > 0).astype(np.float32))
        if reward is not None:
            out["reward"] = torch.from_numpy(reward[:, None])
        if self.device != _CPU:
            out = {key: value.to(self.device) for key, value in out.items()}
        return tensordict_unchecked({**self._observed(), **out}, self.batch_size, self.device)

    def _episode_ends(self, ended: np.ndarray, reward: np.ndarray) -> TensorDictBase:
        """The step's output when the copies ``ended`` (indices) finished an episode, their metrics filled."""
        episode_return, length = np.zeros_like(reward), np.zeros_like(reward)
        episode_return[ended], length[ended] = self._return[ended], self._length[ended]
        return self._output(reward, episode_return, length)

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

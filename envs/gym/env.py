"""Any registered Gymnasium environment as a batched TorchRL environment: ``num_envs`` copies stepped in this process.

**Options.** ``env_id`` (a registered id, or ``module:Id`` to import the module that registers it), ``env_kwargs``
(keyword arguments of ``gymnasium.make``, ``max_episode_steps`` included) and ``wrappers`` (standard Gymnasium
wrappers by name, or any ``gymnasium.Wrapper`` by class path, applied in order to each copy)::

    env:
      class_path: envs.gym.env.GymnasiumEnv
      init_args:
        env_id: LunarLander-v3
        env_kwargs: {gravity: -9.0}
        wrappers:
          - TimeAwareObservation                  # a name from gymnasium.wrappers, default arguments
          - class_path: ClipReward                # or a dotted path to a gymnasium.Wrapper of one's own
            init_args: {min_reward: -1.0, max_reward: 1.0}

**Batch.** The copies are stepped one after the other, each writing its observation into one NumPy array for the
whole batch, and TorchRL resets the finished ones (no Gymnasium autoreset: a copy stays at its last step, done,
until reset, and a reset with a ``_reset`` mask restarts only the masked copies). Parallelism comes from the data
module's worker processes (``EnvWorkers``, ``CollectorWorkers``), each with its own copies; a Gymnasium vector env
would add its own per-step work to the same loop, and ``AsyncVectorEnv`` one process per copy
(docs/results/gymnasium.md, "Gymnasium environments").

**Specs, episode metrics, state**: the family's (``copies.py``). The return is the Gymnasium environment's own: its
reward before the user's wrappers (e.g. before ``ClipReward``), read from a ``RecordEpisodeStatistics`` under them,
whichever layer ends the episode (a ``TimeLimit`` among the wrappers, say); the length is the agent's steps.

**Life loss** (``episodic_life: true``, Atari): a step on which the game's ``info["lives"]`` falls ends the agent's
episode (``terminated``, so values do not bootstrap across a lost life), but the game goes on: the copy's next
"reset" continues from where it is, and only a game over resets the game. This is Stable-Baselines3's
``EpisodicLifeEnv`` (the RL Zoo's Atari wrapper) and envpool's ``episodic_life``; Gymnasium's ``AtariPreprocessing``
has ``terminal_on_life_loss``, but its reset then restarts the whole game, so an agent would never play past its
first life. The episode metrics are the whole game's: 0 at a lost life, the game's score and length at game over.
Evaluation plays whole games with ``evaluation: {env_options: {episodic_life: false}}``; the metrics are the whole
game's (``copies.py``).

**Seeding.** Copy ``i`` of a batch seeded ``seed`` starts its first episode with ``reset(seed=seed + i)`` and its
later ones continue its own generator, as Gymnasium's vector envs do: a batch plays what
``gymnasium.make(env_id)`` copies seeded ``seed + i`` play under the same actions.

**State.** A Gymnasium environment has no snapshot of its state (``copies.py``): after a state is loaded, a copy's
generator is gone, so its next episode ``k`` is seeded ``episode_seed(seed + i, k)``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from envs.counter_rng import episode_seed
from envs.gym.copies import CopyBatchEnv, action_spec, observation_spec
from envs.gym.make import make_env, resolve_wrappers


class GymnasiumEnv(CopyBatchEnv):
    """``num_envs`` copies of a Gymnasium environment as one TorchRL batch (the module docstring has the rules).

    Args:
        num_envs: copies stepped together.
        env_id: a registered Gymnasium id, or ``module:Id`` to import the module that registers it.
        env_kwargs: keyword arguments of ``gymnasium.make``: the environment's own, and ``max_episode_steps``.
        wrappers: Gymnasium wrappers applied to each copy in order: a name from ``gymnasium.wrappers`` or a dotted
            class path, alone or as ``{class_path: ..., init_args: {...}}``.
        episodic_life: a lost life (the ``lives`` entry of the step's info falls) ends the agent's episode, not the
            game (module docstring); for environments that report ``lives`` (the ALE's).
        seed: base seed; copy ``i`` plays the episodes of stream ``seed + i``.
        device: where the returned tensors live (the environments run on the CPU).
        render: build the copies drawable (Gymnasium's ``render_mode="rgb_array"``): a video's environment is built
            with it (``render_options``). Off for training and evaluation, since some environments simulate what is
            only drawn whenever they have a render mode (LunarLander's exhaust particles: 2.4x its step).
    """

    can_render = True  # copies built with render: true (Gymnasium's render_mode="rgb_array"), where it has that mode
    render_options = MappingProxyType({"render": True})
    inexact_state_reason = (
        "a Gymnasium environment has no snapshot of its state (and replaying its actions is exact only for a "
        "deterministic environment under stateless wrappers): loading a state ends the running episodes"
    )

    def __init__(
        self,
        num_envs: int = 1,
        env_id: str = "CartPole-v1",
        env_kwargs: dict[str, Any] | None = None,
        wrappers: list[str | dict[str, Any]] | None = None,
        episodic_life: bool = False,
        seed: int = 0,
        device: str | torch.device = "cpu",
        render: bool = False,
    ) -> None:
        # Messages start with the argument's name: the command line prefixes the flag path it was given under.
        if num_envs < 1:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"env_id must be a Gymnasium id such as 'CartPole-v1', got {env_id!r}")
        kwargs, resolved = dict(env_kwargs or {}), resolve_wrappers(wrappers)
        built = [make_env(env_id, kwargs, resolved, render)]
        first = built[0][0]
        try:
            # Checked before the other copies are built: the spaces (again, with the specs, in _init_copies), and a
            # game with lives (an unseeded reset here: each copy's first episode is seeded at its own reset).
            observation_spec(first.observation_space, env_id, num_envs)
            action_spec(first.action_space, env_id, num_envs)
            info = first.reset()[1]
            if episodic_life:  # refused here, in one line, rather than at the collector's first reset
                lives(info, env_id)
        except ValueError:
            first.close()  # a simulator's resources (a MuJoCo model, an emulator) go with the refusal
            raise
        built += [make_env(env_id, kwargs, resolved, render) for _ in range(num_envs - 1)]
        envs = [env for env, _ in built]
        super().__init__(batch_size=torch.Size([num_envs]), device=device)
        self.env_id, self.drawable = env_id, render
        self._init_copies(envs[0].observation_space, envs[0].action_space, "lives" in info, seed)
        self._envs = envs
        self._steps = [env.step for env in envs]
        self.episodic_life = episodic_life
        # With wrappers each episode's return comes from its copy's own (inner) RecordEpisodeStatistics, the reward
        # before the wrappers; without, nothing can change the reward, and the rewards are summed here.
        self._statistics = [statistics for _, statistics in built] if resolved else None
        # Whether a copy's next reset seeds it (see _restart); every copy started (it can be stepped); episodic_life:
        # each copy's lives after its last step.
        self._reseed = np.ones(num_envs, dtype=bool)
        self._ready = False
        self._lives = np.zeros(num_envs, dtype=np.int64)

    # ------------------------------------------------------------------------------------------- episodes
    def _restart(self, envs: list[int] | range) -> None:
        """Start the next episode of each copy in ``envs``.

        A copy's first episode is seeded ``seed + i`` (its stream); the later ones continue the copy's own generator,
        as Gymnasium's vector envs do (a new generator per episode would cost more than a CartPole step). After a
        state is loaded the copy's generator is gone: its next episode ``k`` is seeded ``episode_seed(stream, k)``.
        """
        for i in envs:
            if self._life_lost[i]:  # the game goes on: the agent's next episode starts where the last life ended
                self._life_lost[i], self._terminated[i], self._truncated[i] = False, False, False
                continue
            seed = None
            if self._reseed[i]:
                stream, episode = int(self._stream[i]), int(self._next_episode[i])
                seed, self._reseed[i] = stream if episode == 0 else episode_seed(stream, episode), False
            self._obs[i], info = self._envs[i].reset(seed=seed)
            if self.episodic_life:
                self._lives[i] = lives(info, self.env_id)
            self._next_episode[i] += 1
            self._started[i], self._terminated[i], self._truncated[i] = True, False, False
            self._return[i], self._length[i] = 0.0, 0
        self._ready = bool(self._started.all())

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """Restart the flagged copies (all, without ``_reset``) and those never started; the others go on."""
        flags = None if tensordict is None else tensordict.get("_reset", None)
        if flags is None:
            self._restart(range(self.batch_size[0]))
        else:
            flagged = flags.reshape(self.batch_size[0], -1).any(-1).cpu().numpy()
            self._restart(np.flatnonzero(flagged | ~self._started).tolist())
        return self._output()

    # ----------------------------------------------------------------------------------------------- step
    def _advance(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if not self._ready:
            raise RuntimeError("GymnasiumEnv: reset the environment before stepping it")
        if len(self._steps) == 1:
            return self._advance_one(actions)
        finished = self._terminated | self._truncated
        # A finished copy is not stepped: it stays at its last step, done, with no reward, until it is reset. When all
        # run (nearly always), whole-array writes: NumPy's writes through index lists cost more.
        live = np.flatnonzero(~finished).tolist() if finished.any() else slice(None)
        steps = self._steps if isinstance(live, slice) else [self._steps[i] for i in live]
        results = [step(a) for step, a in zip(steps, actions[live], strict=True)]
        reward = np.zeros(self.batch_size[0], dtype=np.float32)
        if not results:
            return reward, None
        observations, rewards, terminated, truncated, infos = zip(*results, strict=True)
        self._obs[live], reward[live] = observations, rewards
        self._terminated[live], self._truncated[live] = terminated, truncated
        # In place: `self._return += reward` would assign the attribute through torch.nn.Module.__setattr__.
        np.add(self._return, reward, out=self._return)
        self._length[live] += 1
        if self.episodic_life:
            self._lose_lives(live, infos)
        if True not in terminated and True not in truncated and not self._life_lost.any():
            return reward, None
        ended = np.flatnonzero((self._terminated | self._truncated) & ~finished & ~self._life_lost)
        if self._statistics is not None:  # the return before the wrappers, whichever layer ended the episode
            for i in ended.tolist():
                self._return[i] = self._statistics[i].episode_returns
        return reward, ended

    def _advance_one(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`_advance` of a single copy, on its scalars: a one-copy loop steps once a frame, and NumPy's per-call
        costs on arrays of one row (the masks, reductions and writes through tuples above) come to a noticeable share
        of a cheap task's step (docs/results/gymnasium.md, "The one-copy round written as it steps")."""
        reward = np.zeros(1, dtype=np.float32)
        if self._terminated[0] or self._truncated[0]:
            return reward, None  # finished: not stepped until it is reset
        observation, reward[0], terminated, truncated, info = self._steps[0](actions[0])
        self._obs[0], self._terminated[0], self._truncated[0] = observation, terminated, truncated
        self._return[0] += reward[0]
        self._length[0] += 1
        if self.episodic_life:
            self._lose_lives([0], (info,))
        if not (terminated or truncated) or self._life_lost[0]:
            return reward, None
        if self._statistics is not None:  # the return before the wrappers, whichever layer ended the episode
            self._return[0] = self._statistics[0].episode_returns
        return reward, np.zeros(1, dtype=np.intp)  # copy 0's episode ended

    def _lose_lives(self, live: list[int] | slice, infos: tuple[dict, ...]) -> None:
        """``episodic_life``: end the agent's episode of each stepped copy whose lives fell and whose game goes on."""
        stepped = range(self.batch_size[0]) if isinstance(live, slice) else live
        for i, info in zip(stepped, infos, strict=True):
            now = lives(info, self.env_id)
            if now < self._lives[i] and not (self._terminated[i] or self._truncated[i]):
                self._terminated[i], self._life_lost[i] = True, True
            self._lives[i] = now

    def render(self, index: int = 0) -> np.ndarray:
        """Copy ``index``'s ``render()`` in Gymnasium's ``rgb_array`` mode (uint8 ``[height, width, 3]``); the copies
        must have been built with ``render: true``."""
        if not self.drawable:
            raise ValueError(
                f"env_id {self.env_id}: this environment was built without render: true, so it draws nothing (a "
                "video's environment is built with it)"
            )
        frame = self._envs[self._render_index(index)].render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[-1] != 3:
            raise ValueError(
                f"env_id {self.env_id} cannot render: its environment has no rgb_array render mode, so it makes no "
                "video"
            )
        return np.ascontiguousarray(frame, dtype=np.uint8)

    def _set_seed(self, seed: int | None) -> None:
        """Copy ``i`` starts stream ``seed + i`` from its first episode at its next reset."""
        self._stream = np.arange(self.batch_size[0], dtype=np.int64) + (0 if seed is None else seed)
        self._next_episode[:], self._reseed[:] = 0, True

    def close(self, *, raise_if_closed: bool = True) -> None:
        for env in self._envs:
            env.close()
        super().close(raise_if_closed=raise_if_closed)

    def _forget_episodes(self) -> None:
        """The copies' generators are gone with their episodes: each next reset seeds its copy (see _restart)."""
        self._reseed[:], self._ready = True, False


def lives(info: dict[str, Any], env_id: str) -> int:
    """The ``lives`` entry of a step's or reset's info, which ``episodic_life`` needs."""
    if "lives" not in info:
        raise ValueError(f"episodic_life needs the lives in the info of each step; env_id {env_id}'s has none")
    return int(info["lives"])

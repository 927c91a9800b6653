"""A task that envpool implements in C++ (Atari, MuJoCo, classic control, ...): ``num_envs`` copies stepped by its
thread pool, as a batched TorchRL environment::

    env:
      class_path: envs.gym.envpool_env.EnvpoolEnv
      init_args:
        env_id: Breakout-v5             # envpool's id (envpool.list_all_envs()); ALE/Breakout-v5 is read as Breakout-v5
        env_kwargs: {reward_clip: true}  # envpool's options of the task (envpool.make_spec(env_id).config)
        episodic_life: true
        num_threads: 0                  # envpool's worker threads; 0: one per core, at most one per copy

**Why.** The copies step in envpool's threads, outside Python: 2.2× Gymnasium's vector env on Breakout with 8 copies
and 2 threads, 1.4–2.1× on HalfCheetah with 8–16 (docs/results/gymnasium.md, "MuJoCo and Atari: which
vectorisation").

**What differs from** :class:`~envs.gym.env.GymnasiumEnv`: the task is envpool's implementation, so
the same seed plays other episodes than ``gymnasium.make(id)`` does (and MuJoCo's floating point may differ);
preprocessing is envpool's own options (Atari's frame skip, no-op starts, 84×84 grey, frame stack, FIRE at reset,
reward clipping, life loss: its defaults are the DeepMind settings), not Gymnasium wrappers; and it does not render
(a video needs the Gymnasium engine).

**Batch.** envpool restarts a finished copy on that copy's next step, whose action it ignores; :meth:`maybe_reset`
takes that step for the finished copies only, so the collector reads the next episode's first observation as TorchRL
expects. After a lost life (``episodic_life``) that step continues the game, and envpool presses FIRE
(``use_fire_reset``, its default); without ``episodic_life`` envpool presses nothing after a lost life, so this engine
presses FIRE and then action 2 straight after the step that lost it, in games with a FIRE action (Gymnasium's
``FireReset`` in the other engine): a greedy policy that never chose FIRE would otherwise stand still until the
frame limit. A reset (TorchRL's ``_reset`` mask) restarts the masked copies' games.

**Episode metrics and state**: the family's (``copies.py``). The return is the task's reward before clipping
(envpool's ``info["reward"]`` where it reports it: Atari), the length its agent steps; with ``episodic_life`` both
are the whole game's. The copies cannot be reseeded one by one: a new seed, or a loaded state, builds a new pool, copy
``i`` seeded ``seed + i`` (episode ``k`` of its stream after a state is loaded: ``episode_seed(seed + i, k)``).

**Seeding.** Copy ``i`` of a batch seeded ``seed`` is seeded ``seed + i`` (envpool's ``env_seed``), so it plays what
``envpool.make_gymnasium(env_id, num_envs=1, env_seed=[seed + i])`` plays.
"""

from __future__ import annotations

import difflib
import functools
import os
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from compat.extras import install_command
from envs.counter_rng import episode_seed
from envs.gym.copies import CopyBatchEnv

#: The command that installs envpool (pyproject.toml's extra).
#: envpool's options that the environment sets itself (the batch, the seeds, the threads, the life loss).
OWN_OPTIONS = ("num_envs", "batch_size", "seed", "env_seed", "num_threads", "episodic_life")


def import_envpool(env_id: str) -> Any:
    try:
        import envpool  # noqa: PLC0415 (an optional extra)
    except ModuleNotFoundError:
        raise ValueError(
            f"env_id {env_id} needs envpool, which is not installed: {install_command('envpool')}"
        ) from None
    return envpool


def task_id(envpool: Any, env_id: str) -> str:
    """envpool's id for ``env_id`` (Gymnasium's ``ALE/`` namespace dropped), or one error with the close matches."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"env_id must be an envpool task id such as 'Breakout-v5', got {env_id!r}")
    task = env_id.removeprefix("ALE/")
    known = envpool.list_all_envs()
    if task not in known:
        close = difflib.get_close_matches(task, known, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; envpool.list_all_envs() lists its tasks"
        raise ValueError(f"env_id {env_id!r} is not an envpool task{hint}")
    return task


@functools.cache  # an emulator built to ask: once per game and process (evaluations build environments again)
def fire_is_action_1(task: str, env_id: str) -> bool:
    """Whether the Atari game ``task`` has a FIRE action (index 1 of its minimal action set), as Gymnasium's ALE build
    names its actions (the ``FireReset`` wrapper's check)."""
    import gymnasium  # noqa: PLC0415

    try:
        import ale_py  # noqa: PLC0415
    except ModuleNotFoundError:
        raise ValueError(
            f"env_id {env_id} needs ale-py to know its actions, which is not installed: {install_command('envpool')}"
        ) from None
    gymnasium.register_envs(ale_py)
    game = gymnasium.make(f"ALE/{task}")
    try:
        meanings = game.unwrapped.get_action_meanings()
    finally:
        game.close()
    return len(meanings) >= 2 and meanings[1] == "FIRE"


class EnvpoolEnv(CopyBatchEnv):
    """``num_envs`` copies of an envpool task as one TorchRL batch (the module docstring has the rules).

    Args:
        num_envs: copies stepped together.
        env_id: envpool's task id (``envpool.list_all_envs()``); ``ALE/Breakout-v5`` is read as ``Breakout-v5``.
        env_kwargs: envpool's options of the task (``envpool.make_spec(env_id).config``: ``max_episode_steps``,
            Atari's ``reward_clip``, ``noop_max``, ``stack_num``, ``repeat_action_probability``, ...).
        episodic_life: a lost life ends the agent's episode, not the game (envpool's ``episodic_life``; tasks with
            lives only).
        num_threads: envpool's worker threads; 0: one per core, at most one per copy.
        seed: base seed; copy ``i`` is seeded ``seed + i``.
        device: where the returned tensors live (the copies run on the CPU).
    """

    inexact_state_reason = "envpool has no snapshot of its environments: loading a state ends the running episodes"

    def __init__(
        self,
        num_envs: int = 1,
        env_id: str = "CartPole-v1",
        env_kwargs: dict[str, Any] | None = None,
        episodic_life: bool = False,
        num_threads: int = 0,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        # Messages start with the argument's name: the command line prefixes the flag path it was given under.
        if num_envs < 1:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        if num_threads < 0:
            raise ValueError(f"num_threads must be >= 0 (0: one per core), got {num_threads}")
        envpool = import_envpool(env_id)
        task = task_id(envpool, env_id)
        spec = envpool.make_spec(task)
        options = dict(env_kwargs or {})
        owned = sorted(set(options) & set(OWN_OPTIONS))
        if owned:
            raise ValueError(
                f"env_kwargs {options}: {', '.join(owned)} {'is' if len(owned) == 1 else 'are'} set by the "
                "environment's own options (num_envs, seed, num_threads, episodic_life), not in env_kwargs"
            )
        config = spec.config._asdict()  # the task's options and their defaults (a namedtuple)
        known = set(config) - set(OWN_OPTIONS)
        unknown = sorted(set(options) - known)
        if unknown:
            what = "is not an option" if len(unknown) == 1 else "are not options"
            raise ValueError(
                f"env_kwargs {options}: {', '.join(unknown)} {what} of envpool's {task}; its options: "
                f"{', '.join(sorted(known))}"
            )
        has_lives = "info:lives" in spec.state_array_spec
        if episodic_life:
            if "episodic_life" not in config:
                raise ValueError(
                    f"episodic_life needs a task with lives; envpool's {task} has none (its Atari tasks have)"
                )
            options["episodic_life"] = True
        super().__init__(batch_size=torch.Size([num_envs]), device=device)
        self.env_id, self.episodic_life = env_id, episodic_life
        self._make = envpool.make_gymnasium
        self._task, self._options = task, options
        self._threads = num_threads or min(num_envs, os.cpu_count() or 1)
        self._init_copies(spec.gymnasium_observation_space, spec.gymnasium_action_space, has_lives, seed)
        # The task reports its reward before clipping (Atari) and whether a game, not just a life, ended.
        self._raw_reward = "info:reward" in spec.state_array_spec
        self._reports_game_over = "info:terminated" in spec.state_array_spec
        # envpool presses FIRE when a life is lost only at its episodic "reset": without episodic_life this engine
        # does (module docstring); each copy's lives after its last step, to see one lost.
        fires = has_lives and {**config, **options}.get("use_fire_reset", False) and fire_is_action_1(task, env_id)
        self._fire_after_lost_life = fires and not episodic_life
        self._lives = np.zeros(num_envs, dtype=np.int64)
        self._pool = self._new_pool(self._stream)

    def _new_pool(self, seeds: np.ndarray) -> Any:
        """A pool of the copies, copy ``i`` seeded ``seeds[i]``; no copy started."""
        self._started[:] = False
        return self._make(
            self._task,
            num_envs=self.batch_size[0],
            env_seed=[int(seed) % 2**31 for seed in seeds],  # envpool's seeds are C++ ints
            num_threads=self._threads,
            **self._options,
        )

    # ------------------------------------------------------------------------------------------- episodes
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """Restart the flagged copies' games (all, without ``_reset``) and those never started; the others go on."""
        flags = None if tensordict is None else tensordict.get("_reset", None)
        restart = np.ones(self.batch_size[0], dtype=bool) if flags is None else ~self._started
        if flags is not None:
            restart |= flags.reshape(self.batch_size[0], -1).any(-1).cpu().numpy()
        ids = np.flatnonzero(restart)
        if len(ids):
            observations, info = self._pool.reset(ids)
            self._begin(ids, observations, info, new_game=np.ones(len(ids), dtype=bool))
        return self._output()

    def _restart(self, envs: list[int]) -> None:
        """The finished copies' next episodes: envpool starts them on their next step (the action is ignored), which
        continues the game after a lost life."""
        ids = np.asarray(envs)
        lost_life = self._life_lost[ids]
        ignored = np.zeros((len(ids), *self._action_space.shape), self._action_space.dtype)
        observations, _, _, _, info = self._pool.step(ignored, ids)
        self._begin(ids, observations, info, new_game=~lost_life)

    def _begin(self, ids: np.ndarray, observations: np.ndarray, info: dict, new_game: np.ndarray) -> None:
        """Copies ``ids`` start an episode from ``observations``; a new game's return and length start at 0."""
        self._obs[ids] = observations
        if self._fire_after_lost_life:
            self._lives[ids] = info["lives"]
        self._terminated[ids], self._truncated[ids], self._life_lost[ids] = False, False, False
        self._started[ids] = True
        games = ids[new_game]
        self._return[games], self._length[games] = 0.0, 0
        self._next_episode[games] += 1

    # ----------------------------------------------------------------------------------------------- step
    def _advance(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if not self._started.all():
            raise RuntimeError("EnvpoolEnv: reset the environment before stepping it")
        finished = self._terminated | self._truncated
        # A finished copy is not stepped (envpool would restart it): it stays at its last step, done, with no reward.
        live = np.flatnonzero(~finished)
        reward = np.zeros(self.batch_size[0], dtype=np.float32)
        if not len(live):
            return reward, None
        if finished.any():
            observations, rewards, terminated, truncated, info = self._pool.step(actions[live], live)
        else:
            observations, rewards, terminated, truncated, info = self._pool.step(actions)
        self._obs[live], reward[live] = observations, rewards
        self._terminated[live], self._truncated[live] = terminated, truncated
        self._return[live] += info["reward"] if self._raw_reward else rewards
        self._length[live] += 1
        if self._fire_after_lost_life:
            lost = live[(info["lives"] < self._lives[live]) & ~(terminated | truncated)]
            self._lives[live] = info["lives"]
            if len(lost):
                self._fire(lost, reward)
        done = self._terminated[live] | self._truncated[live]
        if not done.any():
            return reward, None
        if self.episodic_life and self._reports_game_over:  # a lost life ends the agent's episode, not the game
            game_over = self._truncated[live] | info["terminated"].astype(bool)
            self._life_lost[live] = self._terminated[live] & ~game_over
        else:
            game_over = done
        return reward, live[done & game_over]

    def _fire(self, ids: np.ndarray, reward: np.ndarray) -> None:
        """After a lost life, press FIRE then action 2 on copies ``ids`` (Gymnasium's ``FireReset`` in the other
        engine): their observations, rewards and flags are those steps', their rewards added to the step's."""
        for action in (1, 2):
            actions = np.full((len(ids), *self._action_space.shape), action, self._action_space.dtype)
            observations, rewards, terminated, truncated, info = self._pool.step(actions, ids)
            self._obs[ids], reward[ids] = observations, reward[ids] + rewards
            self._terminated[ids], self._truncated[ids] = terminated, truncated
            self._return[ids] += info["reward"] if self._raw_reward else rewards
            self._length[ids] += 1
            self._lives[ids] = info["lives"]
            ids = ids[~(terminated | truncated)]  # a game over on these steps stops the presses
            if not len(ids):
                return

    def _set_seed(self, seed: int | None) -> None:
        """Copy ``i`` is seeded ``seed + i``: a new pool (envpool seeds its copies when it builds them)."""
        stream = np.arange(self.batch_size[0], dtype=np.int64) + (0 if seed is None else seed)
        self._next_episode[:] = 0
        if not np.array_equal(stream, self._stream) or self._started.any():
            self._stream = stream
            self._pool.close()
            self._pool = self._new_pool(stream)

    def _forget_episodes(self) -> None:
        """A new pool, copy ``i`` seeded for episode ``k = next_episode[i]`` of its stream."""
        seeds = [
            stream if episode == 0 else episode_seed(int(stream), int(episode))
            for stream, episode in zip(self._stream, self._next_episode, strict=True)
        ]
        self._pool.close()
        self._pool = self._new_pool(np.asarray(seeds))

    def close(self, *, raise_if_closed: bool = True) -> None:
        self._pool.close()
        super().close(raise_if_closed=raise_if_closed)

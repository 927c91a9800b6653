"""Gymnasium speed: :class:`~envs.gym.env.GymnasiumEnv` against Gymnasium's own vector env, same run.

    python benchmarks/gym_env_speed.py                                   # CartPole-v1 and Pendulum-v1, 1, 8, 64 envs
    python benchmarks/gym_env_speed.py --env-ids LunarLander-v3 --num-envs 16 --threads 1
    python benchmarks/gym_env_speed.py --others                          # and the vectorisations not chosen
    # MuJoCo and Atari as the shipped configs build them (wrappers included), against AsyncVectorEnv and envpool:
    python benchmarks/gym_env_speed.py --configs configs/gym/halfcheetah_ppo.yaml configs/gym/breakout_ppo.yaml \
        --num-envs 1 8 16 --others --most-processes 16

Reports frames per second (environments × steps / seconds) of:

- ``vector``: ``gymnasium.make_vec(id, n, vectorization_mode="sync")`` (a ``SyncVectorEnv``, its default NEXT_STEP
  autoreset) stepped with pre-drawn NumPy actions: the raw Gymnasium vector env;
- ``core``: the wrapper's ``_step`` + ``maybe_reset`` (its own work: the loop over the copies, the output copies,
  the episode statistics, restarts);
- ``wrapped``: ``env.step_and_maybe_reset`` on the wrapper (what collectors call: the environments' own, without
  TorchRL's per-key passes, ``compat.torchrl.FastStepAndMaybeReset``), the step's bookkeeping included;
- ``wrapped, TorchRL's step``: the same through TorchRL's own ``EnvBase.step_and_maybe_reset`` (what the wrapper
  cost before it had its own);
- ``floor``: :class:`Unsimulated`, the wrapper's own step with nothing simulated: the action read, the output tensors
  built from the copies' arrays, the next input made. What any environment of this family pays per batch step on top
  of its simulation, so ``floor`` over ``vector`` is the least overhead the wrapper can reach on that task;
- with ``--others``: ``loop``, ``gymnasium.make`` copies stepped in a bare Python loop (what the wrapper runs inside,
  without its outputs: the floor under both the wrapper and ``SyncVectorEnv``); ``AsyncVectorEnv`` and TorchRL's own
  ``GymEnv`` (one process per copy, as TorchRL builds it over ``AsyncVectorEnv`` for several copies: 8 copies at most,
  so as not to swamp the machine; ``--most-processes`` raises it); and, when ``envpool`` imports and has the task, its
  C++ pool with one thread and with a thread per copy (up to the CPU count).

``--configs`` measures the environment a shipped config builds (its ``env_id``, ``env_kwargs``, ``wrappers`` and
``episodic_life``), and gives the Gymnasium vector envs the same wrappers; envpool does the same preprocessing itself
(:data:`ENVPOOL_TASKS`: Atari's no-op starts, frame skip, 84×84 grey, frame stack, life loss, FIRE and reward clip).

The overhead column is the time a path adds over ``vector`` (the target for ``wrapped`` is ≤ 10 %). Episodes end and
restart during the timed passes. Passes run round-robin and the best of ``--repeats`` is kept, so every path sees
the same share of whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch
import yaml
from tensordict import TensorDict, TensorDictBase
from torchrl.envs import EnvBase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.gym.copies import CopyBatchEnv  # noqa: E402
from envs.gym.env import GymnasiumEnv  # noqa: E402
from envs.gym.make import find_spec, resolve_wrappers  # noqa: E402

#: envpool's id and options for a Gymnasium id whose task it has, preprocessed as the shipped configs do.
ENVPOOL_TASKS = {
    "HalfCheetah-v5": ("HalfCheetah-v5", {}),
    "ALE/Breakout-v5": (
        "Breakout-v5",
        {"episodic_life": True, "reward_clip": True, "stack_num": 4, "frame_skip": 4, "noop_max": 30},
    ),
}

#: The paths with a process per copy run up to this many copies only (a 2-core machine shared with other work).
_MOST_PROCESSES = 8


class Unsimulated(CopyBatchEnv):
    """The Gymnasium family's step around copies that simulate nothing: ``_step`` reads the actions and returns the
    outputs of the copies' arrays (zero reward, no episode ends), as an engine does after its simulation."""

    def __init__(self, like: GymnasiumEnv) -> None:
        super().__init__(batch_size=like.batch_size, device=like.device)
        self.env_id = like.env_id
        self._init_copies(like._observation_space, like._action_space, False, 0)
        self._reward = np.zeros(self.batch_size[0], dtype=np.float32)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._actions(tensordict)
        return self._output(self._reward.copy())

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        return self._output()

    def _restart(self, envs: list[int]) -> None:
        pass  # nothing ever ends

    def _forget_episodes(self) -> None:
        pass

    def _set_seed(self, seed: int | None) -> None:
        pass


def timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(
    env_id: str, n: int, steps: int, repeats: int, others: bool, options: dict | None = None, most: int = 8
) -> dict[str, float]:
    """Seconds of ``steps`` batch steps of each path (the best of ``repeats``); ``options`` are a config's
    GymnasiumEnv options (``env_kwargs``, ``wrappers``, ``episodic_life``)."""
    options = dict(options or {})
    find_spec(env_id)  # registers the ids of a namespace's package (ALE/: ale_py) for make_vec
    vector = gymnasium.make_vec(env_id, num_envs=n, vectorization_mode="sync", **vector_options(options))
    env = GymnasiumEnv(num_envs=n, env_id=env_id, seed=0, **options)
    torch.manual_seed(0)
    actions = [env.action_spec.rand() for _ in range(steps)]
    raw_actions = [action.numpy() for action in actions]
    unsimulated = Unsimulated(env)
    vector.reset(seed=0)
    td, floor_td = env.reset(), unsimulated.reset()

    def raw() -> None:
        for action in raw_actions:
            vector.step(action)

    def core() -> None:
        nonlocal td
        for action in actions:
            td = env.maybe_reset(env._step(TensorDict({"action": action}, batch_size=env.batch_size)))

    def wrapped() -> None:
        nonlocal td
        for action in actions:
            td["action"] = action
            _, td = env.step_and_maybe_reset(td)

    def torchrls_step() -> None:
        nonlocal td
        for action in actions:
            td["action"] = action
            _, td = EnvBase.step_and_maybe_reset(env, td)

    def floor() -> None:
        nonlocal floor_td
        for action in actions:
            floor_td["action"] = action
            _, floor_td = unsimulated.step_and_maybe_reset(floor_td)

    paths: dict[str, Callable[[], None]] = {
        "vector": raw,
        "core": core,
        "wrapped": wrapped,
        "wrapped, TorchRL's step": torchrls_step,
        "floor": floor,
    }
    closing = [vector.close, env.close, unsimulated.close]
    if others:
        paths.update(other_paths(env_id, n, raw_actions, actions, closing, options, most))
    timings = dict.fromkeys(paths, float("inf"))
    for run in paths.values():  # a warm-up pass each (first steps, lazy imports)
        run()
    for _ in range(repeats):
        for name, run in paths.items():
            timings[name] = min(timings[name], timed(run))
    for close in closing:
        close()
    return timings


def vector_options(options: dict) -> dict:
    """``gymnasium.make_vec``'s arguments for a config's options: the env's keyword arguments, and its wrappers as
    callables applied to each copy."""
    wrappers = [functools.partial(cls, **kwargs) for cls, kwargs in resolve_wrappers(options.get("wrappers"))]
    return {**options.get("env_kwargs", {}), **({"wrappers": wrappers} if wrappers else {})}


def other_paths(
    env_id: str, n: int, raw_actions: list, actions: list, closing: list, options: dict, most: int
) -> dict[str, Callable[[], None]]:
    """The vectorisations measured against and not chosen (``--others``)."""
    from torchrl.envs import GymEnv  # noqa: PLC0415

    def make() -> gymnasium.Env:
        env = gymnasium.make(env_id, **options.get("env_kwargs", {}))
        for cls, kwargs in resolve_wrappers(options.get("wrappers")):
            env = cls(env, **kwargs)
        return env

    copies = [make() for _ in range(n)]
    for i, copy in enumerate(copies):
        copy.reset(seed=i)
        closing.append(copy.close)

    def loop() -> None:
        for action in raw_actions:
            for copy, each in zip(copies, action, strict=True):
                if any(copy.step(each)[2:4]):
                    copy.reset()

    paths = {"loop": loop}
    if n <= most:
        kwargs = vector_options(options)
        asynchronous = gymnasium.make_vec(env_id, num_envs=n, vectorization_mode="async", **kwargs)
        asynchronous.reset(seed=0)
        closing.append(asynchronous.close)

        def async_steps() -> None:
            for action in raw_actions:
                asynchronous.step(action)

        paths["AsyncVectorEnv"] = async_steps
    if n <= most and not options.get("wrappers"):  # TorchRL's GymEnv takes no Gymnasium wrappers
        torchrl_env = GymEnv(env_id, num_envs=n) if n > 1 else GymEnv(env_id)
        closing.append(torchrl_env.close)
        state = {"td": torchrl_env.reset()}
        torchrl_actions = [torchrl_env.action_spec.rand() for _ in actions]  # its own encoding (one-hot: Discrete)

        def torchrl_gym() -> None:
            for action in torchrl_actions:
                state["td"]["action"] = action
                _, state["td"] = torchrl_env.step_and_maybe_reset(state["td"])

        paths["torchrl GymEnv"] = torchrl_gym
    try:
        import envpool  # noqa: PLC0415
    except ImportError:
        return paths
    pool_id, pool_options = ENVPOOL_TASKS.get(env_id, (env_id, {}))
    if pool_id not in envpool.list_all_envs():
        return paths
    for threads in sorted({1, min(n, os.cpu_count() or 1)}):
        pool = envpool.make_gymnasium(pool_id, num_envs=n, seed=0, num_threads=threads, **pool_options)
        pool.reset()
        closing.append(pool.close)
        pool_actions = [action.astype(pool.action_space.dtype) for action in raw_actions]

        def envpool_steps(pool: Any = pool, pool_actions: list = pool_actions) -> None:
            for action in pool_actions:
                pool.step(action)

        paths[f"envpool ({threads} thread{'s' if threads > 1 else ''})"] = envpool_steps
    return paths


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-ids", nargs="+", default=None, help="default: CartPole-v1 Pendulum-v1")
    parser.add_argument("--configs", nargs="+", default=[], help="shipped configs whose environments to measure")
    parser.add_argument("--most-processes", type=int, default=_MOST_PROCESSES, help="most copies of process paths")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--frames", type=int, default=20_000, help="frames per timed pass (steps = frames / envs)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; the best is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--others", action="store_true", help="also time the vectorisations not chosen")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    command = " ".join(["python", "benchmarks/gym_env_speed.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"{datetime.now(UTC).isoformat(timespec='seconds')} · `{command}` · {args.threads} thread(s) · torch")
    print(f"{torch.__version__} · gymnasium {gymnasium.__version__} · {platform.processor() or platform.machine()}\n")
    print("| env | envs | path | frames/s | µs per batch step | overhead vs vector |")
    print("|---|---:|---|---:|---:|---:|")
    report = {}
    tasks = [(env_id, {}) for env_id in args.env_ids or ([] if args.configs else ["CartPole-v1", "Pendulum-v1"])]
    for path in args.configs:
        options = dict(yaml.safe_load(Path(path).read_text())["data"]["init_args"]["env"]["init_args"])
        tasks.append((options.pop("env_id"), options))
    for env_id, options in tasks:
        for n in args.num_envs:
            steps = max(args.frames // n, 50)
            timings = measure(env_id, n, steps, args.repeats, args.others, options, args.most_processes)
            for name, seconds in timings.items():
                overhead = seconds / timings["vector"] - 1
                print(
                    f"| {env_id} | {n} | {name} | {n * steps / seconds:,.0f} | {seconds / steps * 1e6:,.1f} | "
                    f"{'—' if name == 'vector' else f'{overhead:+.1%}'} |"
                )
                report[(env_id, n, name)] = {"frames_per_s": n * steps / seconds, "overhead": overhead}
    return report


if __name__ == "__main__":
    main()

"""Gymnasium speed: :class:`~datamodules.envs.gym.env.GymnasiumEnv` against Gymnasium's own vector env, same run.

    python benchmarks/gym_env_speed.py                                   # CartPole-v1 and Pendulum-v1, 1, 8, 64 envs
    python benchmarks/gym_env_speed.py --env-ids LunarLander-v3 --num-envs 16 --threads 1
    python benchmarks/gym_env_speed.py --others                          # and the vectorisations not chosen

Reports frames per second (environments × steps / seconds) of:

- ``vector``: ``gymnasium.make_vec(id, n, vectorization_mode="sync")`` (a ``SyncVectorEnv``, its default NEXT_STEP
  autoreset) stepped with pre-drawn NumPy actions: the raw Gymnasium vector env;
- ``core``: the wrapper's ``_step`` + ``maybe_reset`` (its own work: the loop over the copies, the output copies,
  the episode statistics, restarts);
- ``wrapped``: TorchRL's ``env.step_and_maybe_reset`` on the wrapper (what collectors call), TorchRL's bookkeeping
  included;
- with ``--others``: ``loop``, ``gymnasium.make`` copies stepped in a bare Python loop (what the wrapper runs inside,
  without its outputs: the floor under both the wrapper and ``SyncVectorEnv``); ``AsyncVectorEnv`` and TorchRL's own
  ``GymEnv`` (one process per copy, as TorchRL builds it over ``AsyncVectorEnv`` for several copies: 8 copies at most,
  so as not to swamp the machine); and, when ``envpool`` imports, its C++ pool (one thread).

The overhead column is the time a path adds over ``vector`` (the target for ``wrapped`` is ≤ 10 %). Episodes end and
restart during the timed passes. Passes run round-robin and the best of ``--repeats`` is kept, so every path sees
the same share of whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import gymnasium
import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules.envs.gym.env import GymnasiumEnv  # noqa: E402

#: The paths with a process per copy run up to this many copies only (a 2-core machine shared with other work).
_MOST_PROCESSES = 8


def timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(env_id: str, n: int, steps: int, repeats: int, others: bool) -> dict[str, float]:
    """Seconds of ``steps`` batch steps of each path (the best of ``repeats``)."""
    vector = gymnasium.make_vec(env_id, num_envs=n, vectorization_mode="sync")
    env = GymnasiumEnv(num_envs=n, env_id=env_id, seed=0)
    torch.manual_seed(0)
    actions = [env.action_spec.rand() for _ in range(steps)]
    raw_actions = [action.numpy() for action in actions]
    vector.reset(seed=0)
    td = env.reset()

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

    paths: dict[str, Callable[[], None]] = {"vector": raw, "core": core, "wrapped": wrapped}
    closing = [vector.close, env.close]
    if others:
        paths.update(other_paths(env_id, n, raw_actions, actions, closing))
    timings = dict.fromkeys(paths, float("inf"))
    for run in paths.values():  # a warm-up pass each (first steps, lazy imports)
        run()
    for _ in range(repeats):
        for name, run in paths.items():
            timings[name] = min(timings[name], timed(run))
    for close in closing:
        close()
    return timings


def other_paths(env_id: str, n: int, raw_actions: list, actions: list, closing: list) -> dict[str, Callable[[], None]]:
    """The vectorisations measured against and not chosen (``--others``)."""
    from torchrl.envs import GymEnv  # noqa: PLC0415

    copies = [gymnasium.make(env_id) for _ in range(n)]
    for i, copy in enumerate(copies):
        copy.reset(seed=i)
        closing.append(copy.close)

    def loop() -> None:
        for action in raw_actions:
            for copy, each in zip(copies, action, strict=True):
                if any(copy.step(each)[2:4]):
                    copy.reset()

    paths = {"loop": loop}
    if n <= _MOST_PROCESSES:
        asynchronous = gymnasium.make_vec(env_id, num_envs=n, vectorization_mode="async")
        asynchronous.reset(seed=0)
        closing.append(asynchronous.close)

        def async_steps() -> None:
            for action in raw_actions:
                asynchronous.step(action)

        paths["AsyncVectorEnv"] = async_steps
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
    pool = envpool.make_gymnasium(env_id, num_envs=n, seed=0, num_threads=1)
    pool.reset()
    pool_actions = [action.astype(pool.action_space.dtype) for action in raw_actions]

    def envpool_steps() -> None:
        for action in pool_actions:
            pool.step(action)

    paths["envpool (1 thread)"] = envpool_steps
    return paths


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-ids", nargs="+", default=["CartPole-v1", "Pendulum-v1"])
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
    for env_id in args.env_ids:
        for n in args.num_envs:
            steps = max(args.frames // n, 50)
            timings = measure(env_id, n, steps, args.repeats, args.others)
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

"""MettaGrid speed: the raw engines against :class:`~envs.mettagrid.env.MettaGridEnv` on the same games.

    python benchmarks/metta_env_speed.py --num-envs 8 --steps 1000 --threads 1
    python benchmarks/metta_env_speed.py --num-envs 8 --steps 1000 --threads 1 --parallel 2

Reports agent steps per second (environments × agents × steps / seconds) of:

- ``raw``: the ``MettaGrid.step`` loop alone over the wrapper's own engines and buffers, random actions written
  into the numpy action buffer, finished episodes restarted;
- ``core``: the wrapper's ``_step`` + ``maybe_reset`` (the work the environment itself adds: action conversion and
  logging, output copies, restarts);
- ``step``: TorchRL's ``env.step_and_maybe_reset`` (what collectors call), spec checks and bookkeeping included;
- ``rand_step``: ``env.rand_step`` (draws the action too);
- with ``--parallel W``: ``ParallelEnv`` of W worker processes of ``--num-envs`` environments each.

The overhead column is the time a path adds over ``raw`` (target ≤ 15 %). Episodes end and restart during the timed
passes (``--max-steps``), so restarts are in every figure. Actions are drawn before timing. The last line is the cost
of copying the observations out of the engines' buffer, part of every wrapper path.
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.mettagrid.env import MettaGridEnv  # noqa: E402


def best_time(run, repeats: int) -> float:
    """Best of ``repeats`` timings (the least disturbed by other work on the machine)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-agents", type=int, default=24)
    parser.add_argument("--task", default="altars")
    parser.add_argument("--steps", type=int, default=1000, help="steps per timed pass")
    parser.add_argument("--max-steps", type=int, default=500, help="episode length")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; the best is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--parallel", type=int, default=0, help="also time a ParallelEnv of this many workers")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    options = {"task": args.task, "num_agents": args.num_agents, "max_steps": args.max_steps}
    env = MettaGridEnv(num_envs=args.num_envs, seed=0, **options)
    n, agents, steps = args.num_envs, args.num_agents, args.steps
    actions = torch.randint(0, env.num_actions, (steps, n, agents))
    raw_actions = actions.to(torch.int32).numpy()
    td = env.reset()

    def raw() -> None:
        for t in range(steps):
            env._actions[:] = raw_actions[t]  # what a caller of the bare engines does: write, then step each
            for engine in env._engines:
                engine.step()
            if env._truncations.any() or env._terminals.any():
                env._restart([i for i in range(n) if env._truncations[i].any() or env._terminals[i].any()])
                env._steps[:] = 0  # the restarts' logs are not used here

    def core() -> None:
        nonlocal td
        for t in range(steps):
            td = env.maybe_reset(env._step(TensorDict({"action": actions[t]}, batch_size=env.batch_size)))

    def step() -> None:
        nonlocal td
        for t in range(steps):
            td["action"] = actions[t]
            _, td = env.step_and_maybe_reset(td)

    def rand_step() -> None:
        nonlocal td
        for _ in range(steps):
            out = env.rand_step(td)
            td = env.maybe_reset(out["next"])

    # Round-robin passes, best of each: the paths see the same share of whatever else the machine is doing.
    paths = {"raw": raw, "core": core, "step": step, "rand_step": rand_step}
    timings = dict.fromkeys(paths, float("inf"))
    for _ in range(args.repeats):
        for name, run in paths.items():
            td = env.reset()
            timings[name] = min(timings[name], best_time(run, 1))
    if args.parallel:
        from torchrl.envs import ParallelEnv  # noqa: PLC0415

        factories = [functools.partial(MettaGridEnv, num_envs=n, seed=w * n, **options) for w in range(args.parallel)]
        penv = ParallelEnv(args.parallel, factories, num_sub_threads=1, num_threads=args.threads)
        ptd = penv.reset()
        pactions = torch.randint(0, env.num_actions, (steps, args.parallel, n, agents))

        def parallel() -> None:
            nonlocal ptd
            for t in range(steps):
                ptd["action"] = pactions[t]
                _, ptd = penv.step_and_maybe_reset(ptd)

        timings[f"parallel x{args.parallel}"] = best_time(parallel, args.repeats)
        penv.close()

    def copies() -> None:
        for _ in range(steps):
            env._obs.copy()  # dropped at once, as a step's output is once the collector has stored it

    clone = best_time(copies, args.repeats) / steps
    env.close()

    command = " ".join(["python", "benchmarks/metta_env_speed.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"{datetime.now(UTC).isoformat(timespec='seconds')} · `{command}` · {args.threads} thread(s) · torch")
    print(f"{torch.__version__} · {platform.processor() or platform.machine()} · {n} envs × {agents} agents\n")
    print("| path | agent steps/s | env steps/s | µs per batch step | overhead vs raw |")
    print("|---|---:|---:|---:|---:|")
    report = {}
    for name, seconds in timings.items():
        envs = n * (args.parallel if name.startswith("parallel") else 1)
        rate = envs * agents * steps / seconds
        overhead = seconds / timings["raw"] - 1 if not name.startswith("parallel") else float("nan")
        shown = "—" if name.startswith("parallel") else f"{overhead:+.1%}"
        print(f"| {name} | {rate:,.0f} | {envs * steps / seconds:,.0f} | {seconds / steps * 1e6:,.0f} | {shown} |")
        report[name] = {"seconds": seconds, "agent_steps_per_s": rate, "overhead": overhead}
    share = clone / (timings["raw"] / steps)
    print(f"\nobservation copy: {clone * 1e6:.1f} µs per batch step ({share:.1%} of a raw batch step)")
    return report


if __name__ == "__main__":
    main()

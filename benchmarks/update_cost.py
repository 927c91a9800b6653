"""What an update costs inside the whole training loop, against the bare arithmetic of that update.

    python benchmarks/update_cost.py --agent dqn                  # the reference's DQN setting, eager update
    python benchmarks/update_cost.py --agent dqn --compile true   # the same with the compiled update
    python benchmarks/update_cost.py --agent ppo --compile true   # Snake-PPO, minibatch 2,048
    python benchmarks/update_cost.py --agent pirl --compile true  # PIRL on the vehicle, batch 1,024
    python benchmarks/update_cost.py --agent sac --compile true   # racing SAC, batch 256
    python benchmarks/update_cost.py --agent dqn --compile true --arithmetic  # the update step alone, no loop
    python benchmarks/update_cost.py --arithmetic --config configs/gym/lunarlander_dqn.yaml --compile true  # a config
    python benchmarks/update_cost.py --floor configs/gym/cartpole_dqn.yaml   # what no loop of a Gymnasium task avoids

One process measures, side by side:

- **bare**: the same network, batch size and loss maths, backward, gradient clip and fused Adam step in a plain
  eager PyTorch loop, on batches drawn from the real environment before timing — no framework, no collection;
- **fit**: ``python -m app fit`` with the agent's config and ``configs/bench/throughput.yaml`` (collection, replay
  writes, sampling, Lightning's loop and the target update all included), its wall time per update.

The two are interleaved by the run's own yardstick, the throughput report's (``callbacks/throughput.py``): after
the warm-up, a slice of ``--bare-seconds`` of the bare loop (on copies of the networks, under a forked RNG, the
report's clock stopped) follows every ``--segment-seconds`` of training. This machine's speed drifts within a minute
by more than the overheads measured (docs/results/snake.md, "The update against its bare arithmetic"), so a bare time
taken before or after the fit does not describe the fit; the ratio is each stretch's time per update over the bare
slice right after it, and the figure reported is the median of those ratios: the report's own figure, so that the
benchmark and every run's report read one yardstick. The steady state's time per update is also split into the data
module's phases (collect, buffer_write, sample, update; other is the rest), without the bare slices.
The DQN runs at the reference's setting (``configs/bench/dqn_reference_ratio.yaml``: batch 128, one update per 4 frames,
1 thread). Writes ``update_cost_<agent>_compile-<c>.json`` and prints one summary line.

``--arithmetic`` runs no fit: it alternates the bare update with the agent's own update step taken out of the loop
(its compiled loss, backward, fused Adam and soft target update;
:func:`callbacks.bare_updates.framework_free_update`), to tell what the update step costs from what the loop around it
costs. Writes ``update_arithmetic_<agent>_compile-<c>.json``.

``--floor CONFIG`` runs no fit either: for a Gymnasium config, it alternates the bare update with what any training
loop of that config pays per update besides it, whatever the framework: the environment's own steps (Gymnasium's,
built as the config builds them, ``num_envs`` copies stepped in turn, episodes restarting as they end) and the acting
policy's call on their observations (the agent's, on a TensorDict, as a collection calls it; ε-greedy at its final ε),
``frames_per_update / num_envs`` of each per update. Their
sum over the bare update is the least loop ÷ bare the config can show with each piece warm. A fourth slice runs the
same pieces in the loop's rhythm (a round's batch steps, each acting then stepping, then the updates the round earns,
in turn): its time per update over the bare update is the floor **in rounds**, what any loop that collects in the
updates' thread pays once each piece runs right after the others have taken the CPU's caches. A fifth and sixth
slice time the agent's own update step alone and in those rounds (``framework_free_update``, compiled where the
config compiles it): a fit whose update is compiled runs below the bare update's cost, so the floor it is to be read
against is this one, and a fit's loop ÷ bare less it is the loop's own costs (the step's bookkeeping, the buffer's
writes and draws, the hooks). Writes ``loop_floor_<config>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import EGreedyModule

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli import build, main  # noqa: E402
from callbacks.bare_updates import bare_update, framework_free_update  # noqa: E402
from callbacks.throughput import ThroughputReport  # noqa: E402
from envs.gym.env import GymnasiumEnv  # noqa: E402
from envs.gym.make import make_env, resolve_wrappers  # noqa: E402

CONFIGS = {
    "dqn": ["configs/snake_dqn.yaml", "configs/bench/throughput.yaml", "configs/bench/dqn_reference_ratio.yaml"],
    "ppo": ["configs/snake_ppo.yaml", "configs/bench/throughput.yaml"],
    "pirl": ["configs/pirl_vehicle.yaml", "configs/bench/throughput.yaml"],
    "sac": ["configs/racing_sac.yaml", "configs/bench/throughput.yaml", "configs/bench/sac_update.yaml"],
}
WARMUP_STEPS = 200  # updates left out: compilation, first allocations


def run(
    configs: list[str],
    name: str,
    compile_: str,
    updates: int,
    threads: int,
    segment: float,
    bare: float,
    out: Path,
    extra: Sequence[str] = (),
) -> dict:
    """The fit of ``configs`` with its own yardstick (the throughput report's bare slices,
    :class:`callbacks.throughput.ThroughputReport`): a slice of ``bare`` seconds after every ``segment`` seconds of
    training past the warm-up, and the report's steady-state figures."""
    overrides = [
        *("--model.init_args.compile", compile_),
        *("--threads", str(threads)),
        *("--trainer.max_steps", str(updates)),
        *("--trainer.logger.init_args.save_dir", str(out)),
        *("--trainer.logger.init_args.name", name),
        *("--trainer.enable_progress_bar", "false"),
        *("--trainer.callbacks.init_args.skip_first_steps", str(WARMUP_STEPS)),
        *("--trainer.callbacks.init_args.bare_update_seconds", str(bare)),
        *("--trainer.callbacks.init_args.bare_update_share", str(min(0.5, bare / segment))),
        *extra,
    ]
    cli = main(["fit", *(arg for path in configs for arg in ("--config", path)), *overrides])
    (report,) = [callback.report for callback in cli.trainer.callbacks if isinstance(callback, ThroughputReport)]
    yardstick, steady = report["bare_update"], report["steady_state"] or report["this_process"]
    if not yardstick or "pairs" not in yardstick:
        raise SystemExit(f"the run timed no bare update ({(yardstick or {}).get('error', 'no reference')})")
    if len(yardstick["pairs"]) < 3:
        timed = len(yardstick["pairs"])
        raise SystemExit(f"only {timed} stretches were timed against the bare update: raise --updates")
    bare_ms = [pair["bare_ms"] for pair in yardstick["pairs"]]
    phases = {phase: 1e3 * seconds / steady["updates"] for phase, seconds in steady["seconds"].items() if seconds}
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/update_cost.py", *sys.argv[1:]],
        "machine": {**report["machine"], "load_average_1min_at_end": round(os.getloadavg()[0], 2)},
        "torch": torch.__version__,
        "configs": [str(Path(path).relative_to(ROOT)) if Path(path).is_relative_to(ROOT) else path for path in configs],
        "compile": compile_,
        "report": report["run"],
        "fit": {
            "updates_timed": sum(pair["updates"] for pair in yardstick["pairs"]),
            "ms_per_update": yardstick["loop_ms_per_update"],
            "frames_per_s": steady["frames_per_s"],
            "updates_per_s": steady["updates_per_s"],
            "phases_ms_per_update": phases,  # the steady state's, the slices left out
        },
        "bare_ms_per_update": {"median": yardstick["ms"], "min": min(bare_ms), "max": max(bare_ms)},
        "ratio": yardstick["ratio"],
        "ratio_range": yardstick["ratio_range"],
        "segments": yardstick["pairs"],
    }


def alternated_ms(
    parts: dict[str, Callable[[int], Any]],
    rounds: int,
    seconds: float,
    scale: dict[str, float] | None = None,
    warmup: dict[str, int] | None = None,
) -> dict[str, list[float]]:
    """Milliseconds per call of each of ``parts`` (times ``scale[name]``, default 1), in ``rounds`` rounds of a slice
    of ``seconds`` of each in turn, after ``warmup[name]`` calls each (default 50: compilation, first allocations);
    under a forked generator seeded 0 (PIRL draws collocation points, a policy samples)."""
    times: dict[str, list[float]] = {name: [] for name in parts}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name, part in parts.items():
            for i in range((warmup or {}).get(name, 50)):
                part(i)
        for _ in range(rounds):
            for name, part in parts.items():
                calls, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    part(calls)
                    calls += 1
                times[name].append(1e3 * (time.perf_counter() - start) / calls * (scale or {}).get(name, 1.0))
    return times


def arithmetic(configs: list[str], label: str, compile_: str, threads: int, rounds: int, seconds: float) -> dict:
    """The agent's own update outside any loop (:func:`callbacks.bare_updates.framework_free_update`) against the bare
    update, alternating ``rounds`` times ``seconds`` of each: what the update step costs before the loop around it.
    ``configs``: the agent's (``--agent``) or a replay config's (``--config``), named ``label`` in the result."""
    model, data = build(configs, ["--model.init_args.compile", compile_])
    torch.set_num_threads(threads)
    steps = {"bare": bare_update(model, data), "update": framework_free_update(model, data)}
    times = alternated_ms(steps, rounds, seconds)
    ratios = [update / bare for update, bare in zip(times["update"], times["bare"], strict=True)]
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/update_cost.py", *sys.argv[1:]],
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": threads},
        "torch": torch.__version__,
        "agent": label,
        "compile": compile_,
        "ms_per_update": {name: statistics.median(values) for name, values in times.items()},
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "rounds": times,
    }


def floor(config: str, threads: int, rounds: int, seconds: float) -> dict:
    """The bare update of ``config`` against its environment's own steps and its acting policy's calls per update,
    alternating ``rounds`` slices of ``seconds`` each (see the module's docstring, ``--floor``)."""
    model, data = build([config], ["--threads", str(threads)])
    if data.declared.env_class is not GymnasiumEnv:
        raise SystemExit(f"--floor {config}: a Gymnasium config is needed (its environment: {data.declared.env_class})")
    options = data.declared.options
    wrappers = resolve_wrappers(options.get("wrappers"))
    seeds = [data.rank_seed + copy for copy in range(data.num_envs)]  # copy i plays stream seed + i
    envs = [make_env(options["env_id"], dict(options.get("env_kwargs") or {}), wrappers)[0] for _ in seeds]
    torch.set_num_threads(threads)
    policy, epsilon = model.policy(), None
    for module in policy.modules():  # the policy as it acts once its ε has annealed (ε 1 acts without the network)
        if isinstance(module, EGreedyModule):
            epsilon = float(module.eps.fill_(module.eps_end))
    observations = [env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)]
    actions = []
    for env, seed in zip(envs, seeds, strict=True):
        env.action_space.seed(seed)
        actions.append([env.action_space.sample() for _ in range(1024)])

    def environment(i: int) -> None:  # one step of every copy
        for copy, env in enumerate(envs):
            observations[copy], _, terminated, truncated, _ = env.step(actions[copy][i % 1024])
            if terminated or truncated:
                observations[copy] = env.reset()[0]

    def acting(i: int) -> None:  # one call on every copy's observation
        seen = torch.as_tensor(np.stack(observations), dtype=torch.float32)
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            policy(TensorDict({"observation": seen}, batch_size=[len(envs)]))

    bare, update = bare_update(model, data), framework_free_update(model, data)
    # A loop's rhythm: a round of collect_steps batch steps earns frames_per_batch / frames_per_update updates; a
    # cycle is the fewest whole rounds that earn whole updates (frames_per_update as written: 0.1 is a tenth).
    exact = data.frames_per_batch / Fraction(str(data.frames_per_update))
    earned = exact.limit_denominator(1000) or Fraction(1, math.ceil(1 / exact))  # or: an update in over 1,000 rounds
    cycle_steps, cycle_updates = earned.denominator * data.collect_steps, earned.numerator

    def in_rounds_of(step_of_update: Callable[[int], Any]) -> Callable[[int], None]:
        def in_rounds(i: int) -> None:  # each step's acting and environment, then the updates they earn, in turn
            for step in range(i * cycle_steps, (i + 1) * cycle_steps):
                acting(step)
                environment(step)
            for earned in range(cycle_updates):
                step_of_update(i * cycle_updates + earned)

        return in_rounds

    parts = {
        "bare": bare,
        "update": update,
        "environment": environment,
        "acting": acting,
        "in_rounds": in_rounds_of(bare),
        "in_rounds_update": in_rounds_of(update),
    }
    # A batch step of the copies is num_envs frames: frames_per_update / num_envs of them per update.
    steps = data.frames_per_update / len(envs)
    per_update = {"environment": steps, "acting": steps, "in_rounds": 1 / cycle_updates}
    per_update["in_rounds_update"] = per_update["in_rounds"]
    # The rounds are made of the parts warmed up before them (the update's compilation included): one call each.
    times = alternated_ms(parts, rounds, seconds, per_update, warmup={"in_rounds": 1, "in_rounds_update": 1})
    for env in envs:
        env.close()
    floors = [
        (bare + environment + acting) / bare
        for bare, environment, acting in zip(times["bare"], times["environment"], times["acting"], strict=True)
    ]
    in_rounds_floors = [cost / bare for cost, bare in zip(times["in_rounds"], times["bare"], strict=True)]
    own_updates = [cost / bare for cost, bare in zip(times["update"], times["bare"], strict=True)]
    own_floors = [cost / bare for cost, bare in zip(times["in_rounds_update"], times["bare"], strict=True)]
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/update_cost.py", *sys.argv[1:]],
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": threads},
        "torch": torch.__version__,
        "config": str(path.relative_to(ROOT)) if (path := Path(config).resolve()).is_relative_to(ROOT) else config,
        "env_id": options["env_id"],
        "num_envs": len(envs),
        "frames_per_update": data.frames_per_update,
        "cycle": {"batch_steps": cycle_steps, "updates": cycle_updates},
        "epsilon": epsilon,  # the ε-greedy policy's ε (None: no ε-greedy)
        "compile": model.compile_mode,  # the agent's update step as the config sets it (compiled or eager)
        "ms_per_update": {name: statistics.median(values) for name, values in times.items()},
        "floor": statistics.median(floors),
        "floor_range": [min(floors), max(floors)],
        "floor_in_rounds": statistics.median(in_rounds_floors),
        "floor_in_rounds_range": [min(in_rounds_floors), max(in_rounds_floors)],
        "update": statistics.median(own_updates),
        "update_range": [min(own_updates), max(own_updates)],
        "floor_in_rounds_update": statistics.median(own_floors),
        "floor_in_rounds_update_range": [min(own_floors), max(own_floors)],
        "rounds": times,
    }


def written(result: dict, path: Path) -> Path:
    """``result`` as JSON at ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", choices=sorted(CONFIGS), default="dqn")
    parser.add_argument("--compile", default="false", help="the model's compile option: false, true or a mode")
    parser.add_argument("--updates", type=int, default=4000, help="updates of the fit (the first 200 are warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, for both loops")
    parser.add_argument("--segment-seconds", type=float, default=2.0, help="fit time between two bare slices")
    parser.add_argument("--bare-seconds", type=float, default=0.5, help="time of each bare slice")
    parser.add_argument("--out", default="runs/bench", help="folder for the fit's run and the JSON result")
    parser.add_argument(
        "--arithmetic",
        action="store_true",
        help="no fit: time the agent's own update step outside Lightning and the data path against the bare update "
        "(DQN, PIRL and SAC), alternating --rounds slices of --bare-seconds each",
    )
    parser.add_argument(
        "--config",
        metavar="CONFIG",
        action="append",
        help="with --arithmetic: a replay agent's config (DQN, QR-DQN, SAC, ...; a Gymnasium one too) in place of "
        "--agent's; repeat it to compose configs as the app does, later files overriding earlier ones (a preset on "
        "a shipped config: --config configs/mario_ddqn.yaml --config configs/bench/mario_cpu.yaml)",
    )
    parser.add_argument(
        "--floor",
        metavar="CONFIG",
        help="no fit: a Gymnasium config's bare update against its environment's steps and its acting policy's calls "
        "per update, alternating --rounds slices of --bare-seconds each",
    )
    parser.add_argument("--rounds", type=int, default=7, help="with --arithmetic or --floor: alternations of the loops")
    parser.add_argument(
        "fit",
        nargs=argparse.REMAINDER,
        help="after --: more flags for the fit, e.g. -- --data.init_args.collection.prefetch false",
    )
    args = parser.parse_args(argv)
    args.fit = [flag for flag in args.fit if flag != "--"]
    if args.updates <= 2 * WARMUP_STEPS:
        parser.error(f"--updates must be > {2 * WARMUP_STEPS} ({WARMUP_STEPS} go untimed), got {args.updates}")
    if args.segment_seconds <= 0 or args.bare_seconds <= 0:
        parser.error("--segment-seconds and --bare-seconds must be > 0")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.floor is not None and not Path(args.floor).is_file():
        parser.error(f"--floor {args.floor}: no such config file")
    if args.arithmetic and args.config is None and args.agent == "ppo":
        parser.error("--arithmetic times the replay agents' update (--agent dqn, pirl or sac, or --config)")
    if args.config is not None and not args.arithmetic:
        parser.error("--config goes with --arithmetic (a fit's configs are --agent's)")
    for config in args.config or []:
        if not Path(config).is_file():
            parser.error(f"--config {config}: no such config file")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


if __name__ == "__main__":
    args = parse_args()
    out = Path(args.out)
    if args.floor is not None:
        result = floor(args.floor, args.threads, args.rounds, args.bare_seconds)
        path = written(result, out / f"loop_floor_{Path(args.floor).stem}.json")
        ms = result["ms_per_update"]
        print(
            f"loop floor ({result['env_id']}, {args.threads} thread(s)): per update, bare {ms['bare']:.3f} ms, the "
            f"environment's {result['frames_per_update']:g} frame(s) {ms['environment']:.3f} ms, the acting policy "
            f"{ms['acting']:.3f} ms (medians of {args.rounds} alternating slices): floor {result['floor']:.2f}x the "
            f"bare update (range {result['floor_range'][0]:.2f}-{result['floor_range'][1]:.2f}); in rounds "
            f"({result['cycle']['batch_steps']} batch step(s), then {result['cycle']['updates']} update(s)) "
            f"{ms['in_rounds']:.3f} ms an update: {result['floor_in_rounds']:.2f}x (range "
            f"{result['floor_in_rounds_range'][0]:.2f}-{result['floor_in_rounds_range'][1]:.2f}); with the agent's "
            f"own update step (compile {result['compile']}, {result['update']:.2f}x the bare update alone) in rounds: "
            f"{result['floor_in_rounds_update']:.2f}x (range {result['floor_in_rounds_update_range'][0]:.2f}-"
            f"{result['floor_in_rounds_update_range'][1]:.2f}) -> {path}"
        )
        raise SystemExit(0)
    if args.arithmetic:
        label = args.agent if args.config is None else "+".join(Path(config).stem for config in args.config)
        configs = [str(ROOT / path) for path in CONFIGS[args.agent]] if args.config is None else args.config
        result = arithmetic(configs, label, args.compile, args.threads, args.rounds, args.bare_seconds)
        path = written(result, out / f"update_arithmetic_{label}_compile-{args.compile}.json")
        ms = result["ms_per_update"]
        print(
            f"update arithmetic ({label}, compile {args.compile}, {args.threads} thread(s)): the agent's update "
            f"step {ms['update']:.3f} ms vs bare {ms['bare']:.3f} ms (medians of {args.rounds} alternating slices): "
            f"ratio {result['ratio']:.2f} (range {result['ratio_range'][0]:.2f}-{result['ratio_range'][1]:.2f}) "
            f"-> {path}"
        )
        raise SystemExit(0)
    configs = [str(ROOT / path) for path in CONFIGS[args.agent]]
    name = f"update_cost_{args.agent}"
    seconds = args.segment_seconds, args.bare_seconds
    result = run(configs, name, args.compile, args.updates, args.threads, *seconds, out, args.fit)
    result["agent"] = args.agent
    path = written(result, out / f"update_cost_{args.agent}_compile-{args.compile}.json")
    fit, bare = result["fit"], result["bare_ms_per_update"]
    print(
        f"update cost ({args.agent}, compile {args.compile}, {args.threads} thread(s)): fit {fit['ms_per_update']:.3f} "
        f"ms/update ({fit['frames_per_s']:,.0f} frames/s, {fit['updates_per_s']:,.1f} updates/s) vs bare "
        f"{bare['median']:.3f} ms (median of {len(result['segments'])} slices, {bare['min']:.3f}-{bare['max']:.3f}): "
        f"ratio {result['ratio']:.2f} (median of the segments' ratios, range {result['ratio_range'][0]:.2f}-"
        f"{result['ratio_range'][1]:.2f}) -> {path}"
    )

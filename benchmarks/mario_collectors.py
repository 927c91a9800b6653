"""Mario collection speed: the raw emulator against the collector workers feeding a learner that trains.

    python benchmarks/mario_collectors.py --workers 1 2 --seconds 150

For each worker count W, in one run:

- ``raw``: W processes step the bare emulator at once (gym-super-mario-bros' own ``step`` with random buttons, one
  thread each, resetting when an episode ends) for ``--seconds / 3``: emulator frames per second, all processes
  together. What W collector workers could do at most on this machine. Measured before ``alone`` and again after
  ``fit``: the machine's speed drifts by several per cent within minutes, so the ratios below are against the mean
  of the two, which brackets the runs they compare.
- ``alone``: the config's W collector workers feeding the replay buffer for ``--seconds / 2`` with no learner (this
  process takes their batches and stores them, as the training process's feeder does): experiences per second and
  training episodes ended. What the workers collect when nothing else runs beside them; against ``fit`` below, what
  the learner costs them.
- ``fit``: ``python -m app fit --config configs/mario_ddqn.yaml`` in its own process, with
  ``--data.init_args.collection.workers W`` (``--envs-per-worker`` emulators each, default the config's: together
  ``--data.init_args.num_envs``) for ``--seconds`` of wall time, the learner training all along once the warm-up
  frames are in, with the throughput report: experiences (agent steps, 6 emulator frames each) per second and
  updates per second in its steady state (after the first update: the evaluation environments' start and the
  warm-up are left out). The learner updates on batches of
  ``--batch-size`` without accumulation, so that its updates are frequent enough to frame that window (the shipped
  4 × 512 takes seconds per update on this CPU: docs/results/mario.md, "The update at the reference's setting on
  this CPU"); it runs at a lower priority than the workers either way.

The figure the issue asks for is ``collection / raw``: the emulator frames the workers turned into experiences per
second while the learner trained, against the raw speed of W processes. The shipped config's training episodes start
where the stage does (its evaluation episodes start after 0-8 no-op steps); where training episodes have no-op starts
too (``noop_max`` of the environment), those run on the emulator but are not experiences: ``alone`` counts the
episodes, and ``noop_share`` is the expected no-op frames against all the emulator frames the workers ran. Writes a
JSON and a Markdown table beside ``--out``.

ε: the workers draw which rows explore before they act and run the Q-network on the greedy rows only, so acting
costs in proportion to 1 − ε. By default ε follows the config's schedule from 1: ``alone`` stays at 1, and a short
``fit`` stays near it, early in the 500k annealing frames, which no run of an hour on this CPU gets past
(docs/results/mario.md, "Learning in under an hour on this CPU"). ``--eps 0.05`` holds it at the reference's final
value, where the network runs for nearly every row.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import random
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def raw_emulator(seconds: float, seed: int, results: mp.Queue) -> None:
    """One process stepping the bare emulator for ``seconds``: puts its emulator frames per second."""
    import torch

    torch.set_num_threads(1)
    from envs.mario.nes_compat import ACTION_BUTTONS, MarioEmulator

    emulator, rng = MarioEmulator(1, 1), random.Random(seed)
    emulator.reset()
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, done, _ = emulator.step(ACTION_BUTTONS[rng.randrange(len(ACTION_BUTTONS))])
        frames += 1
        if done:
            emulator.reset()
    results.put(frames / (time.perf_counter() - start))


def raw_speed(processes: int, seconds: float) -> float:
    """Emulator frames per second of ``processes`` bare emulators stepping at once."""
    context = mp.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=raw_emulator, args=(seconds, seed, results)) for seed in range(processes)]
    for worker in workers:
        worker.start()
    speeds = [results.get(timeout=seconds + 120) for _ in workers]
    for worker in workers:
        worker.join()
    return sum(speeds)


def mario_config_envs_per_worker() -> int:
    """Environments per worker in the shipped config."""
    import yaml

    data = yaml.safe_load((ROOT / "configs/mario_ddqn.yaml").read_text())["data"]["init_args"]
    return data["num_envs"] // data["collection"]["init_args"]["workers"]


def config_overrides(workers: int, envs_per_worker: int | None, eps: float | None) -> list[str]:
    """The command-line options that set what ``--workers``, ``--envs-per-worker`` and ``--eps`` ask for."""
    overrides = ["--data.init_args.collection.workers", str(workers)]
    # The config's environments per worker (num_envs is all the workers' environments together).
    per_worker = envs_per_worker if envs_per_worker is not None else mario_config_envs_per_worker()
    overrides += ["--data.init_args.num_envs", str(workers * per_worker)]
    if eps is not None:
        exploration = "--model.init_args.exploration"
        overrides += [f"{exploration}.eps_start", str(eps), f"{exploration}.eps_end", str(eps)]
    return overrides


def collection_alone(workers: int, envs_per_worker: int | None, eps: float | None, seconds: float) -> dict:
    """The shipped config's ``workers`` collector workers feeding the replay buffer for ``seconds`` with no learner."""
    import torch

    from app.cli import build

    torch.set_num_threads(1)
    model, data = build([str(ROOT / "configs/mario_ddqn.yaml")], config_overrides(workers, envs_per_worker, eps))
    data.setup("fit")
    data.connect(model.policy(), model.postprocess, model.batch_keys(), model.store_transform())  # as DQN.setup does
    data._build_collector()
    try:
        data.collection.delivered(wait=True)  # the workers' start-up, outside the window
        experiences = episodes = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            batch, _ = data.collection.delivered(wait=True)
            data.store(batch)
            experiences += batch.numel()
            episodes += int(batch.get(("next", "done")).sum())
        elapsed = time.perf_counter() - start
    finally:
        data.teardown("fit")
    options = data.declared.options  # 0 ... noop_max no-op steps per episode start, uniformly: noop_max / 2 on average
    noop_frames = episodes * options["noop_max"] / 2 * options["frame_skip"]
    return {
        "experiences_per_s": experiences / elapsed,
        "episodes": episodes,
        "noop_share": noop_frames / (noop_frames + options["frame_skip"] * experiences),
    }


def fit_speed(
    workers: int, seconds: float, batch_size: int, envs_per_worker: int | None, eps: float | None, out: Path
) -> dict:
    """The shipped config with ``workers`` collector workers for ``seconds``: its throughput report's figures."""
    run = out / f"workers{workers}"
    clock = time.strftime("%H:%M:%S", time.gmtime(seconds))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "fit",
            "--config",
            str(ROOT / "configs/mario_ddqn.yaml"),
            *config_overrides(workers, envs_per_worker, eps),
            "--data.init_args.batch_size",
            str(batch_size),
            "--model.init_args.optimizer.accumulate_grad_batches",
            "1",
            "--trainer.max_time",
            f"00:{clock}",
            "--trainer.logger.init_args.save_dir",
            str(run),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.callbacks.init_args.skip_first_steps",
            "1",
            "--trainer.callbacks.init_args.bare_update_seconds",
            "0",
        ],
        cwd=ROOT,
        check=True,
    )
    report = json.loads(max(run.rglob("throughput.json"), key=lambda path: path.stat().st_mtime).read_text())
    figures = report["steady_state"] or report["this_process"]
    return {"experiences_per_s": figures["frames_per_s"], "updates_per_s": figures["updates_per_s"], **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=150.0, help="wall time of each fit")
    parser.add_argument("--batch-size", type=int, default=32, help="the learner's batch (no accumulation)")
    parser.add_argument("--envs-per-worker", type=int, help="emulators per worker (default: the config's)")
    parser.add_argument(
        "--eps",
        type=float,
        help="hold ε at this value for the whole run (default: the config's schedule, which starts at 1: the "
        "workers act greedily in few rows, so the Q-network runs for few of them; 0.05 is the reference's final ε)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs/bench_mario_collectors")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workers in args.workers:
        raw_before = raw_speed(workers, args.seconds / 3)
        alone = collection_alone(workers, args.envs_per_worker, args.eps, args.seconds / 2)
        fit = fit_speed(workers, args.seconds, args.batch_size, args.envs_per_worker, args.eps, args.out)
        raw_after = raw_speed(workers, args.seconds / 3)
        raw = (raw_before + raw_after) / 2
        collected = 6 * fit["experiences_per_s"]
        rows.append(
            {
                "workers": workers,
                "envs_per_worker": args.envs_per_worker or "config",
                "eps": args.eps if args.eps is not None else "config",
                "raw_before_frames_per_s": raw_before,
                "raw_after_frames_per_s": raw_after,
                "raw_emulator_frames_per_s": raw,
                "alone_experiences_per_s": alone["experiences_per_s"],
                "alone_vs_raw": 6 * alone["experiences_per_s"] / raw,
                "noop_share": alone["noop_share"],
                "experiences_per_s": fit["experiences_per_s"],
                "collected_emulator_frames_per_s": collected,
                "collection_vs_raw": collected / raw,
                "updates_per_s": fit["updates_per_s"],
            }
        )
        print(rows[-1], flush=True)
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.platform()}, {mp.cpu_count()} CPUs",
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    (args.out / "mario_collectors.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| workers | raw emulator frames/s (before, after) | experiences/s, no learner | alone / raw | no-op share | "
        "experiences/s, learning | as emulator frames/s | collection / raw | updates/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['workers']} | {row['raw_emulator_frames_per_s']:,.0f} ({row['raw_before_frames_per_s']:,.0f}, "
            f"{row['raw_after_frames_per_s']:,.0f}) | {row['alone_experiences_per_s']:,.1f} | "
            f"{row['alone_vs_raw']:.3f} | {row['noop_share']:.3f} | {row['experiences_per_s']:,.1f} | "
            f"{row['collected_emulator_frames_per_s']:,.0f} | {row['collection_vs_raw']:.3f} | "
            f"{row['updates_per_s']:.3f} |"
        )
    (args.out / "mario_collectors.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

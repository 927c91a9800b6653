"""What an update costs inside the whole training loop, against the bare arithmetic of that update.

    python benchmarks/update_cost.py --agent dqn                  # the reference's DQN setting, eager update
    python benchmarks/update_cost.py --agent dqn --compile true   # the same with the compiled update
    python benchmarks/update_cost.py --agent ppo --compile true   # Snake-PPO, minibatch 2,048
    python benchmarks/update_cost.py --agent pirl --compile true  # PIRL on the vehicle, batch 1,024
    python benchmarks/update_cost.py --agent sac --compile true   # racing SAC, batch 256
    python benchmarks/update_cost.py --agent dqn --compile true --arithmetic  # the update step alone, no loop

One process measures, side by side:

- **bare**: the same network, batch size and loss maths, backward, gradient clip and fused Adam step in a plain
  eager PyTorch loop, on batches drawn from the real environment before timing — no framework, no collection;
- **fit**: ``python -m app fit`` with the agent's config and ``configs/bench/throughput.yaml`` (collection, replay
  writes, sampling, Lightning's loop and the target update all included), its wall time per update.

The two are interleaved: after the warm-up, the fit runs in segments of about ``--segment-seconds``, and between
two segments the bare loop runs for ``--bare-seconds`` (a callback, on copies of the networks, under a forked RNG,
outside the segments' time). This machine's speed drifts within a minute by more than the overheads measured
(docs/results/snake.md, "The update against its bare arithmetic"), so a bare time taken before or after the fit does not
describe the fit; the ratio is each segment's time per update over the bare slice right after it, and the figure
reported is the median of those ratios. Each segment's time per update is also split into the data module's phases
(collect, buffer_write, sample, update; other is the rest), without the bare slices.
The DQN runs at the reference's setting (``configs/bench/dqn_reference_ratio.yaml``: batch 128, one update per 4 frames,
1 thread). Writes ``update_cost_<agent>_compile-<c>.json`` and prints one summary line.

``--arithmetic`` runs no fit: it alternates the bare update with the agent's own update step taken out of the loop
(its compiled loss, backward, fused Adam and soft target update;
:func:`callbacks.bare_updates.framework_free_update`), to tell what the update step costs from what the loop around it
costs. Writes ``update_arithmetic_<agent>_compile-<c>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli import build, main  # noqa: E402
from callbacks.bare_updates import bare_update, framework_free_update  # noqa: E402

CONFIGS = {
    "dqn": ["configs/snake_dqn.yaml", "configs/bench/throughput.yaml", "configs/bench/dqn_reference_ratio.yaml"],
    "ppo": ["configs/snake_ppo.yaml", "configs/bench/throughput.yaml"],
    "pirl": ["configs/pirl_vehicle.yaml", "configs/bench/throughput.yaml"],
    "sac": ["configs/racing_sac.yaml", "configs/bench/throughput.yaml", "configs/bench/sac_update.yaml"],
}
WARMUP_STEPS = 200  # updates left out: compilation, first allocations


class InterleavedBare(Callback):
    """Alternates fit segments of about ``segment_seconds`` with ``bare_seconds`` of the bare update, after
    ``skip_first_steps`` updates of warm-up (compilation, buffer warm-up)."""

    def __init__(self, step: Callable[[int], Any], segment_seconds: float, bare_seconds: float, skip_first_steps: int):
        self.step, self.segment_seconds, self.bare_seconds = step, segment_seconds, bare_seconds
        self.skip_first_steps = skip_first_steps
        self.segments: list[dict[str, float]] = []  # one per fit segment, with the bare slice that followed it
        self._start: tuple[float, int, int, dict[str, float]] | None = None  # time, updates, frames, phase totals
        self._bare_calls = 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step < self.skip_first_steps:
            return
        now, frames, timer = time.perf_counter(), trainer.datamodule.frames, trainer.datamodule.timer
        if self._start is None:
            self._start = (now, trainer.global_step, frames, dict(timer.totals))
            return
        began, updates_before, frames_before, phases_before = self._start
        if now - began < self.segment_seconds:
            return
        # A round being prepared in the background (prefetch) finishes now, inside this segment's time (the wait the
        # loop would otherwise pay after the bare slice), and runs beside neither the bare slice nor the next segment.
        trainer.datamodule.settle()
        now = time.perf_counter()
        updates = trainer.global_step - updates_before
        fit_ms = 1e3 * (now - began) / updates
        # The data module's phases over the segment (the throughput report's figures count the bare slices in
        # "other"; these do not).
        phases = {name: 1e3 * (total - phases_before.get(name, 0.0)) / updates for name, total in timer.totals.items()}
        phases["other"] = fit_ms - sum(phases.values())
        bare_ms = self._bare_slice()
        self.segments.append(
            {
                "updates": updates,
                "frames": frames - frames_before,
                "seconds": now - began,
                "fit_ms": fit_ms,
                "phases_ms": phases,
                "bare_ms": bare_ms,
                "ratio": fit_ms / bare_ms,
            }
        )
        self._start = (time.perf_counter(), trainer.global_step, trainer.datamodule.frames, dict(timer.totals))

    def _bare_slice(self) -> float:
        with torch.random.fork_rng(devices=[]):  # PIRL's bare update draws collocation points
            if self._bare_calls == 0:
                for i in range(20):  # first allocations
                    self.step(i)
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < self.bare_seconds:
                self.step(self._bare_calls + calls)
                calls += 1
            self._bare_calls += calls
            return 1e3 * (time.perf_counter() - start) / calls


def run(
    agent: str,
    compile_: str,
    updates: int,
    threads: int,
    segment: float,
    bare: float,
    out: Path,
    extra: list[str] = (),
) -> dict:
    configs = [str(ROOT / path) for path in CONFIGS[agent]]
    overrides = [
        *("--model.init_args.compile", compile_),
        *("--threads", str(threads)),
        *("--trainer.max_steps", str(updates)),
        *("--trainer.logger.init_args.save_dir", str(out)),
        *("--trainer.logger.init_args.name", f"update_cost_{agent}"),
        *("--trainer.enable_progress_bar", "false"),
        # The slices are this benchmark's own (segments of --segment-seconds), not the report's as well.
        *("--trainer.callbacks.init_args.bare_update_seconds", "0"),
        *extra,
    ]
    model, data = build(configs, overrides)
    torch.set_num_threads(threads)
    interleaved = InterleavedBare(bare_update(model, data), segment, bare, skip_first_steps=WARMUP_STEPS)
    main(["fit", *(arg for path in configs for arg in ("--config", path)), *overrides], extra_callbacks=[interleaved])
    segments = interleaved.segments
    if len(segments) < 3:
        raise SystemExit(f"only {len(segments)} fit segments were timed: raise --updates")
    seconds = sum(s["seconds"] for s in segments)
    timed_updates = sum(s["updates"] for s in segments)
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/update_cost.py", *sys.argv[1:]],
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch_threads": threads,
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        },
        "torch": torch.__version__,
        "agent": agent,
        "configs": CONFIGS[agent],
        "compile": compile_,
        "batch_size": getattr(data, "batch_size", None) or data.minibatch_size,
        "fit": {
            "updates_timed": timed_updates,
            "ms_per_update": 1e3 * seconds / timed_updates,
            "frames_per_s": sum(s["frames"] for s in segments) / seconds,
            "updates_per_s": timed_updates / seconds,
            "phases_ms_per_update": {
                name: sum(s["phases_ms"].get(name, 0.0) * s["updates"] for s in segments) / timed_updates
                for name in segments[-1]["phases_ms"]
            },
        },
        "bare_ms_per_update": {
            "median": statistics.median(s["bare_ms"] for s in segments),
            "min": min(s["bare_ms"] for s in segments),
            "max": max(s["bare_ms"] for s in segments),
        },
        "ratio": statistics.median(s["ratio"] for s in segments),
        "ratio_range": [min(s["ratio"] for s in segments), max(s["ratio"] for s in segments)],
        "segments": segments,
    }


def arithmetic(agent: str, compile_: str, threads: int, rounds: int, seconds: float) -> dict:
    """The agent's own update outside any loop (:func:`callbacks.bare_updates.framework_free_update`) against the bare
    update, alternating ``rounds`` times ``seconds`` of each: what the update step costs before the loop around it."""
    model, data = build([str(ROOT / path) for path in CONFIGS[agent]], ["--model.init_args.compile", compile_])
    torch.set_num_threads(threads)
    steps = {"bare": bare_update(model, data), "update": framework_free_update(model, data)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    with torch.random.fork_rng(devices=[]):  # PIRL draws collocation points
        for step in steps.values():
            for i in range(50):  # compilation, first allocations
                step(i)
        for _ in range(rounds):
            for name, step in steps.items():
                calls, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    step(calls)
                    calls += 1
                times[name].append(1e3 * (time.perf_counter() - start) / calls)
    ratios = [update / bare for update, bare in zip(times["update"], times["bare"], strict=True)]
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/update_cost.py", *sys.argv[1:]],
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": threads},
        "torch": torch.__version__,
        "agent": agent,
        "compile": compile_,
        "ms_per_update": {name: statistics.median(values) for name, values in times.items()},
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "rounds": times,
    }


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
    parser.add_argument("--rounds", type=int, default=7, help="with --arithmetic: alternations of the two loops")
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
    if args.arithmetic and args.agent == "ppo":
        parser.error("--arithmetic times the replay agents' update (--agent dqn, pirl or sac)")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


if __name__ == "__main__":
    args = parse_args()
    out = Path(args.out)
    if args.arithmetic:
        result = arithmetic(args.agent, args.compile, args.threads, args.rounds, args.bare_seconds)
        path = out / f"update_arithmetic_{args.agent}_compile-{args.compile}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        ms = result["ms_per_update"]
        print(
            f"update arithmetic ({args.agent}, compile {args.compile}, {args.threads} thread(s)): the agent's update "
            f"step {ms['update']:.3f} ms vs bare {ms['bare']:.3f} ms (medians of {args.rounds} alternating slices): "
            f"ratio {result['ratio']:.2f} (range {result['ratio_range'][0]:.2f}-{result['ratio_range'][1]:.2f}) "
            f"-> {path}"
        )
        raise SystemExit(0)
    result = run(
        args.agent, args.compile, args.updates, args.threads, args.segment_seconds, args.bare_seconds, out, args.fit
    )
    path = out / f"update_cost_{args.agent}_compile-{args.compile}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    fit, bare = result["fit"], result["bare_ms_per_update"]
    print(
        f"update cost ({args.agent}, compile {args.compile}, {args.threads} thread(s)): fit {fit['ms_per_update']:.3f} "
        f"ms/update ({fit['frames_per_s']:,.0f} frames/s, {fit['updates_per_s']:,.1f} updates/s) vs bare "
        f"{bare['median']:.3f} ms (median of {len(result['segments'])} slices, {bare['min']:.3f}-{bare['max']:.3f}): "
        f"ratio {result['ratio']:.2f} (median of the segments' ratios, range {result['ratio_range'][0]:.2f}-"
        f"{result['ratio_range'][1]:.2f}) -> {path}"
    )

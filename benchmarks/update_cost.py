"""What an update costs inside the whole training loop, against the bare arithmetic of that update.

    python benchmarks/update_cost.py --agent dqn                  # the seed's DQN setting, eager update
    python benchmarks/update_cost.py --agent dqn --compile true   # the same with the compiled update
    python benchmarks/update_cost.py --agent ppo --compile true   # Snake-PPO, minibatch 2,048
    python benchmarks/update_cost.py --agent pirl --compile true  # PIRL on the vehicle, batch 1,024

One process measures, side by side:

- **bare**: the same network, batch size and loss maths, backward, gradient clip and fused Adam step in a plain
  eager PyTorch loop, on batches drawn from the real environment before timing — no framework, no collection;
- **fit**: ``python -m app fit`` with the agent's config and ``configs/bench/throughput.yaml`` (collection, replay
  writes, sampling, Lightning's loop and the target update all included), its steady-state wall time per update
  from the throughput report.

The bare loop is timed before and after the fit (the machine's speed drifts), and the ratio is fit / mean(bare).
The DQN runs at the seed's setting (``configs/bench/dqn_seed_ratio.yaml``: batch 128, one update per 4 frames, 1
thread). Writes ``update_cost_<agent>.json`` and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli import build, main  # noqa: E402
from modules.bare import bare_update, time_bare  # noqa: E402

CONFIGS = {
    "dqn": ["configs/snake_dqn.yaml", "configs/bench/throughput.yaml", "configs/bench/dqn_seed_ratio.yaml"],
    "ppo": ["configs/snake_ppo.yaml", "configs/bench/throughput.yaml"],
    "pirl": ["configs/pirl_vehicle.yaml", "configs/bench/throughput.yaml"],
}


def run(agent: str, compile_: str, updates: int, threads: int, seconds: float, out: Path) -> dict:
    configs = [str(ROOT / path) for path in CONFIGS[agent]]
    overrides = [
        *("--model.init_args.compile", compile_),
        *("--threads", str(threads)),
        *("--trainer.max_steps", str(updates)),
        *("--trainer.logger.init_args.save_dir", str(out)),
        *("--trainer.logger.init_args.name", f"update_cost_{agent}"),
        *("--trainer.enable_progress_bar", "false"),
    ]
    model, data = build(configs, overrides)
    torch.set_num_threads(threads)
    bare_step = bare_update(model, data)
    bare_before = time_bare(bare_step, seconds)
    cli = main(["fit", *(arg for path in configs for arg in ("--config", path)), *overrides])
    bare_after = time_bare(bare_step, seconds)
    report = next(cb.report for cb in cli.trainer.callbacks if type(cb).__name__ == "ThroughputReport")
    steady = report["steady_state"] or report["this_process"]
    fit_per_update = steady["wall_s"] / steady["updates"]
    bare = (bare_before + bare_after) / 2
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
            "updates_timed": steady["updates"],
            "ms_per_update": 1e3 * fit_per_update,
            "frames_per_s": steady["frames_per_s"],
            "updates_per_s": steady["updates_per_s"],
            "fraction": steady["fraction"],
        },
        "bare_ms_per_update": {"before": 1e3 * bare_before, "after": 1e3 * bare_after, "mean": 1e3 * bare},
        "ratio": fit_per_update / bare,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", choices=sorted(CONFIGS), default="dqn")
    parser.add_argument("--compile", default="false", help="the model's compile option: false, true or a mode")
    parser.add_argument("--updates", type=int, default=4000, help="updates of the fit (the first 200 are warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, for both loops")
    parser.add_argument("--bare-seconds", type=float, default=5.0, help="time spent on each bare measurement")
    parser.add_argument("--out", default="runs/bench", help="folder for the fit's run and the JSON result")
    args = parser.parse_args(argv)
    if args.updates <= 400:
        parser.error(f"--updates must be > 400 (200 warm-up steps are left out of the figure), got {args.updates}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    return args


if __name__ == "__main__":
    args = parse_args()
    out = Path(args.out)
    result = run(args.agent, args.compile, args.updates, args.threads, args.bare_seconds, out)
    path = out / f"update_cost_{args.agent}_compile-{args.compile}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    fit, bare = result["fit"], result["bare_ms_per_update"]
    print(
        f"update cost ({args.agent}, compile {args.compile}, {args.threads} thread(s)): fit {fit['ms_per_update']:.3f} "
        f"ms/update ({fit['frames_per_s']:,.0f} frames/s, {fit['updates_per_s']:,.1f} updates/s) vs bare "
        f"{bare['mean']:.3f} ms (before {bare['before']:.3f}, after {bare['after']:.3f}): ratio {result['ratio']:.2f}"
        f" -> {path}"
    )

"""MettaGrid throughput in one run: the raw engines, the TorchRL wrapper, three ways to collect, and training.

    python benchmarks/metta_throughput.py                      # about 6 minutes on 2 cores
    python benchmarks/metta_throughput.py --fit-seconds 300

Everything runs in this process, one after the other, so the figures are side by side (1 torch thread in every
process; this machine has 2 cores):

1. ``raw`` ``MettaGrid.step`` and the wrapper's ``step_and_maybe_reset`` on the same engines, random actions
   (``benchmarks/metta_env_speed.py``): what the wrapper adds to the C++ step.
2. Collection with the untrained policy of ``configs/metta_ppo.yaml`` (tokens → grid → CNN → LSTM, 192 agents per
   step), ``--collect-batches`` rollouts of its size after one warm-up rollout:
   - ``in-process``: one ``Collector``, the environments stepped in this process;
   - ``ParallelEnv``: the same collector over the environments split across ``--workers`` processes (the shipped
     ``env_workers`` option); the policy runs here on the whole batch;
   - ``MultiSyncCollector``: ``--workers`` processes, each with its environments and its own copy of the policy.
3. ``fit``: ``configs/metta_ppo.yaml`` for ``--fit-seconds`` with its throughput report (collection + learning).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from metta_env_speed import main as env_speed  # noqa: E402
from torchrl.collectors import Collector, MultiSyncCollector  # noqa: E402
from torchrl.envs import TransformedEnv  # noqa: E402

from app.cli import build  # noqa: E402
from app.cli import main as app_main  # noqa: E402
from datamodules.envs.mettagrid import MettaGridEnv  # noqa: E402

CONFIG = "configs/metta_ppo.yaml"


def worker_env(num_envs: int, seed: int, options: dict, transform) -> TransformedEnv:
    """One MultiSyncCollector worker's environments, with the policy's env transform (a top-level function, so the
    worker process can rebuild it)."""
    return TransformedEnv(MettaGridEnv(num_envs=num_envs, seed=seed, **options), transform.clone())


def time_collector(collector, batches: int) -> float:
    """Agent steps per second over ``batches`` rollouts, after one untimed (worker start, first reset)."""
    iterator = iter(collector)
    next(iterator)
    start, frames = time.perf_counter(), 0
    for _ in range(batches):
        frames += next(iterator).numel()
    seconds = time.perf_counter() - start
    collector.shutdown()
    return frames / seconds


def collection(workers: int, batches: int) -> dict[str, float]:
    model, data = build([CONFIG], ["--data.init_args.env_workers", "0"])
    data.use_env_transform(model.env_transform())
    policy, frames = model.policy(), data.num_envs * data.agents_per_env * data.collect_steps
    options = data._env_options
    rates = {}
    with torch.no_grad():
        in_process = Collector(data.make_env(data.num_envs, 0), policy, frames_per_batch=frames, total_frames=-1)
        rates["in-process"] = time_collector(in_process, batches)
        parallel = Collector(data.make_env(data.num_envs, 0, workers), policy, frames_per_batch=frames, total_frames=-1)
        rates[f"ParallelEnv ×{workers}"] = time_collector(parallel, batches)
        per_worker = data.num_envs // workers
        factories = [
            lambda w=w: worker_env(per_worker, w * per_worker, options, model.env_transform()) for w in range(workers)
        ]
        multi = MultiSyncCollector(
            factories, policy, frames_per_batch=frames, total_frames=-1, num_threads=1, num_sub_threads=1
        )
        rates[f"MultiSyncCollector ×{workers}"] = time_collector(multi, batches)
    return rates


def fit(seconds: int) -> dict:
    with tempfile.TemporaryDirectory() as runs:
        app_main(
            [
                "fit",
                "--config",
                CONFIG,
                "--trainer.max_time",
                f"00:00:{seconds // 60:02d}:{seconds % 60:02d}",
                "--trainer.logger.init_args.save_dir",
                runs,
                "--trainer.enable_progress_bar",
                "false",
            ]
        )
        return json.loads(next(Path(runs).glob("*/version_0/throughput.json")).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="processes for the ParallelEnv and multi-collector")
    parser.add_argument("--collect-batches", type=int, default=8, help="timed rollouts per collection mode")
    parser.add_argument("--fit-seconds", type=int, default=180, help="length of the training run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")

    print("## 1. The engines and the wrapper (8 environments × 24 agents, random actions)\n")
    env = env_speed(["--num-envs", "8", "--steps", "1000", "--repeats", "3", "--threads", "1"])
    print("\n## 2. Collection with the untrained policy (8 environments × 24 agents × 64 steps per rollout)\n")
    rates = collection(args.workers, args.collect_batches)
    print("| collection | agent steps/s |\n|---|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.0f} |")
    print(f"\n## 3. Training: `python -m app fit --config {CONFIG}` for {args.fit_seconds} s\n")
    report = fit(args.fit_seconds)
    steady = report["steady_state"]
    print("| | value |\n|---|---:|")
    print(f"| agent steps/s end to end (steady state) | {steady['frames_per_s']:,.0f} |")
    print(f"| updates/s | {steady['updates_per_s']:.2f} |")
    for phase, share in steady["fraction"].items():
        print(f"| {phase} | {share:.1%} of wall time |")
    print(
        f"\n{stamp} · `python benchmarks/metta_throughput.py` · 1 torch thread per process · torch {torch.__version__}"
        f" · {platform.machine()} · raw step {env['raw']['agent_steps_per_s']:,.0f} agent steps/s, wrapper "
        f"{env['step']['agent_steps_per_s']:,.0f} ({env['step']['overhead']:+.1%})"
    )


if __name__ == "__main__":
    main()

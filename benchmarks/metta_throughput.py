"""MettaGrid throughput in one run: the raw engines, the TorchRL wrapper, three ways to collect, and training.

    python benchmarks/metta_throughput.py                      # mostly three fits of --fit-seconds each
    python benchmarks/metta_throughput.py --fit-seconds 300

Everything runs one after the other, so the figures are side by side (1 torch thread in every process; this machine
has 2 cores):

1. ``raw`` ``MettaGrid.step`` and the wrapper's ``step_and_maybe_reset`` on the same engines, random actions
   (``benchmarks/metta_env_speed.py``): what the wrapper adds to the C++ step.
2. Collection with the untrained policy of ``configs/metta_ppo.yaml`` (tokens → grid → CNN → LSTM, 192 agents per
   step), ``--collect-batches`` rollouts of its size after one warm-up rollout, through the data module's own
   collector (``RolloutDataModule.collect``) in its three modes, each a ``collection`` strategy:
   - ``in-process`` (``InProcess``): the environments and the policy in this process;
   - ``env_workers`` (``EnvWorkers``): the environments split across ``--workers`` processes (TorchRL's
     ``ParallelEnv``); the policy runs here on the whole batch;
   - ``collector_workers`` (``CollectorWorkers``): ``--workers`` processes, each with its environments and its own
     copy of the policy (TorchRL's ``MultiSyncCollector``).
3. ``fit``: ``configs/metta_ppo.yaml`` for ``--fit-seconds`` in each of the three modes, each in its own process
   (``python -m app fit``), with its throughput report (collection + learning).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from metta_env_speed import main as env_speed  # noqa: E402

from app.cli import build  # noqa: E402

CONFIG = "configs/metta_ppo.yaml"  # relative to the checkout, as the report shows it; read from ROOT / CONFIG
MODES = ("in-process", "env_workers", "collector_workers")


#: Each mode's collection strategy (datamodules/collection.py).
STRATEGIES = {"in-process": "InProcess", "env_workers": "EnvWorkers", "collector_workers": "CollectorWorkers"}


def mode_flags(mode: str, workers: int) -> list[str]:
    """The mode's collection strategy, set explicitly: the shipped config's own (CollectorWorkers) must not leak into
    the other modes."""
    flags = ["--data.init_args.collection", STRATEGIES[mode]]
    return flags if mode == "in-process" else [*flags, "--data.init_args.collection.workers", str(workers)]


def collection(
    mode: str, workers: int, batches: int, configs: tuple[str, ...] = (str(ROOT / CONFIG),), flags: tuple = ()
) -> float:
    """Agent steps per second of the data module's ``collect`` over ``batches`` rollouts, after one untimed (worker
    start, first reset), with the untrained policy on the data module's device (``--data.init_args.device``)."""
    model, data = build(list(configs), [*flags, *mode_flags(mode, workers)])
    data.setup("fit")
    model.to(data.device)
    data.use_env_transform(model.env_transform())
    data.connect(model.policy())
    data._build_collector()
    try:
        with torch.no_grad():
            data.collect()
            start, frames = time.perf_counter(), 0
            for _ in range(batches):
                frames += data.collect().numel()
            if data.device.type == "cuda":
                torch.cuda.synchronize(data.device)
            return frames / (time.perf_counter() - start)
    finally:
        data.teardown("fit")


def fit(mode: str, workers: int, seconds: int) -> dict:
    with tempfile.TemporaryDirectory() as runs:
        command = [sys.executable, "-m", "app", "fit", "--config", str(ROOT / CONFIG), *mode_flags(mode, workers)]
        command += ["--trainer.max_time", f"00:00:{seconds // 60:02d}:{seconds % 60:02d}"]
        command += ["--trainer.logger.init_args.save_dir", runs, "--trainer.enable_progress_bar", "false"]
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(next(Path(runs).glob("*/version_0/throughput.json")).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of EnvWorkers and CollectorWorkers")
    parser.add_argument("--collect-batches", type=int, default=8, help="timed rollouts per collection mode")
    parser.add_argument("--fit-seconds", type=int, default=180, help="length of the training run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")

    print("## 1. The engines and the wrapper (8 environments × 24 agents, random actions)\n")
    env = env_speed(["--num-envs", "8", "--steps", "1000", "--repeats", "3", "--threads", "1"])
    print("\n## 2. Collection with the untrained policy (8 environments × 24 agents × 64 steps per rollout)\n")
    print("| collection | agent steps/s |\n|---|---:|")
    for mode in MODES:
        name = mode if mode == "in-process" else f"{mode} {args.workers}"
        print(f"| {name} | {collection(mode, args.workers, args.collect_batches):,.0f} |", flush=True)
    print(f"\n## 3. Training: `python -m app fit --config {CONFIG}` for {args.fit_seconds} s in each mode\n")
    reports = {mode: fit(mode, args.workers, args.fit_seconds) for mode in MODES}
    phases = sorted({phase for report in reports.values() for phase in report["steady_state"]["fraction"]})
    print("| | " + " | ".join(MODES) + " |\n|---|" + "---:|" * len(MODES))
    rows = {
        "agent steps/s end to end (steady state)": lambda s: f"{s['frames_per_s']:,.0f}",
        "updates/s": lambda s: f"{s['updates_per_s']:.2f}",
        **{f"{phase}, share of wall time": (lambda s, p=phase: f"{s['fraction'].get(p, 0.0):.1%}") for phase in phases},
    }
    for name, cell in rows.items():
        print(f"| {name} | " + " | ".join(cell(reports[mode]["steady_state"]) for mode in MODES) + " |")
    print(
        f"\n{stamp} · `python benchmarks/metta_throughput.py` · 1 torch thread per process · torch {torch.__version__}"
        f" · {platform.machine()} · raw step {env['raw']['agent_steps_per_s']:,.0f} agent steps/s, wrapper "
        f"{env['step']['agent_steps_per_s']:,.0f} ({env['step']['overhead']:+.1%})"
    )


if __name__ == "__main__":
    main()

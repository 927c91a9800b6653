"""How long a run with worker processes takes to start, with the workers spawned or forked from a forkserver.

    python benchmarks/worker_start.py --repeats 3
    python benchmarks/worker_start.py --repeats 2 --args --data.init_args.collection.workers 8

Each measurement is a short fit of ``--config`` (``--args`` appended; by default ``configs/metta_ppo.yaml``, its two
collector workers, 4 updates, compilation off so that it does not blur the comparison) in a fresh process that first
chooses how workers start: ``spawn`` (each worker a new interpreter importing torch, tensordict, TorchRL and the
environment's module; TorchRL's default, kept although lightrl's strategies would replace it) or ``forkserver`` (one
server imports torch, tensordict and TorchRL once, each worker is its fork: what lightrl's worker collections choose
on Linux, ``datamodules/workers.py::use_forkserver``). The two alternate, ``--repeats`` times each, so the machine's
drift falls on both. Reported for each fit: its wall time from the process's start to its end (the imports
of the training process itself are in both) and the machine's busy CPU seconds meanwhile, read from ``/proc/stat``
(a forkserver is not waited for by the process that started it, so its share would go uncounted in the process's own
CPU time; so nothing else may run on the machine); and their medians. Writes a JSON and a Markdown table beside
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("spawn", "forkserver")
DEFAULT_ARGS = ["--trainer.max_steps", "4", "--model.init_args.compile", "false"]
MEASURED = ("wall_s", "machine_cpu_s")

CHILD = """
import multiprocessing, sys
import datamodules.collection as collection
from datamodules.workers import use_forkserver
if sys.argv[1] == "spawn":  # kept: lightrl's strategies replace spawn, which they take for TorchRL's default
    multiprocessing.set_start_method("spawn", force=True)
    collection.use_forkserver = lambda: None
else:
    use_forkserver()
from app.cli import main
main(sys.argv[2:])
"""


def busy_cpu_s() -> float:
    """The machine's busy CPU seconds so far (user, nice, system, irq, softirq), from ``/proc/stat``."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


def one_fit(method: str, config: str, extra: list[str], threads: int) -> dict:
    """A short fit in a fresh process with the workers started by ``method``: its wall seconds."""
    with tempfile.TemporaryDirectory() as folder:
        args = ["fit", "--config", str(ROOT / config), "--threads", str(threads), *DEFAULT_ARGS, *extra]
        args += ["--trainer.logger.init_args.save_dir", folder, "--trainer.enable_progress_bar", "false"]
        start, cpu = time.perf_counter(), busy_cpu_s()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, method, *args],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=False,
        )
        wall, cpu = time.perf_counter() - start, busy_cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"the {method} fit failed (exit status {done.returncode}):\n{done.stderr[-3000:]}")
    return {"method": method, "wall_s": round(wall, 2), "machine_cpu_s": round(cpu, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/metta_ppo.yaml", help="the config, relative to the checkout")
    parser.add_argument("--args", nargs=argparse.REMAINDER, default=[], help="more flags for the fit (last)")
    parser.add_argument("--repeats", type=int, default=3, help="fits per start method, alternating")
    parser.add_argument("--threads", type=int, default=1, help="the training process's intra-op threads")
    parser.add_argument("--out", default="runs/worker_start/worker_start", help="the report's path, without suffix")
    options = parser.parse_args()
    if options.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {options.repeats}")

    runs = []
    for repeat in range(options.repeats):
        for method in METHODS:
            runs.append(one_fit(method, options.config, options.args, options.threads))
            print(f"repeat {repeat + 1}/{options.repeats}: {runs[-1]}", flush=True)
    medians = {
        method: {key: statistics.median(run[key] for run in runs if run["method"] == method) for key in MEASURED}
        for method in METHODS
    }
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "config": options.config,
        "args": [*DEFAULT_ARGS, *options.args],
        "threads": options.threads,
        "runs": runs,
        "medians": medians,
    }
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    lines = [
        f"# Worker start: `{options.config}` {' '.join(report['args'])}",
        "",
        f"{report['date']}, {report['machine']}, {options.threads} thread(s) in the training process.",
        "",
        "| start method | fit wall s (median) | machine CPU s (median) | each fit's wall s | each fit's CPU s |",
        "|---|---:|---:|---|---|",
    ]
    for method in METHODS:
        mine = [run for run in runs if run["method"] == method]
        walls, cpus = (", ".join(f"{run[key]:.1f}" for run in mine) for key in MEASURED)
        middle = medians[method]
        lines.append(f"| {method} | {middle['wall_s']:.1f} | {middle['machine_cpu_s']:.1f} | {walls} | {cpus} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""``python -m app seeds``: one config over several seeds, into one folder, with the aggregate an RL result needs.

Commands::

    python -m app seeds --config configs/snake_dqn.yaml --seeds 5
    python -m app seeds --config configs/snake_ppo.yaml --seeds 5 --parallel 2 --out runs/snake_ppo_seeds
    python -m app seeds --config configs/pirl_vehicle.yaml --seeds 3 --trainer.max_steps 20000   # flags go to fit

Each seed is an ordinary ``python -m app fit`` in its own process with ``--seed_everything <seed>`` (which seeds the
environments too, unless the config sets ``data.init_args.seed``) and its run folder ``<out>/seed_<seed>/version_0``
(the config's logger pointed there). A finished seed (``seed.json`` beside its run) is reused; an interrupted one
continues from its ``last.ckpt``; so a stopped command picks up where it stopped. Then ``<out>/seeds.md``,
``seeds.json`` and ``seeds.png`` aggregate the runs' evaluations (``PeriodicEvaluation``): per seed the final and
the best evaluation, across seeds the mean, standard deviation, interquartile mean and 95 % bootstrap interval of the
final returns (:func:`datamodules.evaluation.episode_statistics`, with seeds as the samples), and the learning curve
against frames and against wall time with the seeds' 95 % band and the random policy's line.

The report also pairs each seed's final evaluation with its first, which ``PeriodicEvaluation`` plays at frame 0,
before any update: the policy the run started from, on the run's own evaluation episodes. That is what training
added, measured seed by seed (the spread between seeds cancels out of each difference): per seed the start, the
final return and their difference, across seeds the mean difference with its 95 % bootstrap interval and a sentence
saying whether that interval excludes 0. For a run from scratch the start is the untrained policy; for a config whose
model starts from an earlier stage (racing SAC's ``actor_init: racing_bc.yaml``, app/stages.py) it is that stage's
result, run at the seed's own seed, so racing's report is behaviour cloning against SAC, paired by seed.
"""

from __future__ import annotations

import csv
import json
import math
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import yaml

from app import launch
from app.errors import OneLineArgumentParser, check_config_files
from app.stages import stage_configs
from checkpoints.resume import LAST
from datamodules.evaluation import episode_statistics

MARKER = "seed.json"
RANDOM = "eval/random_return_mean"


def _composed(configs: Sequence[str]) -> dict[str, Any]:
    """The trainer and logger parts of the composed configs (later files win key by key), enough to name the run."""
    composed: dict[str, Any] = {}
    for path in configs:
        text = yaml.safe_load(Path(path).read_text()) or {}
        for key, value in text.items():
            if isinstance(value, dict) and isinstance(composed.get(key), dict):
                composed[key] = {**composed[key], **value}
            else:
                composed[key] = value
    return composed


def seed_command(configs: Sequence[str], seed: int, out: Path, threads: int, overrides: Sequence[str]) -> list[str]:
    """The ``fit`` of one seed: its run folder ``<out>/seed_<seed>/version_0``, continued from its last checkpoint."""
    command = [sys.executable, "-m", "app", "fit", *(arg for path in configs for arg in ("--config", path))]
    command += ["--seed_everything", str(seed), "--threads", str(threads)]
    command += ["--trainer.logger.init_args.save_dir", str(out), "--trainer.logger.init_args.name", f"seed_{seed}"]
    command += ["--trainer.logger.init_args.version", "0", *overrides]
    checkpoint = out / f"seed_{seed}" / "version_0" / "checkpoints" / LAST
    return command + (["--ckpt_path", str(checkpoint)] if checkpoint.is_file() else [])


class Stopped(Exception):
    """The seeds were stopped by SIGTERM; their fits checkpointed, so the same command continues them."""


#: The seeds' ``fit`` processes running now, and whether SIGTERM stopped the seeds (see :func:`_forward_sigterm`).
_RUNNING: set[launch.Command] = set()
_STOPPING = threading.Event()


def _forward_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (a ``kill``, a scheduler's preemption) to the seeds goes on to their fits: each checkpoints after its
    current update and exits, and the seeds stop with them (run alone, a fit would go on training after it)."""
    _STOPPING.set()
    for process in list(_RUNNING):
        process.send_signal(signal.SIGTERM)


def _fit_options(command: Sequence[str]) -> list[str]:
    """What a seed's ``fit`` trains with: its command without the interpreter, ``--threads`` and ``--ckpt_path``."""
    options, skip = [], False
    for arg in command[1:]:
        if skip:
            skip = False
        elif arg in ("--threads", "--ckpt_path"):
            skip = True
        else:
            options.append(arg)
    return options


def run_seed(configs: Sequence[str], seed: int, out: Path, threads: int, overrides: Sequence[str]) -> Path:
    """Run (or continue, or reuse) one seed; returns its run folder."""
    run = out / f"seed_{seed}" / "version_0"
    command = seed_command(configs, seed, out, threads, overrides)
    if (run / MARKER).is_file():
        finished = json.loads((run / MARKER).read_text())["command"]
        if _fit_options(finished) != _fit_options(command):
            raise RuntimeError(
                f"seed {seed}: its finished run {run} was trained with other options ({' '.join(finished[3:])}); "
                "give these their own --out"
            )
        print(f"seed {seed}: reusing its finished run {run}", flush=True)
        return run
    print(f"seed {seed}: {'continuing' if '--ckpt_path' in command else 'running'} it in {run}", flush=True)
    log = out / f"seed_{seed}.log"
    if _STOPPING.is_set():
        raise Stopped
    with open(log, "a") as output:
        process = launch.start(command[3:], stdout=output.fileno(), stderr=output.fileno())  # after `python -m app`
        _RUNNING.add(process)
        try:
            exit_code = process.wait()
        finally:
            _RUNNING.discard(process)
    if _STOPPING.is_set():
        raise Stopped
    if exit_code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"seed {seed} exited with code {exit_code}: {tail[0]} (whole output: {log})")
    (run / MARKER).write_text(json.dumps({"seed": seed, "command": command}, indent=1))
    return run


def read_curve(run: Path) -> list[dict[str, float]]:
    """The evaluations a run logged, in order: ``frames``, ``time_s`` and every ``eval/`` figure."""
    rows = []
    with open(run / "metrics.csv") as file:
        for row in csv.DictReader(file):
            if row.get("eval/return_mean"):
                point = {key: float(value) for key, value in row.items() if key.startswith("eval/") and value != ""}
                point["frames"], point["time_s"] = point.pop("eval/frames"), point.pop("eval/time_s", math.nan)
                rows.append(point)
    return rows


def _at(curve: list[dict[str, float]], key: str, x: float) -> float | None:
    """The return of the last evaluation at or before ``x`` (frames or seconds), None before the first."""
    before = [point["eval/return_mean"] for point in curve if point[key] <= x]
    return before[-1] if before else None


def aggregate(curves: dict[int, list[dict[str, float]]]) -> dict[str, Any]:
    """Per-seed final and best returns, their statistics across seeds, and the curve's band at each frame and time."""
    seeds = sorted(seed for seed, curve in curves.items() if curve)
    finals = torch.tensor([curves[seed][-1]["eval/return_mean"] for seed in seeds])
    per_seed = {
        seed: {
            "final_return": curves[seed][-1]["eval/return_mean"],
            "best_return": max(point["eval/return_mean"] for point in curves[seed]),
            "frames": curves[seed][-1]["frames"],
            "time_s": curves[seed][-1]["time_s"],
            **{key: value for key, value in curves[seed][-1].items() if key.endswith("_mean") and "random" not in key},
        }
        for seed in seeds
    }
    bands = {}
    for key in ("frames", "time_s"):
        grid = sorted({point[key] for seed in seeds for point in curves[seed]})
        band = []
        for x in grid:
            values = [value for seed in seeds if (value := _at(curves[seed], key, x)) is not None]
            if len(values) == len(seeds):  # every seed has been evaluated by then
                band.append({key: x, **episode_statistics(torch.tensor(values))})
        bands[key] = band
    randoms = [point[RANDOM] for seed in seeds for point in curves[seed] if RANDOM in point]
    return {
        "seeds": per_seed,
        "final_return": episode_statistics(finals),
        "final_figures": final_figures(curves, seeds),
        "random_return": sum(randoms) / len(randoms) if randoms else None,
        "curve": bands,
    }


#: Evaluation columns that are not figures of their own: the return and its spread over episodes (the return is
#: aggregated above), the random policy's line, and where the evaluation happened.
_NOT_FIGURES = ("eval/return_", "eval/random_")


def final_figures(curves: dict[int, list[dict[str, float]]], seeds: list[int]) -> dict[str, dict[str, float]]:
    """The statistics across seeds of every other figure of the final evaluation that all seeds logged: the
    environment's own measures (food eaten, laps and lap time, PIRL's safety error), which are often the result a
    system is judged by rather than its return."""
    keys = set.intersection(*(set(curves[seed][-1]) for seed in seeds)) if seeds else set()
    figures = sorted(key for key in keys if key.startswith("eval/") and not key.startswith(_NOT_FIGURES))
    return {
        key.removeprefix("eval/"): episode_statistics(torch.tensor([curves[seed][-1][key] for seed in seeds]), "value")
        for key in figures
    }


def start_label(run: Path) -> str:
    """What a run's frame-0 evaluation measures: the earlier stage its model starts from (read from the run's saved
    config), else the policy it was built with."""
    try:
        model = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("model") or {}
    except (OSError, yaml.YAMLError):
        model = {}
    stages = [Path(config).stem for config in stage_configs(model).values()] if isinstance(model, dict) else []
    return f"start ({', '.join(stages)} stage)" if stages else "start (frame 0)"


def paired(curves: dict[int, list[dict[str, float]]], label: str) -> dict[str, Any] | None:
    """Each seed's final return against its start (its evaluation at frame 0), and the mean difference's statistics
    across seeds. None when a seed has no evaluation at frame 0 (``PeriodicEvaluation(at_start=False)``)."""
    seeds = sorted(seed for seed, curve in curves.items() if curve)
    if not seeds or any(curves[seed][0]["frames"] != 0 for seed in seeds):
        return None
    per_seed = {}
    for seed in seeds:
        start, final = curves[seed][0]["eval/return_mean"], curves[seed][-1]["eval/return_mean"]
        per_seed[seed] = {"start_return": start, "final_return": final, "difference": final - start}
    differences = torch.tensor([row["difference"] for row in per_seed.values()])
    stats = episode_statistics(differences, prefix="difference")
    low, high = stats["difference_ci_low"], stats["difference_ci_high"]
    interval = f"mean difference {stats['difference_mean']:+.4g}, 95 % bootstrap interval [{low:.4g}, {high:.4g}]"
    if len(seeds) < 2:
        verdict = f"One seed: no interval across seeds (difference {stats['difference_mean']:+.4g})."
    elif low > 0:
        where = "in every seed and on average" if (differences > 0).all() else "on average"
        verdict = f"The final policy beats the starting one {where}: {interval}, which excludes 0."
    elif high < 0:
        where = "in every seed and on average" if (differences < 0).all() else "on average"
        verdict = f"The final policy is worse than the starting one {where}: {interval}, which excludes 0."
    else:
        verdict = f"The difference is within the interval: no gain shown ({interval}, which includes 0)."
    return {
        "start": label,
        "seeds": per_seed,
        "difference": stats,
        "excludes_zero": len(seeds) > 1 and (low > 0 or high < 0),
        "verdict": verdict,
    }


def write_report(result: dict[str, Any], out: Path, title: str) -> None:
    (out / "seeds.json").write_text(json.dumps(result, indent=1))
    stats = result["final_return"]
    lines = [
        f"# {title}: {len(result['seeds'])} seeds",
        "",
        f"Command: `{' '.join(result['command'])}`",
        "",
        "| seed | final return | best return | frames | wall s |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {seed} | {row['final_return']:.4g} | {row['best_return']:.4g} | {row['frames']:,.0f} | "
            f"{row['time_s']:,.0f} |"
            for seed, row in result["seeds"].items()
        ),
        "",
        f"Final return across seeds: mean {stats['return_mean']:.4g} ± {stats['return_std']:.3g} (std), IQM "
        f"{stats['return_iqm']:.4g}, 95 % bootstrap interval of the mean [{stats['return_ci_low']:.4g}, "
        f"{stats['return_ci_high']:.4g}]"
        + (f"; random policy {result['random_return']:.4g}." if result["random_return"] is not None else "."),
        "",
    ]
    if result.get("final_figures"):
        lines += [
            "The final evaluation's other figures across seeds (mean ± std, IQM, 95 % bootstrap interval of the mean):",
            "",
            "| figure | mean | std | IQM | 95 % interval |",
            "|---|---:|---:|---:|---:|",
            *(
                f"| {name} | {f['value_mean']:.4g} | {f['value_std']:.3g} | {f['value_iqm']:.4g} | "
                f"[{f['value_ci_low']:.4g}, {f['value_ci_high']:.4g}] |"
                for name, f in result["final_figures"].items()
            ),
            "",
        ]
    pair = result.get("paired")
    if pair is None:
        lines += ["No paired comparison: a seed has no evaluation at frame 0 (PeriodicEvaluation's at_start).", ""]
    else:
        lines += [
            "Final against start, paired by seed (the start: each run's evaluation at frame 0, before any update):",
            "",
            f"| seed | {pair['start']} | final | final − start |",
            "|---:|---:|---:|---:|",
            *(
                f"| {seed} | {row['start_return']:.4g} | {row['final_return']:.4g} | {row['difference']:+.4g} |"
                for seed, row in pair["seeds"].items()
            ),
            "",
            pair["verdict"],
            "",
        ]
    (out / "seeds.md").write_text("\n".join(lines))
    plot(result, out / "seeds.png", title)


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for axis, key, label in ((axes[0], "frames", "environment frames"), (axes[1], "time_s", "wall time (minutes)")):
        band = result["curve"][key]
        scale = 1 / 60 if key == "time_s" else 1
        x = [point[key] * scale for point in band]
        # Against time the seeds' evaluations fall at different moments: the band holds each seed's latest one.
        steps = "steps-post" if key == "time_s" else "default"
        axis.plot(x, [p["return_mean"] for p in band], "o-", markersize=3, drawstyle=steps, label="mean over seeds")
        low, high = [point["return_ci_low"] for point in band], [point["return_ci_high"] for point in band]
        axis.fill_between(x, low, high, alpha=0.25, step="post" if key == "time_s" else None, label="95 % interval")
        if result["random_return"] is not None:
            axis.axhline(result["random_return"], color="0.4", linestyle="--", label="random policy")
        if result.get("paired") is not None:
            starts = [row["start_return"] for row in result["paired"]["seeds"].values()]
            start = f"{result['paired']['start']}, mean"
            axis.axhline(sum(starts) / len(starts), color="tab:green", linestyle=":", label=start)
        axis.set_xlabel(label)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("greedy return")
    axes[0].legend(fontsize="small")
    figure.suptitle(f"{title}: {len(result['seeds'])} seeds")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None, prog: str = "lightrl seeds") -> dict[str, Any]:
    """Parses ``argv`` (flags it does not know go to every seed's ``fit``), runs the seeds, writes the aggregate.
    Bad input exits with status 2 and one line ``<prog>: error: ...`` naming the flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineArgumentParser(
        prog=prog, description="Run a config over several seeds and aggregate them.", allow_abbrev=False
    )
    parser.add_argument("--config", action="append", required=True, help="the training config(s), composed in order")
    parser.add_argument("--seeds", type=int, default=5, help="how many seeds: --first-seed, the next, ...")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed")
    parser.add_argument("--parallel", type=int, default=1, help="seeds run at once (each with --threads threads)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each seed's process")
    parser.add_argument("--out", default=None, help="folder of the runs and the aggregate (default runs/<name>_seeds)")
    args, overrides = parser.parse_known_args(argv)
    for flag, value in (("--seeds", args.seeds), ("--parallel", args.parallel), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    check_config_files(parser, args.config)
    logger = (_composed(args.config).get("trainer") or {}).get("logger")
    if not isinstance(logger, dict) or "class_path" not in logger:
        parser.error(f"--config {args.config[-1]}: the seeds' runs need the config's trainer.logger (e.g. a CSVLogger)")
    name = (logger.get("init_args") or {}).get("name") or Path(args.config[0]).stem
    out = Path(args.out or f"runs/{name}_seeds").resolve()
    out.mkdir(parents=True, exist_ok=True)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    _STOPPING.clear()
    previous = signal.signal(signal.SIGTERM, _forward_sigterm)
    try:
        with ThreadPoolExecutor(args.parallel) as pool:
            folders = pool.map(lambda seed: run_seed(args.config, seed, out, args.threads, overrides), seeds)
            runs = dict(zip(seeds, folders, strict=True))
    except Stopped:
        print("stopped by SIGTERM: the same command continues the seeds", file=sys.stderr)
        raise SystemExit(128 + signal.SIGTERM) from None
    except RuntimeError as error:
        sys.exit(f"{prog}: error: {error}")
    finally:
        signal.signal(signal.SIGTERM, previous)
    curves = {seed: read_curve(run) for seed, run in runs.items()}
    result = {"command": ["python", "-m", "app", "seeds", *argv], **aggregate(curves)}
    result["paired"] = paired(curves, start_label(runs[seeds[0]]))
    write_report(result, out, name)
    print(f"Wrote {out / 'seeds.md'} and seeds.png", flush=True)
    return result

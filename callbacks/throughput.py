"""ThroughputReport: where the wall time of a fit goes, and how many frames, updates and samples per second it buys.

One Lightning training step holds the data module's phases (``collect``, ``advantage``, ``buffer_write``,
``sample``, timed by its :class:`~datamodules.timing.PhaseTimer`) and the update itself, because
``RLModule.training_step`` fetches its own batch. So ``update`` is the step's wall time less the timer's increase
during the step, and ``other`` is the rest of the fit's wall time: logging, checkpoints, evaluation, setup.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from callbacks.schedule import PeriodicEvaluation

# Module-level so tests can drive time by hand; looked up at each call, never bound at import.
_clock = time.perf_counter

DATA_PHASES = ("collect", "advantage", "buffer_write", "sample")
PHASES = (*DATA_PHASES, "update", "other")
_PACKAGES = ("torch", "lightning", "torchrl", "tensordict")


class ThroughputReport(Callback):
    """Times the phases of training, logs rates as it goes, and writes a JSON + Markdown report (and plots) at the end.

    Logged every ``log_every_n_steps`` updates, over the steps since the last log: ``throughput/frames_per_s`` (also
    on the progress bar) and ``throughput/samples_per_s``, summed over ranks; ``throughput/updates_per_s`` and
    ``time/<phase>_frac`` per phase, averaged over ranks. Lightning hands them to the logger on its own logging
    steps only, so keep this a multiple of ``--trainer.log_every_n_steps``.

    Written by rank zero at the end of fit: ``<report_dir>/<name>.json``, ``<name>.md`` and, with ``plots``,
    ``<name>_phases.png`` and ``learning_curve.png`` (from a :class:`PeriodicEvaluation` callback's history).

    Args:
        report_dir: folder for the report; default the trainer's ``log_dir`` (``default_root_dir`` without a logger).
        name: stem of the report's file names.
        log_every_n_steps: updates between logged rates.
        skip_first_steps: training steps left out of the steady-state figures (collector start-up, compilation,
            replay warm-up). The whole-run figures include them.
        plots: also draw the phase breakdown and the learning curve (matplotlib).
        cuda_sync: synchronise the GPU at phase and step boundaries (sets ``datamodule.timer.cuda_sync``), so that
            asynchronous GPU work is charged to the phase that launched it. Off by default: each sync stalls the
            host, which is what the hot loop is built to avoid.
    """

    def __init__(
        self,
        report_dir: str | None = None,
        name: str = "throughput",
        log_every_n_steps: int = 50,
        skip_first_steps: int = 10,
        plots: bool = True,
        cuda_sync: bool = False,
    ) -> None:
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1, got {log_every_n_steps}")
        if skip_first_steps < 0:
            raise ValueError(f"skip_first_steps must be >= 0, got {skip_first_steps}")
        if not name or os.sep in name:
            raise ValueError(f"name must be a non-empty file name stem, got {name!r}")
        self.report_dir, self.name, self.plots, self.cuda_sync = report_dir, name, plots, cuda_sync
        self.log_every_n_steps, self.skip_first_steps = log_every_n_steps, skip_first_steps
        self.report: dict[str, Any] | None = None  # the last report written, for callers and tests
        self._start: dict[str, Any] | None = None

    # ------------------------------------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_start = _clock()
        self._sync = self.cuda_sync and pl_module.device.type == "cuda"
        if self._sync:
            trainer.datamodule.timer.cuda_sync = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Counters are taken here, not at fit start: a resumed run restores global_step after on_fit_start, and the
        # frames already in the checkpoint were collected by an earlier fit.
        self._update_s, self._steps = 0.0, 0
        begin = self._snapshot(trainer)
        self._start = {**begin, "t": self._fit_start}  # the whole run's clock includes setup and the first evaluation
        self._window, self._last_step_end = begin, self._start  # logged rates cover training steps only
        self._steady = begin if self.skip_first_steps == 0 else None
        # Resolved on every rank: trainer.log_dir broadcasts, so rank zero alone would wait for the others forever.
        self._dir = Path(self.report_dir or trainer.log_dir or trainer.default_root_dir)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self._sync:
            torch.cuda.synchronize(pl_module.device)
        self._step_start = _clock()
        self._step_timer = trainer.datamodule.timer.total()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self._sync:
            torch.cuda.synchronize(pl_module.device)
        now = _clock()
        self._update_s += (now - self._step_start) - (trainer.datamodule.timer.total() - self._step_timer)
        self._steps += 1
        self._last_step_end = self._snapshot(trainer, now)
        if self._steps == self.skip_first_steps:
            self._steady = self._last_step_end
        step = trainer.global_step
        # global_step, not a count of this fit's steps: it lines up with the trainer's own logging steps after a resume.
        if step % self.log_every_n_steps == 0 and step != self._window["updates"]:
            self._log_window(trainer, pl_module, summarise(self._window, self._last_step_end))
            self._window = self._last_step_end

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # on_fit_end, not on_train_end: every callback's on_train_end (the final evaluation) has run by now.
        if not trainer.is_global_zero or self._start is None:  # None: the loop never started (max_steps reached)
            return
        overall = summarise(self._start, self._snapshot(trainer))
        # Steady state runs from the end of the warm-up steps to the end of the last step, so the final evaluation
        # and checkpoint (one-off costs, like the warm-up) stay out of it.
        steady = None
        if self._steady is not None and self._last_step_end["t"] > self._steady["t"]:
            steady = summarise(self._steady, self._last_step_end)
        self.report = self._describe(trainer, pl_module, overall, steady)
        self._dir.mkdir(parents=True, exist_ok=True)
        (self._dir / f"{self.name}.json").write_text(json.dumps(self.report, indent=2) + "\n")
        markdown = self._dir / f"{self.name}.md"
        markdown.write_text(to_markdown(self.report))
        if self.plots:
            self._plot(trainer, overall, steady)
        best = steady or overall
        print(
            f"Throughput: {best['frames_per_s']:,.0f} frames/s, {best['updates_per_s']:,.1f} updates/s"
            f" ({'steady state' if steady else 'whole run'}); {100 * best['outside_update_frac']:.1f} % of wall time"
            f" outside the update step. Report: {markdown}"
        )

    # ------------------------------------------------------------------------------------------------ helpers
    def _snapshot(self, trainer: pl.Trainer, now: float | None = None) -> dict[str, Any]:
        data = trainer.datamodule
        return {
            "t": _clock() if now is None else now,
            # Every rank collects and samples alike (same envs, same schedule): rank zero's counts times world size.
            "frames": data.frames * trainer.world_size,
            "samples": data.samples * trainer.world_size,
            "updates": trainer.global_step,
            "steps": self._steps,
            "timer": dict(data.timer.totals),
            "update_s": self._update_s,
        }

    def _log_window(self, trainer: pl.Trainer, pl_module: pl.LightningModule, window: dict[str, Any]) -> None:
        # Each rank logs its own share of frames and samples; sync_dist sums the shares over ranks.
        world = trainer.world_size
        log = dict(batch_size=1, sync_dist=True)  # batch_size: the batch is a TensorDict Lightning cannot measure
        pl_module.log("throughput/frames_per_s", window["frames_per_s"] / world, prog_bar=True, reduce_fx="sum", **log)
        pl_module.log("throughput/samples_per_s", window["samples_per_s"] / world, reduce_fx="sum", **log)
        pl_module.log("throughput/updates_per_s", window["updates_per_s"], **log)
        for phase, fraction in window["fraction"].items():
            pl_module.log(f"time/{phase}_frac", fraction, **log)

    def _describe(self, trainer: pl.Trainer, pl_module: pl.LightningModule, overall: dict, steady: dict | None) -> dict:
        device = trainer.strategy.root_device
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
        return {
            "date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": list(sys.argv),
            "machine": {
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "device": str(device),
                "device_name": device_name,
                "accelerator": type(trainer.accelerator).__name__,
                "precision": str(trainer.precision),
                "strategy": type(trainer.strategy).__name__,
                "world_size": trainer.world_size,
            },
            "versions": {"python": platform.python_version(), **{p: _version(p) for p in _PACKAGES}},
            "data": {"class": type(trainer.datamodule).__name__, "num_envs": trainer.datamodule.num_envs},
            "model": {"class": type(pl_module).__name__},
            # Counts of this fit; frames_at_start > 0 when it resumed from a checkpoint.
            "totals": {
                **{key: overall[key] for key in ("wall_s", "frames", "updates", "samples", "steps")},
                "frames_at_start": self._start["frames"],
            },
            "skip_first_steps": self.skip_first_steps,
            "overall": overall,
            "steady_state": steady,
        }

    def _plot(self, trainer: pl.Trainer, overall: dict, steady: dict | None) -> None:
        import matplotlib  # lazy: only runs that ask for plots pay for the import

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [("whole run", overall)] + ([("steady state", steady)] if steady else [])
        fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(rows)))
        for y, (_, summary) in enumerate(rows):
            left = 0.0
            for index, phase in enumerate(PHASES):
                label = f"{phase} ({100 * overall['fraction'][phase]:.1f} %)" if y == 0 else None
                ax.barh(y, summary["seconds"][phase], left=left, color=f"C{index}", label=label)
                left += summary["seconds"][phase]
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.set_xlabel("wall time (s)")
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.savefig(self._dir / f"{self.name}_phases.png", dpi=100, bbox_inches="tight")
        plt.close(fig)

        evaluation = next((cb for cb in trainer.callbacks if isinstance(cb, PeriodicEvaluation)), None)
        history = evaluation.history if evaluation is not None else []
        if len(history) < 2:
            print("Throughput report: no learning curve (it needs a PeriodicEvaluation callback with >= 2 evaluations)")
            return
        frames = [row["frames"] for row in history]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(frames, [row["eval/return_mean"] for row in history], "o-", color="C0")
        ax.set_xlabel("environment frames")
        ax.set_ylabel("eval/return_mean", color="C0")
        if all("eval/food_mean" in row for row in history):
            food = ax.twinx()  # food eaten and return have different scales
            food.plot(frames, [row["eval/food_mean"] for row in history], "s--", color="C1")
            food.set_ylabel("eval/food_mean", color="C1")
        fig.savefig(self._dir / "learning_curve.png", dpi=100, bbox_inches="tight")
        plt.close(fig)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def summarise(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """Seconds and fraction of wall time per phase, and rates, between two snapshots."""
    wall = end["t"] - start["t"]
    seconds = {phase: end["timer"].get(phase, 0.0) - start["timer"].get(phase, 0.0) for phase in DATA_PHASES}
    seconds["update"] = end["update_s"] - start["update_s"]
    seconds["other"] = wall - sum(seconds.values())  # the remainder, so the fractions always sum to one
    counts = {key: end[key] - start[key] for key in ("frames", "updates", "samples", "steps")}
    fraction = {phase: value / wall if wall > 0 else 0.0 for phase, value in seconds.items()}
    rate = {f"{key}_per_s": counts[key] / wall if wall > 0 else 0.0 for key in ("frames", "updates", "samples")}
    outside = 1.0 - fraction["update"]
    return {"wall_s": wall, **counts, **rate, "seconds": seconds, "fraction": fraction, "outside_update_frac": outside}


def to_markdown(report: dict[str, Any]) -> str:
    """The report as a short human-readable page: context lines, then one table of the figures."""
    overall, steady, machine, totals = report["overall"], report["steady_state"], report["machine"], report["totals"]

    rows = [
        ("wall time (s)", lambda s: f"{s['wall_s']:.2f}"),
        ("frames/s", lambda s: f"{s['frames_per_s']:,.0f}"),
        ("updates/s", lambda s: f"{s['updates_per_s']:,.1f}"),
        ("samples/s", lambda s: f"{s['samples_per_s']:,.0f}"),
        *((phase, lambda s, p=phase: f"{s['seconds'][p]:.2f} s ({100 * s['fraction'][p]:.1f} %)") for phase in PHASES),
        ("**outside update**", lambda s: f"**{100 * s['outside_update_frac']:.1f} %**"),
    ]
    lines = [
        "# Throughput report",
        "",
        f"- date: {report['date']}",
        f"- command: `{' '.join(report['command'])}`",
        f"- machine: {machine['platform']}, {machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads, "
        f"{machine['device']} ({machine['device_name']}), {machine['accelerator']}, {machine['precision']}, "
        f"{machine['strategy']} × {machine['world_size']}",
        "- versions: " + ", ".join(f"{name} {version}" for name, version in report["versions"].items()),
        f"- data: {report['data']['class']} ({report['data']['num_envs']} envs per rank), "
        f"model: {report['model']['class']}",
        f"- totals: {totals['wall_s']:.1f} s, {totals['frames']:,} frames, {totals['updates']:,} updates, "
        f"{totals['samples']:,} samples (frames at start: {totals['frames_at_start']:,})",
        "",
        f"| | whole run | steady state (after {report['skip_first_steps']} steps) |",
        "|---|---:|---:|",
        *(f"| {label} | {render(overall)} | {render(steady) if steady else 'n/a'} |" for label, render in rows),
    ]
    return "\n".join(lines) + "\n"

"""ThroughputReport: where the wall time of a run goes, and how many frames, updates and samples per second it buys.

Every phase is timed where it happens, into the data module's :class:`~datamodules.timing.PhaseTimer`: the data
module times ``collect``, ``advantage``, ``buffer_write`` and ``sample``, the model its ``update`` (loss, backward,
clip, optimizer step, target update), :class:`~callbacks.schedule.PeriodicEvaluation` its ``eval`` and
:class:`~callbacks.schedule.FrameCheckpoint` its ``checkpoint``. So the figures do not depend on the order of the
callbacks. ``other`` is the rest of the wall time: Lightning's loop and hooks, logging, setup.

A run resumed from a checkpoint writes one report for the whole run: the totals up to the checkpoint travel in the
checkpoint (this callback's ``state_dict``), and the report shows this process and the whole run side by side.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from callbacks.bare_updates import BareYardstick
from callbacks.report_plots import plot_learning_curve, plot_phases, run_name
from callbacks.schedule import PeriodicEvaluation

# Module-level so tests can drive time by hand; looked up at each call, never bound at import.
_clock = time.perf_counter

TIMED_PHASES = ("collect", "advantage", "buffer_write", "sample", "update", "eval", "checkpoint")
PHASES = (*TIMED_PHASES, "other")
COUNTS = ("frames", "updates", "samples", "steps")
_PACKAGES = ("torch", "lightning", "torchrl", "tensordict")
#: The default share of the fit's wall time the bare-update yardstick takes (``bare_update_share``): small, as every
#: shipped config runs the report; the benchmark preset (``configs/bench/throughput.yaml``) takes 5 %.
BARE_UPDATE_SHARE = 0.01


def program(argv0: str) -> str:
    """How the run was started, without the machine's paths: ``python -m app`` for a package's ``__main__.py``,
    else the program's name (``lightrl``, a benchmark script)."""
    path = Path(argv0)
    return f"python -m {path.parent.name}" if path.name == "__main__.py" else path.name


class ThroughputReport(Callback):
    """Reads the phase timer, logs rates as it goes, and writes a JSON + Markdown report (and plots) at the end.

    Logged on the trainer's logging steps (``--trainer.log_every_n_steps``), over the steps since the last log:
    ``throughput/frames_per_s`` and ``throughput/samples_per_s``, summed over ranks; ``throughput/updates_per_s`` and
    ``time/<phase>_frac`` per phase, averaged over ranks. Lightning hands logged values to the logger on its own
    logging steps only, and each ``log`` call costs its Python whether written or not, so a rate is logged only where
    it is written (and a training step that takes several updates ends only there).

    Written by rank zero at the end of fit: ``<report_dir>/<name>.json``, ``<name>.md`` and, with ``plots``,
    ``<name>_phases.png`` and ``learning_curve.png`` (from a :class:`PeriodicEvaluation` callback's history, with
    its random-policy baseline). After a resume the files cover the whole run as well as this process. With several
    ranks (DDP, on one machine or several) the figures are their total, and ``per_rank`` (a table in the Markdown)
    has each rank's own frames, rates and phases, gathered from every rank.

    Args:
        report_dir: folder for the report; default the trainer's ``log_dir`` (``default_root_dir`` without a logger).
        name: stem of the report's file names.
        log_every_n_steps: updates between logged rates; None: the trainer's ``log_every_n_steps`` (set another
            only as a multiple of it: Lightning writes nothing in between).
        skip_first_steps: updates (Lightning's steps, as ``max_steps`` counts them) left out of the steady-state
            figures (collector start-up, compilation, replay warm-up): the steady state starts at the end of the
            training step that reaches them. The whole-run figures include them.
        plots: also draw the phase breakdown and the learning curve (matplotlib).
        cuda_sync: synchronise the GPU at phase boundaries (sets ``datamodule.timer.cuda_sync``), so that
            asynchronous GPU work is charged to the phase that launched it. Off by default: each sync stalls the
            host, which is what the hot loop is built to avoid.
        bare_update_seconds: seconds of each slice of the agent's bare reference update (its update arithmetic in plain
            eager PyTorch, :mod:`callbacks.bare_updates`, on the run's torch threads): the yardstick that makes runs on
            machines, or days, of different speed comparable, and the training loop's cost per update a ratio. After the
            warm-up steps, a slice follows every ``bare_update_seconds / bare_update_share`` seconds of training (25 s
            at the defaults), so that the loop and the yardstick are timed side by side as the machine's speed drifts;
            the report's ratio is the median over these pairs of the stretch's time per update over its slice's. The
            slices are left out of every other figure (the report's clock stops during them). A run shorter than one
            stretch, with several ranks, or with asynchronous collection (its workers would go on during a slice, and
            the updates after it would see more experiences) gets one slice at the end of fit of at most
            ``bare_update_share`` of its wall time. 0 skips it.
        bare_update_share: the share of the training time the slices take (a stretch is the last slice's timed
            calls over it; the first slice's one-off batches and warm-up come on top); what a run loses to its
            yardstick, and what other clocks (``max_time``, the evaluations' ``eval/time_s``) still count.
    """

    def __init__(
        self,
        report_dir: str | None = None,
        name: str = "throughput",
        log_every_n_steps: int | None = None,
        skip_first_steps: int = 10,
        plots: bool = True,
        cuda_sync: bool = False,
        bare_update_seconds: float = 0.25,
        bare_update_share: float = BARE_UPDATE_SHARE,
    ) -> None:
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1, got {log_every_n_steps}")
        if skip_first_steps < 0:
            raise ValueError(f"skip_first_steps must be >= 0, got {skip_first_steps}")
        if bare_update_seconds < 0:
            raise ValueError(f"bare_update_seconds must be >= 0, got {bare_update_seconds}")
        if not 0 < bare_update_share <= 0.5:
            raise ValueError(f"bare_update_share must be in (0, 0.5], got {bare_update_share}")
        if not name or os.sep in name:
            raise ValueError(f"name must be a non-empty file name stem, got {name!r}")
        self.report_dir, self.name, self.plots, self.cuda_sync = report_dir, name, plots, cuda_sync
        self.bare_update_seconds, self.bare_update_share = bare_update_seconds, bare_update_share
        self.log_every_n_steps, self.skip_first_steps = log_every_n_steps, skip_first_steps
        self.report: dict[str, Any] | None = None  # the last report written, for callers and tests
        self.files: list[Path] = []  # the files it wrote (callbacks.tracking logs them as artifacts)
        self._start: dict[str, Any] | None = None
        self._before: dict[str, Any] | None = None  # totals of the processes before this one (from the checkpoint)
        self._trainer: pl.Trainer | None = None
        self._paused = 0.0  # seconds the report's clock stood still (the bare slices)

    # ------------------------------------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        # The clock and the timer start here, so setup and an evaluation at train start count whatever the order of
        # the callbacks' on_train_start hooks.
        self._paused, self._slice_took = 0.0, self.bare_update_seconds
        self._start = None  # set when the loop starts: a fit whose loop never starts (max_steps reached) writes nothing
        self._fit_start = {"t": _clock() - self._paused, "timer": dict(trainer.datamodule.timer.totals)}
        yardstick = BareYardstick(pl_module, trainer.datamodule)
        self._yardstick = yardstick if self.bare_update_seconds > 0 and yardstick.exists else None
        self._stretch: dict[str, Any] | None = None  # where the training stretch before the next slice began
        self._pairs: list[dict[str, float]] = []  # each stretch with the bare slice right after it
        self._bare_error: str | None = None
        # Slices beside the loop with one rank (several would wait for each other's) and collection that waits for
        # the learner (asynchronous workers would go on collecting during a slice: more experiences per update).
        collection = getattr(trainer.datamodule, "collection", None)
        self._beside = self._yardstick is not None and trainer.world_size == 1
        self._beside &= not getattr(collection, "runs_beside_learner", False)
        if self.cuda_sync and pl_module.device.type == "cuda":
            trainer.datamodule.timer.cuda_sync = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Counters are taken here, not at fit start: a resumed run restores global_step after on_fit_start, and the
        # frames already in the checkpoint were collected by an earlier process.
        self._steps = 0
        begin = self._snapshot(trainer)
        self._start = {**begin, **self._fit_start}
        self._window, self._last_step_end = begin, self._start  # logged rates cover training steps only
        self._steady = begin if self.skip_first_steps == 0 else None
        # Resolved on every rank: trainer.log_dir broadcasts, so rank zero alone would wait for the others forever.
        self._dir = Path(self.report_dir or trainer.log_dir or trainer.default_root_dir)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._steps += 1
        self._last_step_end = self._snapshot(trainer)
        # Counted in updates (Lightning's steps, as max_steps counts them): a training step may take several.
        if self._steady is None and trainer.global_step - self._start["updates"] >= self.skip_first_steps:
            self._steady = self._last_step_end
        if self._steady is not None and self._beside:
            self._time_beside(trainer)
        step = trainer.global_step
        # global_step, not a count of this fit's steps: it lines up with the trainer's own logging steps after a resume.
        every = self.log_every_n_steps or trainer.log_every_n_steps
        if step % every == 0 and step != self._window["updates"]:
            self._log_window(trainer, pl_module, rates(interval(self._window, self._last_step_end)))
            self._window = self._last_step_end

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # on_fit_end, not on_train_end: every callback's on_train_end (the final evaluation) has run by now.
        if self._start is None:  # the loop never started (max_steps reached): on every rank alike
            return
        ranks = self._each_rank(trainer)  # a collective: every rank takes part before rank zero writes
        if not trainer.is_global_zero:
            return
        this_process = interval(self._start, self._snapshot(trainer))
        whole_run = combine(self._before, this_process)
        # Steady state runs from the end of the warm-up steps to the end of the last step, so the final evaluation
        # and checkpoint (one-off costs, like the warm-up) stay out of it.
        steady = None
        if self._steady is not None and self._last_step_end["t"] > self._steady["t"]:
            steady = rates(interval(self._steady, self._last_step_end))
        self.report = self._describe(trainer, pl_module, rates(this_process), rates(whole_run), steady)
        if ranks is not None:
            self.report["per_rank"] = ranks
        self.report["bare_update"] = self._bare_update(steady or self.report["this_process"])
        background = getattr(trainer.datamodule, "background_timer", None)
        if background is not None and background.totals:  # prefetch: the data path's phases off the training thread
            self.report["background_phases_s"] = dict(background.totals)
        self._dir.mkdir(parents=True, exist_ok=True)
        (self._dir / f"{self.name}.json").write_text(json.dumps(self.report, indent=2) + "\n")
        markdown = self._dir / f"{self.name}.md"
        markdown.write_text(to_markdown(self.report))
        self.files = [self._dir / f"{self.name}.json", markdown]
        if self.plots:
            self._plot(trainer)
        best = steady or self.report["this_process"]
        resumed = f"; whole run over {whole_run['processes']} processes: " if whole_run["processes"] > 1 else ""
        if resumed:
            resumed += f"{whole_run['frames']:,} frames in {whole_run['wall_s']:.1f} s"
        bare = self.report["bare_update"]
        versus_bare = (
            f"; {bare['ratio']:.2f}x the bare update ({bare['ms']:.3f} ms on {_threads(bare)} here, now)"
            if bare and "ratio" in bare
            else ""
        )
        print(
            f"Throughput: {best['frames_per_s']:,.0f} frames/s, {best['updates_per_s']:,.1f} updates/s"
            f" ({'steady state' if steady else 'this process'}); {100 * best['outside_update_frac']:.1f} % of wall"
            f" time outside the update step{versus_bare}{resumed}. Report: {markdown}"
        )

    def _each_rank(self, trainer: pl.Trainer) -> list[dict[str, Any]] | None:
        """With several ranks, each rank's own share of this process (its frames and rates, its phases' fractions),
        gathered from every rank in rank order; None with one."""
        if trainer.world_size == 1 or not torch.distributed.is_initialized():
            return None
        world = trainer.world_size
        own = rates(interval(self._start, self._snapshot(trainer)))
        own = {
            "rank": trainer.global_rank,
            "wall_s": own["wall_s"],
            "frames": own["frames"] // world,
            "frames_per_s": own["frames_per_s"] / world,
            "updates_per_s": own["updates_per_s"],
            "fraction": own["fraction"],
        }
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, own)
        return gathered

    def _time_beside(self, trainer: pl.Trainer) -> None:
        """A bare slice after each stretch of training ``1 / bare_update_share`` times as long as the last slice's timed
        calls took (``bare_update_seconds`` at first), so that the slices keep to their share even where one call
        outlasts ``bare_update_seconds`` (a large network on a CPU); the first slice's one-off batches and warm-up do
        not lengthen the stretches."""
        if self._stretch is None:
            self._stretch = self._last_step_end
            return
        if self._last_step_end["t"] - self._stretch["t"] < self._slice_took / self.bare_update_share:
            return
        # A round made in the background (prefetch) finishes inside the stretch, and runs beside neither the slice
        # nor the next stretch: the slice is timed alone, as an independent probe would be. On a GPU the loop's queued
        # kernels finish inside the stretch too, not inside the slice's paused clock.
        trainer.datamodule.settle()
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        end = self._snapshot(trainer)
        updates, wall_s = end["updates"] - self._stretch["updates"], end["t"] - self._stretch["t"]
        self._pair(updates, wall_s, self.bare_update_seconds, beside=True)
        self._stretch = self._snapshot(trainer)

    def _pair(self, updates: int, wall_s: float, seconds: float, beside: bool) -> None:
        """Times a bare slice of ``seconds`` (the report's clock stopped) against ``updates`` in ``wall_s``."""
        if self._yardstick is None or updates == 0:
            return
        began = _clock()
        try:
            ms = self._yardstick.slice_ms(seconds)
        except Exception as error:  # a yardstick that breaks must take neither the run nor its report with it
            self._bare_error = f"{type(error).__name__}: {error}".splitlines()[0]
            rank_zero_warn(f"throughput report: the bare-update yardstick failed ({self._bare_error}); no more slices")
            ms = None
        finally:
            self._paused += _clock() - began
        if ms is None:  # no reference for this agent, or it failed: no more slices
            self._yardstick, self._beside = None, False
            return
        self._slice_took = self._yardstick.timed_seconds
        loop_ms = 1e3 * wall_s / updates
        pair = {"updates": updates, "seconds": wall_s, "loop_ms": loop_ms, "bare_ms": ms, "slice_seconds": seconds}
        self._pairs.append({**pair, "threads": self._yardstick.threads, "beside_the_loop": beside})

    def _bare_update(self, figures: dict) -> dict | None:
        """The bare update's time and the loop's time per update against it, over the pairs timed side by side (one
        now, against ``figures``, when the run made none)."""
        if not self._pairs and self._yardstick is not None and figures["updates"] > 0:
            # One slice in place of the run's: as long as 8 of them (2 s at the default), within the share.
            seconds = min(8 * self.bare_update_seconds, self.bare_update_share * figures["wall_s"])
            self._pair(figures["updates"], figures["wall_s"], seconds, beside=False)
        if not self._pairs:
            return {"error": self._bare_error} if self._bare_error is not None else None
        ratios = [pair["loop_ms"] / pair["bare_ms"] for pair in self._pairs]
        return {
            "ms": statistics.median(pair["bare_ms"] for pair in self._pairs),
            "loop_ms_per_update": 1e3 * sum(p["seconds"] for p in self._pairs) / sum(p["updates"] for p in self._pairs),
            "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
            "threads": self._pairs[-1]["threads"],  # torch's intra-op threads, the run's
            "slices": len(self._pairs),
            "seconds_paused": self._paused,  # the slices, with the first one's warm-up: out of the report's figures
            "pairs": self._pairs,
            **({"error": self._bare_error} if self._bare_error is not None else {}),  # pairs before it failed
        }

    # ------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        # Called when a checkpoint is written: the totals of the run up to that moment, which a process resumed from
        # this checkpoint continues (work after the checkpoint is redone by it, so it is not counted twice).
        if self._start is None or self._trainer is None:
            return {"whole_run": self._before} if self._before else {}
        return {"whole_run": combine(self._before, interval(self._start, self._snapshot(self._trainer)))}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._before = state_dict.get("whole_run")

    # ------------------------------------------------------------------------------------------------ helpers
    def _snapshot(self, trainer: pl.Trainer) -> dict[str, Any]:
        data = trainer.datamodule
        return {
            "t": _clock() - self._paused,  # the report's clock: the bare slices left out
            # Every rank collects and samples alike (same envs, same schedule): rank zero's counts times world size.
            "frames": data.frames * trainer.world_size,
            "samples": data.samples * trainer.world_size,
            "updates": trainer.global_step,
            "steps": self._steps,
            "timer": dict(data.timer.totals),
        }

    def _log_window(self, trainer: pl.Trainer, pl_module: pl.LightningModule, window: dict[str, Any]) -> None:
        # Each rank logs its own share of frames and samples; sync_dist sums the shares over ranks.
        world = trainer.world_size
        log = dict(batch_size=1, sync_dist=True)  # batch_size: the batch is a TensorDict Lightning cannot measure
        pl_module.log("throughput/frames_per_s", window["frames_per_s"] / world, reduce_fx="sum", **log)
        pl_module.log("throughput/samples_per_s", window["samples_per_s"] / world, reduce_fx="sum", **log)
        pl_module.log("throughput/updates_per_s", window["updates_per_s"], **log)
        for phase, fraction in window["fraction"].items():
            pl_module.log(f"time/{phase}_frac", fraction, **log)

    def _describe(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, this: dict, whole: dict, steady: dict | None
    ) -> dict:
        device = trainer.strategy.root_device
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
        return {
            "date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": [program(sys.argv[0]), *sys.argv[1:]],
            "run": run_name(trainer, self._dir),
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
            # frames_at_start > 0 when this process resumed from a checkpoint; processes counts this one.
            "totals": {
                "this_process": {key: this[key] for key in ("wall_s", *COUNTS)},
                "whole_run": {key: whole[key] for key in ("wall_s", *COUNTS, "processes")},
                "frames_at_start": self._start["frames"],
            },
            "skip_first_steps": self.skip_first_steps,
            "this_process": this,
            "whole_run": whole,
            "steady_state": steady,
        }

    def _plot(self, trainer: pl.Trainer) -> None:
        report = self.report
        rows = [("this process", report["this_process"])]
        rows += [("steady state", report["steady_state"])] if report["steady_state"] else []
        rows += [("whole run", report["whole_run"])] if report["whole_run"]["processes"] > 1 else []
        plot_phases(self._dir / f"{self.name}_phases.png", rows, PHASES)
        self.files.append(self._dir / f"{self.name}_phases.png")
        evaluation = next((cb for cb in trainer.callbacks if isinstance(cb, PeriodicEvaluation)), None)
        history = evaluation.history if evaluation is not None else []
        if len(history) < 2:
            print("Throughput report: no learning curve (it needs a PeriodicEvaluation callback with >= 2 evaluations)")
            return
        title = f"{report['run']}: {report['model']['class']}, greedy evaluation"
        plot_learning_curve(self._dir / "learning_curve.png", history, evaluation.random, title)
        self.files.append(self._dir / "learning_curve.png")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def interval(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """Wall time, seconds per phase and counts between two snapshots (one process: ``processes`` is 1)."""
    wall = end["t"] - start["t"]
    seconds = {phase: end["timer"].get(phase, 0.0) - start["timer"].get(phase, 0.0) for phase in TIMED_PHASES}
    seconds["other"] = wall - sum(seconds.values())  # the remainder, so the fractions always sum to one
    return {"wall_s": wall, **{key: end[key] - start[key] for key in COUNTS}, "seconds": seconds, "processes": 1}


def combine(before: dict[str, Any] | None, this: dict[str, Any]) -> dict[str, Any]:
    """The totals of earlier processes (None: there were none) plus this one's."""
    if not before:
        return dict(this)
    summed = {key: before.get(key, 0) + this[key] for key in ("wall_s", *COUNTS, "processes")}
    seconds = {phase: before["seconds"].get(phase, 0.0) + this["seconds"][phase] for phase in PHASES}
    return {**summed, "seconds": seconds}


def rates(totals: dict[str, Any]) -> dict[str, Any]:
    """``totals`` with per-second rates, each phase's fraction of wall time, and the fraction outside the update."""
    wall = totals["wall_s"]
    fraction = {phase: value / wall if wall > 0 else 0.0 for phase, value in totals["seconds"].items()}
    rate = {f"{key}_per_s": totals[key] / wall if wall > 0 else 0.0 for key in ("frames", "updates", "samples")}
    return {**totals, **rate, "fraction": fraction, "outside_update_frac": 1.0 - fraction["update"]}


def to_markdown(report: dict[str, Any]) -> str:
    """The report as a short human-readable page: context lines, then one table of the figures."""
    this, steady, whole = report["this_process"], report["steady_state"], report["whole_run"]
    machine, totals = report["machine"], report["totals"]
    rows = [
        ("wall time (s)", lambda s: f"{s['wall_s']:.2f}"),
        ("frames", lambda s: f"{s['frames']:,}"),
        ("updates", lambda s: f"{s['updates']:,}"),
        ("frames/s", lambda s: f"{s['frames_per_s']:,.0f}"),
        ("updates/s", lambda s: f"{s['updates_per_s']:,.1f}"),
        ("samples/s", lambda s: f"{s['samples_per_s']:,.0f}"),
        *((phase, lambda s, p=phase: f"{s['seconds'][p]:.2f} s ({100 * s['fraction'][p]:.1f} %)") for phase in PHASES),
        ("**outside update**", lambda s: f"**{100 * s['outside_update_frac']:.1f} %**"),
    ]
    processes = whole["processes"]
    lines = [
        f"# Throughput report: {report['run']}",
        "",
        f"- date: {report['date']}",
        f"- command: `{' '.join(report['command'])}`",
        f"- machine: {machine['platform']}, {machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads, "
        f"{machine['device']} ({machine['device_name']}), {machine['accelerator']}, {machine['precision']}, "
        f"{machine['strategy']} × {machine['world_size']}",
        "- versions: " + ", ".join(f"{name} {version}" for name, version in report["versions"].items()),
        f"- data: {report['data']['class']} ({report['data']['num_envs']} envs per rank), "
        f"model: {report['model']['class']}",
        f"- this process: {this['wall_s']:.1f} s, {this['frames']:,} frames, {this['updates']:,} updates, "
        f"{this['samples']:,} samples (frames at start: {totals['frames_at_start']:,})",
        f"- whole run: {whole['wall_s']:.1f} s, {whole['frames']:,} frames, {whole['updates']:,} updates in "
        f"{processes} process{'es' if processes > 1 else ''} (a resumed process continues from its checkpoint: "
        "the work an earlier one did after that checkpoint is not counted)",
        "- phases: collect, advantage, buffer_write and sample (the data module), update (loss, backward, clip, "
        "optimizer step), eval and checkpoint (the callbacks), other (the rest: loop, hooks, logging, setup)",
        *_background_lines(report.get("background_phases_s")),
        *_bare_lines(report.get("bare_update"), "steady state" if steady else "this process"),
        "",
        f"| | this process | steady state (after {report['skip_first_steps']} updates) | whole run |",
        "|---|---:|---:|---:|",
        *(f"| {label} | {show(this)} | {show(steady) if steady else 'n/a'} | {show(whole)} |" for label, show in rows),
        *_rank_lines(report.get("per_rank")),
    ]
    return "\n".join(lines) + "\n"


def _rank_lines(ranks: list[dict[str, Any]] | None) -> list[str]:
    if not ranks:
        return []
    lines = ["", "Each rank (this process; the table above is their total):", ""]
    lines += ["| rank | frames | frames/s | updates/s | " + " | ".join(PHASES) + " |"]
    lines += ["|---:|---:|---:|---:|" + "---:|" * len(PHASES)]
    for rank in ranks:
        phases = " | ".join(f"{100 * rank['fraction'][phase]:.1f} %" for phase in PHASES)
        lines.append(
            f"| {rank['rank']} | {rank['frames']:,} | {rank['frames_per_s']:,.0f} | {rank['updates_per_s']:,.1f} | "
            f"{phases} |"
        )
    return lines


def _background_lines(seconds: dict[str, float] | None) -> list[str]:
    if not seconds:
        return []
    phases = ", ".join(f"{phase} {value:.2f} s" for phase, value in seconds.items())
    return [
        f"- prefetch: the data path ran in a background thread beside the updates ({phases} this process); the "
        "training thread's collect is its wait for it"
    ]


def _bare_lines(bare: dict | None, over: str) -> list[str]:
    if not bare:
        return []
    if "pairs" not in bare:
        return [f"- bare update: not timed, its yardstick failed ({bare['error']})"]
    low, high = bare["ratio_range"]
    beside = (
        (f"in {bare['slices']} slices, each" if bare["slices"] > 1 else "in one slice,")
        + " after a stretch of the training loop"
        if bare["pairs"][0]["beside_the_loop"]
        else f"in one slice after the training loop ({over})"
    )
    failed = f"; then its yardstick failed ({bare['error']})" if "error" in bare else ""
    return [
        f"- bare update (the agent's update arithmetic in plain eager PyTorch, {_threads(bare)}, timed {beside}): "
        f"{bare['ms']:.3f} ms (median); the training loop's wall time per update over the same stretches: "
        f"{bare['loop_ms_per_update']:.3f} ms; **{bare['ratio']:.2f}x** the bare update (median of the stretches' "
        f"ratios, range {low:.2f}-{high:.2f}){failed}"
    ]


def _threads(bare: dict) -> str:
    """The torch threads the bare update ran on, as "1 thread" or "2 threads" (the run's; a report from before they
    were recorded ran it on one)."""
    threads = bare.get("threads", 1)
    return f"{threads} thread{'s' if threads != 1 else ''}"

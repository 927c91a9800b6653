"""Frame-based schedules: checkpoint every N frames, evaluate every M frames, and atomic checkpoint writes.

The reference implementations made checkpoints and evaluations rare to save time; here both are knobs counted in
environment frames, which mean the same thing whatever the number of environments, the replay ratio or the batch size.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from checkpoints.files import (
    SUMS,
    kept_path,
    link_atomically,
    remove_stale_temporaries,
    updates_in_name,
)
from compat.lightning import ModelCheckpointSteps, is_local_path
from datamodules.base import RLDataModule


class FrameCheckpoint(ModelCheckpointSteps):
    """Saves ``last.ckpt`` (and, with ``save_top_k``, numbered ones) every ``every_n_frames`` environment frames,
    keeping the ``keep_last`` newest as ``last-step<N>.ckpt``.

    At the start of ``fit`` it removes temporary files left in its folder by killed processes. Before rank 0 writes
    a checkpoint, each rank writes what it keeps beside it (:meth:`RLDataModule.save_beside
    <datamodules.base.RLDataModule.save_beside>`): its replay buffer as a memory-mapped folder
    (``last.ckpt.replay-rank0-step<N>/``) and, on ranks > 0, its data-module state (``last.ckpt.rank1-step<N>``), so a
    checkpoint never exists without the parts it needs; the parts of older checkpoints are deleted once it is in
    place. A run stopped by SIGTERM is checkpointed where it stopped (Lightning stops it between updates).

    Each checkpoint is written as ``last-step<N>.ckpt`` (N: the update), verified, and ``last.ckpt`` is then made
    another name of it (a hard link); the ``keep_last`` newest are kept with their files beside them, so a damaged
    newest one (``--ckpt_path last`` checks each file's SHA-256) still leaves one to resume from.

    Args:
        every_n_frames: frames between checkpoints (counted on rank 0's data module; all ranks collect alike).
        dirpath: folder for the checkpoints; default ``<log_dir>/checkpoints``.
        save_top_k: numbered ``frames=N.ckpt`` checkpoints kept besides ``last.ckpt`` (the most recent ones). 0 by
            default: each comes with a copy of the whole replay buffer (130 MB for Snake-DQN, 1 GB for Mario).
        keep_last: ``last`` checkpoints kept (``last-step<N>.ckpt``, the newest also named ``last.ckpt``), each with
            its replay folders and rank files. 2 by default, so that a damaged newest one never ends the run; the
            disk must hold one more while the next is written. 1: only ``last.ckpt``.
    """

    def __init__(
        self,
        every_n_frames: int = 100_000,
        dirpath: str | None = None,
        save_top_k: int = 0,
        keep_last: int = 2,
    ) -> None:
        if every_n_frames < 1:
            raise ValueError(f"every_n_frames must be >= 1, got {every_n_frames}")
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.keep_last = keep_last
        self._started_at = 0  # the update this fit started from (a resumed one's checkpoint)
        self._written: set[int] = set()  # the updates this fit wrote checkpoints at
        super().__init__(
            dirpath=dirpath,
            filename="frames={frames}",
            monitor="frames",
            mode="max",
            save_top_k=save_top_k,
            save_last=True,
            auto_insert_metric_name=False,
        )
        self.every_n_frames = every_n_frames
        self._saved_slot = 0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit" and trainer.is_global_zero and is_local_path(self.dirpath):
            for path in remove_stale_temporaries(self.dirpath):
                rank_zero_info(f"Removed {path}, a checkpoint being written when its process was killed")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started_at, self._written = trainer.global_step, set()
        # A run folder continued in another place (moved, copied, downloaded): Lightning restores this callback's
        # state only in the folder it was written in, so it would take the `last.ckpt` here for another run's and
        # write `last-v1.ckpt` beside it, leaving `last.ckpt` at the older update for the next `--ckpt_path last`.
        last = str(Path(self.dirpath or "") / self._last_name)
        if trainer.ckpt_path and not self.last_model_path and self.dirpath and self.file_exists(last, trainer):
            self.last_model_path = last

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        frames = trainer.datamodule.frames
        slot = frames // self.every_n_frames
        if slot > self._saved_slot:
            self._saved_slot = slot
            self._save_now(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._save_now(trainer)  # the end of fit: the final weights are always checkpointed

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pass  # checkpoints follow frames, not validation runs

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning raises SIGTERMException only between updates, where the run is as consistent as at a scheduled
        # checkpoint: a preempted run saves and loses nothing. Ctrl-C and errors can land mid-update: nothing is saved.
        if isinstance(exception, SIGTERMException) and trainer.state.fn == TrainerFn.FITTING:
            self._save_now(trainer)
            rank_zero_info(f"SIGTERM: saved {self.last_model_path} at update {trainer.global_step}")

    def _save_now(self, trainer: pl.Trainer) -> None:
        if self.saved_at(trainer.global_step):
            return
        with trainer.datamodule.timer.phase("checkpoint"):  # its own phase in the throughput report
            # The rows logged so far go to disk first: a logger holds them between its writes, and a process killed
            # after this checkpoint would lose them, where the resumed run logs only the updates after it.
            if trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.save()
            candidates = self.monitor_candidates(trainer)
            candidates["frames"] = torch.tensor(trainer.datamodule.frames)
            self.save_top_k_and_last(trainer, candidates)

    def write_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        data = trainer.datamodule if isinstance(trainer.datamodule, RLDataModule) else None
        step = trainer.global_step
        if data is not None:
            data.save_beside(filepath)  # every rank: its large stores, and on ranks > 0 its state
            if trainer.world_size > 1:
                trainer.strategy.barrier("FrameCheckpoint.beside")  # all ranks' parts on disk before the checkpoint
        keeps = self.keep_last > 1 and is_local_path(filepath) and Path(filepath).name == self._last_name
        if not keeps:
            super().write_checkpoint(trainer, filepath)  # rank 0 writes the checkpoint; all ranks wait for it
            kept = {step}
        else:
            # The new checkpoint under its own name first; `last.ckpt` moves to it only once it is written and read
            # back, so the previous one stays whole until then, and afterwards as `last-step<M>.ckpt`.
            super().write_checkpoint(trainer, str(kept_path(filepath, step)))
            if trainer.is_global_zero:
                link_atomically(kept_path(filepath, step), Path(filepath))
                Path(f"{filepath}{SUMS}").unlink(missing_ok=True)  # a keep_last=1 run's: last.ckpt is checked by step
            kept = self._kept_updates(Path(filepath), trainer.global_rank, step)
            if trainer.is_global_zero:
                for path in Path(filepath).parent.glob(kept_path(filepath, "*").name):
                    if updates_in_name(path) not in kept:
                        trainer.strategy.remove_checkpoint(path)
        if data is not None:
            data.remove_beside(filepath, keep_updates=kept)  # older, now superseded

    @property
    def _last_name(self) -> str:
        return f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"

    def _kept_updates(self, last: Path, rank: int, step: int) -> set[int]:
        """The updates whose checkpoints stay: the ``keep_last`` newest of those this fit wrote and those it started
        from or before. Any later one on disk is from a run resumed from an earlier checkpoint (the later one was
        damaged, or not wanted): its future was abandoned. Read from this rank's own files, which every rank has on
        its disk."""
        self._written.add(step)
        names = [*last.parent.glob(kept_path(last, "*").name), *last.parent.glob(f"{last.name}.*rank{rank}-step*")]
        on_disk = {updates_in_name(path) for path in names} - {None}
        updates = {update for update in on_disk if update <= self._started_at} | self._written
        return set(sorted(updates)[-self.keep_last :])

    def delete_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        super().delete_checkpoint(trainer, filepath)
        if isinstance(trainer.datamodule, RLDataModule):
            trainer.datamodule.remove_beside(filepath)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["saved_slot"] = self._saved_slot
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._saved_slot = state_dict.get("saved_slot", 0)


class FrameSchedule(Callback):
    """Runs :meth:`run` every ``every_n_frames`` frames of training, before the first update when ``at_start``, and
    at the end of fit unless it has just run at those frames. Its position is saved in checkpoints, so a resumed run
    runs at the frames the uninterrupted one would have.

    Subclasses implement :meth:`run`; the frames counted are the data module's, summed over ranks where reported.
    """

    def __init__(self, every_n_frames: int, at_start: bool) -> None:
        if every_n_frames < 1:
            raise ValueError(f"every_n_frames must be >= 1, got {every_n_frames}")
        self.every_n_frames = every_n_frames
        self.at_start = at_start
        self._done_slot = -1  # the last multiple of every_n_frames run at (-1: the run has not started)
        self._last_frames = -1  # the frames at the last run

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """What runs on the schedule: each subclass's own (an evaluation, a video)."""
        raise NotImplementedError

    def _run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_frames = trainer.datamodule.frames * trainer.world_size
        self.run(trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._done_slot < 0:
            self._done_slot = 0
            if self.at_start:
                self._run(trainer, pl_module)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        slot = trainer.datamodule.frames // self.every_n_frames
        if slot > self._done_slot:
            self._done_slot = slot
            self._run(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._last_frames != trainer.datamodule.frames * trainer.world_size:
            self._run(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {"done_slot": self._done_slot, "last_frames": self._last_frames}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._done_slot = state_dict["done_slot"]
        self._last_frames = state_dict.get("last_frames", -1)


class PeriodicEvaluation(FrameSchedule):
    """Plays greedy episodes in separate evaluation environments every ``every_n_frames`` frames and at the end.

    Logs ``eval/return_mean`` with its spread over the episodes (``eval/return_std``, ``eval/return_iqm``, the 95 %
    bootstrap interval ``eval/return_ci_low``/``_high``), ``eval/length_mean`` and the env's episode metrics (Snake:
    ``eval/food_mean``), and keeps the whole curve, each evaluation's per-episode returns included, in
    :attr:`history` (the throughput report plots it). Once per run, at its first evaluation,
    it also plays a uniformly random policy on the same boards (``eval/random_return_mean``, ``eval/random_food_mean``
    ...): the baseline the curve is read against, kept in :attr:`random`. Its time is the ``eval`` phase of the data
    module's timer, so the throughput report charges it to evaluation wherever this callback sits in the list.

    History and baseline are saved in checkpoints, so a resumed run continues the same curve, on the same clock
    (``time_s``: seconds of training up to the last checkpoint, plus this process's).

    Args:
        every_n_frames: frames between evaluations.
        episodes: episodes per evaluation; default the data module's ``evaluation.episodes``.
        at_start: also evaluate before the first update (frame 0 of the learning curve).
        random_policy: also measure the random policy once per run.
        stop_at_return: stop training at the first evaluation whose mean return reaches this (a task's "solved"
            threshold: CartPole-v1's 475); None: train to ``max_steps``. The run ends as it would at ``max_steps``:
            its final checkpoint and reports are written. (Lightning's ``EarlyStopping`` watches validation epochs,
            which a frame-based loop does not have.)
    """

    def __init__(
        self,
        every_n_frames: int = 50_000,
        episodes: int | None = None,
        at_start: bool = True,
        random_policy: bool = True,
        stop_at_return: float | None = None,
    ) -> None:
        super().__init__(every_n_frames, at_start)
        if episodes is not None and episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        self.episodes = episodes
        self.random_policy = random_policy
        self.stop_at_return = stop_at_return
        self.history: list[dict[str, float]] = []
        self.random: dict[str, float] = {}  # the random policy's eval/random_* metrics, once measured
        self._elapsed_at_start = 0.0  # seconds of training before this process (restored from a checkpoint)
        self._start_time = time.perf_counter()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start_time = time.perf_counter() - self._elapsed_at_start

    def measure(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        """The evaluation itself (the model is in eval mode): metrics without the ``eval/`` prefix."""
        return trainer.datamodule.evaluate(pl_module.greedy_policy(), self.episodes)

    def measure_random(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        """The same evaluation with uniformly random actions: metrics without prefix (logged as ``eval/random_*``)."""
        return trainer.datamodule.evaluate_random(self.episodes)

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with trainer.datamodule.timer.phase("eval"):
            was_training = pl_module.training
            pl_module.eval()
            metrics = {f"eval/{key}": value for key, value in self.measure(trainer, pl_module).items()}
            episode_returns = list(getattr(trainer.datamodule, "last_episode_returns", []))
            if self.random_policy and not self.random:
                metrics.update(
                    {f"eval/random_{key}": value for key, value in self.measure_random(trainer, pl_module).items()}
                )
            pl_module.train(was_training)
            if trainer.world_size > 1:  # each rank evaluated its own episodes: report the mean over ranks
                values = torch.tensor(list(metrics.values()), dtype=torch.float64, device=pl_module.device)
                values = trainer.strategy.reduce(values, reduce_op="mean")
                metrics = dict(zip(metrics, values.tolist(), strict=False))
            if not self.random:
                self.random = {key: value for key, value in metrics.items() if key.startswith("eval/random_")}
            frames = trainer.datamodule.frames * trainer.world_size
            row = {
                "frames": frames,
                "updates": trainer.global_step,
                "time_s": time.perf_counter() - self._start_time,
            }
            self.history.append({**row, **metrics, "episode_returns": episode_returns})
            if self.stop_at_return is not None and metrics["eval/return_mean"] >= self.stop_at_return:
                trainer.should_stop = True
                rank_zero_info(
                    f"Evaluation return {metrics['eval/return_mean']:.4g} >= stop_at_return {self.stop_at_return:g} "
                    f"at {frames:,} frames: training stops"
                )
            trainer.callback_metrics.update({key: torch.tensor(value) for key, value in metrics.items()})
            if trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.log_metrics(
                        {**metrics, "eval/frames": frames, "eval/time_s": row["time_s"]}, step=trainer.global_step
                    )

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "history": self.history,
            "random": self.random,
            "elapsed_s": time.perf_counter() - self._start_time,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.history = list(state_dict["history"])
        if "last_frames" not in state_dict and self.history:  # checkpoints from before the schedule kept it
            self._last_frames = self.history[-1]["frames"]
        self.random = dict(state_dict.get("random", {}))
        # Checkpoints from before the clock was saved: continue from the last evaluation's time.
        self._elapsed_at_start = state_dict.get("elapsed_s", self.history[-1]["time_s"] if self.history else 0.0)

"""EvaluationFeed: a run's evaluations, each written out as it happens, for a process that watches the run.

``python -m app tune`` (app/tune.py) adds it to every trial's ``fit`` (``--trainer.callbacks+=
callbacks.tuning.EvaluationFeed``) and reads the file while the trial trains: each evaluation becomes an intermediate
value of the Optuna trial, and a trial the pruner stops is sent SIGTERM (it then checkpoints and exits between two
updates, as any preempted run does). The callback itself knows nothing of Optuna: it only appends lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from callbacks.schedule import PeriodicEvaluation

#: The file in the run's folder (``trainer.log_dir``), one JSON object per evaluation.
FEED = "evaluations.jsonl"


class EvaluationFeed(Callback):
    """Appends every evaluation of the run's :class:`~callbacks.schedule.PeriodicEvaluation` to
    ``<log_dir>/evaluations.jsonl`` as soon as it is made: ``frames``, ``step`` (the scheduled frame count the
    evaluation stands for, ``frames`` rounded down to a multiple of ``every_n_frames``, so runs that collect in
    rounds of different sizes report at the same steps), ``updates``, ``time_s`` and ``return_mean``.

    Each line is written whole and flushed, so a reader sees complete lines (it skips a last one without its newline).
    """

    def __init__(self) -> None:
        self._evaluation: PeriodicEvaluation | None = None
        self._path: Path | None = None
        self._written = 0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        evaluations = [callback for callback in trainer.callbacks if isinstance(callback, PeriodicEvaluation)]
        if not evaluations:
            raise ValueError(
                "EvaluationFeed needs a callbacks.schedule.PeriodicEvaluation in --trainer.callbacks (the evaluations "
                "it feeds)"
            )
        self._evaluation = evaluations[0]
        if trainer.is_global_zero and trainer.log_dir is not None:
            self._path = Path(trainer.log_dir) / FEED
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._path.write_text("")
            self._written = 0  # a resumed run restores the curve so far: it is written again, whole

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._flush()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush()  # the final evaluation (PeriodicEvaluation's on_train_end ran before this one's)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush()

    def _flush(self) -> None:
        if self._path is None or self._evaluation is None:
            return
        history = self._evaluation.history
        if len(history) <= self._written:
            return
        every = self._evaluation.every_n_frames
        with open(self._path, "a") as file:
            for point in history[self._written :]:
                record = {
                    "frames": point["frames"],
                    "step": point["frames"] // every * every,
                    "updates": point["updates"],
                    "time_s": point["time_s"],
                    "return_mean": point["eval/return_mean"],
                }
                file.write(json.dumps(record) + "\n")
            file.flush()
        self._written = len(history)

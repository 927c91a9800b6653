"""TrackingRuns: each tracking backend's run identity in the checkpoint, and the run's report files as artifacts.

The CLI adds it when a TensorBoard, W&B or MLflow logger is configured (:mod:`app.tracking`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

from callbacks.throughput import ThroughputReport

#: The checkpoint's entry that holds the backends' runs: ``{"tensorboard": version, "wandb": id, "mlflow": run_id}``.
CHECKPOINT_KEY = "tracking_runs"
#: Files of the run folder logged as artifacts besides the throughput report's (a video callback writes ``videos/``).
RUN_FILES = ("config.yaml",)
VIDEOS = "videos/*.mp4"


class TrackingRuns(Callback):
    """Keeps the tracking backends' runs in every checkpoint, so that ``--ckpt_path`` continues them, and at the end
    of ``fit`` logs the throughput report (``throughput.json``, ``throughput.md``, the phase plot), the learning
    curve, ``config.yaml`` and any ``videos/*.mp4`` of the run folder to the backends that take files: W&B (the run's
    files), MLflow (the run's artifacts); TensorBoard gets the learning curve as an image.

    A W&B run is finished after its files are logged (Lightning leaves it open), so that an offline run's files are
    complete when ``fit`` returns.
    """

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        runs = run_identities(trainer.loggers)
        if runs:
            checkpoint[CHECKPOINT_KEY] = runs

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After ThroughputReport's on_fit_end (the CLI adds this callback after the config's), before the loggers are
        # finalized (Lightning's teardown).
        if not trainer.is_global_zero:
            return
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        files = report_files(trainer, folder)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                run = logger.experiment
                for path in files:
                    run.save(str(path), base_path=str(_base(path, folder)), policy="now")
                run.finish()
            elif isinstance(logger, MLFlowLogger):
                for path in files:
                    relative = path.parent.relative_to(folder) if path.is_relative_to(folder) else Path()
                    artifact_path = None if relative == Path() else relative.as_posix()
                    logger.experiment.log_artifact(logger.run_id, str(path), artifact_path=artifact_path)
            elif isinstance(logger, TensorBoardLogger):
                curve = next((path for path in files if path.name == "learning_curve.png"), None)
                if curve is not None:
                    import matplotlib.image

                    image = matplotlib.image.imread(curve)[..., :3]  # RGBA → RGB, floats in [0, 1]
                    logger.experiment.add_image("learning_curve", image, trainer.global_step, dataformats="HWC")
                    logger.experiment.flush()


def run_identities(loggers: list[Logger]) -> dict[str, Any]:
    """Each backend's run: TensorBoard's version, the W&B run id, the MLflow run id (the first logger of each)."""
    runs: dict[str, Any] = {}
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            runs.setdefault("tensorboard", logger.version)
        elif isinstance(logger, WandbLogger) and logger.version is not None:
            runs.setdefault("wandb", logger.version)
        elif isinstance(logger, MLFlowLogger) and logger.run_id is not None:
            runs.setdefault("mlflow", logger.run_id)
    return runs


def report_files(trainer: pl.Trainer, folder: Path) -> list[Path]:
    """The files of a finished run worth keeping with its backend runs, those that exist."""
    files: list[Path] = []
    for callback in trainer.callbacks:
        if isinstance(callback, ThroughputReport):
            files += callback.files
    files += [folder / name for name in RUN_FILES]
    files += sorted(folder.glob(VIDEOS))
    unique = dict.fromkeys(path for path in files if path.is_file())
    return list(unique)


def _base(path: Path, folder: Path) -> Path:
    return folder if path.is_relative_to(folder) else path.parent

"""A run's folder, and how ``--ckpt_path`` continues a run in it.

A run lives in one folder: ``<save_dir>/<name>/version_N/`` with the CSV logger (``config.yaml``, ``metrics.csv``,
``checkpoints/``, the throughput report, the learning curve), or the checkpoint folder alone with the logger off.
Resuming continues that folder rather than starting the next ``version_N``:

- ``--ckpt_path last`` is resolved here, never by Lightning (whose lookup searches only the new run's own, empty
  folder): the newest ``checkpoints/last.ckpt`` among the config's runs; nothing there is an error, not a fresh start.
  Its checkpoints are checked (readable, their SHA-256 and their files beside them): a damaged one is skipped, with
  one warning line, for the newest one kept before it (``last-step<N>.ckpt``, ``FrameCheckpoint``'s ``keep_last``).
- The logger is pointed at the run the checkpoint belongs to (its ``version``) before it creates any folder.
- Lightning's ``CSVLogger`` deletes an existing ``metrics.csv``; a run continued in place gets
  :class:`ResumableCSVLogger` instead, which keeps the rows logged up to the checkpoint and appends after them.
- :class:`SaveRunConfig` writes ``config.yaml`` into the run's folder, or with the logger off into the checkpoint
  folder, never into the current folder.
"""

from __future__ import annotations

import csv
import importlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonargparse import Namespace
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from checkpoints.files import checkpoint_damage
from checkpoints.resume import LAST, last_checkpoints, newest_sound
from compat.lightning import (
    ExperimentWriterLogDirCheck,
    is_local_path,
    set_csv_logger_writer,
    tensorboard_available,
)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

_LIGHTNING_CSV = "lightning.pytorch.loggers.CSVLogger"


def resolve_resume(config: Namespace, subcommand: str) -> Path | None:
    """Turn ``config.ckpt_path`` into a file that exists, and, for ``fit``, point the logger at that file's run.

    ``config`` (the subcommand's part of the parsed config) is changed in place before anything is instantiated, so
    the run's ``config.yaml`` records the checkpoint and the version that were actually used.

    Returns:
        The checkpoint to load, or None for a fresh run (or a ``ckpt_path`` that Lightning resolves itself).

    Raises:
        ValueError: a one-line message naming ``--ckpt_path`` when there is nothing to resume.
    """
    requested = config.get("ckpt_path")
    if requested is None or requested in ("best", "hpc", "registry") or not is_local_path(requested):
        return None  # a fresh run, or a path Lightning resolves (best checkpoint, SLURM, remote stores)
    trainer = config.trainer
    logger = _folder_logger(trainer)
    if requested == "last":
        folders, looked_in = _checkpoint_folders(trainer, logger)
        candidates = [folder for folder in folders if last_checkpoints(folder)]
        if not candidates:
            raise ValueError(f"--ckpt_path last: no {looked_in} — nothing to resume")
        folder = max(candidates, key=lambda folder: max(path.stat().st_mtime for path in last_checkpoints(folder)))
        checkpoint = newest_sound(folder, beside=subcommand == "fit")
    else:
        checkpoint = Path(requested)
        if not checkpoint.is_file():
            raise ValueError(f"--ckpt_path {requested}: no such checkpoint file")
        damage = checkpoint_damage(checkpoint, beside=subcommand == "fit")
        if damage is not None:
            raise ValueError(f"--ckpt_path {requested}: {damage}")
    config["ckpt_path"] = str(checkpoint)
    run_dir = _run_of(checkpoint, logger)
    if subcommand != "fit" or run_dir is None:
        return checkpoint  # `validate` reports into a folder of its own; a foreign checkpoint starts a new run folder
    init_args = logger.init_args
    if init_args.get("version") is None:  # an explicit --trainer.logger.init_args.version forks the run there
        match = re.fullmatch(r"version_(\d+)", run_dir.name)
        init_args["version"] = int(match[1]) if match else run_dir.name
    if logger.class_path in (_LIGHTNING_CSV, f"{CSVLogger.__module__}.CSVLogger"):
        logger.class_path = f"{__name__}.ResumableCSVLogger"  # same arguments; keeps metrics.csv instead of deleting
    return checkpoint


def _folder_logger(trainer: Namespace) -> Namespace | None:
    """The config node of the logger whose folders hold the runs (``save_dir/name/version``), or None without one."""
    logger = trainer.get("logger")
    if logger is None or logger is True:
        # Lightning's default logger, spelled out so that its version can be set like any other's.
        default = TensorBoardLogger if tensorboard_available() else CSVLogger
        logger = Namespace(
            class_path=f"{default.__module__}.{default.__name__}",
            init_args=Namespace(save_dir=trainer.get("default_root_dir") or ".", name="lightning_logs", version=None),
        )
        trainer["logger"] = logger
    if isinstance(logger, list):
        logger = logger[0] if logger else None  # checkpoints follow the first logger's folder, as in Lightning
    if not isinstance(logger, Namespace):
        return None
    if not issubclass(import_class(logger.class_path), (CSVLogger, TensorBoardLogger)):
        return None
    return logger


def _checkpoint_folders(trainer: Namespace, logger: Namespace | None) -> tuple[list[Path], str]:
    """Where this config's runs keep ``last.ckpt``, and how to say so in an error message."""
    dirpath = _checkpoint_dirpath(trainer)
    if dirpath is not None:
        return [Path(dirpath)], f"{LAST} in {dirpath}"
    if logger is None:
        folder = Path(trainer.get("default_root_dir") or ".") / "checkpoints"
        return [folder], f"{LAST} in {folder}"
    root = _logger_root(logger)
    version = logger.init_args.get("version")
    if version is not None:
        folder = root / (version if isinstance(version, str) else f"version_{version}")
        return [folder / "checkpoints"], f"checkpoints/{LAST} in {folder}"
    return sorted(root.glob("*/checkpoints")), f"checkpoints/{LAST} in {root}/version_*"


def _run_of(checkpoint: Path, logger: Namespace | None) -> Path | None:
    """The logger's run folder that ``checkpoint`` belongs to (``<root>/<version>/checkpoints/x.ckpt``), if any."""
    if logger is None or checkpoint.parent.name != "checkpoints":
        return None
    run_dir = checkpoint.resolve().parent.parent
    return run_dir if run_dir.parent == _logger_root(logger).resolve() else None


def _logger_root(logger: Namespace) -> Path:
    init_args = logger.init_args
    return Path(init_args.get("save_dir") or ".") / (init_args.get("name") or "")


def _checkpoint_dirpath(trainer: Namespace) -> str | None:
    for callback in trainer.get("callbacks") or []:
        if isinstance(callback, Namespace) and issubclass(import_class(callback.class_path), ModelCheckpoint):
            return (callback.get("init_args") or Namespace()).get("dirpath")
    return None


def import_class(class_path: str) -> type:
    """The class a config's ``class_path`` names."""
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class ResumableCSVLogger(CSVLogger):
    """Lightning's ``CSVLogger``, able to continue the ``metrics.csv`` of the run it resumes.

    Lightning's writer deletes an existing ``metrics.csv`` when its folder is reused. After :meth:`continue_after`
    (the CLI calls it when ``--ckpt_path`` continues a run in place), this one keeps the rows that describe the run up
    to the checkpoint, drops those the interrupted process logged after it (they are logged again by this one), and
    appends, so the file holds the whole run once. Without it, it behaves exactly like ``CSVLogger``.

    Args: those of ``lightning.pytorch.loggers.CSVLogger``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._continue_after: int | None = None

    def continue_after(self, global_step: int) -> None:
        """Continue the existing ``metrics.csv`` from a checkpoint written at update ``global_step``."""
        self._continue_after = global_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._continue_after is not None:
            set_csv_logger_writer(self, lambda: _ContinuedExperimentWriter(self.log_dir, self._continue_after))
        return super().experiment


class _ContinuedExperimentWriter(ExperimentWriterLogDirCheck):
    """Lightning's CSV writer, keeping the rows of an existing ``metrics.csv`` up to an update, and its columns."""

    def __init__(self, log_dir: str, global_step: int) -> None:
        self._global_step = global_step
        super().__init__(log_dir)

    def check_log_dir(self, fs: AbstractFileSystem) -> None:  # Lightning's deletes metrics.csv here
        if not fs.isfile(self.metrics_file_path):
            return
        with fs.open(self.metrics_file_path, "r", newline="") as file:
            reader = csv.DictReader(file)
            rows, self.metrics_keys = list(reader), list(reader.fieldnames or [])
        kept = [row for row in rows if self._before_checkpoint(row)]
        if len(kept) < len(rows):
            temporary = f"{self.metrics_file_path}.tmp-{os.getpid()}"
            with fs.open(temporary, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(kept)
            fs.mv(temporary, self.metrics_file_path)  # a rename: the old file stays whole until replaced

    def _before_checkpoint(self, row: dict[str, str]) -> bool:
        # The trainer logs an update's metrics (rows with an `epoch`) at the number of updates *before* it, so its row
        # at the checkpoint's step S belongs to update S + 1, which the resumed run repeats. Callbacks log directly at
        # `trainer.global_step` (evaluations: no `epoch`), so their row at S measured the checkpointed weights.
        try:
            step = int(float(row["step"]))
        except (KeyError, TypeError, ValueError):
            return True  # not a row this logger wrote: leave it alone
        return step < self._global_step or (step == self._global_step and not row.get("epoch"))


class SaveRunConfig(SaveConfigCallback):
    """Saves the resolved config into the run's folder: the logger's, or with the logger off the checkpoint folder.

    Lightning's callback writes into ``trainer.log_dir``, which with the logger off is the current folder (or
    ``default_root_dir``); there it would overwrite the ``config.yaml`` of any other run started from the same place.
    With neither a logger nor checkpoints, or outside ``fit``, there is no run folder and nothing is written.

    A resumed run writes it with its first checkpoint, so the folder's ``config.yaml`` always describes its checkpoints:
    a checkpoint that does not fit the run resuming it (another environment's, say) leaves it as it was.
    """

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or not self._resuming:
            self._save(trainer, pl_module, stage)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self._resuming and not self.already_saved:
            self._save(trainer, pl_module, "fit")

    @property
    def _resuming(self) -> bool:
        return self.config.get("ckpt_path") is not None

    def _save(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.loggers or self.already_saved:
            super().setup(trainer, pl_module, stage)
            return
        self.already_saved = True
        checkpoint = trainer.checkpoint_callback
        if stage != "fit" or checkpoint is None or not trainer.is_global_zero:
            return
        # ModelCheckpoint resolves its folder in its own setup, which runs after this one; this is its rule.
        folder = checkpoint.dirpath or os.path.join(trainer.default_root_dir, "checkpoints")
        get_filesystem(folder).makedirs(folder, exist_ok=True)
        path = os.path.join(folder, self.config_filename)
        self.parser.save(self.config, path, skip_none=False, overwrite=self.overwrite, multifile=self.multifile)

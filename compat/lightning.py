"""Lightning's private API: the loop's counters, the optimizer wrapper's step hooks, and the internals of the
checkpoint callback, the CSV logger and the CLI that the project's subclasses of them build on.

- the model runs its own fused optimizer step (:mod:`modules.optim`) yet keeps the bookkeeping that
  ``LightningOptimizer.step`` does around a step (``_on_before_step``/``_on_after_step``: ``global_step``, the
  profiler), and with prefetch takes several updates in one Lightning step, which the epoch loop must count
  (``_batches_that_stepped``: metrics are logged at that count);
- ``FrameCheckpoint`` saves on a frame schedule with ``ModelCheckpoint``'s own steps and writes the data module's
  files around its write and delete (:class:`ModelCheckpointSteps`);
- ``ResumableCSVLogger`` continues an existing ``metrics.csv`` where Lightning's writer deletes it
  (:func:`set_csv_logger_writer`, :class:`ExperimentWriterLogDirCheck`);
- several ranks stop on SIGTERM at the same update (:func:`record_sigterm_only`, :func:`stop_on_sigterm`): Lightning
  2.6's handler broadcasts from inside the signal handler, a collective that meets whatever collective the other ranks
  are in, and each rank also stops on its own flag (Lightning issue 20806);
- small helpers: a path's protocol, whether TensorBoard is installed, a CLI config value, the progress bar's ``leave``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import lightning.pytorch as pl
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

if TYPE_CHECKING:  # annotations only: importing compat.lightning costs no more than what uses it imports
    from fsspec import AbstractFileSystem
    from jsonargparse import Namespace
    from lightning.pytorch.callbacks import TQDMProgressBar
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.core.optimizer import LightningOptimizer
    from lightning.pytorch.loggers import CSVLogger
    from torch import Tensor

T = TypeVar("T")

DISTRIBUTION = "lightning"
#: The Lightning version every function here was written against (tests/app/test_compat.py: same minor, any patch).
WRITTEN_AGAINST = "2.6.6"

#: Every private name used here: (where it lives, the name, the function or class of this module that uses it).
PRIVATE_API = (
    ("lightning.fabric.utilities.cloud_io", "_is_local_file_protocol", "is_local_path"),
    ("lightning.fabric.loggers.tensorboard", "_TENSORBOARD_AVAILABLE", "tensorboard_available"),
    ("lightning.fabric.loggers.tensorboard", "_TENSORBOARDX_AVAILABLE", "tensorboard_available"),
    ("lightning.pytorch.cli.LightningCLI", "_get", "cli_config_get"),
    ("lightning.pytorch.callbacks.TQDMProgressBar", "_leave", "progress_bar_leaves"),
    ("lightning.pytorch.core.optimizer.LightningOptimizer", "_on_before_step", "optimizer_step_with_hooks"),
    ("lightning.pytorch.core.optimizer.LightningOptimizer", "_on_after_step", "optimizer_step_with_hooks"),
    (
        "lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop",
        "_batches_that_stepped",
        "count_batches_stepped",
    ),
    ("lightning.pytorch.loggers.CSVLogger", "_experiment", "set_csv_logger_writer"),
    ("lightning.pytorch.loggers.CSVLogger", "_fs", "set_csv_logger_writer"),
    ("lightning.pytorch.loggers.csv_logs.ExperimentWriter", "_check_log_dir_exists", "ExperimentWriterLogDirCheck"),
    ("lightning.pytorch.loggers.csv_logs.ExperimentWriter", "_fs", "ExperimentWriterLogDirCheck"),
    ("lightning.pytorch.callbacks.ModelCheckpoint", "_last_global_step_saved", "ModelCheckpointSteps"),
    ("lightning.pytorch.callbacks.ModelCheckpoint", "_monitor_candidates", "ModelCheckpointSteps"),
    ("lightning.pytorch.callbacks.ModelCheckpoint", "_save_topk_checkpoint", "ModelCheckpointSteps"),
    ("lightning.pytorch.callbacks.ModelCheckpoint", "_save_last_checkpoint", "ModelCheckpointSteps"),
    ("lightning.pytorch.callbacks.ModelCheckpoint", "_save_checkpoint", "ModelCheckpointSteps"),
    ("lightning.pytorch.callbacks.ModelCheckpoint", "_remove_checkpoint", "ModelCheckpointSteps"),
    ("lightning.pytorch.callbacks.ModelCheckpoint", "_every_n_train_steps", "checkpoint_step_intervals"),
    ("lightning.pytorch.Trainer", "_signal_connector", "record_sigterm_only, stop_on_sigterm"),
)


def is_local_path(path: Any) -> bool:
    """Whether ``path`` is on the local filesystem (no ``s3://``-like protocol), as Lightning decides it."""
    # lightning.fabric.utilities.cloud_io._is_local_file_protocol (private; lightning 2.6.6).
    return _is_local_file_protocol(path)


def tensorboard_available() -> bool:
    """Whether ``TensorBoardLogger`` can write (tensorboard or tensorboardX installed), as Lightning decides it."""
    # lightning.fabric.loggers.tensorboard._TENSORBOARD(X)_AVAILABLE (private; lightning 2.6.6); imported here, on
    # use, as before.
    from lightning.fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE, _TENSORBOARDX_AVAILABLE

    return bool(_TENSORBOARD_AVAILABLE or _TENSORBOARDX_AVAILABLE)


def cli_config_get(cli: LightningCLI, config: Namespace, key: str, default: Any = None) -> Any:
    """``config[key]``, looked up inside the CLI's subcommand when there is one."""
    # LightningCLI._get (private; lightning 2.6.6).
    return cli._get(config, key, default)


def progress_bar_leaves(bar: TQDMProgressBar) -> bool:
    """The ``leave`` the progress bar was built with: whether its bars stay on screen when their epoch ends."""
    # TQDMProgressBar._leave (private; lightning 2.6.6).
    return bar._leave


def optimizer_step_with_hooks(optimizer: LightningOptimizer, step: Callable[[], T]) -> T:
    """Run ``step`` in place of ``optimizer.step()``, with the bookkeeping Lightning does around a step (the trainer's
    ``global_step``, the profiler's record) but without its closure machinery; return what ``step`` returns."""
    # LightningOptimizer._on_before_step, LightningOptimizer._on_after_step (private; lightning 2.6.6): what
    # LightningOptimizer.step calls before and after the wrapped optimizer's step.
    optimizer._on_before_step()
    result = step()
    optimizer._on_after_step()
    return result


def backward_is_plain(trainer: pl.Trainer, module: pl.LightningModule) -> bool:
    """Whether ``module.manual_backward(loss)`` would do no more than ``loss.backward()``: Lightning 2.6 runs around it
    the strategy's ``pre_backward``/``post_backward`` (DDP's gradient all-reduce), the precision plugin's (scaling),
    every callback's and the module's ``on_before_backward``/``on_after_backward`` hooks (each callback's under the
    profiler) and the module's ``backward``: plain when the strategy is one device's, the precision full, the
    profiler Lightning's pass-through and none of those hooks or ``backward`` overridden. Each hook call costs its
    Python whether the hook does anything or not, twice per update on a loop of small ones."""
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.profilers import PassThroughProfiler
    from lightning.pytorch.strategies import SingleDeviceStrategy

    hooks = ("on_before_backward", "on_after_backward")
    if type(trainer.strategy) is not SingleDeviceStrategy or type(trainer.precision_plugin) is not Precision:
        return False
    if type(trainer.profiler) is not PassThroughProfiler:
        return False
    if type(module).backward is not pl.LightningModule.backward:
        return False
    if any(getattr(type(module), hook) is not getattr(pl.LightningModule, hook) for hook in hooks):
        return False
    return all(getattr(type(c), hook) is getattr(pl.Callback, hook) for c in trainer.callbacks for hook in hooks)


def checkpoint_step_intervals(trainer: pl.Trainer) -> list[int]:
    """The ``every_n_train_steps`` of the trainer's ``ModelCheckpoint`` callbacks that save on a step schedule."""
    # ModelCheckpoint._every_n_train_steps (private; lightning 2.6.6): the interval given to its constructor.
    return [n for n in (getattr(c, "_every_n_train_steps", 0) for c in trainer.checkpoint_callbacks) if n and n > 0]


def record_sigterm_only(trainer: pl.Trainer, record: Callable[[], None]) -> None:
    """From now until fit ends, SIGTERM on this rank calls ``record`` and passes the signal on to the processes
    Lightning's launcher started, as Lightning's handler does, without its broadcast and without stopping this rank
    alone. Lightning restores the handlers it found when fit ends."""
    # Trainer._signal_connector (private; lightning 2.6.6): the launcher forwarding of its handler.
    connector = trainer._signal_connector

    def handler(signum: int, _frame: Any) -> None:
        if not connector.received_sigterm and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)
        record()

    signal.signal(signal.SIGTERM, handler)


def stop_on_sigterm(trainer: pl.Trainer) -> None:
    """Stop this rank at the end of the current update, as Lightning stops on SIGTERM (``SIGTERMException``)."""
    # Trainer._signal_connector (private; lightning 2.6.6): the flag its loops read after each update.
    trainer._signal_connector.received_sigterm = True


def count_batches_stepped(trainer: pl.Trainer, n: int) -> None:
    """Add ``n`` to the batches the epoch loop counts as having stepped (metrics are logged at that count)."""
    # _TrainingEpochLoop._batches_that_stepped (private; lightning 2.6.6): one per training_step that stepped.
    trainer.fit_loop.epoch_loop._batches_that_stepped += n


def set_csv_logger_writer(logger: CSVLogger, make_writer: Callable[[], ExperimentWriter]) -> None:
    """Give ``logger`` the writer ``make_writer()`` returns, where it would build its own on first use: its root
    folder is made first, as the logger makes it before building its own. Nothing when it already has a writer."""
    # CSVLogger._experiment, CSVLogger._fs (private; lightning 2.6.6): the writer its `experiment` property builds
    # once, and the filesystem of its root folder.
    if logger._experiment is None:
        logger._fs.makedirs(logger.root_dir, exist_ok=True)
        logger._experiment = make_writer()


class ExperimentWriterLogDirCheck(ExperimentWriter):
    """Lightning's CSV writer with the check it makes of its folder at construction (Lightning's deletes an existing
    ``metrics.csv``) open to subclasses: :meth:`check_log_dir`, given the writer's filesystem."""

    # ExperimentWriter._check_log_dir_exists, ExperimentWriter._fs (private; lightning 2.6.6): the check its
    # constructor calls before making the folder, and the filesystem of its folder.
    def _check_log_dir_exists(self) -> None:
        self.check_log_dir(self._fs)

    def check_log_dir(self, fs: AbstractFileSystem) -> None:
        """Called once by the constructor, before the log folder is made. Default: Lightning's check."""
        super()._check_log_dir_exists()


class ModelCheckpointSteps(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` with the steps a schedule of its own needs under public names, and its
    write and delete of a checkpoint file open to subclasses (:meth:`write_checkpoint`, :meth:`delete_checkpoint`)."""

    def saved_at(self, global_step: int) -> bool:
        """Whether the last checkpoint written was written at update ``global_step``."""
        # ModelCheckpoint._last_global_step_saved (private; lightning 2.6.6).
        return self._last_global_step_saved == global_step

    def monitor_candidates(self, trainer: pl.Trainer) -> dict[str, Tensor]:
        """The metrics a checkpoint's name and the top-k ranking may use (the logged ones, epoch and step)."""
        # ModelCheckpoint._monitor_candidates (private; lightning 2.6.6).
        return self._monitor_candidates(trainer)

    def save_top_k_and_last(self, trainer: pl.Trainer, candidates: dict[str, Tensor]) -> None:
        """Save the top-k checkpoint (with ``save_top_k``) and ``last.ckpt`` (with ``save_last``), as
        ``ModelCheckpoint`` does when its own schedule is due."""
        # ModelCheckpoint._save_topk_checkpoint, ModelCheckpoint._save_last_checkpoint (private; lightning 2.6.6).
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    # ModelCheckpoint._save_checkpoint (private; lightning 2.6.6): every checkpoint file is written through it.
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        self.write_checkpoint(trainer, filepath)

    def write_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        """Write the checkpoint file ``filepath`` (all ranks call it; rank 0 writes). Subclasses extend it."""
        super()._save_checkpoint(trainer, filepath)

    # ModelCheckpoint._remove_checkpoint (private; lightning 2.6.6): every checkpoint file is deleted through it.
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        self.delete_checkpoint(trainer, filepath)

    def delete_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        """Delete the checkpoint file ``filepath``. Subclasses extend it."""
        super()._remove_checkpoint(trainer, filepath)

"""Lightning's checkpoint plugin that writes through :mod:`checkpoints.files`: atomically, with the file's SHA-256."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from checkpoints.files import SUMS, save_atomically, write_sums
from compat.lightning import is_local_path


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file in the same folder, then renames it into place, with its SHA-256
    in ``<name>.sha256`` beside it.

    A rename within one filesystem is atomic, so a run killed mid-write leaves the previous ``last.ckpt`` intact
    rather than a truncated one. The temporary file (``.<name>.tmp-<pid>``) of a process killed outright (``kill -9``)
    stays behind; :func:`~checkpoints.files.remove_stale_temporaries` deletes those of dead processes when the next fit
    starts. The free space is checked first and the file is read back before the rename: a full disk or a failed write
    is a :class:`~checkpoints.files.CheckpointWriteError` naming the folder, with nothing replaced.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if not is_local_path(path):
            super().save_checkpoint(checkpoint, path, storage_options)  # remote stores have their own semantics
            return
        path = Path(path)
        digest = save_atomically(checkpoint, path, verify=True)
        write_sums(path.with_name(path.name + SUMS), {path.name: digest})

    def remove_checkpoint(self, path: str | Path) -> None:
        super().remove_checkpoint(path)
        if is_local_path(path):
            Path(f"{path}{SUMS}").unlink(missing_ok=True)

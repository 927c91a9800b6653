"""The files a data module keeps beside a checkpoint: their names, and writing them so that a kill never leaves half.

That state is per rank: with DDP each rank explores with its own seed, environments and store. Lightning writes only
rank 0's into the checkpoint, so every other rank writes its own file beside it (named by :func:`rank_state_path`).
Stores too large to pickle into a checkpoint (replay buffers) go beside it as memory-mapped folders
(:func:`beside_path`), written under a temporary name and renamed into place (:func:`write_folder_atomically`).
TensorDicts go into checkpoints as plain nested dicts (:func:`to_plain`), so they load with ``weights_only=True``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

TEMPORARY_MARK = ".tmp-"  # files and folders being written: .<name>.tmp-<pid of the writing process>


def rank_state_path(checkpoint_path: str | Path, rank: int, updates: int | None) -> Path:
    """The file beside a checkpoint that holds rank ``rank``'s data-module state, written at update ``updates``.

    The update is part of the name so that a run killed between writing the ranks' files and the checkpoint itself
    never pairs a checkpoint with newer files: the older ones are deleted only once the newer checkpoint is in place.
    """
    return Path(f"{checkpoint_path}.rank{rank}-step{updates}")


def beside_path(checkpoint_path: str | Path, kind: str, rank: int, updates: int) -> Path:
    """A folder beside a checkpoint holding rank ``rank``'s store ``kind`` (e.g. ``replay``) at update ``updates``:
    ``last.ckpt.replay-rank0-step1200``. Named like :func:`rank_state_path`, for the same reason."""
    return Path(f"{checkpoint_path}.{kind}-rank{rank}-step{updates}")


def remove_path(path: Path) -> None:
    """Delete ``path``, a file or a folder with everything in it (nothing if it is gone already)."""
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def write_folder_atomically(folder: Path, write: Callable[[Path], None]) -> None:
    """``write(temporary)`` fills a temporary folder beside ``folder``, whose files are then flushed to disk and
    which is renamed into place (one rename: a process killed meanwhile leaves either no folder or a whole one; its
    temporary is deleted by ``FrameCheckpoint`` when the next fit starts)."""
    temporary = folder.with_name(f".{folder.name}{TEMPORARY_MARK}{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir(parents=True)
        write(temporary)
        for file in temporary.rglob("*"):
            if file.is_file():
                descriptor = os.open(file, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)
        if folder.exists():  # the same update written again (a run resumed from an earlier checkpoint)
            shutil.rmtree(folder)
        os.replace(temporary, folder)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def to_plain(td: TensorDictBase | None) -> dict | None:
    """A TensorDict as nested dicts of tensors, so checkpoints stay loadable with ``weights_only=True``."""
    return None if td is None else td.to_dict()


def from_plain(data: dict | None, batch_dims: int, device: torch.device) -> TensorDictBase | None:
    return None if data is None else TensorDict.from_dict(data, batch_dims=batch_dims, device=device)

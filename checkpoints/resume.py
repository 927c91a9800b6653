"""Which checkpoint a resume loads: the newest of a run's ``last`` checkpoints that is as it was written (its SHA-256
and the files beside it checked), the ones skipped named in one warning line; and what can be read of a checkpoint
without loading its tensors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from checkpoints.files import checkpoint_damage, kept_path, updates_in_name

#: The name of a run's newest checkpoint (a hard link to the newest ``last-step<N>.ckpt``).
LAST = "last.ckpt"


def last_checkpoints(folder: Path) -> list[Path]:
    """The ``last`` checkpoints in ``folder``, newest first: those kept by update (``last-step<N>.ckpt``), and
    ``last.ckpt`` where it is not one of them (a run from before checkpoints were kept)."""
    kept = sorted(folder.glob(kept_path(LAST, "*").name), key=updates_in_name, reverse=True)
    last = folder / LAST
    if last.is_file() and not any(os.path.samefile(last, path) for path in kept):
        kept.insert(0, last)
    return kept


def newest_sound(folder: Path, beside: bool) -> Path:
    """The newest checkpoint in ``folder`` that is as it was written (with the files ``beside`` it: see
    :func:`checkpoint_damage`); one warning line for those skipped."""
    skipped = []
    for checkpoint in last_checkpoints(folder):
        damage = checkpoint_damage(checkpoint, beside)
        if damage is None:
            if skipped:
                print(
                    f"warning: --ckpt_path last: skipped {'; '.join(skipped)}; resuming from {checkpoint}",
                    file=sys.stderr,
                )
            return checkpoint
        skipped.append(f"{checkpoint} ({damage})")
    raise ValueError(f"--ckpt_path last: no checkpoint in {folder} can be resumed: {'; '.join(skipped)}")


def checkpoint_global_step(checkpoint: Path) -> int:
    """The update a checkpoint was written at, read without loading its tensors (memory-mapped).

    Raises:
        ValueError: naming ``--ckpt_path``, when the file is not a Lightning checkpoint.
    """
    try:
        return int(torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)["global_step"])
    except Exception as error:  # a truncated or foreign file: torch raises many kinds
        raise ValueError(f"--ckpt_path {checkpoint}: not a readable checkpoint ({type(error).__name__})") from error


def missing_beside(checkpoint: Path) -> list[str]:
    """The folders a checkpoint names as kept beside it (replay buffers: ``ReplayDataModule``) that are not there."""
    saved = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)
    names = [state["buffer_folder"] for state in saved.values() if isinstance(state, dict) and "buffer_folder" in state]
    return [name for name in names if not (Path(checkpoint).parent / name).is_dir()]

"""A trained run's model and data module, rebuilt from its checkpoint and config: what ``python -m app export`` and
``python -m app watch`` start from. Bad input is one line naming the command's flag (``parser.error``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def find_config(checkpoint: Path, levels: int = 3) -> Path | None:
    """The ``config.yaml`` LightningCLI saved in the run folder: next to the checkpoint or up to ``levels - 1``
    folders above it (``runs/x/version_0/checkpoints/last.ckpt`` → ``runs/x/version_0/config.yaml``). No further,
    so that an unrelated config higher up is never picked."""
    for folder in list(checkpoint.resolve().parents)[:levels]:
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    return None


def run_folder_of(checkpoint: Path) -> Path:
    """The run folder a checkpoint belongs to (``.../version_0`` for ``.../version_0/checkpoints/last.ckpt``)."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def load_trained(
    parser: argparse.ArgumentParser,
    flag: str,
    checkpoint: Path,
    configs: Sequence[str | Path],
    overrides: Sequence[str] = (),
) -> tuple[Any, Any, list[Path]]:
    """The model (with the checkpoint's weights) and data module of the run whose checkpoint ``flag`` names, built
    from ``configs`` (``--config``; default the run's saved ``config.yaml``) and ``overrides`` as ``fit`` builds
    them (:func:`app.cli.build`); also the configs used. Every problem is ``parser.error`` naming the flag."""
    if not checkpoint.is_file():
        parser.error(f"{flag} {checkpoint}: no such file")
    found = [Path(config) for config in configs] or [find_config(checkpoint)]
    if found[0] is None:
        parser.error(f"--config: no config.yaml next to {checkpoint} or in the 2 folders above; pass the run's config")
    for config in found:
        if not config.is_file():
            parser.error(f"--config {config}: no such file")
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated file, not a checkpoint, pickled objects: one line each
        parser.error(f"{flag} {checkpoint} cannot be read: {str(error).splitlines()[0]}")
    if not isinstance(state, dict) or "state_dict" not in state:
        parser.error(f"{flag} {checkpoint} has no state_dict: not a Lightning checkpoint")

    from app.cli import build  # lazy: the CLI's import registers every agent and data module

    model, datamodule = build([str(config) for config in found], list(overrides))
    try:
        model.load_state_dict(state["state_dict"])
    except RuntimeError as error:
        detail = " ".join(line.strip() for line in str(error).splitlines()[:2])  # the error and its first key list
        configs_text = [str(config) for config in found]
        parser.error(f"{flag} {checkpoint} does not fit the model built from --config {configs_text}: {detail}")
    return model, datamodule, found

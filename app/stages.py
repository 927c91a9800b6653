"""Earlier stages of a pipeline: run a config's ``fit`` once, reuse its finished run after.

The racing pipeline is demonstrations → behaviour cloning → SAC; SAC's ``actor_init`` may name the BC config instead
of a checkpoint. A model lists such options in its class attribute ``stage_options``; before ``fit`` starts a fresh
run, the CLI (:mod:`app.cli`) has :func:`run_stage` make sure that stage has run and sets the option on the model to
the stage's checkpoint, so the model only ever reads checkpoints. Each stage is an ordinary ``python -m app fit``
in its own process (its own threads, seed and console output, nothing shared with the calling run's random state)
and its own folder: ``<save_dir>/<name>/stage-<key>/``, from the stage config's CSV logger, where ``<key>`` is the
sha256 of the config file's text. So:

- a finished stage (``stage.json`` beside its checkpoints, written when its process exits cleanly) is reused;
- an interrupted one continues from its ``last.ckpt``;
- an edited config is a new key, so a new run: never a stale result. (Code changes are not in the key: delete
  the folder to rebuild after one.)

A stage follows the seed of the run that needs it, so that runs over several seeds are paired with their stages
(``python -m app seeds``: seed k's SAC starts from seed k's clone, not from one clone shared by every seed, which
would hide the stage's own spread and correlate the seeds). When that run was given a seed (``seed_everything: N``
in its config, or ``--seed_everything N``), the stage runs with ``--seed_everything N`` and its key ends in
``-seed_N``: ``stage-<sha256>-seed_N``, one folder per seed, each reused by any later run with that seed. A run
without one (``seed_everything: true``, Lightning's default, draws a new seed each time; ``false`` seeds nothing)
runs the stage at the stage config's own seed, in ``stage-<sha256>``, reused by every such run. Whatever the stage's
data module seeds by the run's seed follows too: the racing BC stage's demonstrations are collected at the stage's
seed (unless its config sets ``data.init_args.seed``), so each seed clones its own set, cached once per seed."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from app.run_folder import import_class
from checkpoints.resume import LAST

MARKER = "stage.json"
STAGE_SUFFIXES = (".yaml", ".yml")


def stage_configs(model: Any) -> dict[str, Path]:
    """``{option: config}`` for the options of the ``model`` config (``class_path`` and ``init_args``: parsed, or a
    run's saved ``config.yaml`` read as a dict) that name an earlier stage's config: those in the class's
    ``stage_options`` whose value is a ``.yaml`` file."""
    class_path = model.get("class_path") if isinstance(model, dict | Namespace) else None
    if class_path is None:
        return {}
    init_args = model.get("init_args") or {}
    options = getattr(import_class(class_path), "stage_options", ())
    values = {option: init_args.get(option) for option in options}
    return {
        option: Path(value)
        for option, value in values.items()
        if isinstance(value, str | Path) and Path(value).suffix in STAGE_SUFFIXES
    }


def stage_folder(config: Path, flag: str, seed: int | None = None) -> Path:
    """Where the stage of ``config`` keeps its run: ``<save_dir>/<name>/stage-<sha256 of the config, 12 hex>``, and
    ``-seed_<seed>`` after it when the stage runs at the calling run's ``seed``."""
    try:
        text = config.read_text()
        logger = (yaml.safe_load(text) or {}).get("trainer", {}).get("logger") or {}
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{flag} {config}: cannot read this config ({error})") from None
    init_args = logger.get("init_args", {}) if isinstance(logger, dict) else {}
    if "save_dir" not in init_args:
        raise ValueError(
            f"{flag} {config}: a stage config needs a trainer logger with init_args.save_dir (and name), where its "
            "run is kept and found again"
        )
    key = hashlib.sha256(text.encode()).hexdigest()[:12] + ("" if seed is None else f"-seed_{seed}")
    return Path(init_args["save_dir"]) / init_args.get("name", "lightning_logs") / f"stage-{key}"


def run_stage(
    config: str | Path, flag: str, seed: int | None = None, wait: bool = False, poll_seconds: float = 5.0
) -> Path:
    """The ``last.ckpt`` of ``config``'s finished run: reused when there is one, else made by running (or resuming)
    ``python -m app fit --config <config>`` now. Errors name ``flag``, the option that asked for the stage.

    ``seed``: the calling run's seed, which the stage then runs at (``--seed_everything``), in a folder of its own;
    None: the stage config's own seed.

    ``wait``: another process runs the stage (the other ranks of a DDP run wait for rank 0): wait until it has
    finished, then reuse it."""
    config = Path(config)
    folder = stage_folder(config, flag, seed)
    checkpoint = folder / "checkpoints" / LAST
    if wait and not (folder / MARKER).is_file():
        print(f"Stage {config}: waiting for rank 0 to finish it in {folder}", flush=True)
        while not (folder / MARKER).is_file():
            time.sleep(poll_seconds)
    if (folder / MARKER).is_file() and checkpoint.is_file():
        print(f"Stage {config}: reusing its finished run {folder}")
        return checkpoint
    command = [sys.executable, "-m", "app", "fit", "--config", str(config)]
    command += ["--trainer.logger.init_args.version", folder.name]
    if seed is not None:
        command += ["--seed_everything", str(seed)]
    if checkpoint.is_file():
        command += ["--ckpt_path", str(checkpoint)]
    print(f"Stage {config}: {'continuing' if checkpoint.is_file() else 'running'} it in {folder}", flush=True)
    exit_code = subprocess.run(command, check=False).returncode
    if exit_code != 0:
        raise RuntimeError(f"{flag} {config}: the stage exited with code {exit_code} (its output is above)")
    if not checkpoint.is_file():
        raise ValueError(
            f"{flag} {config}: the stage wrote no {checkpoint}; its ModelCheckpoint callback needs save_last: true"
        )
    marker = {"config": str(config), "checkpoint": str(checkpoint), "seed": seed}
    (folder / MARKER).write_text(json.dumps(marker, indent=1))
    return checkpoint

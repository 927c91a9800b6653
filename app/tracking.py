"""Tracking backends: TensorBoard, Weights & Biases and MLflow, each beside the run's own folder.

``--trainer.logger`` takes a backend's short name as well as Lightning's class paths::

    python -m app fit --config configs/snake_dqn.yaml --trainer.logger tensorboard
    python -m app fit --config configs/snake_dqn.yaml --trainer.logger wandb         # offline unless WANDB_MODE=online
    python -m app fit --config configs/snake_dqn.yaml --trainer.logger mlflow        # a file: store in runs/mlruns
    python -m app fit --config configs/snake_dqn.yaml --trainer.logger csv,tensorboard,wandb,mlflow

A short name is that backend's Lightning logger (:data:`BACKENDS`); the flags after it set its options as for the
class path (``--trainer.logger.init_args.project ...``). Whatever the logger, the run keeps one local folder,
``<save_dir>/<name>/version_N/`` (``config.yaml``, ``checkpoints/``, the throughput report, the learning curve), so
``--ckpt_path last`` finds it as it finds a CSV run (:mod:`app.run_folder`):

- a W&B or MLflow logger gets a CSV logger before it (:func:`arrange_loggers`), which owns the folder (Lightning puts
  checkpoints under the first logger's folder); a TensorBoard logger owns it itself, or shares the CSV one's;
- the project's defaults fill what the user left unset: the folder's ``save_dir`` and ``name`` (the config's logger's,
  else ``runs`` and the config file's name); W&B offline (unless ``WANDB_MODE`` is set) with its files in
  ``<save_dir>/wandb``, the project named after the config and the run after its version; MLflow's tracking URI a
  local ``file:`` store under ``save_dir`` (``mlruns``), the experiment named after the config, the run after its
  version;
- each backend's run identity (TensorBoard's version, the W&B run id, the MLflow run id) is saved in every checkpoint
  (:class:`callbacks.tracking.TrackingRuns`), and ``--ckpt_path`` continues those runs (:func:`continue_runs`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from app.run_folder import import_class
from callbacks.tracking import CHECKPOINT_KEY
from compat.extras import install_command
from compat.lightning import tensorboard_available

FLAG = "--trainer.logger"

#: The short names ``--trainer.logger`` takes, and the Lightning logger each stands for.
BACKENDS: dict[str, str] = {
    "csv": "lightning.pytorch.loggers.CSVLogger",
    "tensorboard": "lightning.pytorch.loggers.TensorBoardLogger",
    "wandb": "lightning.pytorch.loggers.WandbLogger",
    "mlflow": "lightning.pytorch.loggers.MLFlowLogger",
}
_CLASSES: dict[str, type] = {
    "csv": CSVLogger,
    "tensorboard": TensorBoardLogger,
    "wandb": WandbLogger,
    "mlflow": MLFlowLogger,
}
#: The module each backend needs, and the extra of pyproject.toml that installs it.
_EXTRAS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}

_SHORT = re.compile(r"[a-z][a-z0-9_]*(,[a-z][a-z0-9_]*)*")
_LIGHTNING_WORDS = {"true", "false", "null", "none"}  # --trainer.logger's own values (the default logger, or none)
_FOLDER_KINDS = ("csv", "tensorboard")  # loggers whose folder is <save_dir>/<name>/version_N


def expand_short_names(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--trainer.logger <short name>`` (or several, comma-separated) turned into the class path
    (or the list of them) that jsonargparse parses; anything else is left as it is.

    Raises:
        ValueError: one line naming ``--trainer.logger`` and the choices, for a name that is no backend.
    """
    expanded: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == FLAG:
            value = next(args, None)
            expanded += [FLAG] if value is None else [FLAG, _expand(value)]
        elif arg.startswith(f"{FLAG}="):
            expanded.append(f"{FLAG}={_expand(arg.partition('=')[2])}")
        else:
            expanded.append(arg)
    return expanded


def _expand(value: str) -> str:
    if not _SHORT.fullmatch(value) or value in _LIGHTNING_WORDS:
        return value  # a class path, a class name, a JSON list, true/false/null: Lightning's own forms
    names = value.split(",")
    for name in names:
        if name not in BACKENDS:
            raise ValueError(
                f"{FLAG} {value}: unknown backend {name!r}; choose {', '.join(BACKENDS)} "
                "(comma-separated for several) or a Logger class path"
            )
    if len(names) == 1:
        return BACKENDS[names[0]]
    return json.dumps([{"class_path": BACKENDS[name]} for name in names])


def kind(node: Any) -> str | None:
    """Which backend a logger's config node is (``csv``, ``tensorboard``, ``wandb``, ``mlflow``), or None."""
    class_path = getattr(node, "class_path", None)
    if class_path is None:
        return None
    cls = import_class(class_path)
    return next((name for name, base in _CLASSES.items() if issubclass(cls, base)), None)


def logger_nodes(trainer: Namespace) -> list[Namespace]:
    logger = trainer.get("logger")
    nodes = logger if isinstance(logger, list) else [logger]
    return [node for node in nodes if isinstance(node, Namespace)]


def check_packages(trainer: Namespace) -> None:
    """Raises ValueError (one line naming ``--trainer.logger`` and the pip command) when a backend is not installed."""
    for node in logger_nodes(trainer):
        backend = kind(node)
        if backend not in _EXTRAS:
            continue
        installed = tensorboard_available() if backend == "tensorboard" else importlib.util.find_spec(backend)
        if not installed:
            raise ValueError(
                f"{FLAG} {backend}: the {backend} package is not installed; "
                f"{install_command(_EXTRAS[backend])} (or pip install {backend})"
            )


def arrange_loggers(trainer: Namespace, config_files: Sequence[Any]) -> bool:
    """Give a run with a tracking backend its local run folder, before ``--ckpt_path`` is resolved against it.

    The first logger becomes a folder logger (the first CSV or TensorBoard one, or a new CSV logger); its ``save_dir``
    and ``name`` default to the config's logger's. Changed in place.

    Returns:
        Whether a backend other than CSV is configured (the run then needs :class:`callbacks.tracking.TrackingRuns`).
    """
    nodes = logger_nodes(trainer)
    kinds = [kind(node) for node in nodes]
    if not any(k in ("tensorboard", "wandb", "mlflow") for k in kinds):
        return False
    folders = [node for node, k in zip(nodes, kinds, strict=True) if k in _FOLDER_KINDS]
    if folders:
        owner = folders[0]
    else:
        owner = Namespace(class_path=BACKENDS["csv"], init_args=Namespace(save_dir=None, name=None, version=None))
    save_dir, name = _configured_root(trainer, config_files)
    if owner.init_args.get("save_dir") in (None, "."):
        owner.init_args["save_dir"] = save_dir
    if owner.init_args.get("name") in (None, "lightning_logs"):
        owner.init_args["name"] = name
    trainer["logger"] = [owner, *(node for node in nodes if node is not owner)]
    return True


def _configured_root(trainer: Namespace, config_files: Sequence[Any]) -> tuple[str, str]:
    """``save_dir`` and ``name`` of the run folder: the config files' logger's, else ``runs`` (``default_root_dir``
    when set) and the first config file's name."""
    save_dir, name = None, None
    for path in config_files:
        logger = _yaml_logger(Path(os.fspath(path)))
        init_args = logger.get("init_args") if isinstance(logger, dict) else None
        if isinstance(init_args, dict):
            save_dir, name = init_args.get("save_dir", save_dir), init_args.get("name", name)
    if name is None and config_files:
        name = Path(os.fspath(config_files[0])).stem
    return save_dir or trainer.get("default_root_dir") or "runs", name or "lightning_logs"


def _yaml_logger(path: Path) -> Any:
    import yaml

    try:
        node = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    node = node.get("trainer") if isinstance(node, dict) else None
    return node.get("logger") if isinstance(node, dict) else None


def continue_runs(trainer: Namespace, checkpoint: Path | None, global_step: int | None) -> None:
    """Fill each backend's run from the run folder: its version (a fresh run: the next free one, pinned so that every
    logger agrees), and with a checkpoint of this run the backend runs it recorded (W&B ``id``, MLflow ``run_id``,
    TensorBoard's ``purge_step``). Values the user set are kept."""
    nodes = logger_nodes(trainer)
    if not nodes or kind(nodes[0]) not in _FOLDER_KINDS:
        return
    owner = nodes[0].init_args
    root = Path(owner.get("save_dir") or ".") / (owner.get("name") or "")
    if owner.get("version") is None:
        owner["version"] = _next_version(root)
    version = owner["version"]
    folder_name = version if isinstance(version, str) else f"version_{version}"
    in_place = checkpoint is not None and checkpoint.resolve().parent.parent == (root / folder_name).resolve()
    saved = _saved_runs(checkpoint) if in_place else {}  # a checkpoint from elsewhere starts new backend runs too
    for node in nodes:
        init_args, backend = node.init_args, kind(node)
        if backend == "tensorboard":
            for key, value in (("save_dir", owner["save_dir"]), ("name", owner["name"]), ("version", version)):
                if init_args.get(key) is None:
                    init_args[key] = value
            if global_step is not None and in_place:
                # TensorBoard drops the events at or after purge_step that the interrupted process wrote after its
                # checkpoint; the resumed run logs those steps again.
                init_args["purge_step"] = global_step + 1
        elif backend == "wandb":
            # Its files go to <save_dir>/wandb/offline-run-<time>-<id> (not into the run folder, where the CSV logger
            # would find a folder it did not make). jsonargparse carries save_dir and name over from the config's CSV
            # logger: the name counts as unset.
            if init_args.get("save_dir") in (None, "."):
                init_args["save_dir"] = owner["save_dir"]
            if init_args.get("project") is None:
                init_args["project"] = owner["name"]
            if init_args.get("name") in (None, owner["name"]):
                init_args["name"] = f"{owner['name']}/{folder_name}"
            if not init_args.get("offline") and "WANDB_MODE" not in os.environ:
                init_args["offline"] = True  # no account or network needed; `wandb sync` uploads later
            if init_args.get("id") is None and init_args.get("version") is None and saved.get("wandb"):
                init_args["id"] = saved["wandb"]  # WandbLogger resumes it (resume="allow")
        elif backend == "mlflow":
            if not init_args.get("tracking_uri"):
                init_args["tracking_uri"] = (Path(owner["save_dir"]) / "mlruns").resolve().as_uri()
            if init_args.get("experiment_name") in (None, "lightning_logs"):
                init_args["experiment_name"] = owner["name"]
            if init_args.get("run_name") is None:
                init_args["run_name"] = folder_name
            if init_args.get("run_id") is None and saved.get("mlflow"):
                init_args["run_id"] = saved["mlflow"]
            if init_args["tracking_uri"].startswith("file:"):
                # MLflow refuses its file store unless asked (it recommends a database); a local file store needs no
                # server and no extra package.
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def _next_version(root: Path) -> int:
    """Lightning's rule for a new run's version: one more than the largest ``version_N`` in ``root``."""
    numbers = [int(path.name[8:]) for path in root.glob("version_*") if path.is_dir() and path.name[8:].isdigit()]
    return max(numbers, default=-1) + 1


def _saved_runs(checkpoint: Path | None) -> dict[str, Any]:
    if checkpoint is None:
        return {}
    saved = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)
    return dict(saved.get(CHECKPOINT_KEY) or {})

"""Tracking backends with their real packages, offline or local: a short fit, then ``--ckpt_path last`` continues the
same backend run, whose metrics cover both parts, and the run's report files are logged as artifacts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

from app.cli import main
from callbacks.tracking import CHECKPOINT_KEY
from tests.helpers import chain_config, fit, write_config

REPORT = {"learning_curve.png", "throughput.json", "throughput.md", "config.yaml"}


def tracked_config(tmp_path: Path) -> Path:
    """The tiny DQN run with the CSV run folder a shipped config has, evaluations and the throughput report."""
    config = chain_config("dqn", tmp_path)
    trainer = config["trainer"]
    trainer["logger"] = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(tmp_path / "runs"), "name": "chain"},
    }
    trainer["log_every_n_steps"] = 10
    trainer["callbacks"] += [
        {"class_path": "callbacks.schedule.PeriodicEvaluation", "init_args": {"every_n_frames": 200, "episodes": 4}},
        {
            "class_path": "callbacks.throughput.ThroughputReport",
            "init_args": {"log_every_n_steps": 10, "bare_update_seconds": 0},
        },
    ]
    return write_config(config, tmp_path / "chain.yaml")


def fit_twice(tmp_path: Path, backend: str) -> tuple[Path, dict]:
    """40 updates, then 40 more continued with ``--ckpt_path last``; the run folder and its checkpoint's runs."""
    config = tracked_config(tmp_path)
    fit(config, "--trainer.logger", backend, "--trainer.max_steps", "40")
    run = tmp_path / "runs/chain/version_0"
    first = torch.load(run / "checkpoints/last.ckpt", weights_only=True)[CHECKPOINT_KEY]
    cli = fit(config, "--trainer.logger", backend, "--trainer.max_steps", "80", "--ckpt_path", "last")
    assert cli.trainer.global_step == 80 and cli.trainer.log_dir == str(run)
    second = torch.load(run / "checkpoints/last.ckpt", weights_only=True)[CHECKPOINT_KEY]
    assert first == second  # the resumed process continued the same backend runs
    assert not (tmp_path / "runs/chain/version_1").exists()
    return run, second


def assert_both_parts(steps: list[int]) -> None:
    """Metrics of the first part (up to update 40) and of the continued one, each step once."""
    assert min(steps) < 40 < max(steps) and max(steps) >= 69
    assert steps == sorted(set(steps))


@pytest.mark.slow
def test_tensorboard_continues_its_version_folder(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    run, runs = fit_twice(tmp_path, "csv,tensorboard")
    assert runs == {"tensorboard": 0}
    assert (run / "metrics.csv").is_file()  # the CSV logger shares the folder
    events = event_accumulator.EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    assert_both_parts([event.step for event in events.Scalars("train/loss")])
    assert_both_parts([event.step for event in events.Scalars("eval/return_mean")])
    assert [image.step for image in events.Images("learning_curve")] == [40, 80]
    saved = yaml.safe_load((run / "config.yaml").read_text())["trainer"]["logger"]
    assert [logger["init_args"]["version"] for logger in saved] == [0, 0]


@pytest.mark.slow
def test_wandb_offline_continues_its_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    # Offline is the project's default. (Lightning sets WANDB_MODE for an offline run: set, then removed here, it is
    # restored after the test.)
    monkeypatch.setenv("WANDB_MODE", "")
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "")  # nothing to log in with: offline needs none
    run, runs = fit_twice(tmp_path, "wandb")
    run_id = runs["wandb"]
    # Offline, each process writes its own part of the run under the same id; `wandb sync` uploads them as one run.
    parts = sorted((tmp_path / "runs/wandb").glob("offline-run-*"))
    assert [part.name.rpartition("-")[2] for part in parts] == [run_id, run_id]
    for part in parts:
        assert (part / f"run-{run_id}.wandb").is_file()
        assert {path.name for path in (part / "files").iterdir()} >= REPORT
    saved = yaml.safe_load((run / "config.yaml").read_text())["trainer"]["logger"][1]["init_args"]
    assert saved["id"] == run_id and saved["project"] == "chain" and saved["name"] == "chain/version_0"


@pytest.mark.slow
def test_mlflow_continues_its_run_in_a_local_file_store(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run, runs = fit_twice(tmp_path, "mlflow")
    client = MlflowClient((tmp_path / "runs/mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("chain")
    [found] = client.search_runs([experiment.experiment_id])
    assert found.info.run_id == runs["mlflow"] and found.info.run_name == "version_0"
    assert_both_parts([metric.step for metric in client.get_metric_history(runs["mlflow"], "train/loss")])
    assert_both_parts([metric.step for metric in client.get_metric_history(runs["mlflow"], "eval/return_mean")])
    assert {artifact.path for artifact in client.list_artifacts(runs["mlflow"])} >= REPORT


def test_a_missing_backend_package_is_one_line_with_the_pip_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # not importable, as where the extra is not installed
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(tracked_config(tmp_path)), "--trainer.logger", "wandb"])
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [
        'error: --trainer.logger wandb: the wandb package is not installed; pip install -e ".[wandb]" '
        "(or pip install wandb)"
    ]
    assert not (tmp_path / "runs").exists()

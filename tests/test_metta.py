"""The MettaGrid configs as the README runs them: a short fit, exact resume with worker processes, the ultra-fast
preset's batch geometry, and bad input."""

from __future__ import annotations

import csv
import os
import signal
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

pytest.importorskip("mettagrid", reason='the metta extra: pip install -e ".[metta]"')

from app.cli import main
from tests.helpers import weights

ROOT = Path(__file__).resolve().parents[1]
# configs/metta_ppo.yaml shrunk for a test (2 environments of 4 agents on a small map, 16-step rollouts cut into
# 8-step segments), its worker processes, logger, checkpoints and evaluation left on.
SMALL = [
    "--data.init_args.env.init_args.num_agents=4",
    "--data.init_args.env.init_args.map_width=8",
    "--data.init_args.env.init_args.map_height=8",
    "--data.init_args.env.init_args.objects={altar: 4, wall: 2}",
    "--data.init_args.env.init_args.max_steps=24",
    "--data.init_args.num_envs=2",
    "--data.init_args.collect_steps=16",
    "--data.init_args.bptt=8",
    "--data.init_args.minibatch_size=32",
    "--data.init_args.eval_episodes=2",
    "--model.init_args.lstm_hidden=32",
    "--model.init_args.trunk_features=32",
    "--trainer.max_time=null",
    "--trainer.log_every_n_steps=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.callbacks.init_args.log_every_n_steps=2",
]


def _last_value(metrics_csv: Path, name: str) -> str:
    with open(metrics_csv, newline="") as file:
        return [row[name] for row in csv.DictReader(file) if row[name]][-1]


def fit_metta(runs: Path, *overrides: str, config: str = "metta_ppo"):
    args = ["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--threads", "1"]
    return main([*args, "--trainer.logger.init_args.save_dir", str(runs), *SMALL, *overrides])


def test_metta_ppo_trains_logs_and_resumes_exactly_with_its_worker_processes(tmp_path):
    # 2 envs x 4 agents x 16 steps = 128 agent steps per rollout, 4 minibatches x 1 epoch = 4 updates each. Stopping
    # at update 10 stops inside a rollout; the checkpoint holds the rollout, every agent's LSTM state and each
    # worker's environments (their episodes replayed from seed and actions on load), which the rest depends on.
    workers = "--data.init_args.env_workers=2"  # the worker processes, as configs/metta_ultra_fast.yaml uses them
    full = fit_metta(tmp_path / "full", "--trainer.max_steps=24", workers)
    fit_metta(tmp_path / "half", "--trainer.max_steps=10", workers)
    resumed = fit_metta(
        tmp_path / "half", "--trainer.max_steps=24", "--ckpt_path=last", "--seed_everything=123", workers
    )

    assert full.datamodule.env_workers == 2 and resumed.trainer.global_step == 24
    run = tmp_path / "half/metta_ppo/version_0"
    assert sorted(path.name for path in run.parent.iterdir()) == ["version_0"]  # continued in its own folder
    a = weights(tmp_path / "full/metta_ppo/version_0/checkpoints/last.ckpt")
    b = weights(run / "checkpoints/last.ckpt")
    for key in a:
        assert torch.equal(a[key], b[key]), key
    metrics = (run / "metrics.csv").read_text()
    for name in ("train/loss_objective", "eval/return_mean", "eval/random_return_mean"):
        assert name in metrics
    # `validate` plays the greedy episodes from the checkpoint (its evaluation environments built and closed
    # under Lightning's inference mode) and reports what the run's own last evaluation did.
    checkpoint = str(run / "checkpoints/last.ckpt")
    args = ["validate", "--config", str(ROOT / "configs/metta_ppo.yaml"), "--ckpt_path", checkpoint]
    validated = main([*args, "--trainer.logger=false", *SMALL, "--data.init_args.eval_episodes=4"])  # the callback's 4
    assert validated.trainer.callback_metrics["eval/return_mean"].item() == pytest.approx(
        float(_last_value(run / "metrics.csv", "eval/return_mean"))
    )


class KillWorker(pl.Callback):
    """SIGKILLs worker process 1 after update 20, as the machine's memory killer might."""

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == 20:
            os.kill(trainer.datamodule.collector.env.base_env._workers[1].pid, signal.SIGKILL)


def test_a_dead_worker_process_stops_the_run_with_a_clear_error_and_the_last_checkpoint_intact(tmp_path):
    # A checkpoint every rollout (128 agent steps, 4 updates), the kill after update 20: the next rollout fails.
    callbacks = tmp_path / "callbacks.yaml"
    callbacks.write_text(
        "trainer:\n  callbacks:\n"
        "    - {class_path: callbacks.schedule.FrameCheckpoint, init_args: {every_n_frames: 128}}\n"
        "    - {class_path: tests.test_metta.KillWorker}\n"
    )
    flags = ("--data.init_args.env_workers=2", "--config", str(callbacks))
    with pytest.raises(RuntimeError, match=r"environment worker process died: worker 1 \(exit code -9\), at 640 fr"):
        fit_metta(tmp_path, "--trainer.max_steps=40", *flags)
    checkpoint = tmp_path / "metta_ppo/version_0/checkpoints/last.ckpt"
    # Written when the 5th rollout was collected (update 17), the last before the kill, and whole.
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 17
    resumed = fit_metta(tmp_path, "--trainer.max_steps=24", "--ckpt_path=last", "--data.init_args.env_workers=2")
    assert resumed.trainer.global_step == 24


def test_the_ultra_fast_preset_runs_with_its_batch_geometry(tmp_path):
    # The seed's geometry: 8 minibatches of whole 32-step segments per rollout, 1 epoch, hidden 256, compile on. The
    # environments are made small (test-sized); the batch is num_envs x num_agents x collect_steps.
    cli = fit_metta(
        tmp_path,
        "--data.init_args.num_envs=4",
        "--data.init_args.collect_steps=32",
        "--data.init_args.bptt=32",
        "--data.init_args.minibatch_size=64",
        "--data.init_args.env_workers=0",
        "--model.init_args.lstm_hidden=256",
        "--trainer.max_steps=16",
        config="metta_ultra_fast",
    )
    data, model = cli.datamodule, cli.model
    assert (data.bptt, data.update_epochs, data.minibatches_per_rollout) == (32, 1, 8)
    assert model.compile_mode is True and model.lstm.lstm.hidden_size == 256
    assert cli.trainer.global_step == 16 and data.frames == 2 * 4 * 4 * 32


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--data.init_args.env.init_args.num_agents=0"],
            "--data.init_args.env.init_args.num_agents must be > 0, got 0",
        ),
        (
            ["--data.init_args.env.init_args.task=maze"],
            "--data.init_args.env.init_args.task must be one of altars, arena, got 'maze'",
        ),
        (
            ["--data.init_args.env.init_args.objects={altar: 4, shrine: 1}"],
            "--data.init_args.env.init_args.objects names 'shrine', which task 'altars' does not have "
            "(it has wall, altar)",
        ),
        (
            ["--data.init_args.bptt=5"],
            "--data.init_args.bptt (5) must divide collect_steps (16) and minibatch_size (32): minibatches are whole "
            "segments of bptt steps",
        ),
        (
            ["--data.init_args.minibatch_size=256"],
            "--data.init_args.minibatch_size (256) is larger than a rollout: num_envs * collect_steps * 4 agents = "
            "128 frames",
        ),
        (
            ["--data.init_args.env_workers=3"],
            "--data.init_args.env_workers (3) must divide --data.init_args.num_envs (2)",
        ),
    ],
)
def test_bad_input_is_one_error_line_naming_the_flag(tmp_path, capsys, overrides, message):
    with pytest.raises(SystemExit) as exited:
        fit_metta(tmp_path / "runs", *overrides)
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("Seed set to ")]
    assert errors == [f"error: {message}"]
    assert not (tmp_path / "runs").exists()

"""Behaviour cloning: the action scaling and loss, and the shipped config run as README runs it (CSV logger on, real
epochs with validation, the closed-loop evaluation, ``--ckpt_path last`` continuing in the same folder)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import TQDMProgressBar

from callbacks.progress import RLProgressBar
from datamodules.envs.racing import STEERING_LIMIT, RacingEnv
from modules.bc import BehaviourCloning
from tests.helpers import fit, write_config

ROOT = Path(__file__).resolve().parents[1]


def test_actions_scale_to_the_unit_box_and_back():
    env = RacingEnv()
    model = BehaviourCloning(env.observation_spec[0], env.action_spec[0])
    corners = torch.tensor([[-6.0, -STEERING_LIMIT], [4.0, STEERING_LIMIT], [-1.0, 0.0]])
    torch.testing.assert_close(model.actor.to_unit(corners), torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]]))
    action = model.actor(torch.randn(100, 8) * 50)  # any input: the action stays inside the box
    assert (action[:, 0] >= -6).all() and (action[:, 0] <= 4).all() and (action[:, 1].abs() <= STEERING_LIMIT).all()
    observation, expert = torch.randn(32, 8), corners[torch.randint(3, (32,))]
    expected = ((torch.tanh(model.actor.network(observation)) - model.actor.to_unit(expert)) ** 2).mean()
    torch.testing.assert_close(model._loss((observation, expert)), expected)


def shortened(tmp_path: Path) -> Path:
    """The shipped config with less data and more frequent, smaller closed-loop evaluations."""
    config = yaml.safe_load((ROOT / "configs" / "racing_bc.yaml").read_text())
    config["data"]["init_args"].update(episodes=8, steps=100, batch_size=64)
    evaluation = next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("ClosedLoopEvaluation"))
    evaluation["init_args"].update(every_n_epochs=2, cars=4)
    return write_config(config, tmp_path / "racing_bc.yaml")


def test_shipped_config_trains_validates_evaluates_and_resumes_in_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = shortened(tmp_path)
    cli = fit(config, "--trainer.max_epochs", "2")
    assert any(isinstance(c, TQDMProgressBar) for c in cli.trainer.callbacks)  # epochs: Lightning's own bar
    assert not any(isinstance(c, RLProgressBar) for c in cli.trainer.callbacks)
    run = tmp_path / "runs" / "racing_bc" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert list((tmp_path / "runs" / "demonstrations").glob("demonstrations-*/complete.json"))
    cli = fit(config, "--trainer.max_epochs", "4", "--ckpt_path", "last")
    assert cli.trainer.current_epoch == 4
    assert not (tmp_path / "runs" / "racing_bc" / "version_1").exists()  # continued in its own folder
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    validation = [float(row["val/loss"]) for row in rows if row.get("val/loss")]
    assert len(validation) == 4 and validation[-1] < validation[0]  # four epochs, two per process, and learning
    evaluations = [row for row in rows if row.get("eval/return_mean")]
    assert [int(row["epoch"]) for row in evaluations] == [1, 3]  # after epochs 2 and 4
    expert = float(evaluations[0]["eval/expert_return_mean"])
    assert expert > 2000 and float(evaluations[0]["eval/expert_lap_completed"]) == 1.0
    for row in evaluations:
        assert float(row["eval/return_vs_expert"]) == pytest.approx(float(row["eval/return_mean"]) / expert)

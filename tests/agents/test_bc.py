"""Behaviour cloning: the action scaling and loss, and the shipped config run as the docs run it (CSV logger on, real
epochs with validation, the closed-loop evaluation, ``--ckpt_path last`` continuing in the same folder, exactly), and
its policy exported by the fit's callback and from its checkpoint alone."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import TQDMProgressBar
from tensordict import TensorDict

from app.export import main as export_main
from callbacks.progress import RLProgressBar
from envs.racing.env import STEERING_LIMIT, RacingEnv
from export.loader import TracedPolicy
from modules.bc import BehaviourCloning
from tests.helpers import RESEEDED, ROOT, fit, weights, write_config

SHORT_EPISODES = ("--data.init_args.env.init_args.max_steps", "200")  # closed-loop episodes of 4 s, not 100 s


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
    """The shipped config with less data and more frequent, smaller and shorter closed-loop evaluations (30-s
    episodes: the expert's first lap takes 26 s)."""
    config = yaml.safe_load((ROOT / "configs" / "racing_bc.yaml").read_text())
    config["data"]["init_args"].update(episodes=8, steps=100, batch_size=64)
    config["data"]["init_args"]["env"]["init_args"]["max_steps"] = 1500
    evaluation = next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("ClosedLoopEvaluation"))
    evaluation["init_args"].update(every_n_epochs=2, cars=4)
    return write_config(config, tmp_path / "racing_bc.yaml")


@pytest.mark.slow
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
    assert expert > 600 and float(evaluations[0]["eval/expert_lap_completed"]) == 1.0  # a lap in 30 s: 805
    for row in evaluations:
        assert float(row["eval/return_vs_expert"]) == pytest.approx(float(row["eval/return_mean"]) / expert)
    # Continued in a copy of the folder made with its links followed, as a download has them, named by its full path:
    # the new final checkpoint is `last.ckpt` there too (Lightning would otherwise write `last-v1.ckpt` beside the
    # copied one, which the next `--ckpt_path last` would take).
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "runs", elsewhere / "runs")
    monkeypatch.chdir(elsewhere)
    cli = fit(
        config,
        "--trainer.max_epochs",
        "5",
        "--ckpt_path",
        "last",
        "--trainer.logger.init_args.save_dir",
        str(elsewhere / "runs"),
    )
    checkpoints = elsewhere / "runs" / "racing_bc" / "version_0" / "checkpoints"
    assert [path.name for path in checkpoints.glob("last*.ckpt")] == ["last.ckpt"]
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == cli.trainer.global_step


class DrawsAtFitStart(pl.Callback):
    """Draws from the global generator as fit starts, as a model's or a callback's own setup may."""

    def on_fit_start(self, trainer, pl_module):
        torch.rand(1)


@pytest.mark.slow
def test_resumed_run_ends_with_identical_weights(tmp_path, monkeypatch):
    # 3 epochs, a stop, and 3 more resumed under another global seed (the demonstrations' seed kept: seed_everything
    # alone would reseed them too), against 6 in one run. Each epoch's shuffle
    # is seeded from the global generator, which Lightning's checkpoint does not hold: only the data module's
    # restored RNG states give the resumed epochs the same batches, and only if applied when the first epoch's loader
    # starts, after the draws of the resumed run's start (DrawsAtFitStart). The stopped run also evaluates after its
    # last epoch (3), which the uninterrupted one does not: the closed-loop evaluation must leave that stream alone.
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load(shortened(tmp_path).read_text())
    config["trainer"]["callbacks"].append({"class_path": "tests.agents.test_bc.DrawsAtFitStart"})
    config = write_config(config, tmp_path / "racing_bc.yaml")
    fit(config, *SHORT_EPISODES, "--trainer.max_epochs", "6", "--trainer.logger.init_args.name", "full")
    fit(config, *SHORT_EPISODES, "--trainer.max_epochs", "3", "--trainer.logger.init_args.name", "half")
    half = tmp_path / "runs" / "half" / "version_0" / "checkpoints" / "last.ckpt"
    first_half = weights(half)
    resume = ("--ckpt_path", "last", *RESEEDED)
    cli = fit(config, *SHORT_EPISODES, "--trainer.max_epochs", "6", "--trainer.logger.init_args.name", "half", *resume)

    assert cli.trainer.current_epoch == 6 and cli.trainer.global_step == 6 * 12  # 720 training pairs, 64 a batch
    full, resumed = weights(tmp_path / "runs" / "full" / "version_0" / "checkpoints" / "last.ckpt"), weights(half)
    assert full.keys() == resumed.keys()
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    trained = [key for key in resumed if key.startswith("actor.network.")]  # not the action box's constants
    assert len(trained) == 6 and all(not torch.equal(first_half[key], resumed[key]) for key in trained)


@pytest.mark.slow
def test_fit_export_and_checkpoint_export_trace_the_clones_actions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load(shortened(tmp_path).read_text())
    options = {"batch_sizes": [4, 16], "backend": "torchscript", "benchmark": False}
    config["trainer"]["callbacks"].append({"class_path": "callbacks.export.PolicyExport", "init_args": options})
    cli = fit(write_config(config, tmp_path / "export.yaml"), *SHORT_EPISODES, "--trainer.max_epochs", "1")
    run = tmp_path / "runs" / "racing_bc" / "version_0"
    # Real inputs: demonstrated observations and start states of the cars, beside random ones far outside them.
    observation = torch.cat(
        [
            cli.datamodule.train_set.tensors[0][:8],
            cli.datamodule.make_env(4, seed=11).reset()["observation"],
            torch.randn(4, 11) * 100,
        ]
    )
    model = cli.model.eval()
    with torch.no_grad():
        clone = model.policy()(TensorDict({"observation": observation}, batch_size=[16]))["action"]
    assert clone.shape == (16, 2) and not torch.equal(clone[0], clone[1])

    traced = TracedPolicy.load(run / "export")
    assert traced.backend_in_use == "torchscript"
    assert json.loads((run / "export" / "export.json").read_text())["output"]["kind"] == "actions"
    torch.testing.assert_close(traced(observation), clone)
    torch.testing.assert_close(traced.act(observation), clone)  # the action itself, not an argmax

    # The same export from last.ckpt and the run's config.yaml alone, as `lightrl export --ckpt_path` does.
    out = tmp_path / "from_checkpoint"
    argv = ["--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--batch-sizes", "4"]
    metadata = export_main([*argv, "--backend", "torchscript", "--no-benchmark", "--out", str(out)])
    assert [artifact["batch_size"] for artifact in metadata["artifacts"]] == [4]
    assert metadata["output"]["kind"] == "actions"
    torch.testing.assert_close(TracedPolicy.load(out)(observation), clone)

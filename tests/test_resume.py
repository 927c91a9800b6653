"""Full resume: 2N updates in one run equal N updates, a stop, and N more resumed from the checkpoint."""

from __future__ import annotations

import os

import lightning.pytorch as pl
import pytest
import torch

from callbacks.schedule import AtomicCheckpointIO
from tests.helpers import chain_config, fit, weights, write_config


@pytest.mark.parametrize("agent", ["dqn", "ppo"])
def test_resumed_run_ends_with_identical_weights(tmp_path, agent):
    # PPO: 8 envs x 16 steps = 128 frames per rollout, 4 minibatches x 2 epochs = 8 updates per rollout; stopping
    # at update 36 interrupts a rollout in its middle, so the saved rollout and minibatch order are exercised.
    # DQN: 8 frames per collect and 2 frames per update; the checkpoint also carries the replay buffer.
    half = 36 if agent == "ppo" else 50
    config = write_config(chain_config(agent, tmp_path / "full"), tmp_path / "full.yaml")
    fit(config, "--trainer.max_steps", str(2 * half))
    interrupted = write_config(chain_config(agent, tmp_path / "half"), tmp_path / "half.yaml")
    fit(interrupted, "--trainer.max_steps", str(half))
    first_half = weights(tmp_path / "half/checkpoints/last.ckpt")
    # Another global seed: only a complete restore (weights, RNG states, envs, store) can still match the full run.
    cli = fit(interrupted, "--trainer.max_steps", str(2 * half), "--ckpt_path", "last", "--seed_everything", "123")

    assert cli.trainer.global_step == 2 * half
    full, resumed = weights(tmp_path / "full/checkpoints/last.ckpt"), weights(tmp_path / "half/checkpoints/last.ckpt")
    assert full.keys() == resumed.keys()
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    # ...and training really moved on after the resume.
    assert any(not torch.equal(first_half[key], resumed[key]) for key in resumed if resumed[key].is_floating_point())


def test_checkpoint_restores_counters_buffer_and_exploration(tmp_path):
    config = write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml")
    cli = fit(config, "--trainer.max_steps", "40")
    checkpoint = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    state = checkpoint["ReplayDataModule"]
    # The collect that completes the 64 warm-up frames already earns 8 / 2 = 4 updates; each later one 4 more.
    assert state["frames"] == cli.datamodule.frames == 64 + (40 - 4) * 2
    assert state["buffer"]["_writer"]["_write_count"] == cli.datamodule.frames
    assert set(state["env"]) == {"position", "steps"}
    assert checkpoint["state_dict"]["egreedy.eps"] == pytest.approx(cli.model.epsilon(state["frames"]))


def test_interrupted_checkpoint_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)

    def dies_mid_write(obj, file, *args, **kwargs):
        file.write(b"partial bytes")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["last.ckpt"]  # no temporary file left behind


class PoisonWeights(pl.Callback):
    """Sets one weight to NaN after update 30, as a diverging run would."""

    def on_train_batch_end(self, trainer, pl_module, *args):
        if trainer.global_step == 30:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))


def test_nan_loss_stops_with_clear_error_and_keeps_last_good_checkpoint(tmp_path):
    config = chain_config("dqn", tmp_path)
    config["trainer"]["callbacks"] = [
        {"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": {"every_n_frames": 40}},
        {"class_path": "tests.test_resume.PoisonWeights"},
    ]
    path = write_config(config, tmp_path / "c.yaml")
    with pytest.raises(FloatingPointError, match=r"loss is nan at update 30"):
        fit(path)
    good = weights(tmp_path / "checkpoints/last.ckpt")
    assert all(torch.isfinite(value).all() for value in good.values() if value.is_floating_point())

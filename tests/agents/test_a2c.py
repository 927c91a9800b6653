"""A2C: its update against TorchRL's ``A2CLoss`` on every kind of action space, the bare reference update's loss, the
RMSprop it steps with, the geometry it refuses, and the Zoo's CartPole config as users run it (logger on, run folder,
``--ckpt_path last``)."""

from __future__ import annotations

import csv

import pytest
import torch
from torchrl.data import Bounded, Categorical, Unbounded

from app.cli import build
from callbacks.bare_updates import as_replay_sample, bare_update, ppo_batches
from modules.a2c import A2C, A2CLossOptions
from modules.networks import NetworkOptions
from modules.optim import OptimizerOptions
from modules.ppo import GaussianOptions
from tests.agents.test_ppo_continuous import HIGH, LOW, SPECS, act
from tests.helpers import ROOT, app_in_process, assert_same_losses_and_gradients, fit

CONFIG = ROOT / "configs/gym/cartpole_a2c.yaml"
SHORT = ("--threads", "1", "--trainer.callbacks.init_args.bare_update_seconds", "0")


@pytest.mark.parametrize(
    ("action", "gaussian", "loss"),
    [
        ("discrete", {}, {}),
        ("discrete", {}, {"critic_loss": "smooth_l1", "entropy_coef": 0.0}),  # an entropy weighted 0: logged only
        ("box", {"distribution": "normal"}, {}),
        ("box", {"distribution": "normal", "scale": "state_dependent"}, {"critic_coef": 0.25}),
        ("box", {"distribution": "tanh_normal"}, {}),
        ("unbounded", {"distribution": "normal"}, {}),
    ],
)
def test_the_update_loss_is_torchrls_a2c_loss_in_values_and_gradients(action, gaussian, loss):
    # The same terms and the same gradient for every parameter, from the same random draws (the tanh-normal's
    # entropy is a sampled estimate), on a rollout the weights have moved away from since it was collected.
    action_spec = {"discrete": Categorical(5), "box": Bounded(LOW, HIGH, (2,)), "unbounded": Unbounded(shape=(2,))}
    torch.manual_seed(0)
    a2c = A2C(
        SPECS["observation_spec"],
        action_spec[action],
        network=NetworkOptions(hidden_sizes=(16,)),
        gaussian=GaussianOptions(**gaussian),
        loss=A2CLossOptions(**{"entropy_coef": 0.03, **loss}),
    )
    batch = act(a2c, 256)
    batch["advantage"] = torch.randn(256, 1)
    batch["value_target"] = torch.randn(256, 1)
    with torch.no_grad():
        for parameter in a2c.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    keys = {"loss_objective", "loss_critic", "loss_entropy", "entropy"}
    if not a2c.loss_options.entropy_coef:  # no entropy term, as A2CLoss; the entropy is still logged
        keys = {"loss_objective", "loss_critic"}
        assert "entropy" in a2c.loss(batch.clone())
    assert_same_losses_and_gradients(a2c, a2c.loss_module, lambda b: a2c.loss(b).select(*keys), batch, keys)


def test_standardised_advantages_are_a2c_loss_of_the_standardised_batch():
    torch.manual_seed(0)
    a2c = A2C(**SPECS, network=NetworkOptions(hidden_sizes=(16,)), loss=A2CLossOptions(normalize_advantage=True))
    batch = act(a2c, 64)
    batch["advantage"] = 3 + 2 * torch.randn(64, 1)
    batch["value_target"] = torch.randn(64, 1)
    standardised = batch.clone()
    standardised["advantage"] = (batch["advantage"] - batch["advantage"].mean()) / batch["advantage"].std()
    ours, theirs = a2c.loss(batch), a2c.loss_module(standardised)
    torch.testing.assert_close(ours["loss_objective"], theirs["loss_objective"], rtol=1e-5, atol=1e-6)


def test_the_default_optimizer_is_stable_baselines3s_rmsprop():
    a2c = A2C(**SPECS)
    optimizer = a2c.configure_optimizers()
    assert type(optimizer) is torch.optim.RMSprop
    (group,) = optimizer.param_groups
    assert (group["lr"], group["alpha"], group["eps"]) == (7e-4, 0.99, 1e-5) and a2c.optim.max_grad_norm == 0.5
    adam = A2C(**SPECS, optimizer=OptimizerOptions(algorithm="adam", lr=1e-3)).configure_optimizers()
    assert type(adam) is torch.optim.Adam
    with pytest.raises(
        ValueError, match="model.optimizer.algorithm must be one of adam, rmsprop, rmsprop_tf, got 'sgd'"
    ):
        OptimizerOptions(algorithm="sgd")


def test_bare_a2c_update_computes_the_agents_loss():
    model, data = build([str(CONFIG)], SHORT)
    step = bare_update(model, data)
    batch = ppo_batches(data, data.minibatch_size)[0]
    assert len(batch["observation"]) == data.num_envs * data.collect_steps  # the whole rollout, once
    td = as_replay_sample(batch)
    td["advantage"] = batch["advantage"].unsqueeze(-1)
    td["value_target"] = batch["value_target"].unsqueeze(-1)
    expected = sum(value for key, value in model.loss(td).items() if key.startswith("loss")).detach()
    assert step(0) == pytest.approx(expected.item(), rel=1e-5)


def test_minibatches_or_epochs_are_one_line_naming_the_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "fit", "--config", str(CONFIG), "--data.init_args.update_epochs", "2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --data.init_args.minibatch_size, --data.init_args.update_epochs: A2C takes one ")
    assert "update on each whole rollout, these give 2; use minibatch_size = num_envs x collect_steps" in line
    assert not (tmp_path / "runs").exists()


def test_a_captured_update_refuses_rmsprop_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "fit", "--config", str(CONFIG), "--model.init_args.compile", "cudagraph")
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "Traceback" not in result.stderr and not (tmp_path / "runs").exists()
    assert "cannot capture RMSprop's step: the fused Adam is what it captures (optimizer.algorithm adam)" in line


@pytest.mark.slow
def test_the_zoo_cartpole_config_trains_and_continues_in_its_run_folder(tmp_path, monkeypatch):
    # As the docs run it: the shipped config, its CSV logger and run folder, then --ckpt_path last from the same folder
    # (exact resume is tests/app/test_resume.py's, on the chain env: a Gymnasium task restarts its episodes on loading).
    monkeypatch.chdir(tmp_path)
    fit(CONFIG, *SHORT, "--trainer.max_steps", "150")
    checkpoint = tmp_path / "runs/gym_cartpole_a2c/version_0/checkpoints/last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["optimizer_states"][0]["state"]
    assert {int(state["step"]) for state in saved.values()} == {150}  # RMSprop's state, one step per rollout
    resumed = fit(CONFIG, *SHORT, "--trainer.max_steps", "300", "--ckpt_path", "last")
    assert resumed.trainer.global_step == 300 and resumed.datamodule.frames == 300 * 40
    assert type(resumed.model.optimizers().optimizer) is torch.optim.RMSprop
    later = torch.load(checkpoint, weights_only=True)["optimizer_states"][0]["state"]
    assert {int(state["step"]) for state in later.values()} == {300}
    rows = list(csv.DictReader((tmp_path / "runs/gym_cartpole_a2c/version_0/metrics.csv").open()))
    evaluated = [float(row["eval/return_mean"]) for row in rows if row.get("eval/return_mean")]
    assert len(evaluated) >= 2 and all(value == value for value in evaluated)

"""TQC: TorchRL's ``TQCLoss`` computed from the update's parameters, the truncated target, the bare reference update,
exact resume with the shipped config, and its options' errors."""

from __future__ import annotations

import pytest
import torch

from app.cli import build
from envs.racing.env import RacingEnv
from modules.networks import CriticOptions
from modules.quantiles import quantile_huber
from modules.sac import ActorOptions
from modules.tqc import TQC
from tests.helpers import (
    ROOT,
    app_in_process,
    assert_same_losses_and_gradients,
    assert_the_bare_update_computes,
    racing_transitions,
    resumed_on_the_racing_car,
)

CONFIG = ROOT / "configs/gym/pendulum_tqc.yaml"
ENV = RacingEnv(curvature_ahead=[5, 15, 30])  # a box of unequal half-ranges, per dimension
SPECS = {"observation_spec": ENV.observation_spec[0], "action_spec": ENV.action_spec[0]}
#: Small networks and batches, a short warm-up: seconds, not the Zoo's minutes.
NETS = (
    *("--model.init_args.actor.hidden_sizes", "[32, 32]", "--model.init_args.critics.hidden_sizes", "[32, 32]"),
    *("--data.init_args.batch_size", "32", "--data.init_args.warmup_frames", "64", "--threads", "1"),
)


def tqc(critics: int = 2, quantiles: int = 5, dropped: int = 1, learn_alpha: bool = True) -> TQC:
    torch.manual_seed(0)
    model = TQC(
        **SPECS,
        actor=ActorOptions(hidden_sizes=(16, 8)),
        critics=CriticOptions(hidden_sizes=(16, 8), count=critics),
        quantiles=quantiles,
        dropped_per_critic=dropped,
        gamma=0.9,
        learn_alpha=learn_alpha,
    )
    with torch.no_grad():
        model.loss_module.log_alpha.fill_(-0.7)  # α off its start
        for target in model.loss_module.target_qvalue_network_params.values(True, True):
            target.add_(0.1 * torch.randn_like(target))  # targets that differ from the critics
    return model


@pytest.mark.parametrize(
    ("critics", "quantiles", "dropped", "learn_alpha"),
    [(2, 5, 1, True), (1, 4, 0, True), (3, 7, 2, True), (2, 25, 2, False)],
)
def test_the_update_loss_is_torchrls_tqc_loss_in_values_and_gradients(critics, quantiles, dropped, learn_alpha):
    # The update computes TQCLoss's losses from its parameters (every critic in one batched matmul a layer): the same
    # terms, and the same gradient for every parameter, as TQCLoss.forward from the same random draws.
    model = tqc(critics, quantiles, dropped, learn_alpha)
    keys = {"loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"}
    assert_same_losses_and_gradients(model, model.loss_module, model.loss, racing_transitions(), keys)


def test_the_target_keeps_the_lowest_of_the_pooled_quantiles():
    # Written from the definition, one transition at a time: pool the target critics' quantiles at the next action
    # the actor samples, drop the highest dropped x critics, subtract α·log π, discount unless terminated.
    model, batch = tqc(critics=3, quantiles=4, dropped=1), racing_transitions(8)
    critic, parameters = model.qvalue.module, model.loss_module.target_qvalue_network_params["module"]
    alpha = model.loss_module.log_alpha.exp().item()
    torch.manual_seed(3)
    next_action, log_prob = model.sample(batch["next", "observation"])
    torch.manual_seed(3)
    losses = model.loss(batch.clone())
    expected = []
    for row in range(8):
        pooled = []
        for index in range(3):
            with parameters[index].to_module(critic):
                pooled += critic(batch["next", "observation"][row], next_action[row]).tolist()
        kept = sorted(pooled)[: 3 * (4 - 1)]  # 12 pooled, the highest 3 dropped
        continues = 0.0 if batch["next", "terminated"][row] else 1.0
        reward = batch["next", "reward"][row].item()
        expected.append([reward + 0.9 * continues * (q - alpha * log_prob[row].item()) for q in kept])
    target = torch.tensor(expected)
    with torch.no_grad():
        predicted = critic.ensemble_outputs(
            model.loss_module.qvalue_network_params["module"], batch["observation"], batch["action"]
        )
    loss_qvalue = quantile_huber(predicted, target).mean((-2, -1)).sum(0).mean()
    torch.testing.assert_close(losses["loss_qvalue"], loss_qvalue, rtol=1e-5, atol=1e-6)


def test_the_bare_reference_update_computes_the_agents_loss():
    overrides = [*NETS, "--model.init_args.critics.count", "3", "--model.init_args.quantiles", "9"]
    model, data = build([str(CONFIG)], overrides)
    assert isinstance(model, TQC) and model.kept_quantiles == 3 * (9 - 2)
    assert_the_bare_update_computes(model, data)


@pytest.mark.slow
def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights_and_its_policy_exports(tmp_path, capsys):
    # The checkpoint carries the replay buffer, the target critics, log α and Adam's state, and every RNG.
    full, first_half, resumed = resumed_on_the_racing_car(CONFIG, tmp_path, 40, *NETS)
    assert full.keys() == resumed.keys() and any("target_qvalue" in key for key in full)
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    assert any(not torch.equal(first_half[key], resumed[key]) for key in resumed if "qvalue_network" in key)
    # The trained policy exports as SAC's does (its deterministic action), from the checkpoint and its run folder.
    # TorchScript, as SAC's export test: `auto` also compiles an AOT Inductor library to time against it
    # (tests/export/test_export.py checks that), a cold compilation of 15-20 s here for the same network code.
    out = tmp_path / "export"
    checkpoint = tmp_path / "half/runs/gym_pendulum_tqc/version_0/checkpoints/last.ckpt"
    args = ("--ckpt_path", str(checkpoint), "--out", str(out), "--batch-sizes", "8")
    args += ("--backend", "torchscript")
    result = app_in_process(capsys, "export", *args, "--no-benchmark")
    assert result.returncode == 0, result.stderr
    assert any(out.iterdir())


@pytest.mark.parametrize(
    ("override", "value", "line"),
    [
        ("quantiles", "0", "--model.init_args.quantiles must be >= 1, got 0"),
        ("dropped_per_critic", "25", "--model.init_args.dropped_per_critic must be in [0, quantiles = 25), got 25"),
        ("dropped_per_critic", "-1", "--model.init_args.dropped_per_critic must be in [0, quantiles = 25), got -1"),
    ],
)
def test_a_quantile_option_out_of_range_is_one_error_line_naming_it(
    override, value, line, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "fit", "--config", str(CONFIG), f"--model.init_args.{override}", value)
    assert result.returncode != 0
    errors = [row for row in result.stderr.splitlines() if row.startswith("error")]
    assert len(errors) == 1 and line in errors[0], result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.ckpt"))

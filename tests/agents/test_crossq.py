"""CrossQ: batch renormalisation as Stable-Baselines3 contrib computes it, TorchRL's ``CrossQLoss`` computed from the
update's parameters, the bare reference update, acting that leaves the statistics alone, exact resume with the
shipped config, and its options' errors."""

from __future__ import annotations

import copy

import pytest
import torch
from sb3_contrib.common.torch_layers import BatchRenorm1d as ContribBatchRenorm
from tensordict import TensorDict
from torchrl.modules import BatchRenorm1d as TorchRLBatchRenorm

from app.cli import build
from envs.racing.env import RacingEnv
from modules.batch_renorm import BatchRenorm
from modules.crossq import BatchRenormOptions, CrossQ
from modules.networks import CriticOptions
from modules.sac import ActorOptions
from tests.helpers import (
    ROOT,
    app_in_process,
    assert_the_bare_update_computes,
    fit,
    on_the_racing_car,
    racing_transitions,
    resumed_on_the_racing_car,
)

CONFIG = ROOT / "configs/gym/pendulum_crossq.yaml"
ENV = RacingEnv(curvature_ahead=[5, 15, 30])  # a box of unequal half-ranges, per dimension
SPECS = {"observation_spec": ENV.observation_spec[0], "action_spec": ENV.action_spec[0]}
#: Small networks and batches, a short warm-up: seconds, not the Zoo's minutes.
NETS = (
    *("--model.init_args.actor.hidden_sizes", "[32, 32]", "--model.init_args.critics.hidden_sizes", "[32, 32]"),
    *("--data.init_args.batch_size", "32", "--data.init_args.warmup_frames", "64", "--threads", "1"),
    *("--model.init_args.batch_renorm.warmup_steps", "10"),  # past the warm-up within the run: the renormalisation
)


def test_batch_renorm_is_stable_baselines3_contribs_to_the_bit_before_and_after_its_warm_up():
    torch.manual_seed(0)
    ours, theirs = BatchRenorm(6, momentum=0.1, warmup_steps=3), ContribBatchRenorm(6, momentum=0.1, warmup_steps=3)
    with torch.no_grad():
        for layer in (ours, theirs):  # an affine part off its start
            (layer.weight if layer is ours else layer.scale).copy_(torch.linspace(0.5, 2.0, 6))
            layer.bias.copy_(torch.linspace(-1.0, 1.0, 6))
    for step in range(8):  # 3 warm-up batches, then the correction towards the running statistics
        x = torch.randn(32, 6) * (1 + step) + step  # batches that drift, so that r and d move off 1 and 0
        x[:, 0] = 0.0  # a feature constant over the batch (a dead ReLU's): no NaN through the correction's √
        outputs, gradients = [], []
        for layer in (ours, theirs):
            leaf = x.clone().requires_grad_(True)
            out = layer(leaf)
            (out * torch.arange(6.0)).sum().backward()
            outputs.append(out.detach())
            gradients.append(leaf.grad)
        assert torch.equal(outputs[0], outputs[1]), step
        torch.testing.assert_close(gradients[0][:, 1:], gradients[1][:, 1:], rtol=1e-6, atol=1e-6)
        # The constant feature: ours is finite throughout; SB3 contrib's turns NaN once it renormalises (0 · ∞).
        assert torch.isfinite(gradients[0]).all()
        assert torch.isfinite(gradients[1][:, 0]).all() == (step < 4)
    assert torch.equal(ours.running_mean, theirs.ra_mean) and torch.equal(ours.running_var, theirs.ra_var)
    assert ours.steps.item() == theirs.steps.item() == 8
    ours.eval(), theirs.eval()
    x = torch.randn(5, 6)
    assert torch.equal(ours(x), theirs(x))
    assert ours.steps.item() == 8  # evaluation moves nothing


def test_batch_renorm_of_an_ensemble_is_each_layer_on_its_own():
    torch.manual_seed(1)
    layers = [BatchRenorm(4, warmup_steps=1) for _ in range(3)]
    stacked = TensorDict.from_modules(*layers, as_module=False).clone()
    for _ in range(3):
        x = torch.randn(3, 16, 4)
        expected = torch.stack([layer(x[i]) for i, layer in enumerate(layers)])
        torch.testing.assert_close(layers[0].ensemble(x, stacked, training=True), expected, rtol=0, atol=1e-6)
    for name in ("running_mean", "running_var", "steps"):
        torch.testing.assert_close(stacked[name], torch.stack([getattr(layer, name) for layer in layers]))


def test_torchrls_batch_renorm_warm_up_factor_grows_past_one():
    # Why modules/batch_renorm.py is not TorchRL's layer: its count is never clamped (clamp_max's result is dropped),
    # so the correction doubles after twice the warm-up. When this fails, TorchRL has fixed it.
    layer = TorchRLBatchRenorm(3, warmup_steps=2)
    for _ in range(5):
        layer(torch.randn(8, 3))
    assert layer.num_batches_tracked.item() == 5 > layer.warmup_steps


def crossq(critics: int = 2, learn_alpha: bool = True, warmup_steps: int = 100_000, delay: int = 3) -> CrossQ:
    torch.manual_seed(0)
    model = CrossQ(
        **SPECS,
        actor=ActorOptions(hidden_sizes=(16, 8)),
        critics=CriticOptions(hidden_sizes=(16, 8), count=critics),
        policy_delay=delay,
        batch_renorm=BatchRenormOptions(momentum=0.1, warmup_steps=warmup_steps),
        gamma=0.9,
        learn_alpha=learn_alpha,
    )
    with torch.no_grad():
        model.loss_module.log_alpha.fill_(-0.7)  # α off its start
    return model


def torchrl_losses(model: CrossQ, batch: TensorDict, actor: bool = True) -> dict[str, torch.Tensor]:
    """``CrossQLoss``'s terms with the actor drawing the next action from its running statistics, as
    Stable-Baselines3 contrib does (TorchRL's own draws it in training mode); ``actor`` False: the critics' only."""
    loss_module = model.loss_module
    model.actor_network.eval()
    loss_qvalue, _ = loss_module.qvalue_loss(batch)
    model.actor_network.train()
    if not actor:
        return {"loss_qvalue": loss_qvalue}
    loss_actor, metadata = loss_module.actor_loss(batch)
    loss_alpha = loss_module.alpha_loss(metadata["log_prob"], tensordict=batch)
    return {"loss_qvalue": loss_qvalue, "loss_actor": loss_actor, "loss_alpha": loss_alpha}


def outcome(model: CrossQ, losses_of, batch: TensorDict, start: dict) -> tuple[dict, list, dict]:
    """From the model's state ``start`` and the same random draws: the loss terms ``losses_of(model, batch)`` gives,
    the gradient their sum gives each trainable parameter (None: none), and the running statistics after."""
    model.load_state_dict(start)  # in place: the loss module's parameters stay the networks' own
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    losses = {key: value for key, value in losses_of(model, batch.clone()).items() if key.startswith("loss")}
    sum(losses.values()).backward()
    gradients = [None if p.grad is None else p.grad.clone() for p in model.trainable_parameters()]
    state = {key: value.clone() for key, value in model.state_dict().items() if "running" in key or "steps" in key}
    return {key: value.detach() for key, value in losses.items()}, gradients, state


@pytest.mark.parametrize(
    ("critics", "learn_alpha", "warmup_steps"), [(2, True, 100_000), (1, True, 0), (3, True, 0), (2, False, 0)]
)
def test_the_update_loss_is_torchrls_crossq_loss_in_values_gradients_and_statistics(critics, learn_alpha, warmup_steps):
    # The update computes CrossQLoss's terms from its parameters (every critic in one batched matmul a layer): the
    # same values, the same gradient for every parameter and the same running statistics after, from the same random
    # draws; the updates between two of the actor's, the critics' term alone. With warmup_steps 0 the
    # renormalisation is on from the first batch, and the statistics enter the values.
    model, batch = crossq(critics, learn_alpha, warmup_steps), racing_transitions()
    model.train()
    for _ in range(2):  # statistics off their start
        model.loss(batch.clone())
    start = copy.deepcopy(model.state_dict())
    cases = [
        (torchrl_losses, CrossQ.loss, {"loss_qvalue", "loss_actor", "loss_alpha"}),
        (lambda m, b: torchrl_losses(m, b, actor=False), CrossQ.critic_loss, {"loss_qvalue"}),
    ]
    for expected_of, actual_of, keys in cases:
        expected, expected_gradients, expected_statistics = outcome(model, expected_of, batch, start)
        actual, actual_gradients, actual_statistics = outcome(model, actual_of, batch, start)
        assert set(actual) == set(expected) == keys
        for key in keys:
            torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-5)
        for a, b in zip(actual_gradients, expected_gradients, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert actual_statistics.keys() == expected_statistics.keys() and actual_statistics
        for key, value in expected_statistics.items():
            torch.testing.assert_close(actual_statistics[key], value, rtol=1e-5, atol=1e-6)
        assert any(not torch.equal(actual_statistics[key], start[key]) for key in actual_statistics)
    # Between two of the actor's updates (the last case), the actor gets no gradient and its statistics stay.
    actor = {id(p) for p in model.loss_module.actor_network_params.values(True, True)}
    assert all(g is None for g, p in zip(actual_gradients, model.trainable_parameters(), strict=True) if id(p) in actor)
    assert all(torch.equal(actual_statistics[k], start[k]) for k in actual_statistics if k.startswith("actor"))


def test_acting_reads_the_running_statistics_and_moves_none():
    model, batch = crossq(warmup_steps=0), racing_transitions(8)
    model.train()
    model.loss(racing_transitions().clone())  # statistics off their start
    before = copy.deepcopy(model.state_dict())
    policy = model.policy()
    acted = policy(batch.select("observation").clone())
    assert model.actor_network.training  # put back after acting
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())
    # One observation at a time acts as the whole batch does: no batch statistics in the action.
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    with set_exploration_type(ExplorationType.DETERMINISTIC):
        whole = policy(batch.select("observation").clone())["action"]
        single = torch.cat([policy(batch[i : i + 1].select("observation").clone())["action"] for i in range(8)])
    torch.testing.assert_close(single, whole, rtol=1e-5, atol=1e-6)
    assert acted["action"].shape == batch["action"].shape


@pytest.mark.parametrize("delay", [1, 2])
def test_the_bare_reference_update_computes_the_agents_loss(delay):
    # policy_delay 1: the first update trains the actor too; 2: the first trains the critics only.
    overrides = [*NETS, "--model.init_args.critics.count", "3", "--model.init_args.policy_delay", str(delay)]
    model, data = build([str(CONFIG)], overrides)
    assert isinstance(model, CrossQ)
    model.train()
    assert_the_bare_update_computes(model, data, model.loss if delay == 1 else model.critic_loss)


@pytest.mark.slow
def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights_and_statistics_and_its_policy_exports(tmp_path, capsys):
    # The checkpoint carries the replay buffer, the networks' running statistics and counts, log α and Adam's state,
    # and every RNG; the halves split between two of the actor's updates (policy_delay 2 in the shipped config).
    full, first_half, resumed = resumed_on_the_racing_car(CONFIG, tmp_path, 42, *NETS)
    assert full.keys() == resumed.keys() and not any("target_qvalue" in key for key in full)
    assert any("running_var" in key for key in full)
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    moved = [key for key in resumed if not torch.equal(first_half[key], resumed[key])]
    assert any("qvalue_network" in key and "running_mean" in key for key in moved)
    assert any(key.startswith("actor") and "running_mean" in key for key in moved)
    steps = [value for key, value in full.items() if key.endswith("steps") and "qvalue_network" in key]
    assert steps and all((value > 10).all() for value in steps)  # past batch_renorm.warmup_steps: renormalising
    # The trained policy exports (its deterministic action, the statistics' evaluation mode), from the checkpoint.
    out = tmp_path / "export"
    checkpoint = tmp_path / "half/runs/gym_pendulum_crossq/version_0/checkpoints/last.ckpt"
    args = ("--ckpt_path", str(checkpoint), "--out", str(out), "--batch-sizes", "8")
    result = app_in_process(capsys, "export", *args, "--backend", "torchscript", "--no-benchmark")
    assert result.returncode == 0, result.stderr
    assert any(out.iterdir())


@pytest.mark.slow
def test_the_compiled_update_trains_as_the_eager_one(tmp_path):
    # compile: true, as `lightrl zoo` writes it for the Zoo's long CrossQ runs (the MuJoCo tasks'), on the shipped
    # config: the same weights and statistics as the eager update's after its first updates, to compilation's rounding.
    states = []
    for compile_option in ("false", "true"):
        cli = fit(
            on_the_racing_car(CONFIG, tmp_path / compile_option), *NETS, "--trainer.max_steps", "12",
            "--model.init_args.compile", compile_option, "--trainer.callbacks", "[]",
        )  # fmt: skip
        assert cli.model.global_step == 12
        compiled_loss = getattr(cli.model._compiled_critic_loss, "_torchdynamo_orig_callable", None)
        assert (compiled_loss is not None) == (compile_option == "true")
        states.append(cli.model.state_dict())
    eager, compiled = states
    for key, value in eager.items():
        torch.testing.assert_close(compiled[key], value, rtol=1e-3, atol=1e-4, msg=key)


@pytest.mark.parametrize(
    ("override", "value", "line"),
    [
        ("policy_delay", "0", "--model.init_args.policy_delay must be >= 1, got 0"),
        ("batch_renorm.momentum", "0", "--model.init_args.batch_renorm.momentum must be in (0, 1], got 0"),
        ("batch_renorm.warmup_steps", "-1", "--model.init_args.batch_renorm.warmup_steps must be >= 0, got -1"),
        ("optimizer.betas", "[0.5, 1.5]", "--model.init_args.optimizer.betas must be two numbers in [0, 1)"),
    ],
)
def test_an_option_out_of_range_is_one_error_line_naming_it(override, value, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "fit", "--config", str(CONFIG), f"--model.init_args.{override}", value)
    assert result.returncode != 0
    errors = [row for row in result.stderr.splitlines() if row.startswith("error")]
    assert len(errors) == 1 and line in errors[0], result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.ckpt"))

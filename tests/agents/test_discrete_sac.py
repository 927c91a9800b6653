"""Discrete SAC: TorchRL's ``DiscreteSACLoss`` written out independently (the bare reference update), acting and the
greedy policy, exact resume, the shipped config as the docs run it, and its options' errors."""

from __future__ import annotations

import csv

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs.utils import ExplorationType, set_exploration_type

from app.cli import build
from modules.discrete_sac import DiscreteSAC
from modules.networks import ActorOptions, CriticOptions
from tests.helpers import (
    RESEEDED,
    ROOT,
    app_in_process,
    assert_same_losses_and_gradients,
    assert_the_bare_update_computes,
    chain_config,
    fit,
    write_config,
)

CONFIG = ROOT / "configs/gym/cartpole_discrete_sac.yaml"
SHORT = ("--threads", "1", "--trainer.callbacks.init_args.bare_update_seconds", "0")


def transitions(rows: int = 64, actions: int = 5) -> TensorDict:
    """Random transitions of a 6-feature observation and ``actions`` actions, a quarter of them terminal."""
    generator = torch.Generator().manual_seed(2)
    terminated = torch.rand(rows, 1, generator=generator) < 0.25
    return TensorDict(
        {
            "observation": torch.randn(rows, 6, generator=generator),
            "action": torch.randint(actions, (rows,), generator=generator),
            "next": {
                "observation": torch.randn(rows, 6, generator=generator),
                "reward": torch.randn(rows, 1, generator=generator),
                "done": terminated,
                "terminated": terminated,
            },
        },
        batch_size=[rows],
    )


@pytest.mark.parametrize(
    ("loss_function", "critics", "learn_alpha"), [("l2", 2, True), ("smooth_l1", 3, True), ("l2", 1, False)]
)
def test_the_update_loss_is_torchrls_discrete_sac_loss_in_values_and_gradients(loss_function, critics, learn_alpha):
    # The update computes DiscreteSACLoss's losses from its parameters (every critic in one batched matmul a layer):
    # the same terms, and the same gradient for every parameter, as DiscreteSACLoss.forward.
    torch.manual_seed(0)
    model = DiscreteSAC(
        Composite(observation=Unbounded(shape=(6,))),
        Categorical(5),
        actor=ActorOptions(hidden_sizes=(16, 8)),
        critics=CriticOptions(hidden_sizes=(16, 8), count=critics),
        gamma=0.9,
        learn_alpha=learn_alpha,
        loss_function=loss_function,
    )
    with torch.no_grad():
        model.loss_module.log_alpha.fill_(-0.7)  # α off its start
        for target in model.loss_module.target_qvalue_network_params.values(True, True):
            target.add_(0.1 * torch.randn_like(target))  # targets that differ from the critics
    keys = {"loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"}
    assert_same_losses_and_gradients(model, model.loss_module, model.loss, transitions(), keys)


@pytest.mark.parametrize(
    ("loss_function", "critics", "learn_alpha"), [("l2", 2, True), ("smooth_l1", 3, True), ("l2", 2, False)]
)
def test_the_bare_reference_update_computes_the_agents_loss(loss_function, critics, learn_alpha):
    # The bare update writes DiscreteSACLoss's maths out (exact sums over the actions, the target critics' minimum):
    # the same total on the same batch, and a real update.
    overrides = ["--threads", "1", "--data.init_args.batch_size", "32", "--data.init_args.num_envs", "4"]
    overrides += ["--model.init_args.loss_function", loss_function, "--model.init_args.critics.count", str(critics)]
    overrides += ["--model.init_args.learn_alpha", str(learn_alpha).lower()]
    model, data = build([str(CONFIG)], overrides)
    assert isinstance(model, DiscreteSAC) and model.loss_module.num_qvalue_nets == critics
    with torch.no_grad():
        torch.manual_seed(0)
        model.loss_module.log_alpha.fill_(-0.7)  # α off its start
        for target in model.loss_module.target_qvalue_network_params.values(True, True):
            target.add_(0.1 * torch.randn_like(target))  # targets that differ from the critics
    assert_the_bare_update_computes(model, data)


def test_acting_samples_the_policy_and_the_greedy_policy_and_the_export_take_its_most_probable_action():
    torch.manual_seed(0)
    observation = Composite(observation=Unbounded(shape=(6,)))
    model = DiscreteSAC(observation, Categorical(5))
    batch = TensorDict({"observation": torch.randn(512, 6)}, batch_size=[512])
    best = model.actor_network(batch["observation"]).argmax(-1)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        greedy = model.greedy_policy()(batch.clone())["action"]
    assert torch.equal(greedy, best) and torch.equal(model.export_network()(batch["observation"]).argmax(-1), best)
    with set_exploration_type(ExplorationType.RANDOM):
        sampled = model.policy()(batch.clone())["action"]
    assert sampled.shape == best.shape and (sampled != best).any()  # a near-uniform policy at the start: it explores
    assert set(sampled.unique().tolist()) == set(range(5))


def chain_sac(root):
    config = chain_config("dqn", root)
    config["model"] = {
        "class_path": "modules.discrete_sac.DiscreteSAC",
        "init_args": {"actor": {"hidden_sizes": [32]}, "critics": {"hidden_sizes": [32]}},
    }
    return write_config(config, root.with_suffix(".yaml"))


@pytest.mark.slow
def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(tmp_path):
    # The checkpoint carries the replay buffer, the target critics, log α, Adam's state and every RNG: 60 updates in
    # one run equal 30, a stop and 30 more under another seed.
    fit(chain_sac(tmp_path / "full"), "--trainer.max_steps", "60")
    fit(chain_sac(tmp_path / "half"), "--trainer.max_steps", "30")
    first_half = torch.load(tmp_path / "half/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    fit(chain_sac(tmp_path / "half"), "--trainer.max_steps", "60", "--ckpt_path", "last", *RESEEDED)
    ours = torch.load(tmp_path / "half/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    reference = torch.load(tmp_path / "full/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    assert ours.keys() == reference.keys() and any("target_qvalue" in key for key in ours)
    for key in ours:
        assert torch.equal(ours[key], reference[key]), key
    assert not torch.equal(first_half["loss_module.log_alpha"], ours["loss_module.log_alpha"])  # α was tuned


@pytest.mark.slow
def test_the_shipped_cartpole_config_trains_and_continues_in_its_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logged = ("--trainer.log_every_n_steps", "32")
    fit(CONFIG, *SHORT, *logged, "--trainer.max_steps", "64")
    resumed = fit(CONFIG, *SHORT, *logged, "--trainer.max_steps", "128", "--ckpt_path", "last")
    assert resumed.trainer.global_step == 128
    run = tmp_path / "runs/gym_cartpole_discrete_sac"
    assert sorted(path.name for path in run.iterdir()) == ["version_0"]  # continued in its own folder
    rows = list(csv.DictReader((run / "version_0/metrics.csv").open()))
    evaluated = [float(row["eval/return_mean"]) for row in rows if row.get("eval/return_mean")]
    assert len(evaluated) >= 2 and all(value >= 1 for value in evaluated)
    assert any(row.get("train/loss_alpha") for row in rows) and any(row.get("train/log_alpha") for row in rows)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--data.init_args.env.init_args.env_id", "Pendulum-v1"],
            "--model modules.discrete_sac.DiscreteSAC acts in a discrete action space; Pendulum-v1 has a Box",
        ),
        (
            ["--model.init_args.target_entropy_weight", "0"],
            "--model.init_args.target_entropy_weight must be in (0, 1], got 0",
        ),
        (["--model.init_args.loss_function", "l1"], "--model.init_args.loss_function must be l2 or smooth_l1"),
        (
            ["--data.init_args.priority.alpha", "0.6"],
            "DiscreteSAC gives the replay buffer no priorities; use 0",
        ),
    ],
)
def test_bad_input_is_one_error_line_naming_the_flag(args, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "fit", "--config", str(CONFIG), *args)
    assert result.returncode != 0
    errors = [row for row in result.stderr.splitlines() if row.startswith("error")]
    assert len(errors) == 1 and line in errors[0], result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.ckpt"))

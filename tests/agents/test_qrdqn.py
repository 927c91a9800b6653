"""QR-DQN: its quantile Huber loss against Stable-Baselines3 contrib's, its target from the target network by hand,
acting and export on the quantiles' means, the bare reference update's loss, prioritized replay, and the Zoo's
CartPole config as users run it (logger on, run folder, ``--ckpt_path last``)."""

from __future__ import annotations

import csv

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs.utils import ExplorationType, set_exploration_type

from app.cli import build
from callbacks.bare_updates import as_replay_sample, bare_update, batch_pool
from modules.networks import NetworkOptions
from modules.qrdqn import QRDQN
from modules.quantiles import quantile_huber
from tests.helpers import RESEEDED, ROOT, chain_config, fit, write_config

CONFIG = ROOT / "configs/gym/cartpole_qrdqn.yaml"
SHORT = ("--threads", "1", "--trainer.callbacks.init_args.bare_update_seconds", "0")


def qrdqn(**options) -> QRDQN:
    torch.manual_seed(0)
    spec = Composite(observation=Unbounded(shape=(4,)))
    return QRDQN(spec, Categorical(3), network=NetworkOptions(hidden_sizes=(16,)), quantiles=5, gamma=0.9, **options)


def transitions(rows: int) -> TensorDict:
    torch.manual_seed(1)
    return TensorDict(
        {
            "observation": torch.randn(rows, 4),
            "action": torch.randint(0, 3, (rows,)),
            ("next", "observation"): torch.randn(rows, 4),
            ("next", "reward"): torch.randn(rows, 1),
            ("next", "terminated"): torch.rand(rows, 1) < 0.3,
            ("next", "done"): torch.zeros(rows, 1, dtype=torch.bool),
        },
        [rows],
    )


@pytest.mark.parametrize("double_dqn", [False, True])
def test_the_loss_regresses_the_taken_quantiles_on_the_target_networks_distribution(double_dqn):
    # The target network's weights differ from the online network's (as between two copies): the target is
    # r + γ (1 − terminated) θ_target(s', a*), a* the target's greedy action (the online network's with double_dqn).
    model, batch = qrdqn(double_dqn=double_dqn), transitions(32)
    with torch.no_grad():
        for parameter in model.q_network.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))  # the online network moves; the target stays
    online = model.q_network.quantiles
    target_network = QRDQN(
        Composite(observation=Unbounded(shape=(4,))), Categorical(3), network=NetworkOptions(hidden_sizes=(16,)),
        quantiles=5,
    ).q_network.quantiles  # fmt: skip
    with model.loss_module.target_value_network_params.to_module(model.actor):  # the target's weights, copied
        target_network.load_state_dict(online.state_dict())
    assert not torch.equal(target_network.network[1][0].weight, online.network[1][0].weight)
    with torch.no_grad():
        following = batch["next", "observation"]
        chooser = online(following) if double_dqn else target_network(following)
        best = chooser.mean(-1).argmax(-1)
        rows = torch.arange(32)
        next_value = target_network(following)[rows, best]
        continues = (~batch["next", "terminated"]).float()
        target = batch["next", "reward"] + 0.9 * continues * next_value
    predicted = online(batch["observation"])[rows, batch["action"]]
    losses = model.loss(batch)
    torch.testing.assert_close(losses["loss_quantile"], quantile_huber(predicted, target).sum(-2).mean())
    torch.testing.assert_close(losses["td_error"], (target.mean(-1) - predicted.mean(-1)).abs().detach())


def test_it_acts_and_exports_on_the_quantiles_means():
    model, batch = qrdqn(), transitions(64)
    means = model.q_network.quantiles(batch["observation"]).mean(-1)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        acted = model.greedy_policy()(batch.select("observation"))
    assert torch.equal(acted["action"], means.argmax(-1))
    torch.testing.assert_close(model.export_network()(batch["observation"]), means)


def test_bare_qrdqn_update_computes_the_agents_loss():
    model, data = build([str(CONFIG)], [*SHORT, "--data.init_args.batch_size", "64"])
    step = bare_update(model, data)
    batch = as_replay_sample(batch_pool(data, data.batch_size)[0])
    expected = model.loss(batch)["loss_quantile"].detach()
    assert step(0) == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.slow
def test_prioritized_replay_takes_its_priorities_and_the_run_resumes_exactly(tmp_path):
    # The chain env's QR-DQN with prioritized replay: 2 x 40 updates in one run equal 40, a stop and 40 more, the
    # priorities (each sample's |mean target − mean prediction|) in the checkpoint.
    def config(root):
        config = chain_config("qrdqn", root, priority={"alpha": 0.6, "beta": 0.4, "beta_updates": 100})
        return write_config(config, root.with_suffix(".yaml"))

    full = fit(config(tmp_path / "full"), "--trainer.max_steps", "80")
    priority = full.datamodule.buffer.sampler.state_dict()["priority"]
    written = priority[priority > 0]
    assert len(written) > 64 and len(written.unique()) > 8  # the updates handed their samples' priorities back
    fit(config(tmp_path / "half"), "--trainer.max_steps", "40")
    fit(config(tmp_path / "half"), "--trainer.max_steps", "80", "--ckpt_path", "last", *RESEEDED)
    ours = torch.load(tmp_path / "half/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    reference = torch.load(tmp_path / "full/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    assert ours.keys() == reference.keys()
    for key in ours:
        assert torch.equal(ours[key], reference[key]), key


@pytest.mark.slow
def test_the_zoo_cartpole_config_trains_and_continues_in_its_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fit(CONFIG, *SHORT, "--trainer.max_steps", "64", "--data.init_args.warmup_frames", "256")
    resumed = fit(CONFIG, *SHORT, "--trainer.max_steps", "128", "--ckpt_path", "last")
    assert resumed.trainer.global_step == 128
    rows = list(csv.DictReader((tmp_path / "runs/gym_cartpole_qrdqn/version_0/metrics.csv").open()))
    evaluated = [float(row["eval/return_mean"]) for row in rows if row.get("eval/return_mean")]
    assert len(evaluated) >= 2 and all(value == value for value in evaluated)

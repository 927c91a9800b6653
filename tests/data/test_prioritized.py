"""Prioritized replay: exact proportional draws, the importance-weight formula, new transitions at the largest
priority, the weighted DQN and PIRL losses, and a real fit writing each update's |TD error| into the slots it drew."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from datamodules.prioritized import ProportionalSampler
from datamodules.replay import ReplayDataModule
from modules.dqn import TargetOptions
from tests.agents.test_dqn import linear_q, make_dqn, transition
from tests.agents.test_pirl import small_run
from tests.helpers import chain_config, fit, write_config

ALPHA, BETA, EPS = 0.7, 0.4, 1e-6


def buffer(capacity: int, filled: int, seed: int = 0) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=ProportionalSampler(capacity, ALPHA, BETA, eps=EPS),
        priority_key="td_error",
        batch_size=filled,
        generator=torch.Generator().manual_seed(seed),
    )
    rb.extend(TensorDict(x=torch.arange(filled)[:, None], batch_size=[filled]))
    return rb


def test_draws_are_proportional_to_priority_to_the_alpha():
    rb = buffer(capacity=10, filled=6)  # 4 empty slots, which must never be drawn
    td_error = torch.tensor([0.1, 0.5, 1.0, 2.0, 0.0, 4.0])
    rb.update_priority(torch.arange(6), td_error)
    draws = 400_000
    sample = rb.sample(draws)
    assert torch.equal(sample["x"].view(-1), sample["index"])  # the rows are the drawn slots
    counts = torch.bincount(sample["index"], minlength=10).double()
    assert counts[6:].sum() == 0
    expected = (td_error.double() + EPS).pow(ALPHA)
    expected = expected / expected.sum()
    frequency = counts[:6] / draws
    assert 0.5 * (frequency - expected).abs().sum() < 0.003  # total variation (its sampling noise here: ~0.001)
    # Pearson's χ² over the five slots with real mass (slot 4's expected count is ~6): below the 0.999 quantile of
    # χ²(4), 18.47.
    real = expected > 1e-4
    chi2 = ((counts[:6][real] - draws * expected[real]) ** 2 / (draws * expected[real])).sum()
    assert chi2 < 18.47


def test_importance_weights_follow_the_formula():
    rb = buffer(capacity=8, filled=5)
    td_error = torch.tensor([0.2, 1.0, 3.0, 0.5, 1.5])
    rb.update_priority(torch.arange(5), td_error)
    sample = rb.sample(64)
    probability = (td_error.double() + EPS).pow(ALPHA)
    probability = probability / probability.sum()
    # w_i = (N P(i))^-β / max_j (N P(j))^-β, N = the transitions stored
    weight = (5 * probability).pow(-BETA) / (5 * probability).pow(-BETA).max()
    torch.testing.assert_close(sample["priority_weight"], weight[sample["index"]].float())
    assert sample["priority_weight"].max() <= 1.0


def test_new_transitions_get_the_largest_priority_seen():
    rb = buffer(capacity=8, filled=3)
    rb.update_priority(torch.arange(3), torch.tensor([0.5, 6.0, 1.0]))
    rb.update_priority(torch.tensor([1]), torch.tensor([0.1]))  # the largest seen stays 6, though no slot holds it now
    rb.extend(TensorDict(x=torch.tensor([[3], [4]]), batch_size=[2]))
    stored = rb.sampler.state_dict()["priority"]
    assert stored[3] == stored[4] == pytest.approx((6.0 + EPS) ** ALPHA)
    assert stored[1] == pytest.approx((0.1 + EPS) ** ALPHA)


def test_sampler_state_round_trips_and_refuses_another_capacity():
    rb = buffer(capacity=8, filled=4)
    rb.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 9.0]))
    other = buffer(capacity=8, filled=4, seed=1)
    other.sampler.load_state_dict(rb.sampler.state_dict())
    assert torch.equal(other.sampler.state_dict()["priority"], rb.sampler.state_dict()["priority"])
    assert other.sampler.default_priority.item() == pytest.approx(9.0 + EPS)
    with pytest.raises(ValueError, match="buffer_size"):
        buffer(capacity=16, filled=4).sampler.load_state_dict(rb.sampler.state_dict())


def test_dqn_loss_applies_the_weights_and_returns_the_absolute_td_error():
    dqn = make_dqn(gamma=0.5, loss_function="l2", target=TargetOptions(update="hard"))
    linear_q(dqn, [[1.0, 2.0], [3.0, 4.0]], [0.5, -0.5])
    batch = torch.cat(
        [
            transition(obs=[1, 0], action=1, next_obs=[0, 1], reward=1.0, terminated=False),  # δ = 2.75 - 2.5
            transition(obs=[1, 0], action=1, next_obs=[0, 1], reward=-1.0, terminated=True),  # δ = -1 - 2.5
        ]
    )
    batch["priority_weight"] = torch.tensor([0.25, 1.0])
    losses = dqn.loss(batch)
    errors = torch.tensor([0.25, -3.5])
    assert losses["loss"].item() == pytest.approx((0.25 * 0.25**2 + 1.0 * 3.5**2) / 1.25)
    torch.testing.assert_close(losses["td_error"], errors.abs())
    del batch["priority_weight"]
    unweighted = dqn.loss(batch)
    assert unweighted["loss"].item() == pytest.approx((0.25**2 + 3.5**2) / 2)
    torch.testing.assert_close(unweighted["td_error"], errors.abs())


class RecordingReplay(ReplayDataModule):
    """The replay data module, recording each served batch with the model's weights before its update, and what the
    model handed back after it."""

    def next_ready_batch(self):  # every batch is served through it (a step may take several)
        batch = super().next_ready_batch()
        self.served = (batch.clone(), copy.deepcopy(self.trainer.lightning_module.loss_module.state_dict()))
        return batch

    def after_update(self, priority=None):
        self.returned = priority.clone()
        super().after_update(priority)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["dqn", "dqn-compiled", "pirl_vehicle-compiled"])
def test_fit_writes_each_updates_td_errors_into_the_slots_it_drew(tmp_path, run):
    priority = {"priority": {"alpha": ALPHA, "beta": BETA, "beta_updates": 40}}
    if run.startswith("pirl"):  # the shipped config (5-step returns, compiled), shortened
        config = small_run("pirl_vehicle.yaml", tmp_path)
        config["data"]["init_args"].update(priority)
    else:
        config = chain_config("dqn", tmp_path, **priority)
        config["model"]["init_args"]["compile"] = run.endswith("compiled")
    config["data"]["class_path"] = "tests.data.test_prioritized.RecordingReplay"
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "60")
    data, model = cli.datamodule, cli.model
    batch, weights_before = data.served
    assert {"index", "priority_weight"} <= set(batch.keys())
    assert data.buffer.sampler.beta == 1.0  # risen from 0.4 over 40 updates

    # The model's |δ| for the last batch, recomputed eagerly by TorchRL's DQNLoss (squared TD error) with the weights
    # it was computed with (PIRL's written-out error equals DQNLoss's at discount 1: tests/agents/test_pirl.py).
    model.loss_module.load_state_dict(weights_before)
    recomputed = batch.clone()
    model.loss_module(recomputed)
    torch.testing.assert_close(data.returned, recomputed["td_error"].sqrt().view(-1), rtol=1e-5, atol=1e-6)
    # ...written as the new priorities of exactly the slots that batch was drawn from.
    stored = data.buffer.sampler.state_dict()["priority"]
    torch.testing.assert_close(stored[batch["index"]], (data.returned.double() + EPS).pow(ALPHA))
    filled = len(data.buffer)
    assert stored[:filled].unique().numel() > 10 and stored[filled:].eq(0).all()


@pytest.mark.slow
def test_bad_priority_options_name_the_flag(tmp_path, capsys):
    config = write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml")
    for flag, value in [("priority.alpha", "-0.5"), ("priority.beta", "1.5"), ("priority.beta_updates", "0")]:
        with pytest.raises(SystemExit):
            fit(config, f"--data.init_args.{flag}", value)
        assert f"--data.init_args.{flag}" in capsys.readouterr().err

"""The bare reference updates compute the agents' own losses: the yardstick measures the same arithmetic."""

from __future__ import annotations

import json
import statistics

import pytest
import torch
from tensordict import TensorDict

from app.cli import build
from callbacks.bare_updates import as_replay_sample, bare_update, batch_pool, framework_free_update, ppo_batches
from tests.helpers import ROOT, assert_the_bare_update_computes, benchmark_module, chain_config, write_config

SMALL = ["--threads", "1", "--data.init_args.num_envs", "4"]


def total(losses: TensorDict) -> torch.Tensor:
    return sum(value for key, value in losses.items() if key.startswith("loss"))


@pytest.mark.parametrize("config", ["snake_dqn.yaml", "pirl_vehicle.yaml"])
def test_bare_dqn_update_computes_the_agents_loss(config):
    model, data = build([str(ROOT / "configs" / config)], [*SMALL, "--data.init_args.batch_size", "64"])
    model.physics = data.declared.physics  # what PIRL's setup takes from the data module (None for Snake)
    step = bare_update(model, data)
    pool = batch_pool(data, data.batch_size)
    batch = as_replay_sample(pool[0])  # the bare loop's batch 0
    torch.manual_seed(7)  # the bare loop draws PIRL's collocation points from the global generator
    physics = data.declared.physics
    points = physics and physics.collocation(model.physics_loss.collocation_points, batch["observation"])
    expected = total(model.loss(batch, points) if points else model.loss(batch)).detach()
    torch.manual_seed(7)
    assert step(0) == pytest.approx(expected.item(), rel=1e-5)
    # ...and it really updates: the next call on the same batch sees moved weights.
    torch.manual_seed(7)
    assert step(len(pool)) != pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["snake_dqn.yaml", "pirl_vehicle.yaml"])
def test_framework_free_update_is_the_agents_update_step(config):
    # benchmarks/update_cost.py --arithmetic times this against the bare update: it must be the same loss on the same
    # batches, and a real update: the weights move.
    # A large learning rate, so that one step visibly changes the loss on the same batch. Both losses eager: the
    # update compiles its loss through the same `model.compiled` as the agent's step, and that the compiled losses are
    # the eager ones is tests/agents/test_lightning_features.py's (DQN) and tests/agents/test_pirl.py's (PIRL); a
    # compilation here would be a third of PIRL's, half a minute of a cold compiler on a slow day.
    overrides = [*SMALL, "--data.init_args.batch_size", "64", "--model.init_args.optimizer.lr", "0.01"]
    overrides += ["--model.init_args.compile", "false"]
    model, data = build([str(ROOT / "configs" / config)], overrides)
    before = [parameter.detach().clone() for parameter in model.trainable_parameters()]
    step = framework_free_update(model, data)
    pool = batch_pool(data, data.batch_size)
    batch = as_replay_sample(pool[0])
    generator = getattr(model, "collocation_generator", None)  # PIRL's: the update draws its points from it
    state = generator and generator.get_state()
    expected = total(model.loss(batch, **(model.loss_draws(batch) if generator else {}))).detach()
    if generator:
        generator.set_state(state)
    assert step(0) == pytest.approx(expected.item(), rel=1e-5)
    assert step(len(pool)) != pytest.approx(expected.item(), rel=1e-5)
    assert not any(torch.equal(a, b) for a, b in zip(before, model.trainable_parameters(), strict=True))


def test_framework_free_td3_update_trains_the_actor_on_its_rhythm_only():
    # The bare TD3 update trains the actor and moves the targets every policy_delay-th update: the agent's own update
    # timed against it (update_cost.py --arithmetic) must do the same, or it times more arithmetic than the bare one.
    overrides = [*SMALL, "--data.init_args.batch_size", "64", "--model.init_args.compile", "false"]
    model, data = build([str(ROOT / "configs/gym/pendulum_td3.yaml")], overrides)
    assert model.policy_delay == 2 and [model.updates_actor(i) for i in range(4)] == [False, True, False, True]
    step = framework_free_update(model, data)
    pool = batch_pool(data, data.batch_size)
    actor = [p.detach().clone() for p in model.loss_module.actor_network_params.values(True, True)]
    targets = [p.detach().clone() for p in model.loss_module.target_qvalue_network_params.values(True, True)]

    def unchanged(before, params) -> bool:
        return all(torch.equal(a, b) for a, b in zip(before, params.values(True, True), strict=True))

    for i, with_actor in enumerate([False, True]):
        batch = as_replay_sample(pool[i])
        torch.manual_seed(i)  # the target policy's noise
        expected = total(model.loss(batch) if with_actor else model.critic_loss(batch)).item()
        torch.manual_seed(i)
        assert step(i) == pytest.approx(expected, rel=1e-5)
        assert unchanged(actor, model.loss_module.actor_network_params) is not with_actor
        assert unchanged(targets, model.loss_module.target_qvalue_network_params) is not with_actor


@pytest.mark.parametrize(("critics", "learn_alpha"), [(2, "true"), (3, "true"), (2, "false")])
def test_bare_sac_update_computes_the_agents_loss(critics, learn_alpha):
    # With more critics than the twin pair, TorchRL's loss and the written-out one both take the minimum over all; with
    # a fixed α (learn_alpha false) neither moves it.
    overrides = [*SMALL, "--data.init_args.batch_size", "64", "--config", str(ROOT / "configs/bench/sac_update.yaml")]
    overrides += ["--model.init_args.critics.count", str(critics), "--model.init_args.learn_alpha", learn_alpha]
    model, data = build([str(ROOT / "configs/racing_sac.yaml")], overrides)
    assert model.loss_module.num_qvalue_nets == critics
    assert_the_bare_update_computes(model, data)


def test_bare_ppo_update_computes_clip_ppo_loss():
    model, data = build([str(ROOT / "configs/snake_ppo.yaml")], [*SMALL, "--data.init_args.minibatch_size", "64"])
    step = bare_update(model, data)
    batch = ppo_batches(data, data.minibatch_size)[0]
    td = as_replay_sample(batch)
    td["action_log_prob"] = batch["log_prob"]
    td["advantage"] = batch["advantage"].unsqueeze(-1)
    td["value_target"] = batch["value_target"].unsqueeze(-1)
    expected = total(model.loss(td)).detach()
    assert step(0) == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.slow
def test_update_cost_reads_the_runs_own_yardstick_its_stretches_and_its_phases(tmp_path):
    # benchmarks/update_cost.py on a tiny run: the fit's own throughput report times the bare slices between stretches
    # of training, and the benchmark's figures are the report's (one yardstick, not a second one beside it).
    update_cost = benchmark_module("update_cost")
    config = write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml")
    bench = str(ROOT / "configs" / "bench" / "throughput.yaml")  # the report as the benchmarks compose it
    extra = ["--trainer.callbacks.init_args.skip_first_steps", "5"]  # after the benchmark's 200: a short warm-up
    result = update_cost.run([str(config), bench], "cost", "false", 600, 1, 0.05, 0.02, tmp_path / "out", extra)
    report = json.loads((tmp_path / "out" / "cost" / "version_0" / "throughput.json").read_text())
    pairs = report["bare_update"]["pairs"]
    assert len(pairs) >= 3 and result["segments"] == pairs and result["report"] == "cost/version_0"
    assert all(pair["beside_the_loop"] and pair["updates"] > 0 and pair["seconds"] >= 0.05 for pair in pairs)
    assert result["ratio"] == statistics.median(pair["loop_ms"] / pair["bare_ms"] for pair in pairs)
    assert result["bare_ms_per_update"]["median"] == statistics.median(pair["bare_ms"] for pair in pairs)
    # The steady state's time per update, split into the data module's phases and the rest, the slices left out.
    steady, phases = report["steady_state"], result["fit"]["phases_ms_per_update"]
    assert phases["update"] > 0 and phases["collect"] > 0
    assert sum(phases.values()) == pytest.approx(1e3 * steady["wall_s"] / steady["updates"])


def test_update_cost_floor_mode_times_the_environments_steps_and_the_acting_policy_per_update():
    # --floor on a shipped Gymnasium config of several copies: each round's environment and acting times are per batch
    # step scaled to the frames of one update (4 frames over 8 copies: half a batch step), the floor their sum over
    # the bare update. The acting policy acts with its network (ε at its end, not the 1 it starts from).
    update_cost = benchmark_module("update_cost")
    result = update_cost.floor(str(ROOT / "configs/gym/cartpole_dqn.yaml"), threads=1, rounds=3, seconds=0.02)
    assert (result["env_id"], result["num_envs"], result["frames_per_update"]) == ("CartPole-v1", 8, 4)
    assert result["epsilon"] == pytest.approx(0.04)  # the config's eps_end
    rounds = result["rounds"]
    parts = ("bare", "update", "environment", "acting", "in_rounds", "in_rounds_update")
    assert [len(rounds[name]) for name in parts] == [3] * len(parts)
    floors = [(b + e + a) / b for b, e, a in zip(rounds["bare"], rounds["environment"], rounds["acting"], strict=True)]
    assert result["floor"] == pytest.approx(sorted(floors)[1]) and result["floor_range"] == [min(floors), max(floors)]
    assert all(value > 0 for values in rounds.values() for value in values) and result["floor"] > 1
    # In rounds as the loop runs them: a round of the config's 32 batch steps of 8 copies (256 frames) earns 64 updates.
    assert result["cycle"] == {"batch_steps": 32, "updates": 64}
    in_rounds = [cost / bare for cost, bare in zip(rounds["in_rounds"], rounds["bare"], strict=True)]
    assert result["floor_in_rounds"] == pytest.approx(sorted(in_rounds)[1])
    # The same rounds with the agent's own update step in place of the bare one (the config's: eager here), the floor
    # a fit of this config can read: its loop ÷ bare less this is the loop's own work.
    assert result["compile"] is False
    own = [cost / bare for cost, bare in zip(rounds["in_rounds_update"], rounds["bare"], strict=True)]
    assert result["floor_in_rounds_update"] == pytest.approx(sorted(own)[1])
    assert result["floor_in_rounds_update_range"] == [min(own), max(own)]
    updates = [cost / bare for cost, bare in zip(rounds["update"], rounds["bare"], strict=True)]
    assert result["update"] == pytest.approx(sorted(updates)[1])
    with pytest.raises(SystemExit, match="a Gymnasium config is needed"):
        update_cost.floor(str(ROOT / "configs/snake_dqn.yaml"), threads=1, rounds=1, seconds=0.01)
    with pytest.raises(SystemExit):
        update_cost.parse_args(["--floor", "no/such/config.yaml"])


def test_update_cost_arithmetic_mode_alternates_the_two_update_steps():
    update_cost = benchmark_module("update_cost")
    snake = [str(ROOT / path) for path in update_cost.CONFIGS["dqn"]]
    result = update_cost.arithmetic(snake, "dqn", "false", threads=1, rounds=3, seconds=0.02)
    assert [len(result["rounds"][name]) for name in ("bare", "update")] == [3, 3]
    ratios = [u / b for u, b in zip(result["rounds"]["update"], result["rounds"]["bare"], strict=True)]
    assert result["ratio"] == pytest.approx(sorted(ratios)[1])
    assert result["ratio_range"] == [min(ratios), max(ratios)]
    with pytest.raises(SystemExit):
        update_cost.parse_args(["--agent", "ppo", "--arithmetic"])
    # --config: any replay config's update (a Gymnasium QR-DQN here), only with --arithmetic, an existing file
    config = str(ROOT / "configs/gym/cartpole_qrdqn.yaml")
    args = update_cost.parse_args(["--arithmetic", "--config", config])
    assert args.config == [config] and args.arithmetic
    # repeated, the configs compose in order (a preset on a shipped config), as the app composes them
    preset = str(ROOT / "configs/bench/throughput.yaml")
    assert update_cost.parse_args(["--arithmetic", "--config", config, "--config", preset]).config == [config, preset]
    result = update_cost.arithmetic([config], "cartpole_qrdqn", "false", threads=1, rounds=2, seconds=0.02)
    assert result["agent"] == "cartpole_qrdqn"
    assert [len(result["rounds"][name]) for name in ("bare", "update")] == [2, 2]
    for flags in (["--config", config], ["--arithmetic", "--config", "no/such/config.yaml"]):
        with pytest.raises(SystemExit):
            update_cost.parse_args(flags)

"""The physics-informed DQN: the reference's network, its loss terms, and short real fits on the toy and the vehicle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from envs.safety.vehicle import VehicleEnv
from modules.pirl import PhysicsInformedDQN, PhysicsLossOptions
from tests.app.test_pins import assert_pinned
from tests.helpers import RESEEDED, ROOT, fit, weights, write_config


def small_run(config_name: str, root: Path, **model: object) -> dict:
    """The shipped config, shortened to a few hundred updates, writing under ``root``; ``model`` overrides its
    init_args (an option group's fields, a mapping, join the config's)."""
    config = yaml.safe_load((ROOT / "configs" / config_name).read_text())
    config["trainer"].update(
        {"max_steps": 150, "max_time": None, "default_root_dir": str(root), "enable_progress_bar": False}
    )
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(root)
    config["trainer"]["callbacks"] = [
        {"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": {"every_n_frames": 10**9}},
        {
            "class_path": "callbacks.safety.SafetyEvaluation",
            "init_args": {"every_n_frames": 10**9, "states": 16, "rollouts": 8},
        },
    ]
    config["trainer"]["log_every_n_steps"] = 50
    config["data"]["init_args"].update({"num_envs": 8, "warmup_frames": 256, "batch_size": 64, "buffer_size": 2000})
    for key, value in model.items():
        if isinstance(value, dict):
            config["model"]["init_args"].setdefault(key, {}).update(value)
        else:
            config["model"]["init_args"][key] = value
    return config


def test_the_seed_network_has_exactly_3481_parameters():
    env = VehicleEnv()
    model = PhysicsInformedDQN(env.observation_spec[0], env.action_spec[0])
    assert sum(p.numel() for p in model.q_network.parameters()) == 3481
    layers = [type(m).__name__ for m in model.q_network.modules() if not isinstance(m, torch.nn.Sequential)]
    assert layers == ["Linear", "Tanh", "Linear", "Tanh", "Linear", "Tanh", "Linear", "Sigmoid"]
    q = model.q_network(torch.randn(5, 16))
    assert q.shape == (5, 25) and (q > 0).all() and (q < 1).all()  # probabilities


@pytest.mark.slow
@pytest.mark.parametrize("config_name", ["pirl_toy.yaml", "pirl_vehicle.yaml"])
def test_short_fit_logs_every_loss_term_and_writes_the_safety_report(tmp_path, config_name):
    config = write_config(small_run(config_name, tmp_path), tmp_path / "c.yaml")
    cli = fit(config)
    assert cli.trainer.global_step == 150
    metrics = cli.trainer.logged_metrics
    for key in ("train/loss", "train/loss_pde", "train/loss_boundary"):
        assert torch.isfinite(metrics[key]), key
    assert metrics["train/loss_pde"] > 0 and metrics["train/loss_boundary"] > 0
    report = json.loads(next(tmp_path.rglob("safety.json")).read_text())
    assert len(report["value"]) == len(report["success"]) == 16 and report["rollouts"] == 8
    values, success = torch.tensor(report["value"]), torch.tensor(report["success"])
    assert report["metrics"]["safety_mae"] == pytest.approx((values - success).abs().mean().item(), rel=1e-5)
    assert 0 <= report["metrics"]["random_return_mean"] <= 1
    assert next(tmp_path.rglob("safety.png")).stat().st_size > 0
    assert cli.datamodule.frames >= 150 * cli.datamodule.frames_per_update
    assert_pinned(config_name.removesuffix(".yaml"), Path(cli.trainer.log_dir))  # tests/app/test_pins.py


@pytest.mark.slow
def test_pde_weight_zero_drops_the_physics_term(tmp_path):
    config = write_config(small_run("pirl_toy.yaml", tmp_path, physics_loss={"pde_weight": 0.0}), tmp_path / "c.yaml")
    cli = fit(config)
    assert "train/loss_pde" not in cli.trainer.logged_metrics
    assert "train/loss_boundary" in cli.trainer.logged_metrics


@pytest.mark.parametrize("double_dqn", [False, True])
def test_written_out_dqn_error_equals_torchrl_dqn_loss(double_dqn):
    torch.manual_seed(0)
    env = VehicleEnv(num_envs=16)
    physics_loss = PhysicsLossOptions(pde_weight=0.0, boundary_weight=0.0)
    model = PhysicsInformedDQN(
        env.observation_spec[0], env.action_spec[0], double_dqn=double_dqn, physics_loss=physics_loss
    )
    model.physics = env.physics
    batch = vehicle_batch(env)
    assert batch["next", "terminated"].any()  # terminal transitions are in the batch
    with torch.no_grad():  # make the target network differ from the online one
        for weight in model.loss_module.target_value_network_params.values(True, True):
            weight.add_(0.1 * torch.randn_like(weight))
    torch.testing.assert_close(model.loss(batch)["loss"], model.loss_module(batch)["loss"])
    # With prioritized replay's importance weights: TorchRL's weighted mean, and each sample's |TD error| back.
    batch["priority_weight"] = torch.rand(batch.numel())
    weighted = model.loss(batch)
    torch.testing.assert_close(weighted["loss"], model.loss_module(batch)["loss"])
    torch.testing.assert_close(weighted["td_error"], batch["td_error"].sqrt().view(-1))


def vehicle_batch(env: VehicleEnv, steps: int = 8):
    td, rows = env.reset(), []
    for _ in range(steps):
        td["action"] = torch.randint(25, (env.batch_size[0],))
        out, td = env.step_and_maybe_reset(td)
        rows.append(out.clone())
    return torch.cat(rows)


@pytest.mark.slow
def test_compiled_loss_equals_eager_while_the_networks_change_in_place():
    # The shipped config compiles the loss, and the compiled loss drops Dynamo's guards on the model: it must still
    # read the online and target weights as they are now (optimizer steps and soft updates change them in place).
    torch.manual_seed(0)
    env = VehicleEnv(num_envs=16)
    model = PhysicsInformedDQN(env.observation_spec[0], env.action_spec[0], double_dqn=True, compile=True)
    model.physics = env.physics
    compiled_loss = model.compiled(model.loss)
    batch = vehicle_batch(env)
    for _ in range(3):
        draws = model.loss_draws(batch)  # the same collocation points for both
        eager = model.loss(batch, **draws)
        compiled = compiled_loss(batch, **draws)
        for key in ("loss", "loss_pde", "loss_boundary"):
            torch.testing.assert_close(compiled[key], eager[key], rtol=1e-4, atol=1e-6)
        with torch.no_grad():
            for weight in model.q_network.parameters():
                weight.add_(0.05 * torch.randn_like(weight))
            model.soft_update()


def test_boundary_loss_pulls_v_to_one_at_the_horizon_and_to_zero_when_unsafe():
    torch.manual_seed(0)
    env = VehicleEnv()
    physics_loss = PhysicsLossOptions(pde_weight=0.0)
    model = PhysicsInformedDQN(env.observation_spec[0], env.action_spec[0], physics_loss=physics_loss)
    model.physics = env.physics
    optimizer = torch.optim.Adam(model.q_network.parameters(), lr=1e-2)
    # The step size falls to 1/20: at a constant 1e-2 the values still swing by ±0.1 from step to step, so where the
    # last step left them depended on the machine's rounding (0.11 on one CPU, 0.03 on another).
    schedule = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.05, total_iters=300)
    replay = env.reset()["observation"].expand(32, 16)
    for _ in range(300):
        points = env.physics.collocation(64, replay)
        loss = (model.value(points["terminal"]) - 1).pow(2).mean() + model.value(points["unsafe"]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    points = env.physics.collocation(256, replay)
    assert model.value(points["terminal"]).mean() > 0.9
    assert model.value(points["unsafe"]).mean() < 0.1


@pytest.mark.slow
def test_physics_free_environment_is_refused(tmp_path):
    config = small_run("pirl_toy.yaml", tmp_path)
    config["data"]["init_args"]["env"] = {"class_path": "envs.testing.chain.ChainEnv"}
    with pytest.raises(ValueError, match="needs an environment that exposes its dynamics"):
        fit(write_config(config, tmp_path / "c.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [False, True])
def test_resumed_vehicle_run_ends_with_identical_weights(tmp_path, prefetch):
    """The vehicle's state (cars, arc positions, noise counters), the replay buffer and the collocation generator
    resume. With prefetch the rounds (2 updates each) are prepared in a background thread beside updates that draw
    collocation points, and the stop at update 41 falls inside a round."""

    def config(root: Path, steps: int) -> Path:
        run = small_run("pirl_vehicle.yaml", root)
        run["trainer"]["callbacks"] = run["trainer"]["callbacks"][:1]  # the checkpoint only
        run["trainer"]["max_steps"] = steps
        run["trainer"]["logger"] = False
        run["data"]["init_args"]["collection"] = {
            "class_path": "datamodules.collection.InProcess",
            "init_args": {"prefetch": prefetch},
        }
        return write_config(run, root.parent / f"{root.name}.yaml")

    fit(config(tmp_path / "full", 82))
    fit(config(tmp_path / "half", 41))
    # Another global seed: only a complete restore (weights, RNG states, envs, buffer) can still match the full run.
    cli = fit(config(tmp_path / "half", 82), "--ckpt_path", "last", *RESEEDED)
    assert cli.trainer.global_step == 82
    full = weights(next((tmp_path / "full").rglob("last.ckpt")))
    resumed = weights(next((tmp_path / "half").rglob("last.ckpt")))
    for key in full:
        assert torch.equal(full[key], resumed[key]), key

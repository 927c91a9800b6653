"""The batched safety environments: the vehicle on its circuit and the 2-D toy, checked step by step."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs

from callbacks.safety import success_rates
from envs.safety.physics import TAU, VehicleParameters, vehicle_controls, vehicle_dynamics
from envs.safety.toy import ToyEnv
from envs.safety.vehicle import VehicleEnv, _circuit

QUIET = (0.0, 0.0, 0.0, 0.0, 0.0)


def place(env: VehicleEnv, vehicle: list[float], tau: float, arc: float = 0.0) -> None:
    """Put every car at the same hand-made state (waypoints recomputed from the road)."""
    env.state[:, :5] = torch.tensor(vehicle)
    env.state[:, TAU] = tau
    env.arc.fill_(arc)
    env.state[:, 5:TAU] = env._waypoints(env.arc, env.state)


def step(env, action: int) -> TensorDict:
    n = env.batch_size[0]
    td = TensorDict({"action": torch.full((n,), action)}, batch_size=[n])
    return env.step(td)["next"]


def test_the_circuit_closes_and_has_both_turn_directions():
    xy, heading, curvature = _circuit(0.25)
    torch.testing.assert_close(xy[-1], xy[0], atol=1e-3, rtol=0)
    assert heading[-1].item() == pytest.approx(2 * math.pi, abs=1e-4)
    assert (curvature > 0).any() and (curvature < 0).any() and (curvature == 0).any()
    assert VehicleEnv().track_length == pytest.approx(432.0, abs=1.0)


def test_specs_and_state_layout():
    env = VehicleEnv(num_envs=64, seed=3)
    check_env_specs(env)
    state = env.reset()["observation"]
    assert state.shape == (64, 16)
    # Start states fill the collocation box (docs/reference_systems.md §2).
    assert state[:, 0].min() >= 5 and state[:, 0].max() <= 20 and state[:, 0].max() - state[:, 0].min() > 10
    assert state[:, 1].abs().max() <= 10 and state[:, 2].abs().max() <= 30 and state[:, 4].abs().max() <= 30
    assert state[:, 3].abs().max() <= 0.95 and state[:, 3].abs().max() > 0.5
    assert state[:, TAU].min() >= 0 and state[:, TAU].max() <= 5
    narrow = VehicleEnv(num_envs=64, seed=3, start_spread=0.5).reset()["observation"]
    assert narrow[:, 3].abs().max() <= 0.475 and narrow[:, 0].min() >= 8.75
    assert (state[:, 5:10] > 0).all()  # waypoints ahead of the car


def test_waypoints_on_a_straight_centre_line():
    env = VehicleEnv(num_envs=1, noise_std=QUIET)
    place(env, [10.0, 0.0, 0.0, 0.0, 0.0], tau=3.0, arc=1.0)  # the first straight starts at arc 0
    torch.testing.assert_close(env.state[0, 5:10], torch.tensor([2.0, 4.0, 6.0, 8.0, 10.0]), atol=1e-3, rtol=0)
    torch.testing.assert_close(env.state[0, 10:15], torch.zeros(5), atol=1e-3, rtol=0)
    place(env, [10.0, 0.0, 0.0, 0.5, 0.0], tau=3.0, arc=1.0)  # half a metre left of the centre line
    torch.testing.assert_close(env.state[0, 10:15], torch.full((5,), -0.5), atol=1e-3, rtol=0)


def test_one_step_is_an_euler_step_of_the_shared_dynamics():
    env = VehicleEnv(num_envs=1, noise_std=QUIET, substeps=1)
    vehicle = [12.0, 2.0, 5.0, 0.2, -3.0]
    place(env, vehicle, tau=2.0, arc=5.0)
    out = step(env, 18)  # throttle 0.9, steer +0.4
    throttle, steer = vehicle_controls(torch.tensor([18]))
    rates = vehicle_dynamics(*torch.tensor([vehicle]).T, throttle, steer, 0.0, VehicleParameters())
    expected = torch.tensor(vehicle) + 0.05 * torch.stack(rates[:5], -1)[0]
    torch.testing.assert_close(out["observation"][0, :5], expected, rtol=1e-5, atol=1e-5)
    assert out["observation"][0, TAU].item() == pytest.approx(1.95)
    assert not out["done"].any()


def test_reaching_the_horizon_pays_one_and_leaving_the_safe_set_pays_zero():
    env = VehicleEnv(num_envs=3, noise_std=QUIET)
    place(env, [10.0, 0.0, 0.0, 0.0, 0.0], tau=0.05, arc=1.0)
    env.state[1, 3] = 0.99  # drifting out at ψ = 20°
    env.state[1, 4] = 20.0
    env.state[2, 0] = 4.01  # almost too slow, steering hard (the front tyre brakes)
    env.state[2, TAU] = 3.0
    out = step(env, 4)  # throttle 0.6, steer +0.8
    assert out["reward"].view(-1).tolist() == [1.0, 0.0, 0.0]
    assert out["done"].view(-1).tolist() == [True, True, True]
    assert out["terminated"].view(-1).tolist() == [True, True, True]


def test_a_batch_replays_the_episodes_of_single_environments():
    batch = VehicleEnv(num_envs=4, seed=10)
    singles = [VehicleEnv(num_envs=1, seed=10 + i) for i in range(4)]
    td = batch.reset()
    single_tds = [env.reset() for env in singles]
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        actions = torch.randint(25, (4,), generator=generator)
        td["action"] = actions
        _, td = batch.step_and_maybe_reset(td)
        for i, env in enumerate(singles):
            single_tds[i]["action"] = actions[i : i + 1]
            _, single_tds[i] = env.step_and_maybe_reset(single_tds[i])
            torch.testing.assert_close(td["observation"][i], single_tds[i]["observation"][0])


def test_replicated_states_diverge_only_through_their_noise():
    env = VehicleEnv(num_envs=2, seed=0)
    start = env.reset()["observation"]
    copies = env.replicate(3, seed=100)
    assert torch.equal(copies.state, start.repeat_interleave(3, 0))
    out = step(copies, 12)
    assert not torch.equal(out["observation"][0], out["observation"][1])  # different noise streams
    quiet = VehicleEnv(num_envs=2, seed=0, noise_std=QUIET)
    quiet.reset()
    out = step(quiet.replicate(3, seed=100), 12)
    assert torch.equal(out["observation"][0], out["observation"][2])


def test_monte_carlo_success_rates_of_sure_and_doomed_states():
    env = ToyEnv(num_envs=2, sigma=0.0, tau_max=1.0)
    env.reset()
    env.state[0] = torch.tensor([0.0, 0.0, 0.1])  # at rest, two steps from the horizon
    env.state[1] = torch.tensor([2.0, 0.95, 0.5])  # pushed out of |x2| <= 1 within a few steps
    rates = success_rates(env, lambda obs: torch.ones(obs.shape[0], dtype=torch.long), rollouts=8, seed=0)
    assert rates.tolist() == [1.0, 0.0]
    noisy = ToyEnv(num_envs=1, sigma=0.4, tau_max=1.0)
    noisy.reset()
    noisy.state[0] = torch.tensor([0.0, 0.6, 1.0])
    rate = success_rates(noisy, lambda obs: torch.zeros(obs.shape[0], dtype=torch.long), rollouts=512, seed=0)
    assert 0.05 < rate.item() < 0.95  # a genuinely uncertain state under noise


def test_toy_step_is_euler_maruyama_of_the_shared_drift():
    env = ToyEnv(num_envs=1, sigma=0.0, controls=(-1.0, 0.0, 1.0))
    env.reset()
    env.state[0] = torch.tensor([0.5, 0.2, 0.6])
    out = step(env, 2)  # u = +1
    x1, x2 = 0.5, 0.2
    expected = torch.tensor([x1 + 0.05 * (-(x1**3) - x2), x2 + 0.05 * (x1 + x2 + 1.0), 0.55])
    torch.testing.assert_close(out["observation"][0], expected)


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="lateral_bound must be > 0"):
        VehicleEnv(lateral_bound=0)
    with pytest.raises(ValueError, match="start_spread must be in"):
        VehicleEnv(start_spread=0.0)
    with pytest.raises(ValueError, match="noise_std must be 5 values"):
        VehicleEnv(noise_std=(1.0, 2.0))
    with pytest.raises(ValueError, match="controls must list at least 2"):
        ToyEnv(controls=(1.0,))

"""Racing: the track's geometry and its refusals, the car's rules on hand-made states, batched cars equal single
cars, and the expert driving whole laps from every start."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs

from envs.racing.env import STEERING_LIMIT, RacingEnv
from envs.racing.expert import FlooredThrottle, TimeOptimalExpert, speed_profile
from envs.racing.stress_circuits import STRESS_CIRCUITS, course_points
from envs.racing.track import Track


def test_default_track_is_a_closed_smooth_loop():
    track = Track()
    assert torch.allclose(track.xy[-1], track.xy[0], atol=1e-4)
    assert (track.heading[-1] - track.heading[0]).item() == pytest.approx(2 * math.pi, abs=1e-4)  # one turn, left
    assert 440 < track.length < 460 and track.min_radius > 18
    steps = (track.xy[1:] - track.xy[:-1]).norm(dim=1)
    assert torch.allclose(steps, torch.full_like(steps, track.resolution), rtol=0.02)  # sampled by arc length
    # Curvature is the heading's rate of change along the arc (continuous: the spline is C2).
    rate = (track.heading[2:] - track.heading[:-2]) / (2 * track.resolution)
    assert torch.allclose(rate, track.curvature[1:-1], atol=2e-3)


def test_a_circle_of_control_points_gives_a_circle():
    points = [(50 * math.cos(a), 50 * math.sin(a)) for a in torch.linspace(0, 2 * math.pi, 25)[:-1].tolist()]
    track = Track(points, width=4.0)
    radius = track.xy.norm(dim=1)
    assert torch.allclose(radius, radius.mean(), rtol=1e-3)
    assert torch.allclose(track.curvature, 1 / radius.mean(), rtol=1e-2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"width": 0.0}, "width must be > 0"),
        ({"width": -1.0}, "width must be > 0"),
        ({"control_points": [(0, 0), (10, 0), (10, 10)]}, "at least 4"),
        ({"control_points": [(0, 0), (0, 0), (10, 0), (10, 10)]}, "0 and 1 are the same point"),
        ({"control_points": [(0, 0), (3, 0), (3, 3), (0, 3)], "width": 4.0}, "folds over itself"),
    ],
)
def test_impossible_tracks_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RacingEnv(**kwargs)


def test_specs_are_consistent():
    check_env_specs(RacingEnv(num_envs=3))


def place(env: RacingEnv, arc: float, lateral: float = 0.0, heading: float = 0.0, speed: float = 10.0) -> None:
    """Put every car at ``arc`` m along the track, ``lateral`` m left of the centre line, ``heading`` rad off it."""
    env.reset()
    arcs = torch.full((env.batch_size[0],), arc)
    centre, track_heading, _ = env.track.at(arcs)
    normal = torch.stack((-torch.sin(track_heading), torch.cos(track_heading)), 1)
    position = centre + lateral * normal
    env.x.copy_(position[:, 0])
    env.y.copy_(position[:, 1])
    env.yaw.copy_(track_heading + heading)
    env.speed.fill_(speed)
    env.arc.copy_(arcs)


def step(env: RacingEnv, acceleration: float, steering: float):
    action = torch.tensor([[acceleration, steering]]).expand(env.batch_size[0], 2).clone()
    return env._step(TensorDict(action=action, batch_size=env.batch_size))


def test_driving_along_the_straight():
    env = RacingEnv(num_envs=1, smoothness=0.0)
    place(env, arc=50.0, speed=10.0)  # the first straight, along +x
    x = env.x.clone()
    out = step(env, 2.0, 0.0)
    assert env.x.item() == pytest.approx(x.item() + 10.0 * env.dt, abs=1e-4)
    assert env.speed.item() == pytest.approx(10.0 + 2.0 * env.dt)
    lateral, heading_error, vx, vy = out["observation"][0, :4].tolist()
    assert abs(lateral) < 1e-3 and abs(heading_error) < 1e-3 and vy == 0.0 and vx == pytest.approx(10.04)
    assert out["progress"].item() == pytest.approx(10.0 * env.dt / env.track.length, rel=1e-3)
    # Only the speed term: v cos(0) / max_speed, at the speed the step ends with.
    assert out["reward"].item() == pytest.approx(10.04 / env.max_speed, rel=1e-3)
    assert not out["done"].item()


def test_actions_outside_the_box_are_clipped():
    # Through the public step: car 0 pushes above the box (+4 m/s², +25°), car 1 below it (−6 m/s², −25°).
    outside = torch.tensor([[100.0, 2.0], [-100.0, -2.0]])
    at_limits = torch.tensor([[4.0, STEERING_LIMIT], [-6.0, -STEERING_LIMIT]])
    results = []
    for action in (outside, at_limits):
        env = RacingEnv(num_envs=2)
        place(env, arc=50.0, speed=10.0)
        results.append(env.step(TensorDict(action=action.clone(), batch_size=env.batch_size))["next"])
        assert env.speed.tolist() == pytest.approx([10.0 + 4.0 * env.dt, 10.0 - 6.0 * env.dt])
        torch.testing.assert_close(env.last_action, at_limits)
    # The step itself (position, heading, speed: the observation; the smoothness term: the reward) is the limits'.
    assert results[0]["observation"][0, 1] > 0 > results[0]["observation"][1, 1]  # turned left, and right
    torch.testing.assert_close(results[0]["observation"], results[1]["observation"], rtol=0, atol=0)
    torch.testing.assert_close(results[0]["reward"], results[1]["reward"], rtol=0, atol=0)


def test_the_grip_limits_the_turn_at_speed():
    env = RacingEnv(num_envs=1, grip=8.0)
    speed, steering = torch.tensor([5.0, 25.0]), torch.tensor([0.2, 0.2])
    _, yaw_rate = env.slip_and_yaw_rate(speed, steering)
    wheelbase = env.lf + env.lr
    beta = math.atan(env.lr / wheelbase * math.tan(0.2))
    free = 5.0 * math.cos(beta) * math.tan(0.2) / wheelbase
    assert yaw_rate[0].item() == pytest.approx(free)  # 5 m/s: within the grip, the plain bicycle
    assert (speed[1] * yaw_rate[1]).item() == pytest.approx(8.0)  # 25 m/s: lateral acceleration held at the grip


def test_a_grip_range_gives_each_episode_its_own_car_and_changes_no_other_draw():
    with pytest.raises(ValueError, match=r"grip_range must be \[low, high\] with 0 < low <= high"):
        RacingEnv(grip_range=[8.0, 6.0])
    plain, varied = RacingEnv(num_envs=64, seed=3), RacingEnv(num_envs=64, seed=3, grip_range=[6.0, 8.0])
    first = varied.reset()
    torch.testing.assert_close(first["observation"], plain.reset()["observation"], rtol=0, atol=0)  # the same starts
    grips = varied.car_grip.clone()
    assert ((grips >= 6.0) & (grips <= 8.0)).all() and grips.std() > 0.3  # drawn, spread over the range
    varied._reset(TensorDict({"_reset": torch.arange(64) < 32}, batch_size=[64]))
    assert (varied.car_grip[:32] != grips[:32]).all() and torch.equal(varied.car_grip[32:], grips[32:])
    # The car's own grip holds it: at 25 m/s a lateral acceleration of each car's grip.
    _, yaw_rate = varied.slip_and_yaw_rate(torch.full((64,), 25.0), torch.full((64,), 0.2))
    torch.testing.assert_close(25.0 * yaw_rate, varied.car_grip)
    # A checkpoint holds it (a one-grip env's keeps its old keys).
    restored = RacingEnv(num_envs=64, seed=3, grip_range=[6.0, 8.0])
    restored.load_state_dict(varied.state_dict())
    assert torch.equal(restored.car_grip, varied.car_grip) and "car_grip" not in plain.state_dict()


def test_off_the_track_costs_and_beyond_the_runoff_ends_the_episode():
    env = RacingEnv(num_envs=1, smoothness=0.0, tracking=0.0)
    place(env, arc=50.0, lateral=2.5, speed=0.0)  # 0.5 m beyond the edge, inside the 1 m run-off
    out = step(env, 0.0, 0.0)
    assert out["reward"].item() == pytest.approx(-1.0) and not out["done"].item()
    place(env, arc=50.0, lateral=-3.2, speed=0.0)
    out = step(env, 0.0, 0.0)
    assert out["reward"].item() == pytest.approx(-1.0 - 10.0)
    assert out["terminated"].item() and out["done"].item() and not out["truncated"].item()


def test_episodes_are_truncated_at_max_steps():
    env = RacingEnv(num_envs=2, max_steps=5)
    td = env.reset()
    for _ in range(5):
        td = env.step(td.set("action", torch.zeros(2, 2)))
        done = td["next", "truncated"].view(-1)
        td = td["next"]
    assert done.all() and not td["terminated"].any()


def test_a_lap_is_counted_once_with_its_time():
    env = RacingEnv(num_envs=1)
    place(env, arc=60.0, speed=20.0)
    env.progress.fill_(env.track.length - 0.3)  # 0.3 m short of a lap; this step covers 0.4 m
    env.elapsed.fill_(30.0)
    out = step(env, 0.0, 0.0)
    assert out["laps"].item() == 1.0 and out["lap_time"].item() == pytest.approx(30.0 + env.dt)
    out = step(env, 0.0, 0.0)
    assert out["laps"].item() == 0.0 and out["lap_time"].item() == 0.0


def test_batched_cars_drive_the_episodes_of_single_cars():
    torch.manual_seed(0)
    steps, cars = 300, 4
    actions = torch.rand(steps, cars, 2) * torch.tensor([10.0, 2 * STEERING_LIMIT]) - torch.tensor(
        [6.0, STEERING_LIMIT]
    )
    batched = RacingEnv(num_envs=cars, seed=7, max_steps=120)
    singles = [RacingEnv(num_envs=1, seed=7 + i, max_steps=120) for i in range(cars)]

    def run(env: RacingEnv, columns: slice) -> torch.Tensor:
        td, rows = env.reset(), []
        for t in range(steps):
            out, td = env.step_and_maybe_reset(td.set("action", actions[t, columns]))
            rows.append(torch.cat((out["next", "observation"], out["next", "reward"], out["next", "done"]), 1))
        return torch.stack(rows)

    together = run(batched, slice(None))
    assert together[..., -1].sum() > cars  # episodes ended (crashes and truncations) and restarted
    for i, env in enumerate(singles):
        torch.testing.assert_close(together[:, i : i + 1], run(env, slice(i, i + 1)))


def test_speed_profile_respects_grip_braking_and_acceleration():
    curvature = [0.0] * 40 + [0.1] * 20 + [0.0] * 40 + [0.0]  # a straight, a tight bend, a straight; closed
    profile = speed_profile(curvature, spacing=1.0, grip=8.0, max_speed=30.0, accelerating=4.0, braking=5.0)
    assert max(profile[40:60]) == pytest.approx(math.sqrt(80.0))  # the bend's grip limit
    for i in range(100):  # neither braking nor accelerating harder than planned between neighbours
        gain = profile[i + 1] ** 2 - profile[i] ** 2
        assert -2 * 5.0 - 1e-6 <= gain <= 2 * 4.0 + 1e-6
    assert profile[0] == profile[-1]


@pytest.mark.slow
def test_expert_drives_a_whole_lap_from_every_start_without_leaving_the_track():
    cars = 256
    env = RacingEnv(num_envs=cars, seed=123)
    expert = TimeOptimalExpert(env)
    td = env.reset()
    worst = torch.zeros(cars)
    first_lap = torch.zeros(cars)
    for _ in range(1_800):  # 36 s: a lap takes the expert about 26 s from a standing or rolling start
        td = env.step(expert(td))
        worst = torch.maximum(worst, td["next", "observation"][:, 0].abs())
        first_lap += td["next", "lap_time"].view(-1)
        assert not td["next", "done"].any()
        td = td["next"]
    assert (first_lap > 0).all()  # every car completed its first lap
    assert worst.max() < env.width / 2  # never off the track
    assert 20 < first_lap.mean() < 35


def test_curvature_ahead_joins_the_observation():
    env = RacingEnv(num_envs=2, curvature_ahead=(0.0, 15.0))
    td = env.reset()
    assert td["observation"].shape == (2, 10)
    _, _, curvature = env.track.at(env.arc.unsqueeze(1) + torch.tensor([0.0, 15.0]))
    torch.testing.assert_close(td["observation"][:, 8:], 20.0 * curvature)
    check_env_specs(env)
    with pytest.raises(ValueError, match="curvature_ahead"):
        RacingEnv(curvature_ahead=(-5.0,))


@pytest.mark.slow
def test_evaluation_averages_lap_time_over_the_episodes_that_completed_a_lap():
    from datamodules.evaluation import EvaluationOptions
    from datamodules.replay import ReplayDataModule

    # The expert completes its first lap (about 26 s) from every start of a 40 s episode; a car that stands still
    # completes none. Mixed in one evaluation, lap_time_mean is the lap's time, not half of it.
    data = ReplayDataModule(
        lambda **kwargs: RacingEnv(max_steps=2000, **kwargs), evaluation=EvaluationOptions(episodes=4)
    )
    assert data.declared.episode_metric_over == {"lap_time": "laps"}  # the env declares it; the data module reads it
    probe = data.make_env(4, 0)
    expert = TimeOptimalExpert(probe)

    def half_standing(td: TensorDict) -> TensorDict:
        td = expert(td)
        td["action"][2:] = torch.tensor([-6.0, 0.0])  # cars 2 and 3 brake and never move
        return td

    metrics = data.evaluate(half_standing)
    assert metrics["laps_mean"] == pytest.approx(0.5)  # two of four cars completed one lap
    assert 24 < metrics["lap_time_mean"] < 30
    standing = data.evaluate(lambda td: td.set("action", torch.tensor([-6.0, 0.0]).expand(4, 2).clone()))
    assert math.isnan(standing["lap_time_mean"]) and standing["laps_mean"] == 0


def test_the_speed_limiter_brings_a_driver_who_never_brakes_round_hairpins_after_long_straights():
    # The stress set's paperclip: 160 m straights into 10 m hairpins. Without the limiter the floored throttle leaves
    # the road at the first hairpin; with it every car completes its lap and is never far over its limit.
    points = course_points(STRESS_CIRCUITS["paperclip"])
    laps = {}
    for limiter in (None, {}):
        env = RacingEnv(num_envs=8, seed=5, control_points=points, observation="road", speed_limiter=limiter)
        driver, td = FlooredThrottle(env), env.reset()
        ended, completed, fastest_over = torch.zeros(8, dtype=torch.bool), torch.zeros(8), 0.0
        for _ in range(2_500):  # 50 s: a lap of the 381 m circuit takes about 25 s
            limit = env.speed_limit() if limiter is not None else None
            td = env.step(driver(td))
            if limit is not None:  # how far over its limit a step ends: only where the limit falls faster than braking
                fastest_over = max(fastest_over, float((env.speed - limit).max()))
            completed += td["next", "laps"].view(-1) * ~ended
            ended |= td["next", "done"].view(-1)
            td = td["next"]
            if bool((ended | (completed >= 1)).all()):
                break
        laps[limiter is not None] = (completed, ended, fastest_over)
    completed, ended, _ = laps[False]
    assert ended.all() and (completed == 0).all()  # off at the first hairpin, every car
    completed, ended, fastest_over = laps[True]
    assert not ended.any() and (completed >= 1).all() and fastest_over < 0.5  # m/s; the hairpins' limit is 8.9


def test_the_speed_limiter_leaves_a_car_under_its_limit_alone_and_its_options_are_checked():
    env = RacingEnv(num_envs=4, seed=1, observation="road", speed_limiter={"horizon": 50})
    free = RacingEnv(num_envs=4, seed=1, observation="road")
    env.reset(), free.reset()
    # Rolling off at the start: far under any corner's speed, the limiter changes nothing.
    action = TensorDict({"action": torch.tensor([[2.0, 0.0]] * 4)}, batch_size=[4])
    torch.testing.assert_close(env.step(action.clone())["next"], free.step(action.clone())["next"], rtol=0, atol=0)
    assert env.init_kwargs()["speed_limiter"] == {"horizon": 50}  # rebuilt as given (workers, evaluation)
    for options, message in (
        ({"brake": 5}, r"speed_limiter.brake: unknown option; the options are braking, horizon, margin"),
        ({"braking": 7}, r"speed_limiter.braking must be <= the car's 6 m/s², got 7.0"),
        ({"margin": 1.5}, r"speed_limiter.margin must be <= 1"),
        ({"spacing": 0}, r"speed_limiter.spacing must be > 0, got 0.0"),
    ):
        with pytest.raises(ValueError, match=message):
            RacingEnv(speed_limiter=options)

"""Racing beyond one circuit (issue 31): the circuit generator, held-out and reversed circuits, per-car circuits and
the road observation, which must hold nothing in world coordinates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from envs.racing.circuits import CircuitGenerator, TrackSource
from envs.racing.env import ROAD_AHEAD, ROAD_FEATURES, RacingEnv, drive_episodes, episode_summary
from envs.racing.expert import TimeOptimalExpert
from envs.racing.stress_circuits import STRESS_CIRCUITS, course_points
from envs.racing.track import DEFAULT_CIRCUIT, Track

WIDTH, RUNOFF = 4.0, 1.0


def test_the_same_seed_gives_the_same_circuit_and_another_seed_another():
    generator = CircuitGenerator()
    first, again = generator.circuit((5, 0, 3), WIDTH, RUNOFF), generator.circuit((5, 0, 3), WIDTH, RUNOFF)
    assert first.control_points == again.control_points and torch.equal(first.xy, again.xy)
    other = generator.circuit((5, 0, 4), WIDTH, RUNOFF)
    assert other.control_points != first.control_points


def test_a_stretch_scales_the_same_ring_along_x():
    plain, doubled = CircuitGenerator(), CircuitGenerator(stretch=(2.0, 2.0))
    ring = plain.control_points(np.random.default_rng([3, 0, 1]))
    stretched = doubled.control_points(np.random.default_rng([3, 0, 1]))
    assert np.array_equal(stretched, ring * np.array([2.0, 1.0]))  # its factor is drawn after the ring's numbers
    long = CircuitGenerator(stretch=(2.5, 3.0), min_radius=8.0).circuit((0, 0, 0), WIDTH, RUNOFF)
    assert CircuitGenerator.gap(long) >= WIDTH + 2 * RUNOFF + 4.0 and long.min_radius >= 8.0


def test_every_generated_circuit_passes_the_track_checks():
    generator = CircuitGenerator()
    for track in TrackSource(pool=24).tracks(WIDTH, RUNOFF):
        # Rebuilt from its control points: the track's own checks (no fold: tightest radius above half the width).
        rebuilt = Track(track.control_points, WIDTH)
        assert rebuilt.min_radius == track.min_radius >= generator.min_radius > WIDTH / 2
        assert CircuitGenerator.gap(track) >= WIDTH + 2 * RUNOFF + generator.clearance
        assert 200 < track.length < 900
    # The gap check can fail: a ring with a narrow slot cut into it passes the fold check, but the road on the two
    # sides of the slot comes within reach of a car that runs wide.
    slot = [(0, 0), (60, 0), (60, 60), (10, 60), (10, 20), (-5, 20), (-5, 60), (-60, 60), (-60, 0)]
    assert CircuitGenerator.gap(Track(slot, WIDTH)) < WIDTH + 2 * RUNOFF + generator.clearance


@pytest.mark.slow
def test_held_out_and_validation_circuits_are_never_in_the_training_pool_nor_in_each_other():
    train = TrackSource(pool=64)
    held_out, validation = TrackSource(split="held_out", held_out=8), TrackSource(split="validation", held_out=8)
    assert not set(train.seeds()) & set(held_out.seeds())
    assert not set(validation.seeds()) & (set(train.seeds()) | set(held_out.seeds()))
    pool = {track.control_points for track in train.tracks(WIDTH, RUNOFF)}
    assert len(pool) == 64
    tests = {track.control_points for track in held_out.tracks(WIDTH, RUNOFF)}
    checks = {track.control_points for track in validation.tracks(WIDTH, RUNOFF)}
    assert len(tests) == len(checks) == 8 and not pool & tests and not pool & checks and not tests & checks


def test_every_stress_circuit_closes_is_a_valid_track_and_is_unlike_the_generators():
    generator = CircuitGenerator()
    for name, course in STRESS_CIRCUITS.items():
        track = Track(course_points(course), WIDTH)
        assert CircuitGenerator.gap(track) >= WIDTH + 2 * RUNOFF + generator.clearance, name
        # Its tightest radius is the drawing's (the spline follows the drawn line within a few per cent) ...
        tightest = min(segment[2] for segment in course if segment[0] != "straight")
        assert track.min_radius == pytest.approx(tightest, rel=0.06), name
    # ... and the set holds a corner tighter than any the generator may draw.
    assert min(Track(course_points(c), WIDTH).min_radius for c in STRESS_CIRCUITS.values()) < generator.min_radius
    with pytest.raises(ValueError, match="the course does not close: it ends 10.00 m from its start"):
        course_points((("straight", 100.0), ("left", 180.0, 20.0), ("straight", 90.0), ("left", 180.0, 20.0)))


def test_a_reversed_circuit_is_the_same_road_the_other_way():
    track = Track(DEFAULT_CIRCUIT)
    backwards = track.reversed()
    assert backwards.length == pytest.approx(track.length, rel=1e-6)
    assert backwards.min_radius == pytest.approx(track.min_radius, rel=3e-3)  # sampled at other points
    # Every point of one centre line is on the other, and the curvature changes sign (a left turn becomes a right).
    nearest = torch.cdist(track.xy.double(), backwards.xy.double()).min(1).values
    assert nearest.max() < backwards.resolution
    assert track.curvature.sum() > 0 > backwards.curvature.sum()
    source = TrackSource(split="held_out", held_out=2, directions="both").tracks(WIDTH, RUNOFF)
    assert [t.control_points for t in source[1::2]] == [t.control_points[::-1] for t in source[0::2]]


def rotate(points, angle: float, shift: tuple[float, float]) -> list[tuple[float, float]]:
    c, s = math.cos(angle), math.sin(angle)
    return [(c * x - s * y + shift[0], s * x + c * y + shift[1]) for x, y in points]


@pytest.mark.parametrize("angle, shift", [(2.0, (300.0, -120.0)), (-0.7, (-50.0, 80.0))])
def test_the_road_observation_does_not_change_when_the_world_turns_and_moves(angle, shift):
    # The same circuit and the same starts (same seed), the whole world rotated and moved: a driver who sees only
    # the road sees the same thing. The reference observation (world tangent and heading) does change.
    moved = rotate(DEFAULT_CIRCUIT, angle, shift)
    observations = {}
    for kind in ("road", "reference"):
        envs = [
            RacingEnv(num_envs=16, seed=3, control_points=points, observation=kind)
            for points in (DEFAULT_CIRCUIT, moved)
        ]
        experts = [TimeOptimalExpert(env) for env in envs]
        tds = [env.reset() for env in envs]
        rows = [[], []]
        for _ in range(150):  # 3 s of the expert's driving, also through corners
            for i, (env, expert) in enumerate(zip(envs, experts, strict=True)):
                rows[i].append(tds[i]["observation"])
                tds[i] = env.step(expert(tds[i]))["next"]
        observations[kind] = [torch.stack(r) for r in rows]
    road, reference = observations["road"], observations["reference"]
    assert road[0].shape[-1] == ROAD_FEATURES + len(ROAD_AHEAD)
    torch.testing.assert_close(road[0], road[1], atol=2e-3, rtol=1e-3)
    assert (reference[0][..., 4:8] - reference[1][..., 4:8]).abs().max() > 0.5


def test_the_expert_drives_the_same_from_either_observation():
    cars = 32
    road, reference = (RacingEnv(num_envs=cars, seed=9, observation=kind) for kind in ("road", "reference"))
    td_road, td_reference = road.reset(), reference.reset()
    actions = [TimeOptimalExpert(env)(td)["action"] for env, td in ((road, td_road), (reference, td_reference))]
    torch.testing.assert_close(actions[0], actions[1], atol=1e-5, rtol=1e-5)


def test_the_road_observation_reads_the_car_against_the_road():
    env = RacingEnv(num_envs=1, observation="road", curvature_ahead=[0.0, 20.0])
    td = env.reset()
    offset, sin, cos, vx, vy, yaw_rate, left, right, along, *curvature = td["observation"][0].tolist()
    assert left == pytest.approx(1 - offset) and right == pytest.approx(1 + offset)
    assert sin**2 + cos**2 == pytest.approx(1.0)
    assert env.lateral_of(td["observation"]).item() == pytest.approx(offset * env.width / 2)
    assert vx * env.max_speed == pytest.approx(env.speed.item(), rel=1e-5) and vy == 0.0 and yaw_rate == 0.0
    assert along == pytest.approx(vx * cos / (1 - env.track.at(env.arc)[2].item() * offset * 2), rel=1e-4)
    kappa = env.track.at(env.arc.unsqueeze(1) + torch.tensor([0.0, 20.0]))[2]
    torch.testing.assert_close(torch.tensor(curvature), 20.0 * kappa[0])


@pytest.mark.slow
def test_per_episode_circuits_are_drawn_from_each_cars_stream_and_checkpointed():
    options = {"tracks": {"pool": 16}, "max_steps": 40, "observation": "road"}
    batched = RacingEnv(num_envs=4, seed=11, **options)
    singles = [RacingEnv(num_envs=1, seed=11 + i, **options) for i in range(4)]

    def run(env: RacingEnv, steps: int, td=None) -> tuple[list[torch.Tensor], object]:
        td = env.reset() if td is None else td
        circuits = []
        for _ in range(steps):
            td = env.step_and_maybe_reset(td.set("action", torch.zeros(env.batch_size[0], 2)))[1]
            circuits.append(td["circuit"].view(-1).clone())
        return circuits, td

    together, td = run(batched, 200)  # 5 episodes per car
    drawn = torch.stack(together)
    assert len(drawn.unique()) > 4  # new circuits at resets
    for i, env in enumerate(singles):
        assert torch.equal(drawn[:, i], torch.stack(run(env, 200)[0]).view(-1))
    # Loaded into a fresh environment, the state (circuit included) continues exactly.
    state = {key: value.clone() for key, value in batched.state_dict().items()}
    assert "circuit" in state
    copy = RacingEnv(num_envs=4, seed=99, **options)
    copy.load_state_dict(state)
    follow, _ = run(batched, 100, td.clone())
    resumed, _ = run(copy, 100, td.clone())
    assert torch.equal(torch.stack(follow), torch.stack(resumed))


@pytest.mark.slow
def test_the_expert_completes_its_first_lap_on_every_stress_circuit_both_ways():
    tracks = {"split": "stress", "per": "env", "directions": "both"}
    env = RacingEnv(num_envs=2 * len(STRESS_CIRCUITS), seed=0, tracks=tracks, observation="road", max_steps=2_400)
    assert sorted(env.circuit.tolist()) == list(range(2 * len(STRESS_CIRCUITS)))  # a car per circuit and direction
    assert [track.length for track in env.circuits.tracks[::2]] == [
        pytest.approx(Track(course_points(course), WIDTH).length) for course in STRESS_CIRCUITS.values()
    ]
    summary = episode_summary(drive_episodes(env, TimeOptimalExpert(env)), env.width)
    assert summary["lap_completed"] == 1.0 and summary["never_off_track"] == 1.0


@pytest.mark.slow
def test_the_expert_completes_its_first_lap_on_held_out_circuits_both_ways():
    tracks = {"split": "held_out", "held_out": 3, "per": "env", "directions": "both"}
    env = RacingEnv(num_envs=6, seed=0, tracks=tracks, observation="road", max_steps=1_800)
    assert sorted(env.circuit.tolist()) == list(range(6))  # one car per circuit and direction
    summary = episode_summary(drive_episodes(env, TimeOptimalExpert(env)), env.width)
    assert summary["lap_completed"] == 1.0 and summary["never_off_track"] == 1.0
    assert 15 < summary["lap_time_mean"] < 40


@pytest.mark.parametrize(
    "options, message",
    [
        ({"observation": "map"}, "observation must be one of reference, road"),
        ({"tracks": {"pools": 4}}, "tracks.pools: unknown option"),
        ({"tracks": {"per": "lap"}}, "tracks.per must be one of episode, env"),
        ({"tracks": {"split": "test"}}, "tracks.split must be one of train, held_out, validation, stress"),
        ({"tracks": {"generator": {"radius": [50, 10]}}}, "tracks.generator.radius must be"),
        ({"tracks": {"generator": {"sharpness": 1}}}, "tracks.generator.sharpness: unknown option"),
        ({"tracks": {"generator": {"stretch": [0.5, 2]}}}, "tracks.generator.stretch must be"),
    ],
)
def test_bad_options_are_one_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        RacingEnv(**options)


def test_several_circuits_render_at_one_size():
    env = RacingEnv(num_envs=2, tracks={"split": "held_out", "held_out": 2, "per": "env"})
    assert env.circuit.tolist() == [0, 1]
    assert env.render(0).shape == env.render(1).shape
    with pytest.raises(RuntimeError, match="env.circuits"):
        env.track  # noqa: B018

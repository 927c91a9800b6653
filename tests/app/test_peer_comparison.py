"""benchmarks/peer_comparison.py's report: the time to the threshold, the ratio between the frameworks, and where
lightrl's time went, read from each run's evaluations and throughput report."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, benchmark_module

peers = benchmark_module("peer_comparison")


def curve(*points: tuple[int, float, float]) -> list[dict[str, float]]:
    return [{"frames": frames, "seconds": seconds, "return": value} for frames, seconds, value in points]


def test_the_report_gives_each_frameworks_time_to_the_threshold_their_ratio_and_lightrls_phases():
    phases = {"collect": 0.3, "update": 0.6, "eval": 0.1, "checkpoint": 0.001}
    results = {
        "tasks": {
            "cartpole_ppo": {
                "lightrl": [
                    {
                        "curve": curve((5000, 10.0, 200.0), (10000, 20.0, 480.0)),
                        "phases": phases,
                        "update_vs_bare": 1.5,
                    },
                    {"curve": curve((5000, 12.0, 490.0)), "phases": phases, "update_vs_bare": 1.7},
                ],
                "sb3": [
                    {"curve": curve((5000, 30.0, 100.0), (10000, 60.0, 476.0))},
                    {"curve": curve((5000, 30.0, 300.0), (10000, 60.0, 400.0))},  # never reaches 475
                ],
            }
        }
    }
    report = peers.summarise(results)
    lightrl, sb3 = (line for line in report.splitlines() if line.startswith("| CartPole-v1"))
    # lightrl: both seeds reached 475, at 20 s and 12 s (median 16 s), at 10,000 and 5,000 frames.
    assert "| lightrl | 2/2 | 16 (12–20) | 7,500 (5,000–10,000) |" in lightrl
    assert "| sb3 | 1/2 | 60 |" in sb3 and "500.0 ± 0.0 at 100k" in sb3
    # A run that missed the threshold counts as the slowest, so a median needs more than half of the runs to reach
    # it: SB3's second of two did not, so there is no ratio.
    assert "× SB3's" not in report
    # The loop's 1.5 and 1.7 times the bare update per update (median 1.6); the update step 60 % of it: 0.90 and 1.02.
    loop = "its training loop took 1.60× its bare update per update, the update step alone about 0.96×"
    assert f"collect 30 %, update 60 %, eval 10 %; {loop}" in report
    assert "checkpoint" not in report  # under half a percent: left out
    # With the steady state's figures (a compilation in the first updates left out): the update step's share is the
    # steady state's, and its frames per second are given beside the whole run's.
    for run, rate in zip(results["tasks"]["cartpole_ppo"]["lightrl"], (900.0, 1100.0), strict=True):
        run.update(steady_phases={"collect": 0.5, "update": 0.5}, steady_frames_per_s=rate)
    steady = (
        "the update step alone about 0.80×; in its steady state (its first updates left out) 1,000 (900–1,100) frames/s"
    )
    assert steady in peers.summarise(results)
    for run in results["tasks"]["cartpole_ppo"]["lightrl"]:
        del run["steady_phases"], run["steady_frames_per_s"]

    # With a third SB3 seed at 50 s the median is 60 s (the missed run the slowest), and the note says who missed.
    results["tasks"]["cartpole_ppo"]["sb3"].append({"curve": curve((5000, 50.0, 490.0))})
    assert (
        "lightrl's median time to 475 is 0.27× SB3's (16 s against 60 s; runs that did not reach it count as the "
        "slowest: sb3 1 of 3)." in peers.summarise(results)
    )
    results["tasks"]["cartpole_ppo"]["sb3"].pop()
    results["tasks"]["cartpole_ppo"]["sb3"][1]["curve"].append({"frames": 15000, "seconds": 90.0, "return": 500.0})
    assert "lightrl's median time to 475 is 0.21× SB3's (16 s against 75 s)." in peers.summarise(results)


def test_a_short_run_reports_frames_rates_and_returns_against_the_random_policys(tmp_path):
    # A task without a threshold (HalfCheetah SAC): both trained for the same seconds; no time to a threshold.
    results = {
        "seconds": 240,
        "tasks": {
            "halfcheetah_sac": {
                "lightrl": [
                    {
                        "curve": curve((5000, 60.0, -300.0), (10000, 120.0, 150.0)),
                        "random_return": -282.5,
                        "phases": {"update": 0.9, "collect": 0.1},
                    }
                ],
                "sb3": [{"curve": curve((5000, 50.0, -250.0), (15000, 240.0, 300.0))}],
            }
        },
    }
    report = peers.summarise(results)
    lightrl, sb3 = (line for line in report.splitlines() if line.startswith("| HalfCheetah-v5"))
    assert "| lightrl | short run | — |" in lightrl and "| sb3 | short run | — |" in sb3
    # Frames/s over each run; the returns at the furthest frames (10,000) and seconds (120) both reached.
    assert "| — | 83.33 | 150 at 10,000 | 150 at 120 s |" in lightrl
    assert "| — | 62.5 | -250 at 10,000 | -250 at 120 s |" in sb3
    assert "a short run of 240 s each; the random policy's return on lightrl's evaluation episodes: -282.5." in report
    preset = peers.lightrl_preset(peers.TASKS["halfcheetah_sac"], 1, 8, 3725, tmp_path)
    assert preset["trainer"]["max_time"] == "00:01:02:05"  # stopped by time, not by a threshold
    evaluation = preset["trainer"]["callbacks"][0]["init_args"]
    assert evaluation["stop_at_return"] is None and evaluation["random_policy"] is True
    peers.plot(results, tmp_path / "peers.png")  # no threshold line to draw
    assert (tmp_path / "peers.png").stat().st_size > 0


def test_sb3_evaluates_on_lightrls_evaluation_episodes(tmp_path):
    # Both frameworks face the same starting states at every evaluation: SB3's evaluation copies, reseeded as the
    # comparison reseeds them before each evaluation, start where lightrl's evaluation environments do.
    pytest.importorskip("stable_baselines3", reason='the bench extra: pip install -e ".[bench]"')
    from app.cli import build

    seed, episodes = 3, 4
    _, data = build([str(ROOT / "configs/gym/pendulum_sac.yaml")], ["--data.init_args.seed", str(seed)])
    lightrl_starts = data._evaluation_env(episodes).reset()["observation"]
    _, eval_env = peers.sb3_envs(peers.TASKS["pendulum_sac"], seed, episodes)
    for _ in range(2):  # every evaluation, after episodes that moved the copies on
        eval_env.seed(peers.evaluation_seed(seed))
        sb3_starts = eval_env.reset()
        assert sb3_starts.shape == tuple(lightrl_starts.shape)
        assert sb3_starts.tolist() == lightrl_starts.tolist()
        for _ in range(5):
            eval_env.step(eval_env.action_space.sample()[None].repeat(episodes, 0))
    eval_env.seed(peers.evaluation_seed(seed + 1))
    assert eval_env.reset().tolist() != lightrl_starts.tolist()


def test_a_zoo_pair_is_compared_with_the_zoos_numbers_on_both_sides(tmp_path):
    # lightrl's side is `lightrl zoo`'s config of the pair, SB3's the same entry's arguments; the threshold is the one
    # given, else Gymnasium's; the budget n_timesteps, evaluated every twentieth of it.
    pytest.importorskip("rl_zoo3")
    from app.zoo import config_text

    td3 = peers.task_of("td3:Pendulum-v1:-200", configs=tmp_path)
    assert (td3.env_id, td3.threshold, td3.budget, td3.eval_every) == ("Pendulum-v1", -200, 20_000, 1000)
    assert td3.sb3_algo == "TD3"
    config = tmp_path / "td3_Pendulum-v1_-200.yaml"
    assert td3.config == str(config) and config.read_text() == config_text("td3", "Pendulum-v1", config)
    assert td3.sb3_kwargs["action_noise_std"] == 0.1 and td3.sb3_kwargs["policy_kwargs"] == {"net_arch": [400, 300]}
    ppo = peers.task_of("ppo:CartPole-v1")  # Gymnasium's reward_threshold; no config written
    assert ppo.threshold == 475 and ppo.sb3_envs == 8 and ppo.sb3_kwargs["learning_rate"] == "lin_0.001"
    assert peers.task_of("a2c:HalfCheetah-v4").sb3_wrap == "normalize"  # the Zoo's VecNormalize
    assert peers.task_of("sac:HalfCheetah-v4").threshold == 4800  # Gymnasium's
    assert peers.task_of("sac:HalfCheetah-v4:none").threshold is None  # a short run


def test_an_atari_pair_is_the_zoos_atari_entry_on_both_sides(tmp_path):
    # lightrl's side AtariWrapper as Gymnasium's wrappers (lightrl zoo's config), SB3's AtariWrapper and the 4 stacked
    # frames of its own (sb3_envs), with the entry's arguments less the wrapping; the A2C entry's RMSpropTFLike is
    # Stable-Baselines3's class on its side.
    pytest.importorskip("rl_zoo3")
    pytest.importorskip("ale_py")
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    a2c = peers.task_of("a2c:BreakoutNoFrameskip-v4", configs=tmp_path)
    assert (a2c.threshold, a2c.budget, a2c.sb3_envs, a2c.sb3_wrap) == (None, 10_000_000, 16, "atari")
    assert "env_wrapper" not in a2c.sb3_kwargs and "frame_stack" not in a2c.sb3_kwargs
    policy = peers.sb3_policy_kwargs(a2c.sb3_kwargs["policy_kwargs"])
    assert policy == {"optimizer_class": RMSpropTFLike, "optimizer_kwargs": {"eps": 1e-5}}
    config = (tmp_path / "a2c_BreakoutNoFrameskip-v4.yaml").read_text()
    assert "algorithm: rmsprop_tf" in config and "envs.gym.atari.FireReset" in config
    assert peers.task_of("dqn:ALE/Pong-v5").sb3_kwargs["optimize_memory_usage"] is False


@pytest.mark.slow
def test_a_zoo_pair_runs_both_frameworks_and_reports_them(tmp_path, monkeypatch):
    # As a user runs it: a short run of a pair (1 s of training each), lightrl from the written config, SB3 in its
    # own process from the pair's name.
    pytest.importorskip("rl_zoo3")
    pytest.importorskip("stable_baselines3")
    scratch = tmp_path / "tmp"  # the runs' temporary folder, to see what they leave there
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    out = tmp_path / "peers"
    peers.main(
        ["--tasks", "ppo:CartPole-v1:none", "--seeds", "1", "--seconds", "1", "--eval-episodes", "2"]
        + ["--out", str(out)]
    )
    report = (out / "peers.md").read_text()
    lightrl, sb3 = (line for line in report.splitlines() if line.startswith("| CartPole-v1 (ppo:CartPole-v1:none)"))
    assert "| lightrl | short run |" in lightrl and "| sb3 | short run |" in sb3
    assert (out / "configs" / "ppo_CartPole-v1_none.yaml").is_file() and (out / "peers.png").stat().st_size > 0
    # Each side's last evaluation is the one where its time ran out (lightrl's at the end of fit, SB3's at its stop),
    # however few periodic evaluations a busy machine let it reach before.
    runs = json.loads((out / "peers.json").read_text())["tasks"]["ppo:CartPole-v1:none"]
    assert all(run["curve"][-1]["seconds"] >= 1 for name in ("lightrl", "sb3") for run in runs[name])
    assert not list(scratch.glob("SB3-*"))  # SB3's logger folder is the run's, not a new one in /tmp per run
    # lightrl's steady-state rate comes from its throughput report, and a report rewritten from peers.json (of a run
    # made before the comparison read it) reads it again from the run's folder.
    assert runs["lightrl"][0]["steady_frames_per_s"] > 0
    results = json.loads((out / "peers.json").read_text())
    del results["tasks"]["ppo:CartPole-v1:none"]["lightrl"][0]["steady_frames_per_s"]
    (out / "peers.json").write_text(json.dumps(results))
    peers.main(["--report-only", "--out", str(out)])
    assert "in its steady state (its first updates left out)" in (out / "peers.md").read_text()


@pytest.mark.parametrize(
    ("pair", "says"),
    [
        ("xyz:CartPole-v1", "--tasks xyz:CartPole-v1: neither a listed task"),
        ("ppo:Pendulum-v1", "cannot map ppo Pendulum-v1: sde_sample_freq: not mapped"),
        ("dqn:Pong-v9", "--env Pong-v9: not in the RL Zoo's hyperparams/dqn.yml"),
        ("dqn:CartPole-v1:high", "--tasks dqn:CartPole-v1:high: the threshold 'high' is a number or none"),
    ],
)
def test_a_pair_that_cannot_be_compared_is_one_error_line(pair, says, tmp_path, capsys):
    pytest.importorskip("rl_zoo3")
    with pytest.raises(SystemExit) as stopped:
        peers.main(["--tasks", pair, "--frameworks", "lightrl", "--out", str(tmp_path / "peers")])
    assert says in str(stopped.value.code) and len(str(stopped.value.code).splitlines()) == 1
    assert not (tmp_path / "peers" / "peers.json").exists()


@pytest.mark.parametrize(
    ("listed", "pair"),
    [
        ("pendulum_td3", "td3:Pendulum-v1:-200"),
        ("pendulum_ddpg", "ddpg:Pendulum-v1:-200"),
        ("pendulum_sac", "sac:Pendulum-v1:-200"),
        ("pendulum_tqc", "tqc:Pendulum-v1:-200"),
        ("cartpole_a2c", "a2c:CartPole-v1"),
        ("breakout_ppo", "ppo:ALE/Breakout-v5"),
    ],
)
def test_the_listed_tasks_are_their_zoo_pairs(listed, pair):
    # The hand-listed tasks' SB3 numbers are the Zoo's entries (the keys SB3's defaults already hold aside).
    pytest.importorskip("rl_zoo3")
    ours, zoo = peers.TASKS[listed], peers.task_of(pair)
    assert (ours.env_id, ours.threshold, ours.budget) == (zoo.env_id, zoo.threshold, zoo.budget)
    assert ours.sb3_algo == zoo.sb3_algo
    assert ours.sb3_envs == zoo.sb3_envs and ours.sb3_wrap == zoo.sb3_wrap
    assert {key: value for key, value in zoo.sb3_kwargs.items() if key not in ours.sb3_kwargs} == {}, listed
    assert {key: zoo.sb3_kwargs[key] for key in ours.sb3_kwargs} == ours.sb3_kwargs

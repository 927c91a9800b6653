"""MuJoCo (HalfCheetah-v5) and Atari (Breakout through ale-py) in the Gymnasium family: their spaces through the agents,
the Atari preprocessing named in a config, the game score reported whole and unclipped, and a resumed short run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
import yaml
from torchrl.envs import TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from datamodules.episodes import EpisodeStatistics
from envs.gym.env import GymnasiumEnv
from modules.networks import NatureCNN, NetworkOptions
from modules.ppo import PPO, GaussianOptions, NormalizationOptions
from modules.sac import SAC, ActorOptions, CriticOptions
from tests.helpers import ROOT, fit

needs_mujoco = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="MuJoCo: the gym extra")
needs_ale = pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None, reason="ALE: the gym extra"
)
BREAKOUT = yaml.safe_load((ROOT / "configs/gym/breakout_ppo.yaml").read_text())["data"]["init_args"]["env"]["init_args"]


@needs_mujoco
def test_halfcheetah_flows_through_ppo_and_sac_with_actions_inside_the_box():
    env = GymnasiumEnv(num_envs=3, env_id="HalfCheetah-v5", seed=0)
    assert env.observation_spec["observation"].shape == (3, 17)
    assert env.action_spec.shape == (3, 6) and env.action_spec.space.high.eq(1).all()
    spec = (env.observation_spec[0], env.action_spec[0])  # one environment's, as the data module links them
    network, gaussian = NetworkOptions(hidden_sizes=(32,)), GaussianOptions(init_scale=3.0)
    normalize = NormalizationOptions(observations=True, rewards=True)
    ppo = PPO(*spec, network=network, gaussian=gaussian, normalize=normalize)
    sac = SAC(*spec, actor=ActorOptions(hidden_sizes=(32,)), critics=CriticOptions(hidden_sizes=(32,)))
    torch.manual_seed(0)
    # PPO's Gaussian (σ of 3 half-ranges: most samples leave the box) reaches the environment clipped into it.
    received = []
    step = env._step
    env._step = lambda td: received.append(td["action"].clone()) or step(td)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):  # sampled, as the collector acts
        rollout = TransformedEnv(env, ppo.env_transform()).rollout(20, ppo.policy(), break_when_any_done=False)
    sampled = rollout["action"]
    assert sampled.abs().max() > 1  # the rollout keeps the sample ...
    assert torch.stack(received).abs().max() <= 1  # ... the simulator gets it clipped
    ppo.postprocess(rollout)  # scaled rewards, and the observation statistics take the rollout in
    assert ppo.reward_scaler.count.item() == 60 and ppo.observation_normalizer.count.item() == 60
    # SAC's tanh-squashed actions, sampled and deterministic, are inside the box.
    td = env.reset()
    for exploration in (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC):
        with set_exploration_type(exploration):
            action = sac.policy()(td.clone())["action"]
        assert action.shape == (3, 6) and action.abs().max() <= 1
    env.close()


@needs_ale
def test_breakout_observations_are_stacked_uint8_frames_read_by_the_nature_cnn():
    env = GymnasiumEnv(num_envs=2, seed=0, **BREAKOUT)
    observation = env.reset()["observation"]
    assert observation.shape == (2, 4, 84, 84) and observation.dtype == torch.uint8  # kept bytes, in the rollout too
    ppo = PPO(env.observation_spec[0], env.action_spec[0])  # network.kind auto: one Nature CNN for actor and critic
    torso = ppo.actor_network.torso
    assert isinstance(torso, NatureCNN) and torso is ppo.critic_network.torso
    assert torso.scale == 1 / 255  # scaled in the network
    td = ppo.policy()(env.reset())
    assert td["action"].shape == (2,) and td["action"].max() < 4
    env.close()


@needs_ale
def test_the_reported_episode_return_is_the_whole_games_unclipped_score():
    # The shipped wrappers with a clip that changes every brick's reward (1 → 0.5), beside the same game unclipped
    # and without life loss: the same seed and actions play the same frames.
    clipped = dict(
        BREAKOUT, wrappers=[*BREAKOUT["wrappers"][:-1], {"class_path": "ClipReward", "init_args": {"max_reward": 0.5}}]
    )
    plain = dict(BREAKOUT, wrappers=BREAKOUT["wrappers"][:-1], episodic_life=False)
    agent, game = GymnasiumEnv(seed=3, **clipped), GymnasiumEnv(seed=3, **plain)
    td, reference = agent.reset(), game.reset()
    generator = torch.Generator().manual_seed(0)
    lives_lost, clipped_total, score, games, steps, game_steps = 0, 0.0, 0.0, [], [], 0
    for _ in range(5000):
        game_steps += 1
        action = torch.randint(4, (1,), generator=generator)
        stepped, td = agent.step_and_maybe_reset(td.set("action", action))
        steps.append(stepped.clone())
        expected = game.step(reference.set("action", action))["next"]
        clipped_total += stepped["next", "reward"].item()
        score += expected["reward"].item()
        if expected["done"].item():  # game over: both report the game's score, the agent's env after 5 lives
            assert stepped["next", "done"].item() and lives_lost == 4
            assert stepped["next", "episode_return"].item() == expected["episode_return"].item() == score
            assert clipped_total == pytest.approx(score / 2)
            # The game's length in the agent's steps (4 emulator frames each, AtariPreprocessing's skip), as envpool's.
            assert stepped["next", "episode_length"].item() == expected["episode_length"].item() == game_steps
            assert stepped["next", "games"].item() == expected["games"].item() == 1
            games.append(score)
            if score > 0:  # a game with bricks broken: the unclipped score differs from the clipped sum
                break
            lives_lost, clipped_total, score, game_steps, reference = 0, 0.0, 0.0, 0, game.reset()
            continue
        reference = expected
        if stepped["next", "done"].item():  # a lost life: the agent's episode ends, the game and its score go on
            lives_lost += 1
            assert stepped["next", "terminated"].item() and stepped["next", "episode_return"].item() == 0
            assert stepped["next", "games"].item() == 0
    else:
        pytest.fail(f"no game with a score in 5,000 steps: {games}")
    # The training episodes' statistics: an episode per life, the game's score averaged over the games alone.
    statistics = EpisodeStatistics(agent.episode_metric_keys, agent.episode_metric_over, rows=1, agents_per_env=1)
    statistics.observe(torch.stack(steps, -1))
    statistics.count()
    figures = statistics.report()
    assert figures["data/episodes"] == 5 * len(games) and figures["train/games_mean"] == pytest.approx(1 / 5)
    assert figures["train/episode_return_mean"] == pytest.approx(sum(games) / len(games))
    assert figures["train/return_mean"] == pytest.approx(sum(games) / 2 / (5 * len(games)))  # clipped, per life
    agent.close(), game.close()


def test_episodic_life_on_an_environment_without_lives_is_one_error_naming_it():
    with pytest.raises(ValueError, match="^episodic_life needs the lives in the info of each step; env_id CartPole-v1"):
        GymnasiumEnv(env_id="CartPole-v1", episodic_life=True)


@needs_mujoco
@pytest.mark.slow
def test_a_halfcheetah_ppo_run_resumes_with_ckpt_path_last_and_its_reward_statistics(tmp_path):
    config = ROOT / "configs/gym/halfcheetah_ppo.yaml"
    runs = tmp_path / "runs"
    args = ["--trainer.logger.init_args.save_dir", str(runs), "--trainer.enable_progress_bar", "false"]
    args += ["--data.init_args.collect_steps", "64", "--data.init_args.evaluation.episodes", "1"]
    fit(config, *args, "--trainer.max_steps", "16")
    saved = torch.load(runs / "gym_halfcheetah_ppo/version_0/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    assert saved["reward_scaler.count"].item() == 64
    cli = fit(config, *args, "--trainer.max_steps", "32", "--ckpt_path", "last")
    assert cli.trainer.global_step == 32 and cli.trainer.log_dir == str(runs / "gym_halfcheetah_ppo/version_0")
    assert cli.model.reward_scaler.count.item() == 128  # the saved rollout's statistics, then one more rollout


@needs_ale
def test_an_atari_id_outside_the_ale_namespace_is_found_in_a_fresh_process():
    """The RL Zoo's ids (``PongNoFrameskip-v4``) are registered by importing ale-py, as the ``ALE/`` ones are: a
    process that has not imported it finds them, and an id registered nowhere is still one error with close matches."""
    script = (
        "from envs.gym.make import find_spec\n"
        "print(find_spec('PongNoFrameskip-v4').entry_point)\n"
        "try:\n    find_spec('PongNoFrameskip-v9')\nexcept ValueError as error:\n    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found, refused = out.strip().splitlines()
    assert found == "ale_py.env:AtariEnv"
    assert refused.startswith("env_id 'PongNoFrameskip-v9' is not a registered Gymnasium id; did you mean")

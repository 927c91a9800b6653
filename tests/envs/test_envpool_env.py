"""The envpool engine of the Gymnasium family (``envs/gym/envpool_env.py``) on envpool's real tasks: the
batch against envpool's own single copies, restarts by envpool's next step, an Atari game's life loss and unclipped
score, what a state restores, and one-line errors through the command line. (The environment contract, the fast step
against TorchRL's included, is checked for it in test_env_contract.py; the shipped config fits in test_gym_env.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from app.cli import main
from compat.extras import install_command
from datamodules.episodes import EpisodeStatistics
from datamodules.rollout import RolloutDataModule
from envs.counter_rng import episode_seed
from tests.helpers import chain_config, fit, write_config

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None, reason='envpool: the envpool extra, pip install -e ".[envpool]"'
)


def envpool_env(**options: Any):
    from envs.gym.envpool_env import EnvpoolEnv  # noqa: PLC0415 (after the skip)

    return EnvpoolEnv(**options)


def single_copy(env_id: str, seed: int, **options: Any):
    import envpool  # noqa: PLC0415

    return envpool.make_gymnasium(env_id, num_envs=1, env_seed=[seed], num_threads=1, **options)


def random_actions(env, steps: int, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [env.action_spec.rand() for _ in range(steps)]


def test_copy_i_plays_what_envpools_own_copy_seeded_seed_plus_i_plays_restarts_included():
    env = envpool_env(num_envs=3, env_id="CartPole-v1", env_kwargs={"max_episode_steps": 12}, seed=5, num_threads=2)
    actions = random_actions(env, 60)
    td, rows = env.reset(), []
    for action in actions:
        td["action"] = action.clone()
        stepped, td = env.step_and_maybe_reset(td)
        rows.append((stepped["next"].clone(), td["observation"].clone()))
    assert sum(int(step["done"].sum()) for step, _ in rows) >= 9  # 12-step episodes: restarts in every copy
    for i in range(3):
        reference = single_copy("CartPole-v1", 5 + i, max_episode_steps=12)
        reference.reset()
        total = 0.0
        for action, (step, carried) in zip(actions, rows, strict=True):
            observation, reward, terminated, truncated, _ = reference.step(action[i : i + 1].numpy())
            total += float(reward[0])
            assert torch.equal(step["observation"][i], torch.from_numpy(observation[0]))
            assert step["terminated"][i].item() == terminated[0] and step["truncated"][i].item() == truncated[0]
            if terminated[0] or truncated[0]:  # envpool's next step restarts the copy; its action is ignored
                assert step["episode_return"][i].item() == total and step["episode_length"][i].item() > 0
                observation = reference.step(np.zeros(1, dtype=np.int64))[0]
                total = 0.0
            else:
                assert step["episode_return"][i].item() == 0
            assert torch.equal(carried[i], torch.from_numpy(observation[0]))  # what the policy reads next
        reference.close()
    env.close()


def test_a_mujoco_task_takes_actions_in_its_box_and_gives_float32_observations():
    env = envpool_env(num_envs=2, env_id="HalfCheetah-v5", seed=3)
    assert (
        env.observation_spec["observation"].shape == (2, 17)
        and env.observation_spec["observation"].dtype == torch.float32
    )
    assert (
        env.action_spec.shape == (2, 6)
        and env.action_spec.space.low.eq(-1).all()
        and env.action_spec.space.high.eq(1).all()
    )
    actions = random_actions(env, 10)
    td = env.reset()
    steps = []
    for action in actions:
        stepped, td = env.step_and_maybe_reset(td.set("action", action))
        steps.append(stepped["next"].clone())
    for i in range(2):
        reference = single_copy("HalfCheetah-v5", 3 + i)
        reference.reset()
        for action, step in zip(actions, steps, strict=True):
            observation, reward, *_ = reference.step(action[i : i + 1].numpy().astype(np.float64))
            assert torch.equal(step["observation"][i], torch.from_numpy(observation[0].astype(np.float32)))
            assert step["reward"][i].item() == pytest.approx(float(reward[0]))
        reference.close()
    env.close()


def test_a_partial_reset_restarts_only_the_masked_copies_and_a_finished_copy_waits():
    env = envpool_env(num_envs=2, env_id="CartPole-v1", seed=0)
    td = env.reset()
    for action in random_actions(env, 5):
        td = env.step(td.set("action", action))["next"]
    before = td["observation"].clone()
    after = env.reset(td.set("_reset", torch.tensor([[True], [False]])))
    assert torch.equal(after["observation"][1], before[1]) and not torch.equal(after["observation"][0], before[0])
    # A finished copy is not stepped until it is reset: done, no reward, its last observation.
    td = env.reset()
    while not td["done"].any():
        td = env.step(td.set("action", torch.tensor([0, 0])))["next"]
    done = td["done"].squeeze(-1)
    again = env.step(td.clone().set("action", torch.tensor([0, 0])))["next"]
    assert again["done"][done].all() and (again["reward"][done] == 0).all()
    assert torch.equal(again["observation"][done], td["observation"][done])
    env.close()


SPACE_INVADERS = {"reward_clip": True, "noop_max": 30, "max_episode_steps": 10_000}


@pytest.mark.slow
def test_an_atari_life_loss_ends_the_agents_episode_and_the_game_score_is_reported_whole_and_unclipped():
    # The same seed and actions with and without reward clipping: the same frames. Space Invaders' aliens are worth
    # 5-30 points, so the clipped rewards differ from the score at once.
    clipped = envpool_env(env_id="ALE/SpaceInvaders-v5", env_kwargs=SPACE_INVADERS, episodic_life=True, seed=1)
    plain = envpool_env(
        env_id="SpaceInvaders-v5", env_kwargs={**SPACE_INVADERS, "reward_clip": False}, episodic_life=True, seed=1
    )
    assert clipped.episode_metric_keys == ("episode_return", "episode_length", "games")
    td, reference = clipped.reset(), plain.reset()
    assert td["observation"].shape == (1, 4, 84, 84) and td["observation"].dtype == torch.uint8
    generator = torch.Generator().manual_seed(0)
    lives_lost, clipped_total, score, steps = 0, 0.0, 0.0, []
    for _ in range(20_000):
        action = torch.randint(6, (1,), generator=generator)
        stepped, td = clipped.step_and_maybe_reset(td.set("action", action))
        expected, reference = plain.step_and_maybe_reset(reference.set("action", action))
        steps.append(stepped.clone())
        assert torch.equal(stepped["next", "observation"], expected["next", "observation"])
        clipped_total += stepped["next", "reward"].item()
        score += expected["next", "reward"].item()
        if not stepped["next", "done"].item():
            continue
        if stepped["next", "games"].item() == 0:  # a lost life: the agent's episode ends, the game goes on
            lives_lost += 1
            assert stepped["next", "terminated"].item() and stepped["next", "episode_return"].item() == 0
            continue
        assert lives_lost == 2  # Space Invaders' three lives
        assert stepped["next", "episode_return"].item() == expected["next", "episode_return"].item() == score
        assert score > clipped_total > 0  # the reported score is the game's, not the clipped sum
        break
    else:
        pytest.fail("no game over in 20,000 steps")
    statistics = EpisodeStatistics(clipped.episode_metric_keys, clipped.episode_metric_over, rows=1, agents_per_env=1)
    statistics.observe(torch.stack(steps, -1))
    statistics.count()
    figures = statistics.report()
    assert figures["data/episodes"] == 3 and figures["train/episode_return_mean"] == pytest.approx(score)
    clipped.close(), plain.close()


@pytest.mark.slow
def test_without_episodic_life_fire_is_pressed_after_a_lost_life_so_a_policy_that_never_fires_plays_on():
    # envpool presses FIRE at its episodic "reset" only: evaluation's whole games (episodic_life off) would stand still
    # after the first lost life under a greedy policy that never chose FIRE, until the 27,000-step limit.
    import envpool  # noqa: PLC0415

    env = envpool_env(env_id="Breakout-v5", seed=0)
    assert env._fire_after_lost_life
    td, steps = env.reset(), 0
    while True:
        stepped, td = env.step_and_maybe_reset(td.set("action", torch.zeros(1, dtype=torch.long)))  # NOOP only
        steps += 1
        if stepped["next", "done"].item():
            break
    assert stepped["next", "games"].item() == 1 and stepped["next", "truncated"].item() is False
    assert steps < 2_000 and stepped["next", "episode_length"].item() == steps + 4 * 2  # FIRE and 2 after each life
    env.close()
    # envpool's own copy, NOOP only, stands still after its first lost life.
    alone = envpool.make_gymnasium("Breakout-v5", num_envs=1, env_seed=[0], num_threads=1)
    alone.reset()
    lives = [int(alone.step(np.zeros(1, dtype=np.int64))[4]["lives"][0]) for _ in range(2_000)]
    assert lives[-1] == 4
    alone.close()


def test_a_state_restores_the_streams_and_counters_and_the_next_reset_starts_the_following_episodes():
    options = {"env_id": "CartPole-v1", "env_kwargs": {"max_episode_steps": 8}}
    env = envpool_env(num_envs=2, seed=4, **options)
    td = env.reset()
    for action in random_actions(env, 30):
        _, td = env.step_and_maybe_reset(td.set("action", action))
    state = env.state_dict()
    counters = state["_extra_state"]["next_episode"]
    assert counters.tolist() == [4, 4]  # the first episode and three restarts of 8 steps each
    restored = envpool_env(num_envs=2, seed=99, **options)
    restored.load_state_dict(state)
    start = restored.reset()["observation"]
    for i in range(2):
        expected = single_copy("CartPole-v1", episode_seed(4 + i, 4) % 2**31, max_episode_steps=8).reset()[0]
        assert torch.equal(start[i], torch.from_numpy(expected[0]))
    with pytest.raises(ValueError, match="its environment state is for env_id CartPole-v1"):
        envpool_env(num_envs=2, env_id="Acrobot-v1").load_state_dict(state)
    env.close(), restored.close()


@pytest.mark.slow
def test_an_envpool_run_resumed_with_ckpt_path_last_continues_in_its_folder_from_fresh_episodes(tmp_path, monkeypatch):
    config = chain_config("ppo", tmp_path / "runs")
    env = {"env_id": "CartPole-v1", "num_threads": 1}
    config["data"]["init_args"]["env"] = {"class_path": "envs.gym.envpool_env.EnvpoolEnv", "init_args": env}
    logger = {"save_dir": str(tmp_path / "runs"), "name": "envpool"}  # a real run folder, as the configs write
    config["trainer"]["logger"] = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": logger}
    path = write_config(config, tmp_path / "envpool.yaml")
    fit(path, "--trainer.max_steps", "12")
    run = tmp_path / "runs" / "envpool"
    checkpoint = torch.load(run / "version_0/checkpoints/last.ckpt", weights_only=True)
    saved = checkpoint["RolloutDataModule"]["env"]["_extra_state"]
    batches = []
    collect = RolloutDataModule.collect
    monkeypatch.setattr(RolloutDataModule, "collect", lambda self: batches.append(collect(self)) or batches[-1])

    cli = fit(path, "--trainer.max_steps", "24", "--ckpt_path", "last")

    assert cli.trainer.global_step == 24 and cli.trainer.log_dir == str(run / "version_0")
    assert [folder.name for folder in run.iterdir()] == ["version_0"]
    # The first rollout after the resume starts each copy's next episode from a pool seeded from the saved counters.
    first = batches[0]["observation"][:, 0]
    for i in range(first.shape[0]):
        stream, episode = int(saved["stream"][i]), int(saved["next_episode"][i])
        assert episode > 1  # episodes ended before the checkpoint
        expected = single_copy("CartPole-v1", episode_seed(stream, episode) % 2**31).reset()[0][0]
        assert torch.equal(first[i], torch.from_numpy(expected))


# ------------------------------------------------------------------------------------------- bad input, one line
FLAG = "--data.init_args.env.init_args"


def one_error_line(tmp_path: Path, capsys, *args: str, **env: Any) -> str:
    config = chain_config("dqn", tmp_path / "out")
    config["data"]["init_args"]["env"] = {"class_path": "envs.gym.envpool_env.EnvpoolEnv", "init_args": env}
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(write_config(config, tmp_path / "envpool.yaml")), *args])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and not (tmp_path / "out").exists()
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([f"{FLAG}.env_id", "CartPol-v1"], f"error: {FLAG}.env_id 'CartPol-v1' is not an envpool task; did you mean "),
        (
            [f"{FLAG}.env_kwargs", "{max_episode_step: 9}"],
            f"error: {FLAG}.env_kwargs {{'max_episode_step': 9}}: max_episode_step is not an option of envpool's "
            "CartPole-v1; its options: base_path, gym_reset_return_info, max_episode_steps,",
        ),
        (
            [f"{FLAG}.env_kwargs", "{num_threads: 2}"],
            f"error: {FLAG}.env_kwargs {{'num_threads': 2}}: num_threads is set by the environment's own options",
        ),
        (
            [f"{FLAG}.episodic_life", "true"],
            f"error: {FLAG}.episodic_life needs a task with lives; envpool's CartPole-v1 has none",
        ),
        ([f"{FLAG}.num_threads", "-1"], f"error: {FLAG}.num_threads must be >= 0 (0: one per core), got -1"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, capsys, args, message):
    assert one_error_line(tmp_path, capsys, *args, env_id="CartPole-v1").startswith(message)


def test_without_envpool_installed_the_error_names_the_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)
    line = one_error_line(tmp_path, capsys, env_id="CartPole-v1")
    assert (
        line == f"error: {FLAG}.env_id CartPole-v1 needs envpool, which is not installed: {install_command('envpool')}"
    )

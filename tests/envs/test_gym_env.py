"""The Gymnasium family (``envs/gym``) on real Gymnasium environments: options, seeding against Gymnasium's
own episodes, partial resets, episode metrics, what a state restores, one-line errors through the command line, and the
shipped configs fitted and resumed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import yaml
from tensordict import TensorDict
from torchrl.data import Unbounded

from app.cli import main
from compat.extras import install_command
from datamodules.rollout import RolloutDataModule
from envs.counter_rng import episode_seed
from envs.gym.env import GymnasiumEnv
from tests.app.test_cli import run_app
from tests.envs.test_adding_an_environment import fits_as_the_docs_run_it
from tests.helpers import ROOT, app_in_process, chain_config, doc_code_blocks, fit, write_config

GYM_CONFIGS = sorted((ROOT / "configs" / "gym").glob("*.yaml"))
#: Box2D's tasks (LunarLander) need the gym extra; the suite skips them without it, like the other optional families.
needs_box2d = pytest.mark.skipif(
    importlib.util.find_spec("Box2D") is None, reason='Box2D: the gym extra, pip install -e ".[gym]"'
)


def random_actions(env: GymnasiumEnv, steps: int, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [env.action_spec.rand() for _ in range(steps)]


def play(env: GymnasiumEnv, actions: list[torch.Tensor]) -> list[TensorDict]:
    """Each step's tensordict under ``actions``, finished copies reset as a collector resets them."""
    td, steps = env.reset(), []
    for action in actions:
        td["action"] = action.clone()
        stepped, td = env.step_and_maybe_reset(td)
        steps.append(stepped.clone())
    return steps


def gymnasium_episodes(env_id: str, seed: int, actions: list[Any], **kwargs: Any) -> dict[str, list]:
    """Gymnasium's own environment under ``actions``, seeded ``seed`` once and its later episodes continuing its
    generator (what its vector envs do): each step's observation, each next episode's first observation, and each
    episode's (return, length)."""
    env = gymnasium.make(env_id, **kwargs)
    env.reset(seed=seed)
    played: dict[str, list] = {"observations": [], "starts": [], "episodes": []}
    total, length = 0.0, 0
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        played["observations"].append(observation)
        total, length = total + float(reward), length + 1
        if terminated or truncated:
            played["episodes"].append((total, length))
            played["starts"].append(env.reset()[0])
            total, length = 0.0, 0
    env.close()
    return played


# ----------------------------------------------------------------------------------------------------- the batch
def test_an_id_with_its_kwargs_and_wrappers_builds_and_steps():
    clip = {"class_path": "ClipReward", "init_args": {"min_reward": -1.0, "max_reward": 0.0}}
    env = GymnasiumEnv(
        num_envs=3,
        env_id="Pendulum-v1",
        env_kwargs={"g": 9.0, "max_episode_steps": 12},
        wrappers=["TimeAwareObservation", clip],
        seed=5,
    )
    assert env.observation_spec["observation"].shape == (3, 4)  # Pendulum's 3 numbers and the wrapper's time
    assert env.action_spec.space.low.eq(-2).all() and env.action_spec.space.high.eq(2).all()  # the torque's box
    assert env._envs[0].unwrapped.g == 9.0
    steps = play(env, random_actions(env, 12))
    rewards = torch.stack([step["next", "reward"] for step in steps])
    assert rewards.min() >= -1.0  # clipped
    last = steps[-1]["next"]
    assert last["truncated"].all() and not last["terminated"].any()  # max_episode_steps 12
    assert last["episode_length"].eq(12).all()
    # The episode's return is Pendulum's own, before the clip: what Gymnasium plays with the same seeds and torques.
    torques = [step["action"].numpy() for step in steps]
    for i in range(3):
        played = gymnasium_episodes("Pendulum-v1", 5 + i, [t[i] for t in torques], g=9.0, max_episode_steps=12)
        assert last["episode_return"][i].item() == pytest.approx(played["episodes"][0][0], rel=1e-5)
    assert all(step["next", "episode_return"].eq(0).all() for step in steps[:-1])  # 0 but on an episode's last step
    env.close()


def test_a_wrapper_that_ends_episodes_reports_the_return_before_the_wrappers_and_the_agents_steps():
    # TimeLimit as a wrapper ends CartPole's episodes after 5 steps, outside the statistics under the wrappers.
    wrappers = [
        {"class_path": "TimeLimit", "init_args": {"max_episode_steps": 5}},
        {"class_path": "ClipReward", "init_args": {"max_reward": 0.5}},
    ]
    env = GymnasiumEnv(num_envs=2, env_id="CartPole-v1", wrappers=wrappers, seed=0)
    steps = play(env, [torch.tensor([0, 1])] * 12)
    ends = [t for t, step in enumerate(steps) if step["next", "done"].any()]
    assert ends == [4, 9]  # CartPole does not fall in 5 steps: the wrapper ended both copies' episodes
    for t in ends:
        assert steps[t]["next", "truncated"].all() and steps[t]["next", "reward"].eq(0.5).all()
        assert steps[t]["next", "episode_return"].eq(5.0).all()  # CartPole's +1s, not the clipped 0.5s
        assert steps[t]["next", "episode_length"].eq(5).all()
    env.close()


def test_a_batch_plays_gymnasiums_own_episodes_for_the_same_seeds():
    env = GymnasiumEnv(num_envs=4, env_id="CartPole-v1", seed=11)
    actions = random_actions(env, 150)
    steps = play(env, actions)
    for i in range(4):
        played = gymnasium_episodes("CartPole-v1", 11 + i, [action[i].item() for action in actions])
        observations = torch.stack([step["next", "observation"][i] for step in steps])
        assert torch.allclose(observations, torch.from_numpy(np.stack(played["observations"])))
        ends = [t for t, step in enumerate(steps) if step["next", "done"][i]]
        assert len(ends) == len(played["episodes"]) >= 3  # several episodes each: the later ones are checked too
        metrics = [
            (steps[t]["next", "episode_return"][i].item(), int(steps[t]["next", "episode_length"][i])) for t in ends
        ]
        assert metrics == played["episodes"]  # the episode metrics are Gymnasium's own returns and lengths
        starts = [steps[t + 1]["observation"][i] for t in ends if t + 1 < len(steps)]  # what the next step starts from
        assert torch.allclose(torch.stack(starts), torch.from_numpy(np.stack(played["starts"][: len(starts)])))
    env.close()


@pytest.mark.parametrize(
    "options",
    [
        # the return before the wrappers; a wrapper's time limit truncating; terminations by the task
        {
            "env_id": "CartPole-v1",
            "wrappers": [
                {"class_path": "TimeLimit", "init_args": {"max_episode_steps": 15}},
                {"class_path": "ClipReward", "init_args": {"max_reward": 0.5}},
            ],
        },
        {"env_id": "FrozenLake-v1"},  # one-hot observations, episodes of a few steps
        pytest.param(  # lost lives that end the agent's episode and not the game, games over
            yaml.safe_load((ROOT / "configs/gym/breakout_ppo.yaml").read_text())["data"]["init_args"]["env"][
                "init_args"
            ],
            marks=[pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="ale_py")],
            id="breakout lives",
        ),
    ],
    ids=["cartpole wrapped", "frozenlake", "breakout lives"],
)
def test_one_copy_steps_as_the_first_copy_of_a_batch(options):
    """A single copy takes its own road through the step (``GymnasiumEnv._advance_one``, NumPy scalars): what it plays
    is what copy 0 of a batch of two plays from the same seed under the same actions, every entry to the bit."""
    alone, batch = GymnasiumEnv(num_envs=1, seed=5, **options), GymnasiumEnv(num_envs=2, seed=5, **options)
    actions = random_actions(batch, 600 if "Breakout" in options["env_id"] else 150)
    ones, twos = play(alone, [action[:1] for action in actions]), play(batch, actions)
    ended = 0
    for one, two in zip(ones, twos, strict=True):
        for key in two.keys(True, True):
            assert torch.equal(one[key], two[key][:1]), key
        ended += int(one["next", "done"].sum())
    assert ended >= 5  # episodes end (and lives are lost): each end's road is compared too
    if "Breakout" in options["env_id"]:
        lost = sum(int((one["next", "done"] & one["next", "games"].eq(0)).sum()) for one in ones)
        assert lost >= 2  # lives lost with the game going on
    alone.close(), batch.close()


@needs_box2d
def test_the_same_seed_repeats_the_episodes_and_another_seed_does_not():
    actions = random_actions(GymnasiumEnv(num_envs=3, env_id="LunarLander-v3"), 60)
    first, again, other = (
        play(GymnasiumEnv(num_envs=3, env_id="LunarLander-v3", seed=seed), actions) for seed in (7, 7, 8)
    )
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a["next", "observation"], b["next", "observation"])
        assert torch.equal(a["next", "reward"], b["next", "reward"])
    assert not torch.equal(first[-1]["next", "observation"], other[-1]["next", "observation"])


def test_a_partial_reset_restarts_only_the_masked_copies():
    env = GymnasiumEnv(num_envs=4, env_id="CartPole-v1", seed=0)
    reference = GymnasiumEnv(num_envs=4, env_id="CartPole-v1", seed=0)
    td, ref = env.reset(), reference.reset()
    actions = random_actions(env, 5)
    for action in actions:  # both take the same 5 steps (too few for a CartPole episode to end)
        td = env.step(td.set("action", action))["next"]
        ref = reference.step(ref.set("action", action))["next"]
    assert torch.equal(td["observation"], ref["observation"])
    mask = torch.tensor([True, False, True, False]).unsqueeze(1)
    reset = env.reset(td.clone().set("_reset", mask))  # as a collector asks: its carried tensordict, flagged
    restarted = mask.view(-1)
    assert torch.equal(reset["observation"][~restarted], ref["observation"][~restarted])  # untouched
    assert not torch.equal(reset["observation"][restarted], ref["observation"][restarted])
    assert env._next_episode.tolist() == [2, 1, 2, 1]
    # A restarted copy begins its second episode, as Gymnasium's own env does after its first.
    for i in (0, 2):
        single = gymnasium.make("CartPole-v1")
        single.reset(seed=i)
        for action in actions:
            single.step(action[i].item())
        assert reset["observation"][i].allclose(torch.from_numpy(single.reset()[0]))
    # The others go on exactly as the reference, which was never reset.
    action = torch.zeros(4, dtype=torch.long)
    stepped = env.step(reset.set("action", action))["next"]
    expected = reference.step(ref.set("action", action))["next"]
    assert torch.equal(stepped["observation"][~restarted], expected["observation"][~restarted])
    for each in (env, reference):
        each.close()


def test_a_finished_copy_stays_done_without_reward_until_it_is_reset():
    env = GymnasiumEnv(num_envs=2, env_id="CartPole-v1", env_kwargs={"max_episode_steps": 3})
    td = env.reset()
    for _ in range(3):
        td = env.step(td.set("action", torch.zeros(2, dtype=torch.long)))["next"]
    assert td["truncated"].all() and td["episode_length"].eq(3).all()
    last = td["observation"].clone()
    again = env.step(td.set("action", torch.ones(2, dtype=torch.long)))["next"]  # evaluation steps finished copies
    assert again["done"].all() and again["reward"].eq(0).all() and again["episode_length"].eq(0).all()
    assert torch.equal(again["observation"], last)
    env.close()


def test_a_discrete_observation_is_one_hot_and_other_spaces_are_one_error_naming_env_id():
    env = GymnasiumEnv(num_envs=2, env_id="FrozenLake-v1", seed=0)
    td = env.reset()
    assert td["observation"].shape == (2, 16) and td["observation"].sum(-1).eq(1).all()
    assert td["observation"][:, 0].eq(1).all()  # both start on square 0
    env.close()
    with pytest.raises(ValueError, match=r"^env_id Blackjack-v1: its observation space Tuple\(Discrete\(32\)"):
        GymnasiumEnv(env_id="Blackjack-v1")


class UnboundedActions(gymnasium.Env):
    """A point pushed by any real force: an action space with no bounds."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
    action_space = gymnasium.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position = np.zeros(1, dtype=np.float32)
        return self.position.copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position += action
        return self.position.copy(), -float(abs(self.position[0])), False, False, {}


def test_an_unbounded_box_of_actions_is_an_unbounded_spec_that_ppos_normal_policy_acts_in(tmp_path):
    gymnasium.register(id="UnboundedActions-v0", entry_point=UnboundedActions, max_episode_steps=20)
    try:
        env = GymnasiumEnv(num_envs=2, env_id="UnboundedActions-v0", seed=0)
        assert isinstance(env.action_spec, Unbounded) and env.action_spec.shape == (2, 1)
        td = env.reset()
        td["action"] = torch.tensor([[5.0], [-30.0]])  # any force: nothing clips it
        assert env.step(td)["next", "observation"].flatten().tolist() == [5.0, -30.0]
        env.close()
        cli = fit(
            ROOT / "configs" / "gym" / "halfcheetah_ppo.yaml",
            *(f"{FLAG}.env_id", "UnboundedActions-v0", "--data.init_args.collect_steps", "64"),
            *("--trainer.max_steps", "2", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")),
            *("--trainer.enable_progress_bar", "false"),
            *("--model.init_args.compile", "false"),  # the actions' path, not the compiled update (its own tests)
        )
        assert cli.trainer.global_step == 2 and cli.model.distribution == "normal"
        assert not cli.model.clips_actions  # nothing to clip to
    finally:
        gymnasium.registry.pop("UnboundedActions-v0", None)


def test_a_state_restores_the_streams_and_counters_and_the_next_reset_starts_the_following_episodes():
    env = GymnasiumEnv(num_envs=3, env_id="CartPole-v1", seed=4)
    play(env, random_actions(env, 40))
    state = env.state_dict()
    counters = env._next_episode.copy()
    restored = [GymnasiumEnv(num_envs=3, env_id="CartPole-v1", seed=99) for _ in range(2)]
    for each in restored:
        each.load_state_dict(state)
    with pytest.raises(RuntimeError, match="reset the environment before stepping it"):  # the episodes ended
        restored[0].step(TensorDict({"action": torch.zeros(3, dtype=torch.long)}, batch_size=[3]))
    first = restored[0].reset()
    for i in range(3):  # episode k of copy i is seeded episode_seed(seed + i, k)
        expected, _ = gymnasium.make("CartPole-v1").reset(seed=episode_seed(4 + i, int(counters[i])))
        assert first["observation"][i].allclose(torch.from_numpy(expected))
    # Loaded into two environments, it plays the same episodes: deterministic, though not a continuation.
    restored[0].load_state_dict(state)
    actions = random_actions(env, 40, seed=1)
    assert all(
        torch.equal(a["next", "observation"], b["next", "observation"])
        for a, b in zip(play(restored[0], actions), play(restored[1], actions), strict=True)
    )
    with pytest.raises(ValueError, match="its environment state is for env_id CartPole-v1"):
        GymnasiumEnv(num_envs=3, env_id="Acrobot-v1").load_state_dict(state)
    for each in (env, *restored):
        each.close()


# ------------------------------------------------------------------------------------------- bad input, one line
def gym_config(tmp_path: Path, **env: Any) -> Path:
    """A tiny DQN run on a Gymnasium env (the chain config's data module and model)."""
    config = chain_config("dqn", tmp_path / "out")
    config["data"]["init_args"]["env"] = {"class_path": "envs.gym.env.GymnasiumEnv", "init_args": env}
    return write_config(config, tmp_path / "gym.yaml")


def one_error_line(tmp_path: Path, capsys, *args: str, **env: Any) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(gym_config(tmp_path, **env)), *args])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and not (tmp_path / "out").exists()
    return lines[0]


FLAG = "--data.init_args.env.init_args"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [f"{FLAG}.env_id", "CartPol-v1"],
            f"error: {FLAG}.env_id 'CartPol-v1' is not a registered Gymnasium id; did you mean CartPole-v1",
        ),
        (
            [f"{FLAG}.wrappers", "[ClipRewrd]"],
            f"error: {FLAG}.wrappers names 'ClipRewrd', which is not a wrapper of gymnasium.wrappers nor the class "
            "path of a gymnasium.Wrapper; did you mean ClipReward?",
        ),
        (
            [f"{FLAG}.wrappers", "[my_package.NoSuchWrapper]"],
            f"error: {FLAG}.wrappers names 'my_package.NoSuchWrapper', which is not a wrapper of gymnasium.wrappers",
        ),
        ([f"{FLAG}.env_kwargs", "{gravity: 1}"], f"error: {FLAG}.env_kwargs {{'gravity': 1}} do not fit CartPole-v1"),
        (
            [f"{FLAG}.env_id", "no_such_module:Thing-v0"],
            f"error: {FLAG}.env_id 'no_such_module:Thing-v0': its module 'no_such_module' does not import",
        ),
        # Whatever the environment raises at an option it refuses (FrozenLake: a KeyError): one line naming env_kwargs.
        (
            [f"{FLAG}.env_id", "FrozenLake-v1", f"{FLAG}.env_kwargs", "{map_name: 5x5}"],
            f"error: {FLAG}.env_kwargs {{'map_name': '5x5'}} do not fit FrozenLake-v1: KeyError: '5x5'",
        ),
        (
            [f"{FLAG}.env_kwargs", "{max_episode_steps: 0}"],
            f"error: {FLAG}.env_kwargs {{'max_episode_steps': 0}} do not fit CartPole-v1: Expect the "
            "`max_episode_steps` to be positive",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, capsys, args, message):
    assert one_error_line(tmp_path, capsys, *args, env_id="CartPole-v1").startswith(message)


USERS_MODULE = """
import gymnasium
import missing_dependency_of_this_module  # noqa: F401 - only in the module that needs it
"""

USERS_WRAPPERS = """
import gymnasium


class ScaleReward(gymnasium.RewardWrapper):
    def reward(self, reward):
        return 2 * reward


class Refusing(gymnasium.Wrapper):
    def __init__(self, env):
        raise RuntimeError("this wrapper refuses every environment")
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [f"{FLAG}.env_id", "users_broken:Thing-v0"],
            f"error: {FLAG}.env_id 'users_broken:Thing-v0': importing its module 'users_broken' failed: "
            "ZeroDivisionError: division by zero",
        ),
        (
            [f"{FLAG}.env_id", "users_wrappers:Thing-v0"],
            f"error: {FLAG}.env_id 'Thing-v0' is not a registered Gymnasium id; importing 'users_wrappers' "
            "registered no such id",
        ),
        (
            [f"{FLAG}.wrappers", "[users_wrappers.ScaleRewrd]"],
            f"error: {FLAG}.wrappers names 'users_wrappers.ScaleRewrd', which is not a wrapper of gymnasium.wrappers "
            "nor the class path of a gymnasium.Wrapper; did you mean users_wrappers.ScaleReward?",
        ),
        (
            [f"{FLAG}.wrappers", "[users_needs_more.Wrapper]"],
            f"error: {FLAG}.wrappers names 'users_needs_more.Wrapper', whose module does not import: No module named "
            "'missing_dependency_of_this_module'",
        ),
        (
            [f"{FLAG}.wrappers", "[users_wrappers.Refusing]"],
            f"error: {FLAG}.wrappers Refusing({{}}) does not apply to CartPole-v1: RuntimeError: this wrapper refuses "
            "every environment",
        ),
    ],
)
def test_a_users_module_or_wrapper_that_fails_is_one_line_naming_the_flag(tmp_path, capsys, monkeypatch, args, message):
    modules = {"users_broken": "1 / 0\n", "users_wrappers": USERS_WRAPPERS, "users_needs_more": USERS_MODULE}
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert one_error_line(tmp_path, capsys, *args, env_id="CartPole-v1").startswith(message)


def test_an_environment_whose_extra_is_not_installed_names_the_install_command(tmp_path, capsys, monkeypatch):
    # Box2D as if it were not installed: its import fails, and Gymnasium's Box2D modules import afresh.
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for name in [name for name in sys.modules if name.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)
    line = one_error_line(tmp_path, capsys, env_id="LunarLander-v3")
    assert line == f"error: {FLAG}.env_id LunarLander-v3 needs Box2D, which is not installed: {install_command('gym')}"


# ------------------------------------------------------------------------------------------ the shipped configs
# Each shipped Gymnasium config fits a few updates and its first evaluations are pinned: tests/app/test_pins.py.


@pytest.mark.slow
def test_a_gym_run_resumed_with_ckpt_path_last_continues_in_its_folder_from_fresh_episodes(tmp_path, monkeypatch):
    config = ROOT / "configs" / "gym" / "cartpole_ppo.yaml"
    runs = tmp_path / "runs"
    args = ["--trainer.logger.init_args.save_dir", str(runs), "--trainer.enable_progress_bar", "false"]
    fit(config, *args, "--trainer.max_steps", "20")
    checkpoint = torch.load(runs / "gym_cartpole_ppo/version_0/checkpoints/last.ckpt", weights_only=True)
    saved = checkpoint["RolloutDataModule"]["env"]["_extra_state"]
    batches = []
    collect = RolloutDataModule.collect
    monkeypatch.setattr(RolloutDataModule, "collect", lambda self: batches.append(collect(self)) or batches[-1])

    cli = fit(config, *args, "--trainer.max_steps", "40", "--ckpt_path", "last")

    assert cli.trainer.global_step == 40 and cli.trainer.log_dir == str(runs / "gym_cartpole_ppo/version_0")
    assert [path.name for path in (runs / "gym_cartpole_ppo").iterdir()] == ["version_0"]
    # The resumed run's first rollout starts each copy's next episode, seeded from the saved counters; the
    # checkpoint's carried observations (of the ended episodes) are not used.
    first = batches[0]["observation"][:, 0]
    for i in range(first.shape[0]):
        stream, episode = int(saved["stream"][i]), int(saved["next_episode"][i])
        expected, _ = gymnasium.make("CartPole-v1").reset(seed=episode_seed(stream, episode))
        assert first[i].allclose(torch.from_numpy(expected))


def test_the_gym_configs_cite_the_rl_zoo_and_name_the_gymnasium_env():
    assert {path.stem for path in GYM_CONFIGS} >= {
        "cartpole_dqn",
        "cartpole_ppo",
        "lunarlander_dqn",
        "lunarlander_ppo",
        "pendulum_sac",
        "pendulum_td3",
    }
    for path in GYM_CONFIGS:
        text = path.read_text()
        assert "rl-baselines3-zoo" in text and f"configs/gym/{path.name}" in text
        env = yaml.safe_load(text)["data"]["init_args"]["env"]
        engine = "envpool_env.EnvpoolEnv" if path.stem.endswith("_envpool") else "env.GymnasiumEnv"
        assert env["class_path"] == f"envs.gym.{engine}" and env["init_args"]["env_id"]


@pytest.mark.slow
def test_the_documented_gymnasium_environment_of_ones_own_fits_by_module_and_id(tmp_path, monkeypatch):
    # The docs' blocks (docs/systems/gymnasium.md): ``python`` (the environment's module) and ``yaml`` (its config).
    example = doc_code_blocks("systems/gymnasium.md", "Your own environment")
    (tmp_path / "corridor.py").write_text(example["python"])
    (tmp_path / "corridor_dqn.yaml").write_text(example["yaml"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "corridor", raising=False)  # the docs' other corridor (Adding an environment)
    config = yaml.safe_load(example["yaml"])["data"]["init_args"]["env"]["init_args"]
    try:
        env = GymnasiumEnv(num_envs=2, **config)
        assert env.observation_spec["observation"].shape == (2, 2)  # the position and the wrapper's time
        play(env, random_actions(env, 10))
        env.close()
    finally:
        sys.modules.pop("corridor", None)
        gymnasium.registry.pop("Corridor-v0", None)
    fits_as_the_docs_run_it(tmp_path, "corridor_dqn.yaml")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("written_with", "resumed_with", "reason", "collection"),
    [
        # Another observation size: the network's first layer differs.
        (
            "Acrobot-v1",
            "CartPole-v1",
            "its weights do not fit this config's model: q_network.1.0.weight is [32, 6]",
            (),
        ),
        # The same spaces, another task: the environment's saved state names its id.
        (
            "CartPole-v0",
            "CartPole-v1",
            "its environment state is for env_id CartPole-v0; this run's is CartPole-v1",
            (),
        ),
        # The same, refused in the worker processes, which die of it: the same line, and the process ends.
        *(
            (
                "CartPole-v0",
                "CartPole-v1",
                "its environment state is for env_id CartPole-v0; this run's is CartPole-v1",
                ("--data.init_args.collection", collection, "--data.init_args.collection.workers", "2"),
            )
            for collection in ("CollectorWorkers", "EnvWorkers")
        ),
    ],
    ids=["weights", "environment state", "environment state in collector workers", "environment state in env workers"],
)
def test_resuming_a_checkpoint_of_another_environment_is_one_line_and_leaves_its_run_folder_as_it_was(
    tmp_path, monkeypatch, capsys, written_with, resumed_with, reason, collection
):
    # As a user meets it: the env id overridden on the command line keeps the config's run name, so `--ckpt_path
    # last` of the config finds the other environment's run. The run that writes the checkpoint runs in this process,
    # and so does the refusal, but where worker processes refuse it: they die of it and the process ends, so there
    # the command runs in a process of its own.
    config = ROOT / "configs" / "gym" / "cartpole_dqn.yaml"
    short = ("--model.init_args.network.hidden_sizes", "[32]", "--data.init_args.warmup_frames", "64", *collection)
    env_id = "--data.init_args.env.init_args.env_id"
    monkeypatch.chdir(tmp_path)
    fit(config, env_id, written_with, "--trainer.max_steps", "4", *short)
    folder = tmp_path / "runs" / "gym_cartpole_dqn" / "version_0"
    before = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}

    args = ("fit", "--config", str(config), env_id, resumed_with, "--trainer.max_steps", "8", *short)
    resumed = (
        run_app(*args, "--ckpt_path", "last", cwd=tmp_path)
        if collection
        else app_in_process(capsys, *args, "--ckpt_path", "last")
    )

    assert resumed.returncode == 1
    (line,) = [line for line in resumed.stderr.splitlines() if line.startswith("error")]
    assert line.endswith("(--trainer.logger.init_args.name)")
    assert line.startswith(f"error: --ckpt_path: the checkpoint does not fit this run: {reason}")
    if not collection:  # (the collector workers' own output goes to the terminal too, their tracebacks included)
        assert "Traceback" not in resumed.stderr
    # Nothing of the run was replaced: its config still describes its checkpoints, which are unchanged.
    assert {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()} == before
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4

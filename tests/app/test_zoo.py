"""``lightrl zoo``: the RL Zoo's tuned DQN, PPO, SAC and TQC entries, read from the installed ``rl_zoo3``, written as
configs that mean the same; the shipped DQN and PPO configs of CartPole and LunarLander, the Pendulum SAC config and
the Breakout PPO and HalfCheetah configs are its output, every pair it maps trains (the Zoo's ``atari`` entries on two
games), and what cannot be mapped is one line naming each key."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import yaml

from app.zoo import Options, ZooError, config_text, map_a2c, map_dqn, map_ppo, map_qrdqn, map_sac, zoo_entry
from tests.helpers import ROOT, app_in_process, fit, write_config

pytest.importorskip("rl_zoo3")  # the zoo extra (CI installs it)

SHIPPED = {
    ("dqn", "CartPole-v1"): "configs/gym/cartpole_dqn.yaml",
    ("dqn", "LunarLander-v3"): "configs/gym/lunarlander_dqn.yaml",
    ("qrdqn", "CartPole-v1"): "configs/gym/cartpole_qrdqn.yaml",
    ("ppo", "CartPole-v1"): "configs/gym/cartpole_ppo.yaml",
    ("ppo", "LunarLander-v3"): "configs/gym/lunarlander_ppo.yaml",
    ("a2c", "CartPole-v1"): "configs/gym/cartpole_a2c.yaml",
    ("sac", "Pendulum-v1"): "configs/gym/pendulum_sac.yaml",
    ("td3", "Pendulum-v1"): "configs/gym/pendulum_td3.yaml",
    ("ddpg", "Pendulum-v1"): "configs/gym/pendulum_ddpg.yaml",
    ("tqc", "Pendulum-v1"): "configs/gym/pendulum_tqc.yaml",
    ("crossq", "Pendulum-v1"): "configs/gym/pendulum_crossq.yaml",
    ("ppo", "ALE/Breakout-v5"): "configs/gym/breakout_ppo.yaml",
    ("ppo", "HalfCheetah-v5"): "configs/gym/halfcheetah_ppo.yaml",  # the Zoo's HalfCheetah-v4 entry
    ("sac", "HalfCheetah-v5"): "configs/gym/halfcheetah_sac.yaml",
}
#: The games each mapped ``atari`` entry is written and trained on: an id the Zoo names (NoFrameskip-v4) and one of
#: ale-py's ALE/ namespace (its emulator set to the NoFrameskip one in env_kwargs).
ATARI_GAMES = ("BreakoutNoFrameskip-v4", "ALE/Pong-v5")


#: The options a shipped config was written with (its header says them): its round stepped as copies together.
SHIPPED_OPTIONS = {
    ("dqn", "CartPole-v1"): Options(copies=8),
    ("qrdqn", "CartPole-v1"): Options(copies=8),
    ("dqn", "LunarLander-v3"): Options(copies=4),
}


@pytest.mark.parametrize(("algo", "env_id"), list(SHIPPED))
def test_the_shipped_configs_are_the_commands_output(algo, env_id, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the command's header names the path it was given, relative to the checkout
    shipped, options = Path(SHIPPED[algo, env_id]), SHIPPED_OPTIONS.get((algo, env_id), Options())
    assert config_text(algo, env_id, shipped, options) == shipped.read_text()
    # and as a user runs it, from another folder, atomically into a new one
    monkeypatch.chdir(tmp_path)
    flags = options.flags().split()
    result = app_in_process(capsys, "zoo", "--algo", algo, "--env", env_id, "--out", "mine/dqn.yaml", *flags)
    assert result.returncode == 0, result.stderr
    written, ours = (yaml.safe_load(path.read_text()) for path in (tmp_path / "mine/dqn.yaml", ROOT / shipped))
    assert written["data"] == ours["data"] and written["model"] == ours["model"]  # the run's name: the file's
    assert [path.name for path in (tmp_path / "mine").iterdir()] == ["dqn.yaml"]


def test_the_rules_follow_the_zoos_numbers():
    """CartPole: a round of 256 frames of the Zoo's one environment and 128 updates of 64, taken as 64 of 128 (the
    same samples per frame), so the target copy that the Zoo makes every 10 frames while collecting happens once a
    round; --copies 8 steps the round as 8 copies of 32 steps; MountainCar: 16 frames and 8 updates, copied every 600
    frames = 300 updates; --exact-updates keeps the Zoo's 128 of 64. A run of more than 50,000 updates (MountainCar's
    59,500) compiles its update; CartPole's 12,250 do not."""
    cartpole = yaml.safe_load("\n".join(_lines(map_dqn(zoo_entry("dqn", "CartPole-v1"), "CartPole-v1", "r"))))
    data, model = cartpole["data"]["init_args"], cartpole["model"]["init_args"]
    assert (data["num_envs"], data["collect_steps"], data["frames_per_update"], data["batch_size"]) == (1, 256, 4, 128)
    copied = map_dqn(zoo_entry("dqn", "CartPole-v1"), "CartPole-v1", "r", Options(copies=8))
    copied_data = yaml.safe_load("\n".join(_lines(copied)))["data"]["init_args"]
    assert (copied_data["num_envs"], copied_data["collect_steps"], copied_data["frames_per_update"]) == (8, 32, 4)
    assert model["target"]["interval"] == 64 and model["exploration"]["eps_frames"] == 8000
    assert cartpole["trainer"]["max_steps"] == (50_000 - 1_000) // 4 and "compile" not in model
    exact_config = map_dqn(zoo_entry("dqn", "CartPole-v1"), "CartPole-v1", "r", Options(exact_updates=True))
    exact = yaml.safe_load("\n".join(_lines(exact_config)))
    assert (exact["data"]["init_args"]["frames_per_update"], exact["data"]["init_args"]["batch_size"]) == (2, 64)
    assert exact["model"]["init_args"]["target"]["interval"] == 128
    car = yaml.safe_load("\n".join(_lines(map_dqn(zoo_entry("dqn", "MountainCar-v0"), "MountainCar-v0", "r"))))
    data, model = car["data"]["init_args"], car["model"]["init_args"]
    assert (data["num_envs"], data["collect_steps"], data["frames_per_update"], data["batch_size"]) == (1, 16, 2, 128)
    assert model["target"]["interval"] == 300 and model["gamma"] == 0.98
    assert car["trainer"]["max_steps"] == (120_000 - 1_000) // 2 and model["compile"] is True


def test_copies_must_divide_an_off_policy_round_and_are_refused_for_rollouts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for flags, message in (
        (
            ["--algo", "dqn", "--env", "MountainCar-v0", "--copies", "3"],
            "--copies 3: must be a positive divisor of the round's 16 frames",
        ),
        (
            ["--algo", "ppo", "--env", "CartPole-v1", "--copies", "8"],
            "--copies 8: divides an off-policy round; PPO's rollout",
        ),
        (["--algo", "sac", "--env", "Pendulum-v1", "--copies", "0"], "--copies 0: must be >= 1"),
    ):
        result = app_in_process(capsys, "zoo", *flags, "--out", "x.yaml")
        assert result.returncode != 0 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) <= 3  # one line (argparse's usage line before its error)
    assert not (tmp_path / "x.yaml").exists()


def test_ppo_follows_the_zoos_numbers():
    """CartPole: 8 copies x 32 steps, one minibatch of 256 for 20 epochs, the lr and the clip falling linearly to 0;
    390 whole rollouts in 1e5 frames. HalfCheetah: VecNormalize as both normalisations, log_std_init -2 as the
    Gaussian's initial scale, ReLU, no orthogonal initialisation."""
    cartpole = yaml.safe_load("\n".join(_lines(map_ppo(zoo_entry("ppo", "CartPole-v1"), "CartPole-v1", "r"))))
    data, model = cartpole["data"]["init_args"], cartpole["model"]["init_args"]
    assert (data["num_envs"], data["collect_steps"], data["minibatch_size"], data["update_epochs"]) == (8, 32, 256, 20)
    assert cartpole["trainer"]["max_steps"] == 390 * 20 and "compile" not in model
    assert model["optimizer"]["lr_end"] == 0.0 and model["loss"]["clip_decay_frames"] == 100_000
    assert model["optimizer"]["eps"] == 1e-5 and model["network"]["orthogonal_init"] is True
    cheetah = map_ppo(zoo_entry("ppo", "HalfCheetah-v4"), "HalfCheetah-v4", "r")
    model = yaml.safe_load("\n".join(_lines(cheetah)))["model"]["init_args"]
    assert model["normalize"] == {"observations": True, "rewards": True}
    assert model["gaussian"]["init_scale"] == 0.1353 and model["network"]["orthogonal_init"] is False
    assert model["network"].get("activation", "relu") == "relu"  # ReLU: lightrl's default, not written


def mapped(mapper, algo: str, env_id: str) -> dict:
    """The config ``mapper`` writes for the Zoo's ``algo`` entry of ``env_id``, as YAML reads it."""
    return yaml.safe_load("\n".join(_lines(mapper(zoo_entry(algo, env_id), env_id, "r"))))


#: The mapped algorithms with an ``atari`` entry, and their mappings.
ATARI_MAPPERS = {"dqn": map_dqn, "qrdqn": map_qrdqn, "ppo": map_ppo, "a2c": map_a2c}


def test_an_atari_game_takes_the_zoos_atari_entry_as_the_zoo_chooses():
    """The Zoo's rule (ExperimentManager.is_atari): an id it does not list whose entry point is ale-py's AtariEnv
    takes its ``atari`` entry; any other id it does not list is one line."""
    pytest.importorskip("ale_py")
    from app.zoo import zoo_tables

    tables = zoo_tables()
    for algo in ATARI_MAPPERS:
        for game in (*ATARI_GAMES, "SpaceInvadersNoFrameskip-v4", "ALE/Seaquest-v5"):
            assert zoo_entry(algo, game) == tables[algo]["atari"]
    with pytest.raises(ZooError, match="--env Taxi-v3: not in the RL Zoo's hyperparams/dqn.yml"):
        zoo_entry("dqn", "Taxi-v3")  # registered, not an Atari game
    with pytest.raises(ZooError, match="--env BreakoutNoFrameskip-v4: not in the RL Zoo's hyperparams/sac.yml"):
        zoo_entry("sac", "BreakoutNoFrameskip-v4")  # the SAC table has no atari entry


def test_a_task_the_zoo_tunes_in_another_version_takes_that_versions_entry():
    """Gymnasium's MuJoCo tasks are at v5 and the Zoo's tables at v4: a registered id whose task a table lists in
    other versions only takes the newest of them, and the config says so; an unregistered version is one line."""
    from app.zoo import entry_id, zoo_table

    assert entry_id(zoo_table("sac"), "sac", "HalfCheetah-v5") == "HalfCheetah-v4"
    assert zoo_entry("ppo", "Hopper-v5") == zoo_table("ppo")["Hopper-v4"]
    text = config_text("sac", "HalfCheetah-v5", Path("hc.yaml"))
    assert "# The Zoo tunes this task as HalfCheetah-v4: that entry's numbers, on HalfCheetah-v5." in text
    assert yaml.safe_load(text)["data"]["init_args"]["env"]["init_args"]["env_id"] == "HalfCheetah-v5"
    with pytest.raises(ZooError, match="--env HalfCheetah-v9: not in the RL Zoo's hyperparams/sac.yml"):
        zoo_entry("sac", "HalfCheetah-v9")  # not registered: no version of it to map


@pytest.mark.parametrize("game", ATARI_GAMES)
def test_the_atari_entries_are_atariwrapper_as_gymnasium_wrappers_and_the_nature_cnn(game):
    """Each algorithm's atari entry: AtariWrapper's steps in its order as Gymnasium's wrappers (up to 30 no-op
    starts, 4 frames a step with the last two max-pooled, 84x84 grey bytes; FIRE; frame_stack 4; the reward's sign),
    a lost life ending the agent's episode but not an evaluation's game, the NoFrameskip-v4 ids' emulator (ALE/
    ids set to it), and the Nature CNN (network kind auto) on two threads, not compiled."""
    pytest.importorskip("ale_py")
    for algo, mapper in ATARI_MAPPERS.items():
        config = mapped(mapper, algo, game)
        data, model = config["data"]["init_args"], config["model"]["init_args"]
        env = data["env"]["init_args"]
        assert env["wrappers"] == [
            {
                "class_path": "AtariPreprocessing",
                "init_args": {
                    "noop_max": 30,
                    "frame_skip": 4,
                    "screen_size": 84,
                    "grayscale_obs": True,
                    "scale_obs": False,
                },
            },
            "envs.gym.atari.FireReset",
            {"class_path": "FrameStackObservation", "init_args": {"stack_size": 4}},
            {"class_path": "ClipReward", "init_args": {"min_reward": -1.0, "max_reward": 1.0}},
        ]
        assert env["episodic_life"] is True and data["evaluation"]["env_options"] == {"episodic_life": False}
        if game.startswith("ALE/"):  # registered with 4 frames a step and sticky actions 0.25
            assert env["env_id"] == game and env["env_kwargs"] == {"frameskip": 1, "repeat_action_probability": 0.0}
        else:  # registered by ale_py on import, outside its ALE/ namespace
            assert env["env_id"] == game and "env_kwargs" not in env
        assert model["network"]["kind"] == "auto" and "hidden_sizes" not in model["network"]
        assert ("orthogonal_init" in model["network"]) is (algo in ("ppo", "a2c"))  # ActorCriticCnnPolicy's
        assert config["threads"] == 2 and "compile" not in model
        assert config["trainer"]["callbacks"][1]["init_args"] == {"every_n_frames": 1_000_000, "episodes": 16}


def test_the_atari_entries_follow_the_zoos_numbers():
    """DQN: one copy, 4 frames and one update a round after 100,000 warm-up frames, the target copied every 1,000
    frames (250 updates), ε to 0.01 over a tenth of 1e7 frames, 100,000 transitions with each frame kept once.
    QR-DQN: Stable-Baselines3 contrib's defaults under the entry's warm-up and ε (a million transitions, 200
    quantiles, lr 5e-5, the target every 10,000 frames, no clipping). PPO: 8 x 128, 4 epochs of 256, the lr and the
    clip falling linearly to 0 over 1e7 frames: 9,765 whole rollouts. A2C: 16 x 5, TensorFlow's RMSprop with ε 1e-5
    (policy_kwargs), vf_coef 0.25: 125,000 rollouts."""
    pytest.importorskip("ale_py")
    game = ATARI_GAMES[0]
    dqn = mapped(map_dqn, "dqn", game)
    data, model = dqn["data"]["init_args"], dqn["model"]["init_args"]
    assert (data["num_envs"], data["collect_steps"], data["frames_per_update"], data["batch_size"]) == (1, 4, 4, 32)
    assert (data["warmup_frames"], data["buffer_size"], data["store_frames_once"]) == (100_000, 100_000, True)
    assert model["target"] == {"update": "hard", "interval": 250} and model["loss_function"] == "smooth_l1"
    assert model["exploration"] == {"eps_start": 1.0, "eps_end": 0.01, "eps_frames": 1_000_000}
    assert model["optimizer"] == {"lr": 1e-4, "max_grad_norm": 10.0}
    assert dqn["trainer"]["max_steps"] == (10_000_000 - 100_000) // 4
    qrdqn = mapped(map_qrdqn, "qrdqn", game)
    data, model = qrdqn["data"]["init_args"], qrdqn["model"]["init_args"]
    assert (data["warmup_frames"], data["buffer_size"], data["store_frames_once"]) == (50_000, 1_000_000, True)
    assert model["quantiles"] == 200 and model["target"]["interval"] == 2_500 and model["optimizer"] == {"lr": 5e-5}
    assert model["exploration"] == {"eps_start": 1.0, "eps_end": 0.01, "eps_frames": 250_000}
    ppo = mapped(map_ppo, "ppo", game)
    data, model = ppo["data"]["init_args"], ppo["model"]["init_args"]
    assert (data["num_envs"], data["collect_steps"], data["minibatch_size"], data["update_epochs"]) == (8, 128, 256, 4)
    assert ppo["trainer"]["max_steps"] == 10_000_000 // 1024 * 16 and model["network"]["orthogonal_init"] is True
    assert model["loss"]["clip_epsilon"] == 0.1 and model["loss"]["clip_decay_frames"] == 10_000_000
    assert (model["loss"]["entropy_coef"], model["loss"]["critic_coef"], model["loss"]["critic_loss"]) == (
        0.01,
        0.5,
        "l2",
    )
    assert model["optimizer"]["lr"] == 2.5e-4 and model["optimizer"]["lr_decay"] == "linear"
    assert model["optimizer"]["eps"] == 1e-5
    a2c = mapped(map_a2c, "a2c", game)
    data, model = a2c["data"]["init_args"], a2c["model"]["init_args"]
    assert (data["num_envs"], data["collect_steps"], data["minibatch_size"], data["update_epochs"]) == (16, 5, 80, 1)
    assert a2c["trainer"]["max_steps"] == 125_000 and (model["gamma"], model["gae_lambda"]) == (0.99, 1.0)
    assert model["optimizer"] == {"algorithm": "rmsprop_tf", "lr": 7e-4, "max_grad_norm": 0.5, "eps": 1e-5}
    assert (model["loss"]["entropy_coef"], model["loss"]["critic_coef"], model["loss"]["normalize_advantage"]) == (
        0.01,
        0.25,
        False,
    )


def test_the_atari_configs_play_the_noframeskip_emulator_into_each_agents_nature_cnn():
    """The written environment, for real: ALE/Pong-v5 set to the NoFrameskip-v4 emulator plays what
    PongNoFrameskip-v4 plays, seed for seed; its observations are 4 stacked 84x84 bytes, which DQN reads with a Nature
    CNN and its Q-head, QR-DQN with a head of actions x quantiles, and A2C with one Nature CNN for both heads."""
    pytest.importorskip("ale_py")
    import torch

    from envs.gym.env import GymnasiumEnv
    from modules.a2c import A2C
    from modules.dqn import DQN
    from modules.networks import NatureCNN, NetworkOptions
    from modules.qrdqn import QRDQN

    options = {
        game: mapped(map_dqn, "dqn", game)["data"]["init_args"]["env"]["init_args"]
        for game in ("ALE/Pong-v5", "PongNoFrameskip-v4")
    }
    v5, v4 = (GymnasiumEnv(num_envs=1, seed=3, **options[game]) for game in options)
    td, reference = v5.reset(), v4.reset()
    assert td["observation"].shape == (1, 4, 84, 84) and td["observation"].dtype == torch.uint8
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        action = torch.randint(6, (1,), generator=generator)
        stepped, td = v5.step_and_maybe_reset(td.set("action", action))
        expected, reference = v4.step_and_maybe_reset(reference.set("action", action))
        assert torch.equal(stepped["next", "observation"], expected["next", "observation"])
        assert torch.equal(stepped["next", "reward"], expected["next", "reward"])
    specs = (v5.observation_spec[0], v5.action_spec[0])
    network = NetworkOptions(kind="auto")
    dqn, qrdqn, a2c = DQN(*specs, network=network), QRDQN(*specs, network=network), A2C(*specs, network=network)
    assert isinstance(dqn.q_network, NatureCNN) and dqn.q_network(td["observation"]).shape == (1, 6)
    assert qrdqn.q_network.quantiles(td["observation"]).shape == (1, 6, 200)
    assert isinstance(a2c.actor_network.torso, NatureCNN) and a2c.actor_network.torso is a2c.critic_network.torso
    v5.close()
    v4.close()


def test_the_atari_entries_refuse_what_they_cannot_map():
    """AtariWrapper on what is not an Atari game, an Atari entry read by an MLP, and an A2C optimizer lightrl lacks:
    one line naming each."""
    pytest.importorskip("ale_py")
    atari = zoo_entry("a2c", ATARI_GAMES[0])
    with pytest.raises(ZooError, match="AtariWrapper: CartPole-v1 is not an Atari game"):
        map_a2c(atari, "CartPole-v1", "r")
    with pytest.raises(ZooError, match="policy MlpPolicy: only MlpPolicy entries, and CnnPolicy on an Atari game"):
        map_a2c({**atari, "policy": "MlpPolicy"}, ATARI_GAMES[0], "r")
    with pytest.raises(ZooError, match="frame_stack None: AtariWrapper's frames are mapped stacked"):
        map_a2c({key: value for key, value in atari.items() if key != "frame_stack"}, ATARI_GAMES[0], "r")
    sgd = {**atari, "policy_kwargs": "dict(optimizer_class=SGD, optimizer_kwargs=dict(momentum=0.9), net_arch=[64])"}
    with pytest.raises(ZooError) as error:
        map_a2c(sgd, ATARI_GAMES[0], "r")
    message = str(error.value)
    assert "optimizer_class SGD: lightrl maps RMSpropTFLike" in message
    assert "optimizer_kwargs ['momentum']: only eps and alpha are mapped" in message
    assert "policy_kwargs net_arch: not an option of lightrl's Nature CNN (CnnPolicy)" in message


def test_sac_follows_the_zoos_numbers():
    """Pendulum: one update per frame after 100 warm-up frames, a buffer of the run's 20,000 frames (the default
    million never fills), α learned from 1; LunarLanderContinuous: 400-300 networks, tau 0.01, a linear lr."""
    pendulum = yaml.safe_load("\n".join(_lines(map_sac(zoo_entry("sac", "Pendulum-v1"), "Pendulum-v1", "r"))))
    data, model = pendulum["data"]["init_args"], pendulum["model"]["init_args"]
    assert (data["num_envs"], data["frames_per_update"], data["warmup_frames"], data["buffer_size"]) == (
        1,
        1,
        100,
        20_000,
    )
    assert (
        pendulum["trainer"]["max_steps"] == 19_900 and model["alpha_init"] == 1.0 and model["optimizer"]["lr"] == 1e-3
    )
    lander = map_sac(zoo_entry("sac", "LunarLanderContinuous-v3"), "LunarLanderContinuous-v3", "r")
    model = yaml.safe_load("\n".join(_lines(lander)))["model"]["init_args"]
    assert model["actor"]["hidden_sizes"] == model["critics"]["hidden_sizes"] == [400, 300]
    assert model["critics"]["tau"] == 0.01 and model["optimizer"]["lr_decay"] == "linear"
    hardcore = map_sac(zoo_entry("sac", "BipedalWalkerHardcore-v3"), "BipedalWalkerHardcore-v3", "r")
    model = yaml.safe_load("\n".join(_lines(hardcore)))["model"]["init_args"]
    assert model["alpha_init"] == 0.005 and model["learn_alpha"] is False  # the Zoo's numeric ent_coef: α fixed
    with pytest.raises(ZooError, match="ent_coef fast: a number, auto or auto_X"):
        map_sac({**zoo_entry("sac", "Pendulum-v1"), "ent_coef": "fast"}, "Pendulum-v1", "r")


def mapped_pairs() -> list[tuple[str, str]]:
    """The coverage figure's mapped pairs, the Zoo's ``atari`` entry as :data:`ATARI_GAMES`."""
    from app.zoo import coverage

    rows = coverage()
    pairs = [(row["algo"], env_id) for row in rows for env_id in row["mapped"] if env_id != "atari"]
    return pairs + [(row["algo"], game) for row in rows if "atari" in row["mapped"] for game in ATARI_GAMES]


#: Per algorithm: what keeps one update of a mapped config to seconds (the rest of the config as written).
SHORT = {
    "dqn": ("--data.init_args.warmup_frames", "64"),
    "qrdqn": ("--data.init_args.warmup_frames", "64"),
    "sac": ("--data.init_args.warmup_frames", "64"),
    "td3": ("--data.init_args.warmup_frames", "64"),
    "ddpg": ("--data.init_args.warmup_frames", "64"),
    "tqc": ("--data.init_args.warmup_frames", "64"),
    "crossq": ("--data.init_args.warmup_frames", "64"),
    "a2c": (),  # a rollout is n_envs x 5 frames already (Atari's: 16 copies)
    "ppo": (
        "--data.init_args.collect_steps",
        "8",
        "--data.init_args.minibatch_size",
        "8",
        "--data.init_args.update_epochs",
        "1",
    ),
}


#: What else keeps an Atari pair's update to seconds: a replay of 1,000 transitions (the Zoo's 100,000, QR-DQN's
#: 1,000,000, would allocate a frame ring of gigabytes), and A2C's rollout from 4 emulators, not 16.
ATARI_SHORT = {
    "dqn": ("--data.init_args.buffer_size", "1000"),
    "qrdqn": ("--data.init_args.buffer_size", "1000"),
    "a2c": ("--data.init_args.num_envs", "4", "--data.init_args.minibatch_size", "20"),
}


#: The pairs whose config compiles its update (runs of more than 50,000 updates) that train compiled here, one per
#: algorithm; the other such pairs train eagerly. Each pair's loss has its own shapes, so each is a compilation of its
#: own: 4-6 s of a cold compiler a pair, 17 pairs on 2026-11-30. That the compiled loss is the eager one, agent by
#: agent, is tests/agents/test_lightning_features.py's; a written DQN config trains compiled in tests/app/test_pins.py
#: (configs/gym/lunarlander_dqn.yaml, this command's output).
COMPILED = {("ppo", "LunarLander-v3"), ("a2c", "HalfCheetah-v4")}


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "env_id"), mapped_pairs())
def test_every_pair_the_command_maps_builds_and_trains(algo, env_id, tmp_path, capsys, monkeypatch):
    """The coverage figure's pairs: each config written as a user writes it, then one update and its checkpoint."""
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "zoo", "--algo", algo, "--env", env_id, "--out", "zoo.yaml")
    assert result.returncode == 0, result.stderr
    # The evaluations (at the start and the end) play one episode, not the config's 16, of at most 64 steps (through
    # Gymnasium's own time limit): a MuJoCo task's greedy and random episodes of 1,000 steps were most of a pair's
    # time, and the mapping writes the same callback and the same environment for every pair.
    config = yaml.safe_load((tmp_path / "zoo.yaml").read_text())
    (evaluation,) = [c for c in config["trainer"]["callbacks"] if c["class_path"].endswith(".PeriodicEvaluation")]
    evaluation["init_args"]["episodes"] = 1
    config["data"]["init_args"]["env"]["init_args"].setdefault("env_kwargs", {})["max_episode_steps"] = 64
    compiles = config["model"]["init_args"].get("compile", False)
    assert compiles or (algo, env_id) not in COMPILED  # the compiled pairs still compile as written
    if compiles and (algo, env_id) not in COMPILED:
        config["model"]["init_args"]["compile"] = False
    write_config(config, tmp_path / "zoo.yaml")
    # The throughput report (the last callback) without its bare-update yardstick and its figures: seconds of timing
    # and drawing that check nothing here (tests/app/test_throughput.py checks both).
    report = ("--trainer.callbacks.init_args.bare_update_seconds", "0", "--trainer.callbacks.init_args.plots", "false")
    atari = ATARI_SHORT.get(algo, ()) if env_id in ATARI_GAMES else ()
    cli = fit(tmp_path / "zoo.yaml", "--trainer.max_steps", "1", *SHORT[algo], *atari, *report)
    assert cli.trainer.global_step == 1
    folder = tmp_path / "runs/gym_zoo/version_0"
    assert (folder / "checkpoints/last.ckpt").is_file()
    evaluated = [row for row in csv.DictReader((folder / "metrics.csv").open()) if row.get("eval/return_mean")]
    assert len(evaluated) == 2  # the evaluation before the update and the one at the end


def test_the_coverage_figure_has_every_pair_this_file_trains():
    # DQN 4, QR-DQN 4, PPO 13, A2C 10, SAC 9, TQC 9, CrossQ 10, TD3 10, DDPG 10, and atari of DQN, QR-DQN, PPO and A2C
    # (each on two games here)
    assert len(mapped_pairs()) >= 79 + 4 * len(ATARI_GAMES)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--algo", "dqn", "--env", "atari"],
            "--env atari: the Zoo's entry for every Atari game; name a game, e.g. BreakoutNoFrameskip-v4",
        ),
        (
            ["--algo", "ppo", "--env", "CarRacing-v3"],
            "policy CnnPolicy: only MlpPolicy entries, and CnnPolicy on an Atari game's frames (env_wrapper "
            "AtariWrapper), are mapped",
        ),
        (["--algo", "dqn", "--env", "Pong-v9"], "--env Pong-v9: not in the RL Zoo's hyperparams/dqn.yml"),
        (
            ["--algo", "a3c", "--env", "CartPole-v1"],
            "--algo a3c: not mapped yet (this command maps dqn, qrdqn, ppo",
        ),
        (["--algo", "ppo", "--env", "Pendulum-v1"], "cannot map ppo Pendulum-v1: sde_sample_freq: not mapped"),
        (
            ["--algo", "ars", "--env", "Pendulum-v1"],
            "--algo ars: not mapped yet: no ARS agent in lightrl (a random search over linear policies, without "
            "gradients: no TorchRL loss) (this command maps dqn, qrdqn, ppo",
        ),
    ],
)
def test_what_cannot_be_mapped_is_one_line_naming_it(args, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "zoo", *args, "--out", "x.yaml")
    assert result.returncode == 1 and not (tmp_path / "x.yaml").exists()
    assert len(result.stderr.strip().splitlines()) == 1 and line in result.stderr


def test_ddpg_is_td3_without_its_tricks_as_stable_baselines3_builds_it():
    from app.zoo import map_ddpg

    ddpg = map_ddpg(zoo_entry("ddpg", "Pendulum-v1"), "Pendulum-v1", "r")
    config = yaml.safe_load("\n".join(_lines(ddpg)))
    model = config["model"]["init_args"]
    assert config["model"]["class_path"] == "modules.td3.TD3" and model["critics"]["count"] == 1
    assert model["target_noise"] == model["target_noise_clip"] == 0.0 and model["policy_delay"] == 1
    assert model["action_noise"] == 0.1 and config["data"]["init_args"]["warmup_frames"] == 10_000


def test_tqc_is_sacs_mapping_with_its_quantile_critics():
    from app.zoo import map_tqc

    hopper = yaml.safe_load("\n".join(_lines(map_tqc(zoo_entry("tqc", "Hopper-v4"), "Hopper-v4", "r"))))
    model = hopper["model"]["init_args"]
    assert hopper["model"]["class_path"] == "modules.tqc.TQC" and "count" not in model["critics"]  # 2, the default
    assert model["quantiles"] == 25 and model["dropped_per_critic"] == 5  # top_quantiles_to_drop_per_net 5
    assert model["actor"]["hidden_sizes"] == model["critics"]["hidden_sizes"] == [256, 256]
    assert hopper["data"]["init_args"]["warmup_frames"] == 10_000 and model["optimizer"]["lr"] == 3e-4
    # policy_kwargs n_critics and n_quantiles, as a HER entry gives them (HER itself is refused: another line)
    entry = {**zoo_entry("tqc", "Pendulum-v1"), "policy_kwargs": "dict(net_arch=[64, 64], n_critics=3, n_quantiles=7)"}
    model = yaml.safe_load("\n".join(_lines(map_tqc(entry, "Pendulum-v1", "r"))))["model"]["init_args"]
    assert model["critics"]["count"] == 3 and model["quantiles"] == 7 and model["dropped_per_critic"] == 2
    with pytest.raises(ZooError, match="replay_buffer_class: not mapped"):
        map_tqc(zoo_entry("tqc", "PandaReach-v1"), "PandaReach-v1", "r")


def test_every_key_the_mapping_does_not_know_is_named():
    entry = {**zoo_entry("dqn", "CartPole-v1"), "frame_stack": 4, "normalize": True, "train_freq": [1, "episode"]}
    with pytest.raises(ZooError) as error:
        map_dqn(entry, "CartPole-v1", "r")
    message = str(error.value)
    assert "frame_stack" in message and "normalize" in message and "episodes are not mapped" in message


def _lines(config):
    from app.zoo import render

    return render(config)


def test_the_coverage_counts_every_pair_and_maps_every_installed_dqn_entry(capsys):
    from app.zoo import MAPPED, coverage, zoo_tables

    rows = {row["algo"]: row for row in coverage()}
    # The Zoo's atari entry is one pair of each table that has it, installed (and mapped) where ale-py is.
    atari = importlib.util.find_spec("ale_py") is not None
    dqn_pairs = 4 + atari
    assert set(rows) == set(zoo_tables()) and rows["dqn"]["installed"] == len(rows["dqn"]["mapped"]) == dqn_pairs
    assert rows["dqn"]["pairs"] == 5 and rows["ppo_lstm"]["pairs"] == len(zoo_tables()["ppo_lstm"]) - 1  # no default
    for algo in ("dqn", "qrdqn", "ppo", "a2c"):
        assert ("atari" in rows[algo]["mapped"]) is atari
    assert {"CartPole-v1", "LunarLander-v3", "HalfCheetah-v4"} <= set(rows["ppo"]["mapped"])
    assert {"Pendulum-v1", "HalfCheetah-v4"} <= set(rows["sac"]["mapped"])
    assert {"Pendulum-v1", "HalfCheetah-v4", "Humanoid-v4"} <= set(rows["td3"]["mapped"])
    assert {"CartPole-v1", "LunarLander-v3", "Acrobot-v1", "HalfCheetah-v4"} <= set(rows["a2c"]["mapped"])
    assert rows["qrdqn"]["installed"] == len(rows["qrdqn"]["mapped"]) == dqn_pairs
    assert {"Pendulum-v1", "HalfCheetah-v4", "BipedalWalker-v3"} <= set(rows["ddpg"]["mapped"])
    assert {"Pendulum-v1", "Hopper-v4", "Humanoid-v4"} <= set(rows["tqc"]["mapped"])
    assert {"Pendulum-v1", "BipedalWalker-v3", "HalfCheetah-v4"} <= set(rows["crossq"]["mapped"])
    mapped = ("dqn", "qrdqn", "ppo", "a2c", "sac", "tqc", "crossq", "td3", "ddpg")
    assert all(row["mapped"] == [] for algo, row in rows.items() if algo not in mapped)
    # Every installed pair not mapped is one line saying why: the refusal `zoo --algo ... --env ...` gives.
    assert all(len(row["mapped"]) + len(row["refused"]) == row["installed"] for row in rows.values() if row["mapped"])
    assert rows["ppo"]["refused"]["Pendulum-v1"].startswith("cannot map ppo Pendulum-v1: sde_sample_freq: not mapped")
    result = app_in_process(capsys, "zoo", "--coverage")
    assert result.returncode == 0 and f"| dqn | 5 | {dqn_pairs} | {dqn_pairs} |" in result.stdout
    listed = result.stdout.split("Installed pairs not mapped:\n")[1].splitlines()
    unmapped = sum(len(row["refused"]) + (algo not in MAPPED and row["installed"] > 0) for algo, row in rows.items())
    assert len(listed) == unmapped and f"- {rows['ppo']['refused']['Pendulum-v1']}" in listed
    # An algorithm not mapped: what lightrl lacks for it.
    lacks = "--algo trpo: not mapped yet: no TRPO agent in lightrl (TorchRL has no TRPO loss)"
    assert f"- trpo ({rows['trpo']['installed']} installed): {lacks}" in listed
    assert any(
        line.startswith("- ppo_lstm (") and "recurrent PPO reads MettaGrid's token grids" in line for line in listed
    )

"""``lightrl zoo``: the RL Zoo's tuned DQN, PPO, SAC and TQC entries, read from the installed ``rl_zoo3``, written as
configs that mean the same; the shipped DQN and PPO configs of CartPole and LunarLander and the Pendulum SAC config
are its output, every pair it maps trains, and what cannot be mapped is one line naming each key."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from app.zoo import Options, ZooError, config_text, map_dqn, map_ppo, map_sac, zoo_entry
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
}
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
    frames = 300 updates; --exact-updates keeps the Zoo's 128 of 64."""
    cartpole = yaml.safe_load("\n".join(_lines(map_dqn(zoo_entry("dqn", "CartPole-v1"), "CartPole-v1", "r"))))
    data, model = cartpole["data"]["init_args"], cartpole["model"]["init_args"]
    assert (data["num_envs"], data["collect_steps"], data["frames_per_update"], data["batch_size"]) == (1, 256, 4, 128)
    copied = map_dqn(zoo_entry("dqn", "CartPole-v1"), "CartPole-v1", "r", Options(copies=8))
    copied_data = yaml.safe_load("\n".join(_lines(copied)))["data"]["init_args"]
    assert (copied_data["num_envs"], copied_data["collect_steps"], copied_data["frames_per_update"]) == (8, 32, 4)
    assert model["target"]["interval"] == 64 and model["exploration"]["eps_frames"] == 8000
    assert cartpole["trainer"]["max_steps"] == (50_000 - 1_000) // 4
    exact_config = map_dqn(zoo_entry("dqn", "CartPole-v1"), "CartPole-v1", "r", Options(exact_updates=True))
    exact = yaml.safe_load("\n".join(_lines(exact_config)))
    assert (exact["data"]["init_args"]["frames_per_update"], exact["data"]["init_args"]["batch_size"]) == (2, 64)
    assert exact["model"]["init_args"]["target"]["interval"] == 128
    car = yaml.safe_load("\n".join(_lines(map_dqn(zoo_entry("dqn", "MountainCar-v0"), "MountainCar-v0", "r"))))
    data, model = car["data"]["init_args"], car["model"]["init_args"]
    assert (data["num_envs"], data["collect_steps"], data["frames_per_update"], data["batch_size"]) == (1, 16, 2, 128)
    assert model["target"]["interval"] == 300 and model["gamma"] == 0.98


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
    from app.zoo import coverage

    return [(row["algo"], env_id) for row in coverage() for env_id in row["mapped"]]


#: Per algorithm: what keeps one update of a mapped config to seconds (the rest of the config as written).
SHORT = {
    "dqn": ("--data.init_args.warmup_frames", "64"),
    "qrdqn": ("--data.init_args.warmup_frames", "64"),
    "sac": ("--data.init_args.warmup_frames", "64"),
    "td3": ("--data.init_args.warmup_frames", "64"),
    "ddpg": ("--data.init_args.warmup_frames", "64"),
    "tqc": ("--data.init_args.warmup_frames", "64"),
    "crossq": ("--data.init_args.warmup_frames", "64"),
    "a2c": (),  # a rollout is n_envs x 5 frames already
    "ppo": (
        "--data.init_args.collect_steps",
        "8",
        "--data.init_args.minibatch_size",
        "8",
        "--data.init_args.update_epochs",
        "1",
    ),
}


#: The pairs whose config compiles its update (runs of more than 50,000 updates) that train compiled here, one per
#: algorithm; the other such pairs train eagerly. Each pair's loss has its own shapes, so each is a compilation of its
#: own: 4-6 s of a cold compiler a pair, 17 pairs on 2026-11-30. That the compiled loss is the eager one, agent by
#: agent, is tests/agents/test_lightning_features.py's.
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
    cli = fit(tmp_path / "zoo.yaml", "--trainer.max_steps", "1", *SHORT[algo], *report)
    assert cli.trainer.global_step == 1
    folder = tmp_path / "runs/gym_zoo/version_0"
    assert (folder / "checkpoints/last.ckpt").is_file()
    evaluated = [row for row in csv.DictReader((folder / "metrics.csv").open()) if row.get("eval/return_mean")]
    assert len(evaluated) == 2  # the evaluation before the update and the one at the end


def test_the_coverage_figure_has_every_pair_this_file_trains():
    assert len(mapped_pairs()) >= 79  # DQN 4, QR-DQN 4, PPO 13, A2C 10, SAC 9, TQC 9, CrossQ 10, TD3 10, DDPG 10


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--algo", "dqn", "--env", "atari"], "; policy CnnPolicy: only MlpPolicy entries are mapped (image: not yet)"),
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
    assert set(rows) == set(zoo_tables()) and rows["dqn"]["installed"] == len(rows["dqn"]["mapped"]) == 4
    assert {"CartPole-v1", "LunarLander-v3", "HalfCheetah-v4"} <= set(rows["ppo"]["mapped"])
    assert {"Pendulum-v1", "HalfCheetah-v4"} <= set(rows["sac"]["mapped"])
    assert {"Pendulum-v1", "HalfCheetah-v4", "Humanoid-v4"} <= set(rows["td3"]["mapped"])
    assert {"CartPole-v1", "LunarLander-v3", "Acrobot-v1", "HalfCheetah-v4"} <= set(rows["a2c"]["mapped"])
    assert rows["qrdqn"]["installed"] == len(rows["qrdqn"]["mapped"]) == 4
    assert {"Pendulum-v1", "HalfCheetah-v4", "BipedalWalker-v3"} <= set(rows["ddpg"]["mapped"])
    assert {"Pendulum-v1", "Hopper-v4", "Humanoid-v4"} <= set(rows["tqc"]["mapped"])
    assert {"Pendulum-v1", "BipedalWalker-v3", "HalfCheetah-v4"} <= set(rows["crossq"]["mapped"])
    mapped = ("dqn", "qrdqn", "ppo", "a2c", "sac", "tqc", "crossq", "td3", "ddpg")
    assert all(row["mapped"] == [] for algo, row in rows.items() if algo not in mapped)
    # Every installed pair not mapped is one line saying why: the refusal `zoo --algo ... --env ...` gives.
    assert all(len(row["mapped"]) + len(row["refused"]) == row["installed"] for row in rows.values() if row["mapped"])
    assert rows["ppo"]["refused"]["Pendulum-v1"].startswith("cannot map ppo Pendulum-v1: sde_sample_freq: not mapped")
    result = app_in_process(capsys, "zoo", "--coverage")
    assert result.returncode == 0 and "| dqn | 4 | 4 | 4 |" in result.stdout
    listed = result.stdout.split("Installed pairs not mapped:\n")[1].splitlines()
    unmapped = sum(len(row["refused"]) + (algo not in MAPPED and row["installed"] > 0) for algo, row in rows.items())
    assert len(listed) == unmapped and f"- {rows['ppo']['refused']['Pendulum-v1']}" in listed
    # An algorithm not mapped: what lightrl lacks for it.
    lacks = "--algo trpo: not mapped yet: no TRPO agent in lightrl (TorchRL has no TRPO loss)"
    assert f"- trpo ({rows['trpo']['installed']} installed): {lacks}" in listed
    assert any(
        line.startswith("- ppo_lstm (") and "recurrent PPO reads MettaGrid's token grids" in line for line in listed
    )

"""lightrl against Stable-Baselines3 on standard Gymnasium tasks, in one run, on one machine.

For each task and seed, lightrl's shipped config (``configs/gym/<task>.yaml``) and Stable-Baselines3 with the RL
Zoo's tuned hyperparameters (``hyperparams/<algo>.yml`` of DLR-RM/rl-baselines3-zoo) train one after the other, each
in its own process with the same torch thread count, and both are evaluated the same way: every ``eval_every``
environment frames, ``eval_episodes`` greedy (deterministic) episodes, one on each of as many evaluation environments,
which every evaluation resets from the same seeds (lightrl's: the run's seed + 1,000,003 + i), so both frameworks face
the same starting states, the same at every evaluation. A run stops at the first evaluation whose mean return reaches
the task's threshold, or at the RL Zoo's step budget. Tasks without a threshold (HalfCheetah, Breakout: budgets for a
GPU machine) are short runs: each run trains for ``--seconds``, is evaluated once more where its time ran out, and
the report sets their frames/s and returns beside the random policy's.

Written to ``--out``: ``peers.json`` (every evaluation of every run: frames, wall seconds, mean return),
``peers.md`` (per task: time and frames to the threshold, the return both reached at equal frames and at equal wall
time, frames/s, and the ratio of the times; the RL Zoo's published score beside, labelled as theirs) and
``peers.png`` (the learning curves against frames and against wall time: median over seeds, the band their range).

    python benchmarks/peer_comparison.py --tasks cartpole_dqn cartpole_ppo --seeds 3 --out runs/peers
    python benchmarks/peer_comparison.py --tasks halfcheetah_sac halfcheetah_ppo --seeds 2 --seconds 240
    python benchmarks/peer_comparison.py --tasks tqc:Pendulum-v1:-200 td3:Hopper-v4 --seeds 3   # any Zoo pair

A task is a listed one (``TASKS``) or any RL Zoo pair ``ALGO:ENV_ID[:THRESHOLD]`` that ``lightrl zoo`` maps
(:func:`task_of`): lightrl runs the command's config of it, SB3 the same entry's arguments.

Stable-Baselines3 is a benchmark extra (``pip install -e ".[bench]"``), never a runtime dependency.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Task:
    """One comparison: the Gymnasium id, lightrl's config, SB3's algorithm and RL Zoo hyperparameters."""

    env_id: str
    config: str
    threshold: float | None  # None: a short run (--seconds of training each), its return against the random policy's
    budget: int  # the RL Zoo's n_timesteps: environment frames
    eval_every: int
    sb3_algo: str
    sb3_kwargs: dict[str, Any] = field(default_factory=dict)
    sb3_envs: int = 1
    sb3_wrap: str = "none"  # the RL Zoo's env wrapping: "none", "normalize" (VecNormalize) or "atari"
    zoo_score: str = ""  # the RL Zoo's benchmark.md: mean ± std at its budget


#: The RL Zoo's CartPole DQN entry (its QR-DQN entry is the same with 10 quantiles an action).
CARTPOLE_DQN = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1_000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}

#: The RL Zoo's Pendulum TD3 entry (its DDPG entry has the same numbers).
PENDULUM_TD3 = {
    "gamma": 0.98,
    "buffer_size": 200_000,
    "learning_starts": 10_000,
    "action_noise_std": 0.1,  # noise_type normal: NormalActionNoise of this sigma on every action dimension
    "gradient_steps": 1,
    "train_freq": 1,
    "learning_rate": 1e-3,
    "policy_kwargs": {"net_arch": [400, 300]},
}

#: The RL Zoo's hyperparameters (rl-baselines3-zoo, hyperparams/{dqn,qrdqn,ppo,a2c,sac,tqc,td3,ddpg}.yml) and
#: published scores (benchmark.md). ``lin_X``: a learning rate (or clip range) falling linearly from X to 0 over the
#: run.
TASKS: dict[str, Task] = {
    "cartpole_dqn": Task(
        "CartPole-v1",
        "configs/gym/cartpole_dqn.yaml",
        threshold=475,
        budget=50_000,
        eval_every=2_500,
        sb3_algo="DQN",
        sb3_kwargs=CARTPOLE_DQN,
        zoo_score="500.0 ± 0.0 at 50k",
    ),
    "cartpole_ppo": Task(
        "CartPole-v1",
        "configs/gym/cartpole_ppo.yaml",
        threshold=475,
        budget=100_000,
        eval_every=5_000,
        sb3_algo="PPO",
        sb3_kwargs={
            "n_steps": 32,
            "batch_size": 256,
            "gae_lambda": 0.8,
            "gamma": 0.98,
            "n_epochs": 20,
            "ent_coef": 0.0,
            "learning_rate": "lin_0.001",
            "clip_range": "lin_0.2",
        },
        sb3_envs=8,
        zoo_score="500.0 ± 0.0 at 100k",
    ),
    "cartpole_qrdqn": Task(
        "CartPole-v1",
        "configs/gym/cartpole_qrdqn.yaml",
        threshold=475,
        budget=50_000,
        eval_every=2_500,
        sb3_algo="QRDQN",  # sb3-contrib's
        sb3_kwargs={**CARTPOLE_DQN, "policy_kwargs": {"net_arch": [256, 256], "n_quantiles": 10}},
    ),
    "cartpole_a2c": Task(
        "CartPole-v1",
        "configs/gym/cartpole_a2c.yaml",
        threshold=475,
        budget=500_000,
        eval_every=5_000,
        sb3_algo="A2C",
        sb3_kwargs={"ent_coef": 0.0},
        sb3_envs=8,
    ),
    "lunarlander_dqn": Task(
        "LunarLander-v3",
        "configs/gym/lunarlander_dqn.yaml",
        threshold=200,
        budget=100_000,
        eval_every=10_000,
        sb3_algo="DQN",
        sb3_kwargs={
            "learning_rate": 6.3e-4,
            "batch_size": 128,
            "buffer_size": 50_000,
            "learning_starts": 0,
            "gamma": 0.99,
            "target_update_interval": 250,
            "train_freq": 4,
            "gradient_steps": -1,
            "exploration_fraction": 0.12,
            "exploration_final_eps": 0.1,
            "policy_kwargs": {"net_arch": [256, 256]},
        },
        zoo_score="154.4 ± 79.2 at 100k (LunarLander-v2)",
    ),
    "lunarlander_ppo": Task(
        "LunarLander-v3",
        "configs/gym/lunarlander_ppo.yaml",
        threshold=200,
        budget=1_000_000,
        eval_every=25_000,
        sb3_algo="PPO",
        sb3_kwargs={
            "n_steps": 1024,
            "batch_size": 64,
            "gae_lambda": 0.98,
            "gamma": 0.999,
            "n_epochs": 4,
            "ent_coef": 0.01,
        },
        sb3_envs=16,
        zoo_score="242.1 ± 31.8 at 1M (LunarLander-v2)",
    ),
    "pendulum_sac": Task(
        "Pendulum-v1",
        "configs/gym/pendulum_sac.yaml",
        threshold=-200,
        budget=20_000,
        eval_every=1_000,
        sb3_algo="SAC",
        sb3_kwargs={"learning_rate": 1e-3},
        zoo_score="-157.0 ± 88.7 at 20k",
    ),
    "pendulum_tqc": Task(
        "Pendulum-v1",
        "configs/gym/pendulum_tqc.yaml",
        threshold=-200,
        budget=20_000,
        eval_every=1_000,
        sb3_algo="TQC",  # sb3-contrib's
        sb3_kwargs={"learning_rate": 1e-3},
    ),
    "pendulum_td3": Task(
        "Pendulum-v1",
        "configs/gym/pendulum_td3.yaml",
        threshold=-200,
        budget=20_000,
        eval_every=1_000,
        sb3_algo="TD3",
        sb3_kwargs=PENDULUM_TD3,
    ),
    "pendulum_ddpg": Task(
        "Pendulum-v1",
        "configs/gym/pendulum_ddpg.yaml",
        threshold=-200,
        budget=20_000,
        eval_every=1_000,
        sb3_algo="DDPG",
        sb3_kwargs=PENDULUM_TD3,
    ),
    # Short runs: these tasks' budgets (1M-10M frames) are for a GPU machine; here both frameworks train for the same
    # wall time (--seconds) and the report compares their frames/s and returns with the random policy's.
    "halfcheetah_sac": Task(
        "HalfCheetah-v5",
        "configs/gym/halfcheetah_sac.yaml",
        threshold=None,
        budget=1_000_000,
        eval_every=5_000,
        sb3_algo="SAC",
        sb3_kwargs={"learning_starts": 10_000},
        zoo_score="9,535 ± 100 at 1M (HalfCheetah-v3)",
    ),
    "halfcheetah_ppo": Task(
        "HalfCheetah-v5",
        "configs/gym/halfcheetah_ppo.yaml",
        threshold=None,
        budget=1_000_000,
        eval_every=10_000,
        sb3_algo="PPO",
        sb3_kwargs={
            "n_steps": 512,
            "batch_size": 64,
            "gamma": 0.98,
            "learning_rate": 2.0633e-05,
            "ent_coef": 0.000401762,
            "clip_range": 0.1,
            "n_epochs": 20,
            "gae_lambda": 0.92,
            "max_grad_norm": 0.8,
            "vf_coef": 0.58096,
            "policy_kwargs": {
                "log_std_init": -2,
                "ortho_init": False,
                "activation_fn": "ReLU",
                "net_arch": {"pi": [256, 256], "vf": [256, 256]},
            },
        },
        sb3_wrap="normalize",
        zoo_score="5,819 ± 663 at 1M (HalfCheetah-v3)",
    ),
    "breakout_ppo": Task(
        "ALE/Breakout-v5",
        "configs/gym/breakout_ppo.yaml",
        threshold=None,
        budget=10_000_000,
        eval_every=25_000,
        sb3_algo="PPO",
        sb3_kwargs={
            "n_steps": 128,
            "n_epochs": 4,
            "batch_size": 256,
            "learning_rate": "lin_2.5e-4",
            "clip_range": "lin_0.1",
            "vf_coef": 0.5,
            "ent_coef": 0.01,
        },
        sb3_envs=8,
        sb3_wrap="atari",
        zoo_score="398.0 ± 33.3 at 10M (BreakoutNoFrameskip-v4)",
    ),
}
#: The same comparison with lightrl on its envpool engine (configs/gym/breakout_ppo_envpool.yaml).
TASKS["breakout_ppo_envpool"] = replace(TASKS["breakout_ppo"], config="configs/gym/breakout_ppo_envpool.yaml")

#: Stable-Baselines3's (or sb3-contrib's) class of each algorithm ``lightrl zoo`` maps.
SB3_CLASSES = {
    "dqn": "DQN",
    "qrdqn": "QRDQN",
    "ppo": "PPO",
    "a2c": "A2C",
    "sac": "SAC",
    "tqc": "TQC",
    "crossq": "CrossQ",
    "td3": "TD3",
    "ddpg": "DDPG",
}
#: A Zoo entry's keys that are not its algorithm's keyword arguments as they stand (``env_wrapper`` and
#: ``frame_stack``: the Zoo's atari entry, built by :func:`sb3_envs`).
_NOT_KWARGS = {
    "n_timesteps",
    "policy",
    "n_envs",
    "normalize",
    "noise_type",
    "noise_std",
    "policy_kwargs",
    "env_wrapper",
    "frame_stack",
}


def task_of(name: str, configs: Path | None = None) -> Task:
    """A listed task (``TASKS``), or any Zoo pair ``ALGO:ENV_ID`` (``ALGO:ENV_ID:THRESHOLD``, ``:none`` a short run)
    of an algorithm
    ``lightrl zoo`` maps: lightrl's config is the command's output, written to ``configs/<name>.yaml`` (None: not
    written, for a process that runs SB3 or reads a report), SB3's arguments the same Zoo entry's (``lin_X``
    schedules, ``policy_kwargs``, Gaussian action noise, ``n_envs``, ``normalize``, an Atari game's AtariWrapper and
    frame stack). The threshold is the one given, else Gymnasium's ``reward_threshold`` for the id; without either
    the pair is a short run (``--seconds``). The budget is the entry's ``n_timesteps``, evaluated every twentieth of
    it."""
    if name in TASKS:
        return TASKS[name]
    algo, _, rest = name.partition(":")
    env_id, _, threshold_text = rest.partition(":")
    if algo not in SB3_CLASSES or not env_id:
        raise ValueError(
            f"--tasks {name}: neither a listed task ({', '.join(sorted(TASKS))}) nor ALGO:ENV_ID[:THRESHOLD] of an "
            f"algorithm lightrl zoo maps ({', '.join(SB3_CLASSES)})"
        )
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from app.zoo import config_text, policy_kwargs, zoo_entry

    entry = zoo_entry(algo, env_id)  # a ZooError (one line) for a pair the Zoo does not have
    config = (configs or Path("configs")) / f"{folder_name(name)}.yaml"
    if configs is not None:
        text = config_text(algo, env_id, config)  # a ZooError for what lightrl cannot map
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(text)
    kwargs = {key: value for key, value in entry.items() if key not in _NOT_KWARGS}
    if "policy_kwargs" in entry:  # read, never evaluated; sb3_policy_kwargs turns the names into classes
        kwargs["policy_kwargs"] = policy_kwargs(entry["policy_kwargs"])
    if entry.get("noise_type") == "normal":
        kwargs["action_noise_std"] = float(entry["noise_std"])
    normalize = entry.get("normalize", False)
    if normalize not in (False, True):
        raise ValueError(f"--tasks {name}: the Zoo's normalize {normalize!r}: only true or false are compared")
    atari = "env_wrapper" in entry  # the Zoo's atari entry: lightrl zoo maps no other wrapper
    if atari and entry.get("frame_stack") != 4:
        raise ValueError(f"--tasks {name}: the Zoo's frame_stack {entry.get('frame_stack')!r}: 4 is compared")
    if threshold_text == "none":  # a short run even where Gymnasium has a threshold (out of reach on a CPU)
        threshold = None
    elif threshold_text:
        try:
            threshold = float(threshold_text)
        except ValueError:
            raise ValueError(f"--tasks {name}: the threshold {threshold_text!r} is a number or none") from None
    else:
        import gymnasium as gym

        if atari:
            import ale_py

            gym.register_envs(ale_py)
        threshold = gym.spec(env_id).reward_threshold
    budget = int(float(entry["n_timesteps"]))
    return Task(
        env_id,
        str(config),
        threshold=threshold,
        budget=budget,
        eval_every=max(budget // 20, 1),
        sb3_algo=SB3_CLASSES[algo],
        sb3_kwargs=kwargs,
        sb3_envs=entry.get("n_envs", 1),
        sb3_wrap="atari" if atari else "normalize" if normalize else "none",
    )


def folder_name(task_name: str) -> str:
    """A task's folder: a Zoo pair's ``:`` become ``_``."""
    return task_name.replace(":", "_")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=["cartpole_dqn", "cartpole_ppo"],
        help=f"listed tasks ({', '.join(sorted(TASKS))}) or Zoo pairs ALGO:ENV_ID[:THRESHOLD|none]",
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per task and framework (0 .. N-1)")
    parser.add_argument("--frameworks", nargs="+", choices=["lightrl", "sb3"], default=["lightrl", "sb3"])
    parser.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes per evaluation")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of every run")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds one run may take before it is stopped")
    parser.add_argument(
        "--seconds", type=int, default=300, help="training seconds of each run of a short-run task (no threshold)"
    )
    parser.add_argument("--out", default="runs/peers", help="folder for the runs, peers.json, peers.md and peers.png")
    parser.add_argument("--report-only", action="store_true", help="rewrite peers.md/png from peers.json")
    parser.add_argument("--sb3-run", nargs=3, metavar=("TASK", "SEED", "CSV"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.seconds < 1:
        parser.error(f"--seconds must be >= 1, got {args.seconds}")
    if args.eval_episodes < 1:
        parser.error(f"--eval-episodes must be >= 1, got {args.eval_episodes}")
    return args


# ------------------------------------------------------------------------------------------------------ lightrl
def lightrl_preset(task: Task, seed: int, episodes: int, seconds: int, folder: Path) -> dict[str, Any]:
    """What the comparison sets on top of the shipped config: the seed, the evaluation schedule and the stop (the
    threshold, or ``seconds`` of training for a short run), a CSV logger into ``folder``. Everything else (the agent,
    its hyperparameters, the collection) is the config's."""
    short = task.threshold is None
    evaluation = {
        "every_n_frames": task.eval_every,
        "episodes": episodes,
        "stop_at_return": task.threshold,
        "at_start": False,  # SB3's EvalCallback does not evaluate before training either
        "random_policy": short,  # a short run is read against the random policy (at the first evaluation)
    }
    return {
        "seed_everything": seed,
        "trainer": {
            "max_time": f"00:{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if short else None,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(folder), "name": "lightrl", "version": 0},
            },
            "callbacks": [
                {"class_path": "callbacks.schedule.PeriodicEvaluation", "init_args": evaluation},
                {"class_path": "callbacks.throughput.ThroughputReport"},
            ],
        },
        "data": {"init_args": {"seed": seed}},
    }


def run_lightrl(task: Task, seed: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    preset = folder / "comparison.yaml"
    preset.write_text(yaml.safe_dump(lightrl_preset(task, seed, args.eval_episodes, args.seconds, folder)))
    command = [sys.executable, "-m", "app", "fit", "--config", str(ROOT / task.config), "--config", str(preset)]
    command += ["--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, not an installed one's
    start = time.perf_counter()
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=args.timeout, env=env)
    process_seconds = time.perf_counter() - start
    (folder / "output.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"lightrl {task.config} seed {seed} failed: {' | '.join(tail)}")
    curve, random_return = [], None
    with open(folder / "lightrl" / "version_0" / "metrics.csv") as file:
        for row in csv.DictReader(file):
            if row.get("eval/random_return_mean"):
                random_return = float(row["eval/random_return_mean"])
            if row.get("eval/return_mean"):
                curve.append(
                    {
                        "frames": int(float(row["eval/frames"])),
                        "seconds": float(row["eval/time_s"]),
                        "return": float(row["eval/return_mean"]),
                    }
                )
    return {
        "curve": curve,
        "random_return": random_return,
        "process_seconds": process_seconds,
        **throughput_figures(folder),
    }


def throughput_figures(folder: Path) -> dict[str, Any]:
    """Where a lightrl run's time went, from its throughput report (callbacks/throughput.py): the share of wall time
    per phase over the whole process, the same and the frames per second over the steady state (after the report's
    first updates: a compilation and other one-off work in them left out), and the loop against its bare update."""
    report = json.loads((folder / "lightrl" / "version_0" / "throughput.json").read_text())
    bare = report.get("bare_update") or {}
    steady = report.get("steady_state") or {}
    return {
        "phases": report["this_process"]["fraction"],
        "steady_phases": steady.get("fraction"),
        "steady_frames_per_s": steady.get("frames_per_s"),
        "update_vs_bare": bare.get("ratio"),  # the loop's wall time per update (steady state) over the bare update
    }


# --------------------------------------------------------------------------------------------- Stable-Baselines3
def sb3_envs(task: Task, seed: int, episodes: int) -> tuple[Any, Any]:
    """The training and evaluation vector envs the RL Zoo builds for ``task`` (its ``normalize`` and Atari wrapping):
    ``episodes`` evaluation copies, one episode each (the Recorder reseeds them before every evaluation)."""
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize, VecTransposeImage

    if task.sb3_wrap == "atari":  # AtariWrapper and 4 stacked frames (hyperparams/ppo.yml, atari)
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        # The Zoo's NoFrameskip-v4 emulator (every frame, no sticky actions: AtariWrapper skips 4 itself), as the
        # lightrl config plays it; channels first, as SB3 makes the training env itself for its CNN policy.
        emulator = {"frameskip": 1, "repeat_action_probability": 0.0}

        def atari(n_envs: int, env_seed: int) -> Any:
            vector = make_atari_env(task.env_id, n_envs=n_envs, seed=env_seed, env_kwargs=emulator)
            return VecTransposeImage(VecFrameStack(vector, 4))

        return atari(task.sb3_envs, seed), atari(episodes, evaluation_seed(seed))
    env = make_vec_env(task.env_id, n_envs=task.sb3_envs, seed=seed)
    eval_env = make_vec_env(task.env_id, n_envs=episodes, seed=evaluation_seed(seed))
    if task.sb3_wrap == "normalize":  # the Zoo's VecNormalize, with the algorithm's discount; EvalCallback syncs it
        gamma = task.sb3_kwargs.get("gamma", 0.99)
        return VecNormalize(env, gamma=gamma), VecNormalize(eval_env, gamma=gamma, training=False, norm_reward=False)
    return env, eval_env


def sb3_policy_kwargs(given: dict[str, Any]) -> dict[str, Any]:
    """``policy_kwargs`` as Stable-Baselines3 takes them: the classes named in TASKS and the Zoo's entries
    (``activation_fn`` a ``torch.nn`` class, ``optimizer_class`` RMSpropTFLike: the Zoo's A2C Atari entry)."""
    import torch
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    kwargs = dict(given)
    if "activation_fn" in kwargs:
        kwargs["activation_fn"] = getattr(torch.nn, kwargs["activation_fn"])
    if "optimizer_class" in kwargs:
        kwargs["optimizer_class"] = {"RMSpropTFLike": RMSpropTFLike}[kwargs["optimizer_class"]]
    return kwargs


def evaluation_seed(seed: int) -> int:
    """The seed of the first evaluation environment, copy i taking the next ones: lightrl's for a run of ``seed``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from datamodules.evaluation import EVAL_SEED_OFFSET

    return seed + EVAL_SEED_OFFSET


def sb3_run(task_name: str, seed: int, csv_path: Path, episodes: int, threads: int, seconds: int) -> None:
    """One SB3 training (in this process), its evaluations written to ``csv_path`` as they come."""
    import gymnasium as gym
    import stable_baselines3
    import torch
    from stable_baselines3.common.callbacks import (
        BaseCallback,
        CallbackList,
        EvalCallback,
        StopTrainingOnRewardThreshold,
    )
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

    torch.set_num_threads(threads)
    task = task_of(task_name)
    kwargs = {
        key: (lambda progress, start=float(value[4:]): progress * start)
        if isinstance(value, str) and value.startswith("lin_")
        else value
        for key, value in task.sb3_kwargs.items()
    }
    if "policy_kwargs" in kwargs:
        kwargs["policy_kwargs"] = sb3_policy_kwargs(kwargs["policy_kwargs"])
    env, eval_env = sb3_envs(task, seed, episodes)
    if "action_noise_std" in kwargs:  # the Zoo's noise_type normal: Gaussian noise on every action dimension
        import numpy as np
        from stable_baselines3.common.noise import NormalActionNoise

        dims = env.action_space.shape[-1]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dims), kwargs.pop("action_noise_std") * np.ones(dims))
    policy = "CnnPolicy" if task.sb3_wrap == "atari" else "MlpPolicy"
    algorithm = getattr(stable_baselines3, task.sb3_algo, None)
    if algorithm is None:  # QR-DQN, TQC, ...: sb3-contrib's (the bench extra), imported only for those
        import sb3_contrib

        algorithm = getattr(sb3_contrib, task.sb3_algo)
    model = algorithm(policy, env, seed=seed, verbose=0, **kwargs)
    rows: list[dict[str, float]] = []
    first_evaluation_seed = evaluation_seed(seed)
    start = time.perf_counter()

    def record(frames: int, mean_return: float) -> None:
        rows.append({"frames": frames, "seconds": time.perf_counter() - start, "return": mean_return})
        with open(csv_path, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=["frames", "seconds", "return"])
            writer.writeheader()
            writer.writerows(rows)

    class Recorder(EvalCallback):
        def _on_step(self) -> bool:
            if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:  # EvalCallback evaluates at this step
                self.eval_env.seed(first_evaluation_seed)  # the same starting states at every evaluation
            evaluations = len(self.evaluations_results)
            keep_going = super()._on_step()
            if len(self.evaluations_results) > evaluations:
                record(self.num_timesteps, self.last_mean_reward)
            return keep_going

    class StopAfter(BaseCallback):
        """A short run's stop: ``seconds`` after the start of training, as lightrl's ``max_time``, with an evaluation
        there, as lightrl's at the end of fit: a run on a busy machine that stops before its first periodic
        evaluation still has its return at the time it was given."""

        def _on_step(self) -> bool:
            if time.perf_counter() - start < seconds:
                return True
            sync_envs_normalization(self.training_env, recorder.eval_env)  # VecNormalize's statistics, as EvalCallback
            recorder.eval_env.seed(first_evaluation_seed)
            mean_return, _ = evaluate_policy(self.model, recorder.eval_env, episodes, deterministic=True)
            record(self.num_timesteps, float(mean_return))
            return False

    short = task.threshold is None
    stop = None if short else StopTrainingOnRewardThreshold(reward_threshold=task.threshold, verbose=0)
    recorder = Recorder(
        eval_env,
        log_path=str(csv_path.parent),  # EvalCallback keeps its evaluations (evaluations_results) only with a log path
        callback_on_new_best=stop,
        n_eval_episodes=episodes,
        eval_freq=max(task.eval_every // task.sb3_envs, 1),
        deterministic=True,
        verbose=0,
    )
    gym.logger.min_level = 40
    model.learn(total_timesteps=task.budget, callback=CallbackList([recorder, StopAfter()]) if short else recorder)


def run_sb3(task_name: str, seed: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    csv_path = folder / "evaluations.csv"
    command = [sys.executable, str(Path(__file__).resolve()), "--sb3-run", task_name, str(seed), str(csv_path)]
    command += ["--eval-episodes", str(args.eval_episodes), "--threads", str(args.threads)]
    command += ["--seconds", str(args.seconds)]
    start = time.perf_counter()
    # SB3's logger makes a folder for its (here empty) output: the run's, not a new SB3-<time> folder in /tmp per run.
    environment = {**os.environ, "SB3_LOGDIR": str(folder)}
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=args.timeout, env=environment)
    process_seconds = time.perf_counter() - start
    (folder / "output.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"sb3 {task_name} seed {seed} failed: {' | '.join(tail)}")
    if not csv_path.exists():
        raise RuntimeError(f"sb3 {task_name} seed {seed} recorded no evaluation (see {folder / 'output.log'})")
    with open(csv_path) as file:
        rows = csv.DictReader(file)
        curve = [
            {"frames": int(float(r["frames"])), "seconds": float(r["seconds"]), "return": float(r["return"])}
            for r in rows
        ]
    return {"curve": curve, "process_seconds": process_seconds}


# ------------------------------------------------------------------------------------------------------ report
def reached(curve: list[dict[str, float]], threshold: float | None) -> dict[str, float] | None:
    if threshold is None:  # a short run has none
        return None
    return next((point for point in curve if point["return"] >= threshold), None)


def return_at(curve: list[dict[str, float]], key: str, value: float) -> float | None:
    """The return of the last evaluation at or before ``value`` frames (or seconds)."""
    before = [point["return"] for point in curve if point[key] <= value]
    return before[-1] if before else None


def figure(value: float) -> str:
    """Four significant figures, thousands separated, never in scientific notation (10,000, not 1e+04)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def spread(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return figure(values[0])
    return f"{figure(statistics.median(values))} ({figure(min(values))}–{figure(max(values))})"


def summarise(results: dict[str, Any]) -> str:
    lines = [
        "| task | framework | reached threshold | time to threshold, s | frames to threshold | frames/s | "
        "return at equal frames | return at equal time | RL Zoo (theirs) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    notes = []
    for task_name, runs in results["tasks"].items():
        task = task_of(task_name)
        frameworks = [name for name in ("lightrl", "sb3") if runs.get(name)]
        # Equal frames / equal time: the furthest point every run of every framework reached.
        common_frames = min(run["curve"][-1]["frames"] for name in frameworks for run in runs[name] if run["curve"])
        common_seconds = min(run["curve"][-1]["seconds"] for name in frameworks for run in runs[name] if run["curve"])
        medians, missed = {}, {}
        for name in frameworks:
            hits = [reached(run["curve"], task.threshold) for run in runs[name]]
            times = [hit["seconds"] for hit in hits if hit]
            # A run that did not reach the threshold within the budget counts as the slowest: the median is defined
            # while fewer than half of the runs missed it.
            median = statistics.median([hit["seconds"] if hit else math.inf for hit in hits]) if hits else math.inf
            medians[name] = median if math.isfinite(median) else None
            missed[name] = (len(hits) - len(times), len(hits))
            rates = [run["curve"][-1]["frames"] / run["curve"][-1]["seconds"] for run in runs[name] if run["curve"]]
            at_frames = [return_at(run["curve"], "frames", common_frames) for run in runs[name]]
            at_seconds = [return_at(run["curve"], "seconds", common_seconds) for run in runs[name]]
            threshold = f"{len(times)}/{len(hits)} | {spread(times)} | "
            if task.threshold is None:
                threshold = "short run | — | "
            lines.append(
                f"| {task.env_id} ({task_name}) | {name} | {threshold}"
                f"{spread([hit['frames'] for hit in hits if hit])} | {spread(rates)} | "
                f"{spread([v for v in at_frames if v is not None])} at {common_frames:,.0f} | "
                f"{spread([v for v in at_seconds if v is not None])} at {common_seconds:,.0f} s | "
                f"{task.zoo_score if name == 'sb3' else ''} |"
            )
        phases = [run["phases"] for run in runs.get("lightrl", []) if run.get("phases")]
        if phases:
            shares = ", ".join(
                f"{phase} {100 * statistics.median(run[phase] for run in phases):.0f} %"
                for phase in phases[0]
                if statistics.median(run[phase] for run in phases) >= 0.005
            )
            # The throughput report's ratio is the loop's wall time per update over the bare update, in the steady
            # state; the update step's own is that times the update's share of the steady state's wall time.
            timed = [run for run in runs["lightrl"] if run.get("update_vs_bare")]
            bare = ""
            if timed:
                loop = statistics.median(run["update_vs_bare"] for run in timed)
                step = statistics.median(
                    run["update_vs_bare"] * (run.get("steady_phases") or run["phases"]).get("update", 0.0)
                    for run in timed
                )
                bare = f"; its training loop took {loop:.2f}× its bare update per update, "
                bare += f"the update step alone about {step:.2f}×"
            steady = [run["steady_frames_per_s"] for run in runs["lightrl"] if run.get("steady_frames_per_s")]
            if steady:
                bare += f"; in its steady state (its first updates left out) {spread(steady)} frames/s"
            notes.append(f"- {task.env_id} ({task_name}): lightrl's wall time (median over seeds): {shares}{bare}.")
        randoms = [run["random_return"] for run in runs.get("lightrl", []) if run.get("random_return") is not None]
        if task.threshold is None and randoms:
            notes.append(
                f"- {task.env_id} ({task_name}): a short run of {results.get('seconds', '?')} s each; the random "
                f"policy's return on lightrl's evaluation episodes: {spread(randoms)}."
            )
        if medians.get("lightrl") and medians.get("sb3"):
            short = [f"{name} {missed[name][0]} of {missed[name][1]}" for name in frameworks if missed[name][0]]
            unreached = f"; runs that did not reach it count as the slowest: {', '.join(short)}" if short else ""
            notes.append(
                f"- {task.env_id} ({task_name}): lightrl's median time to {task.threshold:g} is "
                f"{medians['lightrl'] / medians['sb3']:.2f}× SB3's ({medians['lightrl']:.0f} s against "
                f"{medians['sb3']:.0f} s{unreached})."
            )
    return "\n".join(lines + [""] + notes) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(results["tasks"])
    figure, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.2 * len(tasks)), squeeze=False)
    for row, task_name in enumerate(tasks):
        task = task_of(task_name)
        for column, key in enumerate(("frames", "seconds")):
            axis = axes[row][column]
            for name, colour in (("lightrl", "tab:blue"), ("sb3", "tab:orange")):
                runs = [run["curve"] for run in results["tasks"][task_name].get(name, []) if run["curve"]]
                if not runs:
                    continue
                for index, curve in enumerate(runs):  # each seed's curve, thin; their median on the frame grid
                    label = f"{name} (each seed)" if key == "seconds" and index == 0 else None
                    points = ([p[key] for p in curve], [p["return"] for p in curve])
                    axis.plot(*points, color=colour, alpha=0.35, lw=1, label=label)
                grid = sorted({p[key] for curve in runs for p in curve}) if key == "frames" else None
                if grid:
                    values = [[return_at(curve, key, x) for curve in runs] for x in grid]
                    axis.plot(
                        grid,
                        [statistics.median([v for v in vs if v is not None]) for vs in values],
                        color=colour,
                        lw=2,
                        label=f"{name} (median of {len(runs)})",
                    )
            if task.threshold is not None:
                axis.axhline(task.threshold, color="grey", ls="--", lw=1)
            axis.set_xlabel("environment frames" if key == "frames" else "wall seconds")
            axis.set_ylabel("greedy return")
            axis.set_title(f"{task.env_id}: {task_name}")
            axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(results: dict[str, Any], out: Path) -> None:
    (out / "peers.json").write_text(json.dumps(results, indent=1))
    machine = results["machine"]
    header = (
        f"# lightrl against Stable-Baselines3\n\n{results['date']}, {machine['platform']}, {machine['cpu_count']} "
        f"CPUs, {results['threads']} torch thread(s) per run, runs one after the other; {results['eval_episodes']} "
        f"greedy episodes per evaluation.\nCommand: `{' '.join(results['command'])}`\n\n"
    )
    (out / "peers.md").write_text(header + summarise(results))
    plot(results, out / "peers.png")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.sb3_run:
        task_name, seed, csv_path = args.sb3_run
        sb3_run(task_name, int(seed), Path(csv_path), args.eval_episodes, args.threads, args.seconds)
        return
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        results = json.loads((out / "peers.json").read_text())
        for task_name, runs in results["tasks"].items():  # the figures of the throughput reports still on disk
            for run in runs.get("lightrl", []):
                folder = out / folder_name(task_name) / "lightrl" / f"seed{run['seed']}"
                if (folder / "lightrl" / "version_0" / "throughput.json").exists():
                    run.update(throughput_figures(folder))
        write_report(results, out)
        return
    # Looked up, not imported: importing it here would print its notes about the old gym package for nothing.
    if "sb3" in args.frameworks and importlib.util.find_spec("stable_baselines3") is None:
        sys.exit('error: --frameworks sb3 needs Stable-Baselines3: pip install -e ".[bench]"')
    tasks = {}
    for task_name in args.tasks:
        try:
            tasks[task_name] = task_of(task_name, configs=out / "configs")
        except ValueError as error:  # ZooError among them: one line naming the pair and why
            sys.exit(f"error: {error}")
        if not (ROOT / tasks[task_name].config).exists():
            sys.exit(f"error: --tasks {task_name}: {tasks[task_name].config} does not exist")
    results: dict[str, Any] = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/peer_comparison.py", *(argv if argv is not None else sys.argv[1:])],
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "threads": args.threads,
        "seconds": args.seconds,
        "eval_episodes": args.eval_episodes,
        "tasks": {},
    }
    for task_name, task in tasks.items():
        runs = results["tasks"].setdefault(task_name, {})
        for seed in range(args.seeds):
            for name in args.frameworks:
                folder = out / folder_name(task_name) / name / f"seed{seed}"
                print(f"{datetime.now():%H:%M:%S} {task_name} {name} seed {seed} ...", flush=True)
                run = (
                    run_lightrl(task, seed, args, folder)
                    if name == "lightrl"
                    else run_sb3(task_name, seed, args, folder)
                )
                hit = reached(run["curve"], task.threshold)
                last = run["curve"][-1] if run["curve"] else {"frames": 0, "seconds": 0.0, "return": float("nan")}
                goal = "ran its short run" if task.threshold is None else f"did not reach {task.threshold:g}"
                print(
                    (f"    reached {task.threshold:g}" if hit else f"    {goal}")
                    + (f" at {hit['frames']:,} frames, {hit['seconds']:.1f} s" if hit else "")
                    + f"; last evaluation {last['return']:.1f} at {last['frames']:,} frames",
                    flush=True,
                )
                runs.setdefault(name, []).append({"seed": seed, **run})
                write_report(results, out)  # after every run: a stopped comparison keeps what it measured
    print(f"Wrote {out / 'peers.md'}")


if __name__ == "__main__":
    main()

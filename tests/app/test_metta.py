"""The MettaGrid configs as the docs run them: a short fit, exact resume with worker processes, the ultra-fast
preset's batch geometry, and bad input."""

from __future__ import annotations

import csv
import os
import signal
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("mettagrid", reason='the metta extra: pip install -e ".[metta]"')

from app.cli import main
from datamodules.collection import CollectorWorkers
from tests.app.test_pins import assert_pinned
from tests.helpers import RESEEDED, ROOT, AfterUpdate, weights

# configs/metta_ppo.yaml shrunk for a test (2 environments of 4 agents on a small map, 16-step rollouts cut into
# 8-step segments), its worker processes, logger, checkpoints and evaluation left on.
SMALL = [
    "--data.init_args.env.init_args.num_agents=4",
    "--data.init_args.env.init_args.map_width=8",
    "--data.init_args.env.init_args.map_height=8",
    "--data.init_args.env.init_args.objects={altar: 4, wall: 2}",
    "--data.init_args.env.init_args.max_steps=24",
    "--data.init_args.num_envs=2",
    "--data.init_args.collect_steps=16",
    "--data.init_args.bptt=8",
    "--data.init_args.minibatch_size=32",
    "--data.init_args.evaluation.episodes=2",
    "--model.init_args.network.lstm_hidden=32",
    "--model.init_args.network.trunk_features=32",
    "--trainer.max_time=null",
    "--trainer.log_every_n_steps=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.callbacks.init_args.log_every_n_steps=2",
]


def _last_value(metrics_csv: Path, name: str) -> str:
    with open(metrics_csv, newline="") as file:
        return [row[name] for row in csv.DictReader(file) if row[name]][-1]


def fit_metta(runs: Path, *overrides: str, config: str = "metta_ppo"):
    args = ["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--threads", "1"]
    return main([*args, "--trainer.logger.init_args.save_dir", str(runs), *SMALL, *overrides])


# The two kinds of worker processes: environments alone (configs/metta_ultra_fast.yaml, the policy on the learner's
# device) and environments with a copy of the policy (configs/metta_ppo.yaml, the faster on a CPU).
WORKERS = [
    # The worker kinds differ in collection only: the shipped pair (collector workers, the compiled loss) resumes in
    # the case below, and here the loss runs eagerly, which spares the test the compilation.
    (
        "--data.init_args.collection=EnvWorkers",
        "--data.init_args.collection.workers=2",
        "--model.init_args.compile=false",
    ),
    ("--data.init_args.collection=CollectorWorkers", "--data.init_args.collection.workers=2"),
]


@pytest.mark.slow
@pytest.mark.parametrize("workers", WORKERS)
def test_metta_ppo_trains_logs_and_resumes_exactly_with_its_worker_processes(tmp_path, workers):
    # 2 envs x 4 agents x 16 steps = 128 agent steps per rollout, 4 minibatches x 1 epoch = 4 updates each. Stopping
    # at update 10 stops inside a rollout; the checkpoint holds the rollout, every agent's LSTM state and each
    # worker's environments (their episodes replayed from seed and actions on load), and with collector workers each
    # worker's generator, which draws its agents' actions: the rest depends on all of them.
    full = fit_metta(tmp_path / "full", "--trainer.max_steps=24", *workers)
    fit_metta(tmp_path / "half", "--trainer.max_steps=10", *workers)
    resumed = fit_metta(
        tmp_path / "half",
        "--trainer.max_steps=24",
        "--ckpt_path=last",
        *RESEEDED,
        *workers,
    )

    kind = workers[0].split("=")[1]
    if kind == "CollectorWorkers":  # the shipped collection, compiled: this fit's first evaluations are its pin
        assert_pinned("metta_ppo", tmp_path / "full/metta_ppo/version_0")
    collection = full.datamodule.collection
    assert type(collection).__name__ == kind and collection.workers == 2 and resumed.trainer.global_step == 24
    run = tmp_path / "half/metta_ppo/version_0"
    assert sorted(path.name for path in run.parent.iterdir()) == ["version_0"]  # continued in its own folder
    a = weights(tmp_path / "full/metta_ppo/version_0/checkpoints/last.ckpt")
    b = weights(run / "checkpoints/last.ckpt")
    for key in a:
        assert torch.equal(a[key], b[key]), key
    metrics = (run / "metrics.csv").read_text()
    for name in ("train/loss_objective", "eval/return_mean", "eval/random_return_mean"):
        assert name in metrics
    # `validate` plays the greedy episodes from the checkpoint (its evaluation environments built and closed
    # under Lightning's inference mode) and reports what the run's own last evaluation did.
    checkpoint = str(run / "checkpoints/last.ckpt")
    args = ["validate", "--config", str(ROOT / "configs/metta_ppo.yaml"), "--ckpt_path", checkpoint]
    episodes = "--data.init_args.evaluation.episodes=4"  # the callback's 4
    validated = main([*args, "--trainer.logger=false", *SMALL, episodes])
    assert validated.trainer.callback_metrics["eval/return_mean"].item() == pytest.approx(
        float(_last_value(run / "metrics.csv", "eval/return_mean"))
    )


class KillWorker(AfterUpdate):
    """SIGKILLs worker process 1 after update 20, as the machine's memory killer might."""

    def after_update(self, trainer, pl_module) -> None:
        if trainer.global_step == 20:
            data = trainer.datamodule
            collector_workers = isinstance(data.collection, CollectorWorkers)
            worker = data.collector.procs[1] if collector_workers else data.collector.env.base_env._workers[1]
            os.kill(worker.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_dead_worker_process_stops_the_run_with_a_clear_error_and_the_last_checkpoint_intact(tmp_path):
    # A checkpoint every rollout (128 agent steps, 4 updates), the kill after update 20: the next rollout fails. The
    # shipped config's collector workers, with the loss eager: a worker's death does not depend on how the learner
    # computes its loss, and the compiled loss resumes in the test above (every kind of worker is killed in
    # tests/app/test_failures.py).
    workers = (*WORKERS[1], "--model.init_args.compile=false")
    error = r"collector worker 1 died: killed by SIGKILL \(signal 9\).*, at 640 frames; training stopped"
    callbacks = tmp_path / "callbacks.yaml"
    callbacks.write_text(
        "trainer:\n  callbacks:\n"
        "    - {class_path: callbacks.schedule.FrameCheckpoint, init_args: {every_n_frames: 128}}\n"
        "    - {class_path: tests.app.test_metta.KillWorker}\n"
    )
    with pytest.raises(RuntimeError, match=error):
        fit_metta(tmp_path, "--trainer.max_steps=40", *workers, "--config", str(callbacks))
    checkpoint = tmp_path / "metta_ppo/version_0/checkpoints/last.ckpt"
    # Written by the step that collected the 5th rollout (its updates 17-18, to the logging step), the last before the
    # kill, and whole.
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 18
    resumed = fit_metta(tmp_path, "--trainer.max_steps=24", "--ckpt_path=last", *workers)
    assert resumed.trainer.global_step == 24


@pytest.mark.slow
def test_the_ultra_fast_preset_runs_with_its_batch_geometry(tmp_path):
    # The reference's geometry: 8 minibatches of whole 32-step segments per rollout, 1 epoch. The environments and
    # the network are made small (test-sized); the batch is num_envs x num_agents x collect_steps. Its collector
    # workers stay on (2 instead of 16), so the collection the preset ships is the one tested; its compiled loss is
    # the one tests/app/test_metta.py's resume test compiles (and test_recurrent_ppo.py checks against eager), so it
    # runs eagerly here, which spares the test a compilation of its own (the shipped value is checked below).
    cli = fit_metta(
        tmp_path,
        "--data.init_args.num_envs=4",
        "--data.init_args.collect_steps=32",
        "--data.init_args.bptt=32",
        "--data.init_args.minibatch_size=64",
        "--data.init_args.collection.workers=2",
        "--model.init_args.compile=false",
        "--trainer.max_steps=16",
        config="metta_ultra_fast",
    )
    data = cli.datamodule
    assert (data.bptt, data.update_epochs, data.minibatches_per_rollout) == (32, 1, 8)
    assert cli.trainer.global_step == 16 and data.frames == 2 * 4 * 4 * 32
    assert isinstance(data.collection, CollectorWorkers) and data.collection.workers == 2
    shipped = yaml.safe_load((ROOT / "configs/metta_ultra_fast.yaml").read_text())["model"]["init_args"]
    assert shipped["compile"] is True and shipped["network"]["lstm_hidden"] == 256  # what the fit above set smaller


def test_the_ultra_fast_preset_ships_the_seeds_geometry_and_schedule():
    # docs/reference_systems.md §5: batch 262,144, minibatch 32,768, BPTT 32, checkpoint every 100 epochs and evaluation
    # every 500, where Metta's epoch is one rollout and its training pass: counted here in frames (agent steps) of
    # whole rollouts.
    config = yaml.safe_load((ROOT / "configs/metta_ultra_fast.yaml").read_text())
    data = config["data"]["init_args"]
    batch = data["num_envs"] * data["env"]["init_args"]["num_agents"] * data["collect_steps"]
    assert (batch, data["minibatch_size"], data["bptt"], data["update_epochs"]) == (262_144, 32_768, 32, 1)
    every = {
        c["class_path"].rsplit(".", 1)[1]: c.get("init_args", {}).get("every_n_frames")
        for c in config["trainer"]["callbacks"]
    }
    assert (every["FrameCheckpoint"], every["PeriodicEvaluation"]) == (100 * batch, 500 * batch)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--data.init_args.env.init_args.num_agents=0"],
            "--data.init_args.env.init_args.num_agents must be > 0, got 0",
        ),
        (
            ["--data.init_args.env.init_args.task=maze"],
            "--data.init_args.env.init_args.task must be one of altars, arena, got 'maze'",
        ),
        (
            ["--data.init_args.env.init_args.objects={altar: 4, shrine: 1}"],
            "--data.init_args.env.init_args.objects names 'shrine', which task 'altars' does not have "
            "(it has wall, altar)",
        ),
        (
            ["--data.init_args.bptt=5"],
            "--data.init_args.bptt (5) must divide collect_steps (16) and minibatch_size (32): minibatches are whole "
            "segments of bptt steps",
        ),
        (
            ["--data.init_args.minibatch_size=256"],
            "--data.init_args.minibatch_size (256) is larger than a rollout: num_envs * collect_steps * 4 agents = "
            "128 frames",
        ),
        (
            ["--data.init_args.collection=EnvWorkers", "--data.init_args.collection.workers=3"],
            "--data.init_args.collection.init_args.workers (3) must divide --data.init_args.num_envs (2)",
        ),
        (
            ["--data.init_args.collection.workers=3"],
            "--data.init_args.collection.init_args.workers (3) must divide --data.init_args.num_envs (2)",
        ),
        (
            ["--data.init_args.collection=AsyncCollectorWorkers", "--data.init_args.collection.workers=2"],
            "--data.init_args.collection AsyncCollectorWorkers: RolloutDataModule has no replay buffer to feed "
            "(asynchronous workers need datamodules.replay.ReplayDataModule; CollectorWorkers collects in step with "
            "the learner)",
        ),
    ],
)
def test_bad_input_is_one_error_line_naming_the_flag(tmp_path, capsys, overrides, message):
    with pytest.raises(SystemExit) as exited:
        fit_metta(tmp_path / "runs", *overrides)
    assert exited.value.code == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors == [f"error: {message}"]
    assert not (tmp_path / "runs").exists()


def test_the_lstm_state_resets_exactly_where_each_environment_starts_an_episode_at_its_own_time():
    # Environment 1 is three steps into its episode when collection starts, environment 0 at its start: with 6-step
    # episodes, environment 0 starts new ones at steps 6 and 12 of the collection, environment 1 at 3 and 9. Every
    # agent's state must be zero exactly at its own environment's starts and carried everywhere else.
    from torchrl.collectors import Collector
    from torchrl.envs import TransformedEnv

    from envs.mettagrid.env import MettaGridEnv
    from modules.recurrent_ppo import RecurrentNetworkOptions, RecurrentPPO

    options = {"num_agents": 4, "map_width": 8, "map_height": 8, "objects": {"altar": 4, "wall": 2}, "max_steps": 6}
    torch.manual_seed(0)
    env = MettaGridEnv(num_envs=2, seed=3, **options)
    network = RecurrentNetworkOptions(lstm_hidden=16, trunk_features=16, grid_features=20)
    model = RecurrentPPO(env.observation_spec[0, 0], env.action_spec[0, 0], network=network)
    model._take_feature_scale(env.observation_layout.scale)
    env.reset()
    for _ in range(3):
        env.rand_step()  # one random step of every environment
    staggered = env.env_state()
    staggered["steps"][0] = 0  # environment 0 back at the start of its episode, environment 1 three steps in
    collector = Collector(
        TransformedEnv(env, model.env_transform()), model.policy(), frames_per_batch=2 * 4 * 12, total_frames=-1
    )
    env.load_env_state(staggered)
    batch = next(iter(collector))  # [2 envs, 4 agents, 12 steps]
    collector.shutdown()

    starts = torch.zeros(2, 12, dtype=torch.bool)
    starts[0, [0, 6]] = True
    starts[1, [0, 3, 9]] = True  # step 0: the collector's own first reset, as it began
    is_init = batch["is_init"].squeeze(-1)
    assert torch.equal(is_init, starts[:, None, :].expand(2, 4, 12))
    h, next_h = (batch[key].flatten(-2) for key in ("recurrent_state_h", ("next", "recurrent_state_h")))  # 1 layer
    assert torch.all(h[is_init] == 0) and torch.all(h[~is_init].abs().sum(-1) > 0)
    carried = ~is_init[..., 1:]
    assert torch.equal(h[..., 1:, :][carried], next_h[..., :-1, :][carried])

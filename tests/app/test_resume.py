"""Full resume: 2N updates in one run equal N updates, a stop, and N more resumed from the checkpoint."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from app.cli import main
from checkpoints.io import AtomicCheckpointIO
from tests.app_process import run_app_process
from tests.helpers import (
    PREFETCH,
    RESEEDED,
    ROOT,
    SNAKE_DQN_BATCH,
    SNAKE_PPO_MINIBATCH,
    AfterUpdate,
    chain_config,
    fit,
    saved_replay,
    weights,
    write_config,
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "agent", ["dqn", "dqn-3-step", "dqn-prioritized", "dqn-prefetch", "qrdqn-3-step", "ppo", "a2c", "recurrent"]
)
def test_resumed_run_ends_with_identical_weights(tmp_path, agent):
    # PPO: 8 envs x 16 steps = 128 frames per rollout, 4 minibatches x 2 epochs = 8 updates per rollout; stopping
    # at update 36 interrupts a rollout in its middle, so the saved rollout and minibatch order are exercised.
    # DQN: 8 frames per collect and 2 frames per update; the checkpoint also carries the replay buffer, and with
    # 3-step returns each environment's window of its last steps, which the next writes complete; with prioritized
    # replay every slot's priority, the largest priority seen and β's schedule.
    # With prefetch, each round is collected, written and drawn in a background thread while the previous round's
    # updates run, and the checkpoint (at update 50, inside a round of 4) also carries the round prepared next.
    # Recurrent PPO: 8 envs x 4 agents x 16 steps = 512 frames, 4 segment minibatches x 2 epochs = 8 updates per
    # rollout; the checkpoint also carries every agent's LSTM state, which the next rollout starts from.
    # A2C: 8 envs x 4 steps, one update on each whole rollout, with RMSprop's running averages in the checkpoint.
    # QR-DQN: DQN's, its quantiles regressed on 3-step targets.
    half = {"ppo": 36, "recurrent": 12}.get(agent, 50)

    def config(root: Path) -> dict:
        config = chain_config(agent.split("-")[0], root)
        if agent in ("dqn-3-step", "qrdqn-3-step"):
            config["model"]["init_args"]["n_steps"] = 3
        if agent == "dqn-prioritized":
            config["data"]["init_args"].update(priority={"alpha": 0.7, "beta": 0.4, "beta_updates": 150})
        if agent == "dqn-prefetch":
            config["data"]["init_args"]["collection"] = PREFETCH
            config["trainer"]["log_every_n_steps"] = 7  # rounds of 4 updates, cut at the logging steps too
        return config

    fit(write_config(config(tmp_path / "full"), tmp_path / "full.yaml"), "--trainer.max_steps", str(2 * half))
    interrupted = write_config(config(tmp_path / "half"), tmp_path / "half.yaml")
    fit(interrupted, "--trainer.max_steps", str(half))
    first_half = weights(tmp_path / "half/checkpoints/last.ckpt")
    # Another global seed: only a complete restore (weights, RNG states, envs, store) can still match the full run.
    cli = fit(
        interrupted,
        "--trainer.max_steps",
        str(2 * half),
        "--ckpt_path",
        "last",
        *RESEEDED,
    )

    assert cli.trainer.global_step == 2 * half
    full, resumed = weights(tmp_path / "full/checkpoints/last.ckpt"), weights(tmp_path / "half/checkpoints/last.ckpt")
    assert full.keys() == resumed.keys()
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    # ...and training really moved on after the resume.
    assert any(not torch.equal(first_half[key], resumed[key]) for key in resumed if resumed[key].is_floating_point())


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["dqn-prefetch", "ppo"])
def test_a_run_stopped_by_sigterm_saves_and_resumes_exactly(tmp_path, agent):
    # SIGTERM (a scheduler's preemption, `kill`) reaches Lightning's handler, which stops the run after the current
    # update; FrameCheckpoint saves there. The chain configs checkpoint every 1e9 frames, so this save is the only one.
    # PPO stops inside a rollout; DQN with prefetch inside a round prepared in the background.
    half = 36 if agent == "ppo" else 50

    class Preempt(AfterUpdate):
        def after_update(self, trainer, pl_module):
            if trainer.global_step == half:
                os.kill(os.getpid(), signal.SIGTERM)

    def config(root: Path) -> dict:
        config = chain_config(agent.split("-")[0], root)
        if agent == "dqn-prefetch":
            config["data"]["init_args"]["collection"] = PREFETCH
        config["trainer"]["max_steps"] = 2 * half
        return config

    fit(write_config(config(tmp_path / "full"), tmp_path / "full.yaml"))
    preempted = write_config(config(tmp_path / "stopped"), tmp_path / "stopped.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(preempted)], extra_callbacks=[Preempt()])
    assert exited.value.code == 128 + signal.SIGTERM
    assert torch.load(tmp_path / "stopped/checkpoints/last.ckpt", weights_only=True)["global_step"] == half
    cli = fit(preempted, "--ckpt_path", "last")
    assert cli.trainer.global_step == 2 * half
    full, resumed = (
        weights(tmp_path / "full/checkpoints/last.ckpt"),
        weights(tmp_path / "stopped/checkpoints/last.ckpt"),
    )
    for key in full:
        assert torch.equal(full[key], resumed[key]), key


@pytest.mark.slow
def test_checkpoint_restores_counters_buffer_and_exploration(tmp_path):
    config = write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml")
    cli = fit(config, "--trainer.max_steps", "40")
    checkpoint = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    state = checkpoint["ReplayDataModule"]
    # The collect that completes the 64 warm-up frames already earns 8 / 2 = 4 updates; each later one 4 more.
    assert state["frames"] == cli.datamodule.frames == 64 + (40 - 4) * 2
    assert saved_replay(tmp_path / "checkpoints/last.ckpt", state)[1]["write_count"] == cli.datamodule.frames
    # The file holds the rows written, not the 100,000 the buffer allocates (an early checkpoint of a large buffer).
    saved = torch.load(tmp_path / "checkpoints" / state["buffer_folder"] / "buffer.pt", weights_only=True)["buffer"]
    tensors = [value for value in saved["_storage"]["_storage"].values() if isinstance(value, torch.Tensor)]
    assert {tensor.shape[0] for tensor in tensors} == {
        state["frames"]
    } and cli.datamodule.buffer.storage.max_size == 10**5
    assert set(state["env"]) == {"position", "steps"}
    assert checkpoint["state_dict"]["egreedy.eps"] == pytest.approx(cli.model.epsilon(state["frames"]))


def test_interrupted_checkpoint_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)

    def dies_mid_write(obj, file, *args, **kwargs):
        file.write(b"partial bytes")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], torch.ones(3))
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "last.ckpt.sha256"]  # no temporary file left behind


class PoisonWeights(AfterUpdate):
    """Sets one weight to NaN after update 30, as a diverging run would."""

    def after_update(self, trainer, pl_module):
        if trainer.global_step == 30:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))


@pytest.mark.slow
def test_nan_loss_stops_with_clear_error_and_keeps_last_good_checkpoint(tmp_path):
    config = chain_config("dqn", tmp_path)
    config["trainer"]["callbacks"] = [
        {"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": {"every_n_frames": 40}},
        {"class_path": "tests.app.test_resume.PoisonWeights"},
    ]
    path = write_config(config, tmp_path / "c.yaml")
    with pytest.raises(FloatingPointError, match=r"loss is nan at update 30"):
        fit(path)
    good = weights(tmp_path / "checkpoints/last.ckpt")
    assert all(torch.isfinite(value).all() for value in good.values() if value.is_floating_point())


# ------------------------------------------------------------------------------------------------------------------
# Resuming the shipped configs as the docs run them: CSV logger on, `--ckpt_path last`, the run's own folder.

# Small enough to run in seconds; everything else (logger, callbacks, model) as shipped.
SHORT = {
    "snake_ppo": [
        "--data.init_args.num_envs", "16", "--data.init_args.collect_steps", "8",
        *SNAKE_PPO_MINIBATCH, "--data.init_args.env.init_args.max_steps", "50",
    ],
    "snake_dqn": [
        "--data.init_args.num_envs", "8", "--data.init_args.buffer_size", "2000", *SNAKE_DQN_BATCH,
        "--data.init_args.warmup_frames", "64", "--data.init_args.env.init_args.max_steps", "50",
    ],
}  # fmt: skip


class RecordStart(pl.Callback):
    """Remembers the update a fit started from (the checkpoint's, when it resumed)."""

    def on_train_start(self, trainer, pl_module):
        self.start_step = trainer.global_step


def fit_shipped(name: str, runs: Path, *overrides: str):
    """``python -m app fit --config configs/<name>.yaml`` with its CSV logger writing under ``runs``, shortened."""
    args = [*SHORT[name], "--threads", "1", "--trainer.logger.init_args.save_dir", str(runs)]
    args += ["--trainer.log_every_n_steps", "5", "--trainer.enable_progress_bar", "false"]
    # Appended after the overrides, which may replace the whole callback list (`--config preset.yaml`).
    return fit(
        ROOT / "configs" / f"{name}.yaml", *args, *overrides, "--trainer.callbacks+=tests.app.test_resume.RecordStart"
    )


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def start_step(cli) -> int:
    return next(callback for callback in cli.trainer.callbacks if isinstance(callback, RecordStart)).start_step


@pytest.mark.slow
def test_ckpt_path_last_continues_the_newest_run_of_a_shipped_config_in_its_folder(tmp_path):
    runs = tmp_path / "runs"
    fit_shipped("snake_ppo", runs, "--trainer.max_steps", "20")
    run_dir = runs / "snake_ppo/version_0"
    first = metrics_rows(run_dir)

    cli = fit_shipped("snake_ppo", runs, "--trainer.max_steps", "40", "--ckpt_path", "last")

    assert start_step(cli) == 20 and cli.trainer.global_step == 40  # continued from update 20, not restarted
    assert [path.name for path in (runs / "snake_ppo").iterdir()] == ["version_0"]  # no version_1
    assert cli.trainer.log_dir == str(run_dir)
    assert (run_dir / "config.yaml").is_file() and (run_dir / "throughput.json").is_file()
    rows = metrics_rows(run_dir)
    assert rows[: len(first)] == first  # the first part is kept as it was...
    train_steps = [int(row["step"]) for row in rows if row["epoch"]]
    assert train_steps == [4, 9, 14, 19, 24, 29, 34, 39]  # ...and the second appended: both parts, none twice
    eval_steps = [int(row["step"]) for row in rows if row["eval/return_mean"]]
    assert eval_steps == sorted(set(eval_steps)) and eval_steps[0] == 0 and eval_steps[-1] == 40
    checkpoint = torch.load(run_dir / "checkpoints/last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 40


@pytest.mark.slow
def test_a_run_folder_copied_elsewhere_continues_there_and_its_last_checkpoint_moves_on(tmp_path):
    # A run folder downloaded, or copied with its links followed (`last.ckpt` then a file of its own, not the link
    # this project writes), and continued in its new place: each continuation's final checkpoint is the new
    # `last.ckpt`, so the next `--ckpt_path last` continues from it, not from the update the folder was copied at.
    fit_shipped("snake_ppo", tmp_path / "runs", "--trainer.max_steps", "20")
    moved = tmp_path / "elsewhere" / "runs"
    shutil.copytree(tmp_path / "runs", moved)  # symlinks=False: the linked files' contents
    checkpoints = moved / "snake_ppo/version_0/checkpoints"
    assert not (checkpoints / "last.ckpt").is_symlink()
    for steps in (40, 60):
        cli = fit_shipped("snake_ppo", moved, "--trainer.max_steps", str(steps), "--ckpt_path", "last")
        assert start_step(cli) == steps - 20 and cli.trainer.global_step == steps
        assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == steps
    assert sorted(path.name for path in checkpoints.glob("last*.ckpt")) == [
        "last-step40.ckpt",
        "last-step60.ckpt",
        "last.ckpt",
    ]  # no `last-v1.ckpt` beside it; the two newest kept, as in the run's own folder
    assert [path.name for path in (moved / "snake_ppo").iterdir()] == ["version_0"]


@pytest.mark.slow
def test_a_step_takes_every_update_a_collection_earns_and_logs_and_resumes_in_updates(tmp_path):
    # 8 boards and 2 frames per update: each collection earns 4 updates, which one Lightning step takes (with prefetch,
    # the next collection runs beside them). Steps still end at the logging steps (every 5 updates) and at max_steps,
    # so metrics.csv counts updates as with one update per step, and a resume continues the run in its folder.
    runs, run_dir = tmp_path / "runs", tmp_path / "runs/snake_dqn/version_0"
    rounds = ("--data.init_args.frames_per_update", "2", "--data.init_args.collection.prefetch", "true")
    cli = fit_shipped("snake_dqn", runs, *rounds, "--trainer.max_steps", "22")
    assert cli.trainer.global_step == 22
    steps_taken = cli.trainer.fit_loop.epoch_loop.batch_progress.total.completed
    assert steps_taken < 22 / 2  # several updates per Lightning step

    cli = fit_shipped("snake_dqn", runs, *rounds, "--trainer.max_steps", "43", "--ckpt_path", "last")

    assert start_step(cli) == 22 and cli.trainer.global_step == 43
    rows = metrics_rows(run_dir)
    assert [int(row["step"]) for row in rows if row["train/loss"]] == [4, 9, 14, 19, 24, 29, 34, 39]
    assert all(row["train/epsilon"] for row in rows if row["train/loss"])


class EveryStep(pl.Callback):
    """A callback of this test file that acts at every step's end: a step then takes one round (a callback of
    unknown schedule), and it sees the frames after each."""

    def __init__(self) -> None:
        self.frames: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, *args):
        self.frames.append(trainer.datamodule.frames)


@pytest.mark.slow
def test_a_step_takes_several_one_update_rounds_and_the_run_is_the_one_of_one_round_a_step(tmp_path, monkeypatch):
    """The shipped Pendulum SAC config (a round of one frame and one update) for 240 updates after a 60-frame
    warm-up, evaluations every 50 frames, checkpoints every 70, metrics every 40 updates: in Lightning steps of
    several rounds, and of one round each as before (``STEP_SECONDS`` below zero). The same weights, evaluations at
    the same frames and updates with the same returns, checkpoints at the same updates, the same metrics rows, in a
    fraction of the steps; with a callback of unknown schedule, one round a step again."""
    import yaml

    import modules.base

    config = yaml.safe_load((ROOT / "configs/gym/pendulum_sac.yaml").read_text())
    checkpoints, evaluation, throughput = config["trainer"]["callbacks"]
    checkpoints["init_args"]["every_n_frames"] = 70
    evaluation["init_args"].update(every_n_frames=50, episodes=2)
    path = write_config(config, tmp_path / "pendulum_sac.yaml")

    def run(name: str, step_seconds: float, *extra: str):
        monkeypatch.setattr(modules.base, "STEP_SECONDS", step_seconds)
        cli = fit(
            path,
            *("--trainer.max_steps", "240", "--data.init_args.warmup_frames", "60"),
            *("--trainer.log_every_n_steps", "40", "--trainer.enable_progress_bar", "false"),
            *("--trainer.logger.init_args.save_dir", str(tmp_path / name), *extra),
        )
        callbacks = {type(callback).__name__: callback for callback in cli.trainer.callbacks}
        history = [
            {key: value for key, value in point.items() if key != "time_s"}
            for point in callbacks["PeriodicEvaluation"].history
        ]
        return {
            "weights": {key: value.clone() for key, value in cli.model.state_dict().items()},
            "evaluations": history,
            "checkpoints": sorted(callbacks["FrameCheckpoint"]._written),
            "rows": [
                {key: value for key, value in row.items() if not key.startswith(("throughput/", "time/", "eval/time"))}
                for row in metrics_rows(tmp_path / name / "gym_pendulum_sac/version_0")
            ],
            "steps": cli.trainer.fit_loop.epoch_loop.batch_progress.total.completed,
            "cli": cli,
        }

    joined, alone = run("joined", 10.0), run("alone", -1.0)
    for key in ("evaluations", "checkpoints", "rows"):
        assert joined[key] == alone[key], key
    for key, value in alone["weights"].items():
        assert torch.equal(joined["weights"][key], value), key
    # The warm-up's round ends at frame 60 with the first update, then a frame an update: at the start, after the
    # rounds that reach each multiple of 50 frames, at the end (frame 299); checkpoints at frames 70, 140, 210, 280.
    evaluated = [(point["frames"], point["updates"]) for point in alone["evaluations"]]
    assert evaluated == [(0, 0), (60, 1), (100, 41), (150, 91), (200, 141), (250, 191), (299, 240)]
    assert alone["checkpoints"] == [11, 81, 151, 221, 240]
    assert alone["steps"] == 240 and joined["steps"] < 240 / 4
    # A callback this project does not know: one round a step, each seen.
    every_step = run("every_step", 10.0, "--trainer.callbacks+=tests.app.test_resume.EveryStep")
    watcher = next(callback for callback in every_step["cli"].trainer.callbacks if isinstance(callback, EveryStep))
    assert every_step["steps"] == 240 and watcher.frames == list(range(60, 300))


@pytest.mark.slow
def test_resume_from_a_mid_run_checkpoint_rewrites_the_lost_rows_exactly(tmp_path):
    # A run checkpointed every 256 frames, resumed from its checkpoint of update 50 (the step whose rollout passed 512
    # frames, ended at a logging step) as if killed after it: the rows it had logged after that checkpoint are
    # dropped and logged again, and metrics.csv ends as one straight run's.
    every_256 = tmp_path / "every_256.yaml"
    every_256.write_text(
        "trainer:\n  callbacks:\n"
        "    - {class_path: callbacks.schedule.FrameCheckpoint, init_args: {every_n_frames: 256, save_top_k: -1}}\n"
        "    - {class_path: callbacks.schedule.PeriodicEvaluation, init_args: {every_n_frames: 256, episodes: 8}}\n"
    )
    runs = tmp_path / "runs"
    run_dir = runs / "snake_ppo/version_0"
    fit_shipped("snake_ppo", runs, "--config", str(every_256), "--trainer.max_steps", "60")
    straight = metrics_rows(run_dir)
    middle = run_dir / "checkpoints/frames=512.ckpt"
    assert torch.load(middle, weights_only=True)["global_step"] == 50

    cli = fit_shipped(
        "snake_ppo", runs, "--config", str(every_256), "--trainer.max_steps", "60", "--ckpt_path", str(middle)
    )

    assert start_step(cli) == 50 and cli.trainer.log_dir == str(run_dir)
    resumed = metrics_rows(run_dir)
    assert [row["step"] for row in resumed] == [row["step"] for row in straight]
    # Training episodes that span the checkpoint are summed on from where it stood (their running sums are in it).
    assert sum(bool(row["train/return_mean"]) for row in straight if int(row["step"]) > 50) >= 2
    for row, again in zip(straight, resumed, strict=True):
        for key, value in row.items():
            if not key.startswith(("time/", "throughput/")):  # wall-clock figures differ between runs
                assert again[key] == value, (row["step"], key)


class KillBefore(pl.Callback):
    """SIGKILLs this process as the first Lightning step after update ``step`` starts: after everything the step that
    ended there wrote (its checkpoint)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_process_killed_right_after_a_checkpoint_keeps_the_rows_it_logged_before_it(tmp_path):
    # The CSV logger holds rows in memory between its writes: a checkpoint writes them first, so a process killed
    # after the checkpoint loses none that the resumed run (which logs only the updates after it) would not redo.
    every_256 = tmp_path / "every_256.yaml"
    every_256.write_text(
        "trainer:\n  callbacks:\n"
        "    - {class_path: callbacks.schedule.FrameCheckpoint, init_args: {every_n_frames: 256}}\n"
        "    - {class_path: callbacks.schedule.PeriodicEvaluation, init_args: {every_n_frames: 256, episodes: 8}}\n"
    )
    straight_runs, runs = tmp_path / "straight", tmp_path / "runs"
    fit_shipped("snake_ppo", straight_runs, "--config", str(every_256), "--trainer.max_steps", "60")
    killed = run_app_process(
        *("fit", "--config", str(ROOT / "configs/snake_ppo.yaml")),
        *SHORT["snake_ppo"],
        *("--threads", "1", "--trainer.logger.init_args.save_dir", str(runs), "--trainer.log_every_n_steps", "5"),
        *("--trainer.enable_progress_bar", "false", "--config", str(every_256), "--trainer.max_steps", "60"),
        *("--trainer.callbacks+=tests.app.test_resume.KillBefore", "--trainer.callbacks.init_args.step", "50"),
        cwd=ROOT,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    run_dir = runs / "snake_ppo/version_0"
    assert torch.load(run_dir / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 50
    assert {row["step"] for row in metrics_rows(run_dir)} >= {"4", "24", "49"}  # on disk before the kill

    cli = fit_shipped("snake_ppo", runs, "--config", str(every_256), "--trainer.max_steps", "60", "--ckpt_path", "last")

    assert start_step(cli) == 50
    straight, resumed = metrics_rows(straight_runs / "snake_ppo/version_0"), metrics_rows(run_dir)
    assert [row["step"] for row in resumed] == [row["step"] for row in straight]
    for row, again in zip(straight, resumed, strict=True):
        for key, value in row.items():
            if not key.startswith(("time/", "throughput/")) and key != "eval/time_s":  # wall-clock figures differ
                assert again[key] == value, (row["step"], key)


# A checkpoint write that a SIGKILL interrupts: the real AtomicCheckpointIO, whose torch.save has written half of a real
# checkpoint when the process is killed (the wrapper only holds it there long enough to be killed mid-write).
WRITE_AND_HANG = """
import io, sys, time, torch
from pathlib import Path
from checkpoints.io import AtomicCheckpointIO
from checkpoints.files import write_folder_atomically

def write_half_then_hang(write):
    write()
    print("half written", flush=True)
    time.sleep(600)

if sys.argv[2] == "replay folder":  # what FrameCheckpoint writes first: the buffer's folder beside the checkpoint
    def fill(temporary):
        (temporary / "storage").mkdir()
        write_half_then_hang(lambda: (temporary / "storage/observation.memmap").write_bytes(bytes(1 << 20)))
    write_folder_atomically(Path(sys.argv[1] + ".replay-rank0-step30"), fill)
else:  # then the checkpoint itself
    save = torch.save
    def save_half(obj, file, *args, **kwargs):
        whole = io.BytesIO()
        save(obj, whole, *args, **kwargs)
        write_half_then_hang(lambda: (file.write(whole.getvalue()[: len(whole.getvalue()) // 2]), file.flush()))
    torch.save = save_half
    checkpoint = torch.load(sys.argv[1], weights_only=True)
    checkpoint["global_step"] = 10**6  # what a resume would report if it ever read this file
    AtomicCheckpointIO().save_checkpoint(checkpoint, sys.argv[1])
"""


def kill_9_while_writing(part: str, checkpoint: Path) -> Path:
    """A process killed (-9) halfway through writing ``part`` of a checkpoint: the temporary it left behind."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITE_AND_HANG, str(checkpoint), part],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert writer.stdout.readline() == "half written\n"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    name = f"{checkpoint.name}.replay-rank0-step30" if part == "replay folder" else checkpoint.name
    return checkpoint.parent / f".{name}.tmp-{writer.pid}"


@pytest.mark.slow
def test_kill_9_during_a_checkpoint_write_resumes_from_the_previous_checkpoint(tmp_path, capsys):
    runs = tmp_path / "runs"
    fit_shipped("snake_dqn", runs, "--trainer.max_steps", "20")
    folder = runs / "snake_dqn/version_0/checkpoints"
    before = {path.relative_to(folder): path.stat().st_mtime_ns for path in folder.rglob("*")}
    assert sorted(path.name for path in folder.iterdir()) == checkpoint_files(20)
    # Killed while writing the replay buffer's folder, and (another process) while writing the checkpoint itself.
    temporaries = [kill_9_while_writing(part, folder / "last.ckpt") for part in ("replay folder", "checkpoint")]
    replay_temporary, checkpoint_temporary = temporaries
    assert (replay_temporary / "storage/observation.memmap").stat().st_size > 0  # partial writes left behind...
    assert checkpoint_temporary.stat().st_size > 0
    assert {path.relative_to(folder): path.stat().st_mtime_ns for path in folder.rglob("*")} == {
        **before,
        **{
            path.relative_to(folder): path.stat().st_mtime_ns
            for temporary in temporaries
            for path in (temporary, *temporary.rglob("*"))
        },
    }  # ...and nothing of the previous checkpoint touched

    cli = fit_shipped("snake_dqn", runs, "--trainer.max_steps", "40", "--ckpt_path", "last")

    assert start_step(cli) == 20 and cli.trainer.global_step == 40
    # The dead writers' temporaries are gone; the previous checkpoint is kept with its folder (keep_last 2).
    assert sorted(path.name for path in folder.iterdir()) == checkpoint_files(20, 40)
    assert not any(path.exists() for path in temporaries)
    assert [path.name for path in (runs / "snake_dqn").iterdir()] == ["version_0"]

    # A checkpoint copied without its buffer's folder: resuming that file is one error naming the flag and the folder.
    shutil.rmtree(folder / "last.ckpt.replay-rank0-step40")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        fit_shipped("snake_dqn", runs, "--trainer.max_steps", "60", "--ckpt_path", str(folder / "last.ckpt"))
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: --ckpt_path {folder / 'last.ckpt'}: its replay buffer's folder last.ckpt.replay-rank0-step40 is not "
        "beside it (keep the folder with its checkpoint)"
    ]


def checkpoint_files(*updates: int) -> list[str]:
    """What a checkpoint folder of a replay config holds with the checkpoints of ``updates`` kept, sorted by name:
    ``last.ckpt`` (the newest), each kept one with its checksum, replay folder and manifest of that folder."""
    names = ["last.ckpt"]
    for step in updates:
        names += [f"last-step{step}.ckpt", f"last-step{step}.ckpt.sha256"]
        names += [f"last.ckpt.replay-rank0-step{step}", f"last.ckpt.sums-rank0-step{step}"]
    return sorted(names)

"""Mario's agent on the base: gradient accumulation, the frame-once replay store, mixed precision and compile on the
BatchNorm CNN, and the shipped config as the docs run it (worker processes, logger on, ``--ckpt_path last``)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import yaml
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from datamodules.base import AutocastPolicy
from tests.helpers import RESEEDED, ROOT, chain_config, fit, weights, write_config

# Small frames and short stacks keep the real emulator's tests quick; the network is the reference's at any frame size.
SMALL_MARIO = {
    "class_path": "envs.mario.env.MarioEnv",
    "init_args": {"size": 40, "frame_stack": 4, "stuck_steps": 15},
}


@pytest.mark.slow
def test_accumulated_batches_update_like_one_batch_of_their_size(tmp_path):
    # 4 x 32 accumulated against 1 x 128: the same frames (8 per collection, one update each) and the same draws
    # (one call of 128 per collection either way, after the same 128 warm-up frames), random actions throughout
    # (ε = 1, so the weights cannot steer the play). The gradients of the four quarter-losses sum to the gradient of
    # the whole batch's mean.
    def run(name: str, batch_size: int, accumulate: int) -> dict:
        config = chain_config(
            "dqn", tmp_path / name, batch_size=batch_size, frames_per_update=8 / accumulate, warmup_frames=128
        )
        config["model"]["init_args"]["exploration"].update(eps_start=1.0, eps_end=1.0)
        config["model"]["init_args"]["optimizer"] = {"max_grad_norm": 10.0}
        config["trainer"]["max_steps"] = 12
        overrides = ["--trainer.accumulate_grad_batches", str(accumulate)] if accumulate > 1 else []
        cli = fit(write_config(config, tmp_path / f"{name}.yaml"), *overrides)
        assert cli.model.optim.accumulate_grad_batches == accumulate and cli.trainer.global_step == 12
        assert cli.datamodule.samples == 12 * 128
        return torch.load(tmp_path / name / "checkpoints/last.ckpt", weights_only=True)

    accumulated, whole = run("accumulated", 32, 4), run("whole", 128, 1)
    for key, value in whole["state_dict"].items():
        if value.is_floating_point():
            torch.testing.assert_close(accumulated["state_dict"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    # 12 real steps with the same gradients: Adam's moment estimates agree too, and are not zero.
    for a, b in zip(
        accumulated["optimizer_states"][0]["state"].values(),
        whole["optimizer_states"][0]["state"].values(),
        strict=True,
    ):
        assert int(a["step"]) == int(b["step"]) == 12
        torch.testing.assert_close(a["exp_avg"], b["exp_avg"], rtol=1e-3, atol=1e-6)
    assert any(bool(state["exp_avg"].abs().sum() > 0) for state in whole["optimizer_states"][0]["state"].values())


def mario_config(root: Path, **model) -> dict:
    config = chain_config("dqn", root, env=SMALL_MARIO, num_envs=2, batch_size=16, warmup_frames=32)
    config["data"]["init_args"].update(buffer_size=400, store_frames_once=True, priority={"alpha": 0.7})
    config["model"]["init_args"] = {
        "network": {"kind": "batch_norm_cnn"},
        "loss_function": "smooth_l1",
        "double_dqn": True,
        "target": {"update": "soft", "tau": 0.01},
        "optimizer": {"weight_decay": 1e-5},
        "exploration": {"eps_frames": 200},
        **model,
    }
    return config


@pytest.mark.slow
def test_the_frame_once_store_resumes_exactly(tmp_path):
    # N + N updates equal 2N: the ring of frames, its ids and bookkeeping, the priorities and the emulators' episodes
    # (replayed) all come back from the checkpoint, with another global seed on resume.
    full = write_config(mario_config(tmp_path / "full"), tmp_path / "full.yaml")
    fit(full, "--trainer.max_steps", "24")
    half = write_config(mario_config(tmp_path / "half"), tmp_path / "half.yaml")
    fit(half, "--trainer.max_steps", "12")
    checkpoints = tmp_path / "half/checkpoints"
    state = torch.load(checkpoints / "last.ckpt", weights_only=True)["ReplayDataModule"]
    # The buffer is beside the checkpoint, not in it: TorchRL's state of the buffer (storage, the sampler's
    # priorities) and the frame store's ring, in the one file of the folder the checkpoint names.
    assert "buffer" not in state and state["buffer_folder"] == "last.ckpt.replay-rank0-step12"
    assert sorted(path.name for path in checkpoints.glob("last.ckpt.replay-*")) == [state["buffer_folder"]]
    saved = torch.load(checkpoints / state["buffer_folder"] / "buffer.pt", weights_only=True)
    assert saved["buffer"]["_sampler"] and int(saved["frames"]["written"]) > 0  # the frames are in its ring
    cli = fit(
        half,
        "--trainer.max_steps",
        "24",
        "--ckpt_path",
        "last",
        *RESEEDED,
    )
    assert cli.trainer.global_step == 24
    # The previous checkpoint is kept (keep_last 2) with its folder.
    assert sorted(path.name for path in checkpoints.glob("last.ckpt.replay-*")) == [
        "last.ckpt.replay-rank0-step12",
        "last.ckpt.replay-rank0-step24",
    ]
    a, b = weights(tmp_path / "full/checkpoints/last.ckpt"), weights(tmp_path / "half/checkpoints/last.ckpt")
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_bf16_acting_runs_the_policy_under_autocast_and_hands_back_float32():
    seen = []

    def q_values(observation: torch.Tensor) -> torch.Tensor:
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return torch.nn.functional.linear(observation, torch.ones(3, observation.shape[-1]))

    policy = AutocastPolicy(TensorDictModule(q_values, ["observation"], ["action_value"]), "cpu", torch.bfloat16)
    out = policy(TensorDict(observation=torch.randn(5, 4), batch_size=[5]))
    assert seen == [(True, torch.bfloat16)]  # the forward pass ran in bfloat16...
    assert out["action_value"].dtype == torch.float32  # ...and what it wrote comes back in float32
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.slow
def test_bf16_mixed_and_compile_train_the_batch_norm_cnn(tmp_path):
    config = write_config(mario_config(tmp_path, compile=True), tmp_path / "c.yaml")
    cli = fit(config, "--trainer.max_steps", "6", "--trainer.precision", "bf16-mixed")
    assert cli.trainer.precision == "bf16-mixed" and cli.trainer.global_step == 6
    before = cli.model.q_network.features[1].running_mean.clone()
    assert before.abs().sum() > 0  # the updates' batches moved BatchNorm's averages...
    cli.datamodule.evaluate(cli.model.greedy_policy(), episodes=2)
    assert torch.equal(cli.model.q_network.features[1].running_mean, before)  # ...acting in eval mode did not


@pytest.mark.slow
def test_the_shipped_config_trains_with_workers_and_resumes_in_its_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = ["--data.init_args.collection.workers", "1", "--data.init_args.num_envs", "2"]
    small += ["--data.init_args.batch_size", "8", "--data.init_args.warmup_frames", "64"]
    small += ["--model.init_args.optimizer.accumulate_grad_batches", "2", "--data.init_args.buffer_size", "2000"]
    small += ["--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1"]
    small += ["--trainer.callbacks.init_args.bare_update_seconds", "0"]
    # The shipped niceness lowers the learner below every other process: beside other tests (a parallel run) it
    # would wait for all of them.
    small += ["--data.init_args.collection.learner_nice", "0"]
    # Its evaluations on 2 emulators, not 8: every evaluation plays whole Mario episodes (the first also a random
    # policy's), more time than the 5 updates; how they play is the next test's.
    config = yaml.safe_load((ROOT / "configs/mario_ddqn.yaml").read_text())
    for callback in config["trainer"]["callbacks"]:
        if callback["class_path"].endswith("PeriodicEvaluation"):
            callback["init_args"]["episodes"] = 2
    config = write_config(config, tmp_path / "mario_ddqn.yaml")
    fit(config, *small, "--trainer.max_steps", "3")
    run = tmp_path / "runs/mario_ddqn/version_0"
    saved = torch.load(run / "checkpoints/last.ckpt", weights_only=True)
    saved_folder = run / "checkpoints" / saved["ReplayDataModule"]["buffer_folder"]
    written = int(torch.load(saved_folder / "buffer.pt", weights_only=True)["frames"]["written"])
    cli = fit(config, *small, "--trainer.max_steps", "5", "--ckpt_path", "last")
    assert cli.trainer.global_step == 5
    assert [path.name for path in (tmp_path / "runs/mario_ddqn").iterdir()] == ["version_0"]
    with open(run / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("train/loss")]
    steps = [int(row["step"]) for row in rows]
    # The reference's monitoring goes to the logger with the losses: buffer fill, queued batches, TD error.
    assert all(float(row["data/buffer"]) > 0 and row["data/queued_batches"] != "" for row in rows)
    assert all(float(row["train/td_error"]) >= 0 for row in rows)
    assert len(steps) == 5 and steps == sorted(set(steps))  # both processes' rows, in one file, once each
    # The buffer, its frame store and the counters carry on from the checkpoint (whether the resumed updates waited
    # for new frames depends on the update credit the checkpoint restored and on when the worker delivers).
    data, state = cli.datamodule, saved["ReplayDataModule"]
    assert data.frames >= state["frames"] > 0 and len(data.buffer) == data.frames
    assert data.samples == state["samples"] + 2 * 2 * 8  # 2 updates of 2 accumulated batches of 8
    store = data.buffer._transform[0]
    assert int(store.written) >= written > 0
    # Kept beside the previous checkpoint (keep_last 2), now last-step3.ckpt.
    assert saved_folder.is_dir() and (run / "checkpoints/last-step3.ckpt").is_file()
    assert (run / "collector_workers/worker0.log").exists()
    assert (run / "throughput.json").exists()
    assert isinstance(data.policy, AutocastPolicy) and data.policy.dtype == torch.bfloat16  # the config's bf16 acting


@pytest.mark.slow
def test_the_shipped_config_trains_from_the_stage_start_and_evaluates_from_no_op_starts():
    from app.cli import build

    _, data = build([str(ROOT / "configs/mario_ddqn.yaml")], [])
    training = data.make_env(4, data.seed).reset()["observation"][:, -1]
    evaluation = data._evaluation_env(4).reset()["observation"][:, -1]
    assert all(torch.equal(frame, training[0]) for frame in training)  # the stage's first frame in every emulator
    assert len({frame.sum().item() for frame in evaluation}) > 1  # 0-8 no-op steps: greedy episodes differ


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        (
            "--data.init_args.collection.workers",
            "0",
            "--data.init_args.collection.init_args.workers must be >= 1, got 0",
        ),
        ("--data.init_args.buffer_size", "100", "--data.init_args.batch_size (512) must be <= buffer_size (100)"),
        ("--data.init_args.act_precision", "fp8", "--data.init_args.act_precision must be one of 32, bf16, got 'fp8'"),
        (
            "--data.init_args.frame_capacity",
            "50000",
            "--data.init_args.frame_capacity (50000) must be > buffer_size (50000): about one frame per stored",
        ),
        (
            "--data.init_args.evaluation.env_options",
            "{noop_max: -1}",
            "--data.init_args.evaluation.env_options: noop_max must be >= 0, got -1",
        ),
        (
            "--data.init_args.evaluation.env_options",
            "{noop_steps: 4}",
            "--data.init_args.evaluation.env_options: MarioEnv.__init__() got an unexpected keyword argument "
            "'noop_steps'",
        ),
    ],
)
def test_bad_options_of_the_shipped_config_are_one_error_line_naming_the_flag(tmp_path, capsys, flag, value, message):
    from app.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(ROOT / "configs/mario_ddqn.yaml"), flag, value])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}")

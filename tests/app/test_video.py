"""Videos: MP4 files decoded back and compared with the environment's frames, the recording callback in a fit, the
``watch`` command on a trained checkpoint, and the bad-input lines."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from app.cli import build, main
from app.watch import main as watch
from callbacks.video import VideoWriter
from envs.snake.env import SnakeEnv
from tests.app.test_cli import assert_one_error_line
from tests.app_process import run_app_process
from tests.helpers import ROOT, SNAKE_DQN_BATCH, chain_config, fit, short_snake_fit, write_config

imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")

# What H.264 in yuv420p at CRF 18 (callbacks/video.py) may change: colours are stored once per 2x2 pixels and every
# value is rounded, so edges between cells of different colours blur by a pixel. Over a whole frame that is a small
# mean error; the mean over a 16x16 block (a Snake cell) stays close to the drawn one. A frame of another step differs
# by a whole cell (the head moved), far above both.
MEAN_TOLERANCE = 4.0  # mean |decoded - drawn| over a frame, in levels of 255
BLOCK_TOLERANCE = 8.0  # the largest difference of a 16x16 block's mean colour, in levels of 255


def decode(path: Path) -> list[np.ndarray]:
    """Every frame of the MP4 ``path``, RGB uint8 [height, width, 3], by ffmpeg (imageio-ffmpeg)."""
    frames = imageio_ffmpeg.read_frames(str(path))
    width, height = next(frames)["size"]
    return [np.frombuffer(frame, dtype=np.uint8).reshape(height, width, 3) for frame in frames]


def block_means(image: np.ndarray) -> np.ndarray:
    height, width = (side // 16 * 16 for side in image.shape[:2])
    return image[:height, :width].astype(float).reshape(height // 16, 16, width // 16, 16, 3).mean((1, 3))


def test_the_mp4_decodes_to_the_frames_drawn(tmp_path):
    env = SnakeEnv(num_envs=1, size=10, backend="torch", seed=5)
    td = env.reset()
    generator = torch.Generator().manual_seed(0)
    drawn = []
    with VideoWriter(tmp_path / "snake.mp4", fps=10) as video:
        for _ in range(30):
            drawn.append(env.render(0))
            video.append(drawn[-1])
            td = env.step(td.set("action", torch.randint(0, 4, (1,), generator=generator)))["next"]
            if bool(td["done"].all()):
                td = env.reset()
    decoded = decode(tmp_path / "snake.mp4")
    assert len(decoded) == len(drawn) == 30
    for index, (frame, image) in enumerate(zip(decoded, drawn, strict=True)):
        assert frame.shape == image.shape
        assert np.abs(frame.astype(float) - image).mean() < MEAN_TOLERANCE, index
        assert np.abs(block_means(frame) - block_means(image)).max() < BLOCK_TOLERANCE, index
        # In order: each decoded frame is nearest to the one drawn at its step, of the distinct drawn ones.
        errors = [np.abs(frame.astype(float) - other).mean() for other in drawn]
        others = [e for e, other in zip(errors, drawn, strict=True) if not np.array_equal(other, image)]
        assert all(errors[index] < e for e in others)


def test_recording_plays_the_evaluation_episodes():
    model, data = build(
        [str(ROOT / "configs" / "snake_ppo.yaml")],
        ["--data.init_args.env.init_args.backend", "torch", "--data.init_args.env.init_args.max_steps", "40"],
    )
    model.eval()
    frames: list[np.ndarray] = []
    results = data.record(model.greedy_policy(), 3, frames.append)
    evaluation = data.evaluate(model.greedy_policy(), 3)  # the evaluation's first 3 episodes: the same ones
    assert np.mean([r["return"] for r in results]) == pytest.approx(evaluation["return_mean"], abs=1e-5)
    assert np.mean([r["length"] for r in results]) == pytest.approx(evaluation["length_mean"])
    assert len(frames) == sum(r["frames"] for r in results) == sum(r["length"] + 1 for r in results)
    cut = data.record(model.greedy_policy(), 1, lambda frame: None, max_frames=5)
    assert cut[0]["frames"] == 5 and cut[0]["length"] == 4


def test_a_gymnasium_video_is_drawn_by_an_environment_built_to_be_drawn():
    pytest.importorskip("Box2D")
    model, data = build([str(ROOT / "configs" / "gym" / "lunarlander_ppo.yaml")], [])
    model.eval()
    frames: list[np.ndarray] = []
    results = data.record(model.greedy_policy(), 1, frames.append, max_frames=20)
    assert len(frames) == results[0]["frames"] == 20
    assert all(frame.shape == (400, 600, 3) and frame.dtype == np.uint8 for frame in frames)
    assert len({frame.tobytes() for frame in frames}) > 1  # the lander moves

    def main_engine(env, steps: int = 30):  # action 2 fires the main engine, which puffs exhaust particles
        td = env.reset()
        for _ in range(steps):
            td = env.step_and_maybe_reset(td.set("action", torch.full(env.batch_size, 2)))[1]
        return [copy.unwrapped for copy in env._envs]

    # Training and evaluation copies are not drawn, and LunarLander simulates its exhaust particles, decoration it
    # makes bodies of its physics world, only in an environment that is.
    trained = data.make_env(2, seed=0, options=data.evaluation.env_options)
    with pytest.raises(ValueError, match="built without render: true, so it draws nothing"):
        trained.render(0)
    assert all(not lander.particles for lander in main_engine(trained))
    drawn = data.make_env(1, seed=0, options=dict(data.declared.render_options))
    assert all(lander.particles for lander in main_engine(drawn))


@pytest.mark.slow
def test_the_callback_records_in_a_fit_and_watch_plays_the_checkpoint(tmp_path, monkeypatch, capsys):
    run = tmp_path / "train"
    run.mkdir()
    monkeypatch.chdir(run)
    video = ("--trainer.callbacks+=callbacks.video.EvaluationVideo", "--trainer.callbacks.every_n_frames", "1024")
    short = ("--trainer.callbacks.max_frames", "20", "--trainer.callbacks.episodes", "2", "--trainer.max_steps", "60")
    short += ("--data.init_args.warmup_frames", "256", *SNAKE_DQN_BATCH)
    cli = short_snake_fit("snake_dqn.yaml", *video, *short)
    folder = Path(cli.trainer.log_dir)
    videos = sorted((folder / "videos").glob("frames_*.mp4"))
    callback = next(c for c in cli.trainer.callbacks if type(c).__name__ == "EvaluationVideo")
    assert [Path(path) for path in callback.videos] == sorted(videos, key=lambda p: int(p.stem.split("_")[1]))
    assert videos and folder / "videos" / f"frames_{cli.datamodule.frames}.mp4" in videos  # one at the end
    for path in videos:
        assert 2 <= len(decode(path)) <= 40  # two episodes of at most 20 frames each

    # `watch` as a user runs it: another process, from a folder outside the checkout, on the run folder.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = elsewhere / "watched.mp4"
    args = ["watch", "--ckpt_path", str(folder.resolve()), "--episodes", "2", "--max_frames", "30", "--out", str(out)]
    args += ["--data.init_args.env.init_args.backend", "torch"]
    done = run_app_process(*args, cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    written = int(re.search(r"Wrote .*watched\.mp4 \((\d+) frames at 30 fps\)", done.stdout).group(1))
    lengths = [int(steps) for steps in re.findall(r"episode \d: return \S+, (\d+) steps", done.stdout)]
    assert len(lengths) == 2 and written == sum(length + 1 for length in lengths) <= 60
    frames = decode(out)
    assert len(frames) == written and frames[0].shape == (160, 160, 3)  # the 10x10 board, 16 pixels a cell


def chain_fit_with_a_video(tmp_path: Path, capsys) -> str:
    """``fit`` of the chain env with an ``EvaluationVideo``: must stop before anything is written; its error line."""
    config = write_config(chain_config("dqn", tmp_path / "root"), tmp_path / "chain.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(config), "--trainer.callbacks+=callbacks.video.EvaluationVideo"])
    assert exited.value.code == 2 and not (tmp_path / "root").exists()
    return capsys.readouterr().err


def test_a_video_of_an_environment_that_cannot_render_is_one_line(tmp_path, capsys):
    message = (
        "trainer.callbacks[1] (callbacks.video.EvaluationVideo): envs.testing.chain.ChainEnv cannot "
        "render (it has no render(); BatchedEnv.can_render is False), so it makes no video"
    )
    assert_one_error_line(2, chain_fit_with_a_video(tmp_path, capsys), message)


def test_a_missing_encoder_is_one_line_with_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # as if it were not installed: its import fails
    message = (
        "trainer.callbacks[1] (callbacks.video.EvaluationVideo): writing MP4 needs imageio-ffmpeg, which is not "
        f'installed: pip install -e "{os.path.relpath(ROOT)}[video]" (or pip install "imageio[ffmpeg]")'
    )
    assert_one_error_line(2, chain_fit_with_a_video(tmp_path, capsys), message)
    with pytest.raises(SystemExit) as exited:
        watch(["--ckpt_path", str(tmp_path / "last.ckpt")], prog="watch")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.splitlines() == [f"watch: error: --out: {message.partition(': ')[2]}"], err


def test_watch_bad_input_is_one_line(tmp_path, capsys):
    missing = tmp_path / "runs" / "last.ckpt"
    for args, message in (
        (["--ckpt_path", str(missing)], f"--ckpt_path {missing}: no such file or run folder"),
        (
            ["--ckpt_path", str(tmp_path)],
            f"--ckpt_path {tmp_path}: a folder without checkpoints/last.ckpt (not a run folder)",
        ),
        (["--ckpt_path", str(missing), "--episodes", "0"], "--episodes must be >= 1, got 0"),
        (["--ckpt_path", str(missing), "--out", "x.gif"], "--out x.gif: the video is MP4; name a .mp4 file"),
    ):
        with pytest.raises(SystemExit) as exited:
            watch(args, prog="watch")
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.strip().splitlines() == [f"watch: error: {message}"], err


@pytest.mark.slow
def test_watch_on_a_run_whose_environment_cannot_render_is_one_line(tmp_path, capsys):
    config = chain_config("dqn", tmp_path)
    config["trainer"]["max_steps"] = 20
    cli = fit(write_config(config, tmp_path / "chain.yaml"))
    checkpoint = Path(cli.trainer.checkpoint_callback.last_model_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        watch(["--ckpt_path", str(checkpoint), "--config", str(tmp_path / "chain.yaml")], prog="watch")
    err = capsys.readouterr().err
    message = f"--ckpt_path {checkpoint}: envs.testing.chain.ChainEnv cannot render"
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1 and f"watch: error: {message}" in err, err

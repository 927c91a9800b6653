"""The default progress bar: on every config without listing it, what it shows, and how rarely it redraws."""

from __future__ import annotations

import time

import pytest

from callbacks.progress import RLProgressBar, compact
from callbacks.schedule import PeriodicEvaluation
from tests.helpers import SNAKE_DQN_BATCH, chain_config, fit, short_snake_fit, write_config


def number(shown: str) -> float:
    """The value of a compact figure (``14.8k`` -> 14800)."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(shown[-1], 1.0)
    return float(shown[:-1] if scale != 1.0 else shown) * scale


def test_compact_figures():
    assert [compact(v) for v in (0, 7, 950, 12.5, 0.887, 9999, 14_800, 1_234_567, 2.5e9)] == [
        "0", "7", "950", "12.5", "0.887", "9999", "14.8k", "1.23M", "2.5G"
    ]  # fmt: skip
    assert number("14.8k") == 14_800 and number("1.23M") == 1_230_000 and number("12.5") == 12.5


@pytest.mark.slow
def test_shipped_config_shows_frames_rates_and_the_latest_evaluation(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the config's CSV logger writes runs/snake_dqn/version_0 here
    small = ("--data.init_args.buffer_size", "2000", "--data.init_args.warmup_frames", "512")
    small += ("--trainer.log_every_n_steps", "10")  # the config logs every 500 updates
    cli = short_snake_fit("snake_dqn.yaml", "--trainer.max_steps", "20", *SNAKE_DQN_BATCH, *small)
    bar = cli.trainer.progress_bar_callback
    assert type(bar) is RLProgressBar  # registered by default: the config does not list it
    metrics = bar.get_metrics(cli.trainer, cli.model)
    assert metrics["frames"] == compact(cli.datamodule.frames) and cli.datamodule.frames >= 512
    assert number(metrics["frames/s"]) > 0 and number(metrics["updates/s"]) > 0
    latest = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PeriodicEvaluation)).history[-1]
    assert latest["frames"] == cli.datamodule.frames  # the final evaluation
    assert (
        metrics["return"] == f"{latest['eval/return_mean']:.2f}"
        and metrics["food"] == f"{latest['eval/food_mean']:.2f}"
    )
    assert "v_num" not in metrics
    # The training episodes as last logged (datamodules/episodes.py): the mean over those ended before that step.
    logged = cli.trainer.callback_metrics
    assert metrics["ep_return"] == f"{float(logged['train/return_mean']):.2f}"
    assert metrics["ep_length"] == f"{float(logged['train/length_mean']):.0f}"
    shown = capsys.readouterr().out
    assert "20/20 updates" in shown and f"frames={metrics['frames']}" in shown and "food=" in shown
    assert "ep_return=" in shown and "ep_length=" in shown
    assert (tmp_path / "runs" / "snake_dqn" / "version_0" / "metrics.csv").exists()


@pytest.mark.slow
def test_a_resumed_run_counts_its_updates_towards_max_steps(tmp_path, capsys):
    config = chain_config("dqn", tmp_path)
    config["trainer"].update(max_steps=20, enable_progress_bar=True)
    path = write_config(config, tmp_path / "c.yaml")
    fit(path)
    capsys.readouterr()
    cli = fit(path, "--trainer.max_steps", "35", "--ckpt_path", "last")
    bar = cli.trainer.progress_bar_callback.train_progress_bar
    assert (bar.initial, bar.n, bar.total) == (20, 35, 35)  # Lightning skips on_train_epoch_start on a resume
    drawn = capsys.readouterr().out  # Lightning's bars write to stdout
    assert "35/35 updates" in drawn and "35/? updates" not in drawn  # before the fix: the count with no total


@pytest.mark.slow
def test_the_bar_redraws_by_the_clock_not_by_the_step(tmp_path):
    config = chain_config("ppo", tmp_path)
    config["trainer"]["enable_progress_bar"] = True
    start = time.perf_counter()
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "300")
    elapsed = time.perf_counter() - start
    bar = cli.trainer.progress_bar_callback
    # The first step, the end, and at most one redraw per refresh interval in between: not one per step.
    assert 2 <= bar.redraws <= 2 + elapsed / bar.refresh_s < 300
    assert bar.train_progress_bar.n == 300 and bar.train_progress_bar.total == 300
    assert number(bar.get_metrics(cli.trainer, cli.model)["updates/s"]) > 0


@pytest.mark.slow
def test_the_trainer_flag_turns_the_default_bar_off(tmp_path):
    cli = fit(write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml"), "--trainer.max_steps", "5")
    assert cli.trainer.progress_bar_callback is None  # chain_config sets enable_progress_bar: false


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"refresh_s": 0}, "refresh_s must be > 0"), ({"window_s": -1}, "window_s")]
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RLProgressBar(**kwargs)

"""The random-policy baseline: uniform actions on the evaluation boards, repeatable, logged once per run.

The figures pinned here are the ones the Snake results quote for a random policy (docs/results/snake.md).
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from app.cli import build
from datamodules.evaluation import episode_statistics
from tests.helpers import ROOT, SNAKE_PPO_MINIBATCH, short_snake_fit

# The same games as the default C++ kernel (tests/envs/test_snake_env.py), without its first-use compilation.
TORCH_BACKEND = ("--data.init_args.env.init_args.backend", "torch")


@pytest.fixture(scope="module")
def snake_data():
    _, data = build([str(ROOT / "configs" / "snake_dqn.yaml")], TORCH_BACKEND)
    return data


def test_random_policy_on_the_snake_evaluation_boards(snake_data):
    before = torch.get_rng_state()
    figures = snake_data.evaluate_random(32)
    assert torch.equal(torch.get_rng_state(), before)  # the training run's random stream is left where it was
    assert snake_data.evaluate_random(32) == figures  # seeded like the boards: the same figure every time
    # The Snake results: 0.19 food and return -0.81 over the 32 boards of snake_dqn.yaml (seed 0).
    means = {key: figures[key] for key in ("return_mean", "length_mean", "food_mean")}
    assert means == pytest.approx({"return_mean": -0.8125, "length_mean": 14.1875, "food_mean": 0.1875})
    assert figures["return_ci_low"] < figures["return_mean"] < figures["return_ci_high"]
    assert figures == pytest.approx(episode_statistics(torch.tensor(snake_data.last_episode_returns)) | means)
    # Every random game ends in a crash long before the 500-step cap: return = food - 1, game by game.
    assert figures["return_mean"] == pytest.approx(figures["food_mean"] - 1)
    # The greedy evaluation of an untrained network on the same boards is a different thing (what "0.03" was).
    greedy_untrained = build([str(ROOT / "configs" / "snake_dqn.yaml")], TORCH_BACKEND)[0].greedy_policy()
    assert snake_data.evaluate(greedy_untrained, 32) != figures


@pytest.mark.slow
def test_shipped_config_logs_the_random_policy_once_beside_the_greedy_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's CSV logger writes runs/snake_ppo/version_0 here
    cli = short_snake_fit(
        "snake_ppo.yaml",
        "--trainer.max_steps", "4",
        "--trainer.enable_progress_bar", "false",
        "--data.init_args.num_envs", "64",
        *SNAKE_PPO_MINIBATCH,
    )  # fmt: skip
    run = tmp_path / "runs" / "snake_ppo" / "version_0"
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    greedy = [row for row in rows if row["eval/food_mean"]]
    random = [row for row in rows if row["eval/random_food_mean"]]
    assert len(greedy) == 2 and len(random) == 1 and random[0] is greedy[0]  # at the first evaluation only
    # The Snake results: 0.16 food and return -0.84 over the 64 boards of snake_ppo.yaml.
    assert float(random[0]["eval/random_food_mean"]) == pytest.approx(0.15625)
    assert float(random[0]["eval/random_return_mean"]) == pytest.approx(-0.84375)
    figures = cli.datamodule.evaluate_random(64)
    assert {key: figures[key] for key in ("return_mean", "length_mean", "food_mean")} == pytest.approx(
        {"return_mean": -0.84375, "length_mean": 14.953125, "food_mean": 0.15625}
    )
    assert (run / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "| eval |" in (run / "throughput.md").read_text()


@pytest.mark.parametrize("count", [1, 2, 7, 32, 100])
def test_episode_statistics_are_the_standard_ones(count):
    scipy_stats = pytest.importorskip("scipy.stats")
    values = torch.randn(count, generator=torch.Generator().manual_seed(count)) * 3 + 1
    figures = episode_statistics(values)
    array = values.double().numpy()
    assert figures["return_mean"] == pytest.approx(array.mean())
    assert figures["return_std"] == pytest.approx(array.std(ddof=1) if count > 1 else 0.0)
    assert figures["return_iqm"] == pytest.approx(scipy_stats.trim_mean(array, 0.25))  # rliable's IQM
    assert figures == episode_statistics(values)  # its own generator: the same values, the same interval
    if count > 1:
        # The percentile bootstrap of the mean agrees with scipy's (other draws: up to a little resampling noise).
        reference = scipy_stats.bootstrap((array,), np.mean, n_resamples=20_000, method="percentile", rng=0)
        width = reference.confidence_interval.high - reference.confidence_interval.low
        assert figures["return_ci_low"] == pytest.approx(reference.confidence_interval.low, abs=0.05 * width)
        assert figures["return_ci_high"] == pytest.approx(reference.confidence_interval.high, abs=0.05 * width)
    else:
        assert figures["return_ci_low"] == figures["return_ci_high"] == figures["return_mean"]


def test_the_interquartile_mean_ignores_a_few_outlying_episodes():
    values = torch.tensor([10.0] * 14 + [-1000.0, 1000.0])
    figures = episode_statistics(values)
    assert figures["return_iqm"] == 10.0 and figures["return_std"] > 300

"""``python -m app seeds``: a config over several seeds into one folder, resumable, with the aggregate."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.app.test_cli import run_app
from tests.app_process import run_app_process, start_app
from tests.helpers import ROOT, app_in_process, evaluated_chain_config, write_config


def seeds_config(tmp_path):
    config = evaluated_chain_config("dqn", every_n_frames=200, max_steps=200)
    (tmp_path / "configs").mkdir(exist_ok=True)
    return write_config(config, tmp_path / "configs" / "chain.yaml")


@pytest.mark.slow
def test_seeds_run_into_one_folder_aggregate_and_are_reused(tmp_path, monkeypatch, capsys):
    config = seeds_config(tmp_path)
    work = tmp_path / "work"  # a folder that is neither the checkout nor the config's
    work.mkdir()
    result = run_app("seeds", "--config", str(config), "--seeds", "2", "--parallel", "2", cwd=work)
    assert result.returncode == 0, result.stderr
    out = work / "runs" / "chain_seeds"
    summary = json.loads((out / "seeds.json").read_text())
    assert sorted(summary["seeds"]) == ["0", "1"]
    for seed in range(2):
        run = out / f"seed_{seed}" / "version_0"
        assert yaml.safe_load((run / "config.yaml").read_text())["seed_everything"] == seed
        assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "seed.json").is_file()
        # the seed's environments follow its seed_everything (the config does not set them apart)
        assert yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"]["seed"] == seed
    finals = [row["final_return"] for row in summary["seeds"].values()]
    stats = summary["final_return"]
    assert stats["return_mean"] == pytest.approx(sum(finals) / 2)
    assert stats["return_ci_low"] <= stats["return_mean"] <= stats["return_ci_high"]
    assert summary["random_return"] is not None and summary["curve"]["frames"]
    assert (out / "seeds.png").stat().st_size > 0 and "| 1 |" in (out / "seeds.md").read_text()
    # From scratch, the start each seed is paired with is its untrained policy, evaluated at frame 0.
    pair = summary["paired"]
    assert pair["start"] == "start (frame 0)" and pair["verdict"] in (out / "seeds.md").read_text()
    for seed, row in pair["seeds"].items():
        assert row["final_return"] == summary["seeds"][seed]["final_return"]
        assert row["difference"] == row["final_return"] - row["start_return"]
    # A command with other options does not take the finished seeds for its own: one line, nothing run. (The first
    # command ran in a process of its own, as a user's does; these two run in this one.)
    monkeypatch.chdir(work)
    other = app_in_process(capsys, "seeds", "--config", str(config), "--seeds", "2", "--trainer.max_steps", "300")
    assert other.returncode == 1 and other.stderr.startswith("python -m app seeds: error: seed 0: its finished run")
    assert other.stderr.strip().endswith("give these their own --out") and "running" not in other.stdout
    # A second command reuses the finished seeds and adds only the new one.
    again = app_in_process(capsys, "seeds", "--config", str(config), "--seeds", "3")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("reusing its finished run") == 2 and "seed 2: running" in again.stdout
    assert len(json.loads((out / "seeds.json").read_text())["seeds"]) == 3 and "| 2 |" in (out / "seeds.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--parallel", "0"], "--parallel must be >= 1, got 0"),
        (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
    ],
)
def test_bad_seed_options_are_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    config = seeds_config(tmp_path)
    result = app_in_process(capsys, "seeds", "--config", str(config), *args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(f"error: {message}")


def test_the_aggregate_reports_every_figure_of_the_final_evaluation_that_all_seeds_logged(tmp_path):
    from app.seeds import aggregate, write_report
    from datamodules.evaluation import episode_statistics

    def point(frames, food, **more):
        return {"frames": frames, "time_s": frames / 10, "eval/return_mean": food, "eval/return_std": 1.0,
                "eval/random_return_mean": 0.1, "eval/food_mean": food, **more}  # fmt: skip

    curves = {
        0: [point(0, 0.0), point(100, 4.0, **{"eval/safety_mae": 0.2})],
        1: [point(0, 0.5), point(100, 6.0)],  # no safety_mae: not a figure of every seed
        2: [point(0, 0.2), point(100, 8.0, **{"eval/safety_mae": 0.1})],
    }
    result = {"command": ["python", "-m", "app", "seeds"], **aggregate(curves), "paired": None}
    # The return and its spread, and the random policy's line, are reported elsewhere, not as figures.
    assert list(result["final_figures"]) == ["food_mean"]
    assert result["final_figures"]["food_mean"] == episode_statistics(torch.tensor([4.0, 6.0, 8.0]), "value")
    write_report(result, tmp_path, "toy")
    figures = result["final_figures"]["food_mean"]
    row = f"| food_mean | {figures['value_mean']:.4g} | {figures['value_std']:.3g} |"
    assert row in (tmp_path / "seeds.md").read_text()


def children(pid: int) -> list[int]:
    """The processes ``pid`` started, from any of its threads (Linux's /proc)."""
    return [
        int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()
    ]


@pytest.mark.slow
@pytest.mark.parametrize("group", [False, True], ids=["to the seeds", "to their process group"])
def test_sigterm_to_the_seeds_stops_their_fit_at_a_checkpoint_and_the_same_command_continues_it(tmp_path, group):
    # SIGTERM to the seeds alone (a `kill`), or to every process of their group (a scheduler ending a job: the server
    # that forks the fits gets it too, and must outlive them to tell the seeds how they ended).
    config = evaluated_chain_config("dqn", every_n_frames=200, max_steps=1_000_000)  # runs until it is stopped
    path = write_config(config, tmp_path / "chain.yaml")
    command = ["seeds", "--config", str(path), "--seeds", "1", "--out", "out"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seeds = start_app(*command, cwd=tmp_path, env=env, new_session=group)
    metrics = tmp_path / "out" / "seed_0" / "version_0" / "metrics.csv"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and metrics.read_text().count("\n") > 2) and time.monotonic() < deadline:
        time.sleep(0.5)  # the fit is training: its first evaluations are logged
    (server,) = children(seeds.pid)  # the server that forks the seed's `python -m app fit` (app/launch.py)
    (fit,) = children(server)
    if group:
        os.killpg(seeds.pid, signal.SIGTERM)
    else:
        seeds.send_signal(signal.SIGTERM)
    _, errors = seeds.communicate(timeout=60)
    assert seeds.returncode == 128 + signal.SIGTERM, errors
    assert errors.strip().splitlines()[-1] == "stopped by SIGTERM: the same command continues the seeds"
    assert not Path(f"/proc/{fit}").exists()  # the fit stopped with it (and was reaped)
    checkpoint = tmp_path / "out" / "seed_0" / "version_0" / "checkpoints" / "last.ckpt"
    stopped_at = torch.load(checkpoint, weights_only=True)["global_step"]
    assert stopped_at > 0
    # The same command (its budget now reachable) continues the seed from there.
    again = run_app_process(*command, "--trainer.max_steps", str(stopped_at + 50), cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert "seed 0: continuing it" in again.stdout
    assert torch.load(checkpoint, weights_only=True)["global_step"] == stopped_at + 50

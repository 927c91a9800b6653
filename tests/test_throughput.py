"""ThroughputReport: phase accounting and rates on a hand-driven clock, the files it writes, and one real fit."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import callbacks.throughput as throughput
import datamodules.timing as timing
from callbacks.schedule import PeriodicEvaluation
from callbacks.throughput import ThroughputReport
from datamodules.timing import PhaseTimer
from tests.helpers import chain_config, fit, write_config

FRAMES_PER_STEP, SAMPLES_PER_STEP = 180, 36


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeData:
    def __init__(self, frames: int) -> None:
        self.timer, self.frames, self.samples, self.num_envs = PhaseTimer(), frames, 0, 4


class FakeModule:
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.logged: list[dict[str, float]] = []  # one dict per log point

    def log(self, name: str, value: float, **kwargs) -> None:
        if name == "throughput/frames_per_s":
            self.logged.append({})
            assert kwargs["prog_bar"] and kwargs["sync_dist"] and kwargs["reduce_fx"] == "sum"
        self.logged[-1][name] = value


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(throughput, "_clock", clock)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))  # the real PhaseTimer, on the same clock
    return clock


def make_trainer(tmp_path, world_size: int = 1, history: list[dict] | None = None) -> SimpleNamespace:
    evaluation = PeriodicEvaluation()
    evaluation.history = history or []
    return SimpleNamespace(
        datamodule=FakeData(frames=5000),  # resumed: frames collected by an earlier fit must not count
        global_step=100,
        world_size=world_size,
        is_global_zero=True,
        log_dir=str(tmp_path / "logs"),
        default_root_dir=str(tmp_path),
        callbacks=[evaluation],
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        accelerator=SimpleNamespace(),
        precision="32-true",
    )


def step(callback, trainer, module, clock, collect: float, update: float, gap: float = 0.25) -> None:
    """One training step: data phases, then the update, then ``gap`` seconds outside the step."""
    data = trainer.datamodule
    callback.on_train_batch_start(trainer, module, None, 0)
    with data.timer.phase("collect"):
        clock.advance(collect)
    with data.timer.phase("buffer_write"):
        clock.advance(0.125)
    with data.timer.phase("sample"):
        clock.advance(0.125)
    data.frames += FRAMES_PER_STEP
    data.samples += SAMPLES_PER_STEP
    clock.advance(update)
    trainer.global_step += 1
    callback.on_train_batch_end(trainer, module, None, None, 0)
    clock.advance(gap)


def run_fit(callback, trainer, module, clock) -> None:
    """1 s of setup, a slow first step, four steady 1 s steps, then 1.5 s of final evaluation and checkpoint."""
    callback.on_fit_start(trainer, module)
    clock.advance(1.0)
    callback.on_train_start(trainer, module)
    step(callback, trainer, module, clock, collect=1.75, update=0.5, gap=0.0)  # ends at t = 3.5
    for _ in range(4):
        clock.advance(0.25)
        step(callback, trainer, module, clock, collect=0.25, update=0.25, gap=0.0)  # 1 s each, ends at t = 7.5
    clock.advance(1.5)
    callback.on_train_end(trainer, module)
    callback.on_fit_end(trainer, module)


@pytest.mark.parametrize("world_size", [1, 2])
def test_phases_rates_and_report_files_from_a_driven_clock(tmp_path, clock, capsys, world_size):
    history = [{"frames": f, "updates": 0, "time_s": 0.0, "eval/return_mean": r, "eval/food_mean": r / 2} for f, r in
               [(0, 0.0), (900, 1.5), (1800, 4.0)]]  # fmt: skip
    trainer, module = make_trainer(tmp_path, world_size, history), FakeModule()
    callback = ThroughputReport(log_every_n_steps=2, skip_first_steps=1)
    run_fit(callback, trainer, module, clock)
    approx = pytest.approx

    # Whole run: 9 s from fit start; 2.75 s collecting (1.75 + 4 × 0.25), 1.5 s updating, 3.5 s outside the steps.
    report = json.loads((tmp_path / "logs" / "throughput.json").read_text())
    overall = report["overall"]
    assert overall["wall_s"] == approx(9.0)
    assert overall["seconds"] == approx(
        {"collect": 2.75, "advantage": 0.0, "buffer_write": 0.625, "sample": 0.625, "update": 1.5, "other": 3.5}
    )
    assert sum(overall["fraction"].values()) == approx(1.0)
    assert overall["fraction"]["update"] == approx(1.5 / 9)
    assert overall["outside_update_frac"] == approx(1 - 1.5 / 9)
    assert overall["frames"] == 900 * world_size  # 5000 frames from before the resume are left out
    assert overall["frames_per_s"] == approx(100.0 * world_size)
    assert overall["samples_per_s"] == approx(20.0 * world_size)
    assert overall["updates"] == 5 and overall["updates_per_s"] == approx(5 / 9)
    assert report["totals"] == approx(
        {"wall_s": 9.0, "frames": 900 * world_size, "updates": 5, "samples": 180 * world_size, "steps": 5,
         "frames_at_start": 5000 * world_size}
    )  # fmt: skip

    # Steady state: from the end of the first step (t = 3.5) to the end of the last (t = 7.5), four 1 s steps.
    steady = report["steady_state"]
    assert steady["wall_s"] == approx(4.0) and steady["steps"] == 4
    assert steady["frames_per_s"] == approx(180.0 * world_size)
    assert steady["updates_per_s"] == approx(1.0)
    assert steady["fraction"] == approx(
        {"collect": 0.25, "advantage": 0.0, "buffer_write": 0.125, "sample": 0.125, "update": 0.25, "other": 0.25}
    )
    assert steady["outside_update_frac"] == approx(0.75)

    assert report["machine"]["world_size"] == world_size and report["machine"]["cpu_count"] >= 1
    assert report["data"] == {"class": "FakeData", "num_envs": 4} and report["model"]["class"] == "FakeModule"
    assert set(report["versions"]) == {"python", "torch", "lightning", "torchrl", "tensordict"}

    # Logged at updates 102 and 104 (global_step), each over the window since the previous log point; frames and
    # samples are each rank's share, which sync_dist sums.
    assert len(module.logged) == 2
    window = module.logged[1]  # steps 3 and 4: 2 s, 360 frames per rank
    assert window["throughput/frames_per_s"] == approx(180.0)
    assert window["throughput/samples_per_s"] == approx(36.0)
    assert window["throughput/updates_per_s"] == approx(1.0)
    assert window["time/collect_frac"] == approx(0.25) and window["time/update_frac"] == approx(0.25)
    assert sum(value for key, value in window.items() if key.startswith("time/")) == approx(1.0)

    markdown = (tmp_path / "logs" / "throughput.md").read_text()
    assert f"| frames/s | {100 * world_size} | {180 * world_size} |" in markdown
    assert "| update | 1.50 s (16.7 %) | 1.00 s (25.0 %) |" in markdown
    assert "| **outside update** | **83.3 %** | **75.0 %** |" in markdown
    for image in ("throughput_phases.png", "learning_curve.png"):
        assert (tmp_path / "logs" / image).read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert str(tmp_path / "logs" / "throughput.md") in printed and "75.0 %" in printed


def test_without_a_learning_curve_or_plots(tmp_path, clock, capsys):
    trainer, module = make_trainer(tmp_path), FakeModule()
    run_fit(ThroughputReport(report_dir=str(tmp_path / "here"), name="bench"), trainer, module, clock)
    assert (tmp_path / "here" / "bench_phases.png").exists()
    assert not (tmp_path / "here" / "learning_curve.png").exists()
    assert "no learning curve" in capsys.readouterr().out
    # Fewer steps than skip_first_steps (10): no steady state, and the table says so.
    assert json.loads((tmp_path / "here" / "bench.json").read_text())["steady_state"] is None
    assert "| frames/s | 100 | n/a |" in (tmp_path / "here" / "bench.md").read_text()

    trainer = make_trainer(tmp_path / "second")
    run_fit(ThroughputReport(plots=False), trainer, module, clock)
    assert sorted(path.name for path in (tmp_path / "second" / "logs").iterdir()) == [
        "throughput.json",
        "throughput.md",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"log_every_n_steps": 0}, "log_every_n_steps must be >= 1, got 0"),
        ({"skip_first_steps": -1}, "skip_first_steps must be >= 0, got -1"),
        ({"name": ""}, "name must be a non-empty file name stem"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ThroughputReport(**kwargs)


def test_real_fit_through_the_cli_writes_the_report(tmp_path):
    config = chain_config("dqn", tmp_path / "out")
    config["trainer"]["callbacks"].append(
        {"class_path": "callbacks.schedule.PeriodicEvaluation", "init_args": {"every_n_frames": 80, "episodes": 2}}
    )
    cli = fit(
        write_config(config, tmp_path / "c.yaml"),
        "--trainer.max_steps", "30",
        "--trainer.callbacks+=callbacks.throughput.ThroughputReport",
        "--trainer.callbacks.log_every_n_steps", "10",
        "--trainer.callbacks.skip_first_steps", "5",
    )  # fmt: skip
    callback = next(cb for cb in cli.trainer.callbacks if isinstance(cb, ThroughputReport))
    assert (callback.log_every_n_steps, callback.skip_first_steps) == (10, 5)  # init args reached the appended callback
    report = json.loads((tmp_path / "out" / "throughput.json").read_text())  # no logger: default_root_dir
    assert report == callback.report
    assert report["totals"]["updates"] == 30 and report["totals"]["frames"] == cli.datamodule.frames > 0
    for figures in (report["overall"], report["steady_state"]):
        assert sum(figures["fraction"].values()) == pytest.approx(1.0)
        assert figures["seconds"]["collect"] > 0 and figures["seconds"]["update"] > 0
        assert figures["frames_per_s"] > 0
    assert report["data"] == {"class": "ReplayDataModule", "num_envs": 8} and report["model"]["class"] == "DQN"
    assert "throughput/frames_per_s" in cli.trainer.progress_bar_metrics
    assert (tmp_path / "out" / "learning_curve.png").exists()

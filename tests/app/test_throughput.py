"""ThroughputReport: phase accounting and rates on a hand-driven clock, the files it writes, and one real fit."""

from __future__ import annotations

import csv
import json
import statistics
import time
from types import SimpleNamespace

import pytest
import torch

import callbacks.bare_updates as bare_updates
import callbacks.throughput as throughput
import datamodules.timing as timing
from app.cli import build
from callbacks.bare_updates import BareYardstick
from callbacks.schedule import PeriodicEvaluation
from callbacks.throughput import ThroughputReport
from datamodules.timing import PhaseTimer
from tests.helpers import ROOT, chain_config, evaluated_chain_config, fit, write_config

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
            assert kwargs["sync_dist"] and kwargs["reduce_fx"] == "sum" and not kwargs.get("prog_bar")
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
        log_every_n_steps=2,  # the rates a report logs by default: on the trainer's logging steps
        world_size=world_size,
        is_global_zero=True,
        log_dir=str(tmp_path / "logs"),
        default_root_dir=str(tmp_path),
        callbacks=[evaluation],
        logger=None,
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        accelerator=SimpleNamespace(),
        precision="32-true",
    )


def step(callback, trainer, module, clock, collect: float, update: float, gap: float = 0.25) -> None:
    """One training step: data phases, then the update (timed by the model), then ``gap`` seconds outside it."""
    data = trainer.datamodule
    with data.timer.phase("collect"):
        clock.advance(collect)
    with data.timer.phase("buffer_write"):
        clock.advance(0.125)
    with data.timer.phase("sample"):
        clock.advance(0.125)
    data.frames += FRAMES_PER_STEP
    data.samples += SAMPLES_PER_STEP
    with data.timer.phase("update"):
        clock.advance(update)
    trainer.global_step += 1
    callback.on_train_batch_end(trainer, module, None, None, 0)
    clock.advance(gap)


def run_fit(callback, trainer, module, clock) -> None:
    """1 s of setup, a slow first step, four steady 1 s steps, then the final evaluation (1 s), checkpoint
    (0.25 s) and 0.25 s of teardown."""
    callback.on_fit_start(trainer, module)
    clock.advance(1.0)
    callback.on_train_start(trainer, module)
    step(callback, trainer, module, clock, collect=1.75, update=0.5, gap=0.0)  # ends at t = 3.5
    for _ in range(4):
        clock.advance(0.25)
        step(callback, trainer, module, clock, collect=0.25, update=0.25, gap=0.0)  # 1 s each, ends at t = 7.5
    with trainer.datamodule.timer.phase("checkpoint"):
        clock.advance(0.25)
    with trainer.datamodule.timer.phase("eval"):
        clock.advance(1.0)
    clock.advance(0.25)
    callback.on_train_end(trainer, module)
    callback.on_fit_end(trainer, module)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_phases_rates_and_report_files_from_a_driven_clock(tmp_path, clock, capsys, world_size):
    history = [{"frames": f, "updates": 0, "time_s": f / 100, "eval/return_mean": r, "eval/food_mean": r / 2} for f, r
               in [(0, 0.0), (900, 1.5), (1800, 4.0)]]  # fmt: skip
    trainer, module = make_trainer(tmp_path, world_size, history), FakeModule()
    callback = ThroughputReport(log_every_n_steps=2, skip_first_steps=1)
    run_fit(callback, trainer, module, clock)
    approx = pytest.approx

    # This process: 9 s from fit start; 2.75 s collecting (1.75 + 4 × 0.25), 1.5 s updating, 1 s evaluating,
    # 0.25 s checkpointing, 2.25 s elsewhere (1 s setup, 4 × 0.25 s between steps, 0.25 s teardown).
    report = json.loads((tmp_path / "logs" / "throughput.json").read_text())
    this = report["this_process"]
    assert this["wall_s"] == approx(9.0)
    assert this["seconds"] == approx(
        {"collect": 2.75, "advantage": 0.0, "buffer_write": 0.625, "sample": 0.625, "update": 1.5, "eval": 1.0,
         "checkpoint": 0.25, "other": 2.25}
    )  # fmt: skip
    assert sum(this["fraction"].values()) == approx(1.0)
    assert this["fraction"]["update"] == approx(1.5 / 9)
    assert this["outside_update_frac"] == approx(1 - 1.5 / 9)
    assert this["frames"] == 900 * world_size  # 5000 frames from before the resume are left out
    assert this["frames_per_s"] == approx(100.0 * world_size)
    assert this["samples_per_s"] == approx(20.0 * world_size)
    assert this["updates"] == 5 and this["updates_per_s"] == approx(5 / 9)
    assert report["totals"]["this_process"] == approx(
        {"wall_s": 9.0, "frames": 900 * world_size, "updates": 5, "samples": 180 * world_size, "steps": 5}
    )
    assert report["totals"]["frames_at_start"] == 5000 * world_size
    # No checkpoint state was loaded: the whole run is this process.
    assert report["whole_run"] == this and report["totals"]["whole_run"]["processes"] == 1

    # Steady state: from the end of the first step (t = 3.5) to the end of the last (t = 7.5), four 1 s steps; the
    # final evaluation and checkpoint are outside it.
    steady = report["steady_state"]
    assert steady["wall_s"] == approx(4.0) and steady["steps"] == 4
    assert steady["frames_per_s"] == approx(180.0 * world_size)
    assert steady["updates_per_s"] == approx(1.0)
    assert steady["fraction"] == approx(
        {"collect": 0.25, "advantage": 0.0, "buffer_write": 0.125, "sample": 0.125, "update": 0.25, "eval": 0.0,
         "checkpoint": 0.0, "other": 0.25}
    )  # fmt: skip
    assert steady["outside_update_frac"] == approx(0.75)

    assert report["machine"]["world_size"] == world_size and report["machine"]["cpu_count"] >= 1
    assert report["data"] == {"class": "FakeData", "num_envs": 4} and report["model"]["class"] == "FakeModule"
    assert set(report["versions"]) == {"python", "torch", "lightning", "torchrl", "tensordict"}
    assert report["run"] == str(tmp_path / "logs")  # no logger: the run is named by its folder

    # Logged at updates 102 and 104 (global_step), each over the window since the previous log point; frames and
    # samples are each rank's share, which sync_dist sums.
    assert len(module.logged) == 2
    window = module.logged[1]  # steps 3 and 4: 2 s, 360 frames per rank
    assert window["throughput/frames_per_s"] == approx(180.0)
    assert window["throughput/samples_per_s"] == approx(36.0)
    assert window["throughput/updates_per_s"] == approx(1.0)
    assert window["time/collect_frac"] == approx(0.25) and window["time/update_frac"] == approx(0.25)
    assert window["time/eval_frac"] == 0.0 and window["time/checkpoint_frac"] == 0.0
    assert sum(value for key, value in window.items() if key.startswith("time/")) == approx(1.0)

    markdown = (tmp_path / "logs" / "throughput.md").read_text()
    assert "| | this process | steady state (after 1 updates) | whole run |" in markdown
    assert f"| frames/s | {100 * world_size} | {180 * world_size} | {100 * world_size} |" in markdown
    assert "| update | 1.50 s (16.7 %) | 1.00 s (25.0 %) | 1.50 s (16.7 %) |" in markdown
    assert "| eval | 1.00 s (11.1 %) | 0.00 s (0.0 %) | 1.00 s (11.1 %) |" in markdown
    assert "| checkpoint | 0.25 s (2.8 %) | 0.00 s (0.0 %) | 0.25 s (2.8 %) |" in markdown
    assert "| **outside update** | **83.3 %** | **75.0 %** | **83.3 %** |" in markdown
    for image in ("throughput_phases.png", "learning_curve.png"):
        assert (tmp_path / "logs" / image).read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert str(tmp_path / "logs" / "throughput.md") in printed and "75.0 %" in printed


@pytest.mark.slow
def test_a_resumed_process_adds_to_the_whole_run_from_the_checkpoint_state(tmp_path, clock, capsys):
    first, module = ThroughputReport(skip_first_steps=1), FakeModule()
    trainer = make_trainer(tmp_path)
    run_fit(first, trainer, module, clock)
    state = first.state_dict()  # what a checkpoint written now holds: the 9 s and 5 updates so far
    assert state["whole_run"]["wall_s"] == pytest.approx(9.0) and state["whole_run"]["updates"] == 5

    clock.advance(100.0)  # time between the processes is not the run's
    second = ThroughputReport(skip_first_steps=1)
    second.load_state_dict(state)
    trainer.datamodule.timer = timing.PhaseTimer()  # a new process: a fresh timer, the counters from the checkpoint
    run_fit(second, trainer, module, clock)
    report = second.report
    assert report["this_process"]["wall_s"] == pytest.approx(9.0) and report["this_process"]["updates"] == 5
    whole = report["whole_run"]
    assert whole["processes"] == 2 and whole["wall_s"] == pytest.approx(18.0)
    assert whole["updates"] == 10 and whole["frames"] == 1800 and whole["samples"] == 360
    assert whole["seconds"] == pytest.approx(
        {key: 2 * value for key, value in report["this_process"]["seconds"].items()}
    )
    assert whole["frames_per_s"] == pytest.approx(100.0) and whole["fraction"]["update"] == pytest.approx(1.5 / 9)
    assert report["totals"]["frames_at_start"] == 5900
    assert "in 2 processes" in (tmp_path / "logs" / "throughput.md").read_text()
    assert "whole run over 2 processes: 1,800 frames in 18.0 s" in capsys.readouterr().out


@pytest.mark.slow
def test_without_a_learning_curve_or_plots(tmp_path, clock, capsys):
    trainer, module = make_trainer(tmp_path), FakeModule()
    run_fit(ThroughputReport(report_dir=str(tmp_path / "here"), name="bench"), trainer, module, clock)
    assert (tmp_path / "here" / "bench_phases.png").exists()
    assert not (tmp_path / "here" / "learning_curve.png").exists()
    assert "no learning curve" in capsys.readouterr().out
    # Fewer steps than skip_first_steps (10): no steady state, and the table says so.
    assert json.loads((tmp_path / "here" / "bench.json").read_text())["steady_state"] is None
    assert "| frames/s | 100 | n/a | 100 |" in (tmp_path / "here" / "bench.md").read_text()

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
        ({"bare_update_share": 0.0}, r"bare_update_share must be in \(0, 0.5\], got 0.0"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ThroughputReport(**kwargs)


def test_the_slices_stop_the_reports_clock_and_keep_to_their_share(tmp_path, clock, monkeypatch):
    # The same driven fit with and without a yardstick whose slice takes 0.5 s and reads 1 ms: every figure (this
    # process, steady state, whole run, logged windows, the checkpoint's totals) is the same; the one slice paired
    # the 1 s stretch before it with its 1 ms, and after a 0.5 s slice the next stretch waits 0.5 / 0.1 = 5 s: none in
    # the 3 s left.
    class FakeYardstick:
        exists, timed_seconds, threads = True, 0.5, 1

        def __init__(self, model, data) -> None:
            pass

        def slice_ms(self, seconds: float) -> float:
            clock.advance(0.5)
            return 1.0

    monkeypatch.setattr(throughput, "BareYardstick", FakeYardstick)
    monkeypatch.setattr(FakeData, "settle", lambda self: None, raising=False)
    runs = {}
    for seconds in (0.1, 0.0):
        trainer, module = make_trainer(tmp_path / str(seconds)), FakeModule()
        callback = ThroughputReport(
            skip_first_steps=1, log_every_n_steps=2, plots=False, bare_update_seconds=seconds, bare_update_share=0.1
        )
        run_fit(callback, trainer, module, clock)
        runs[seconds] = (callback.report, module.logged, callback.state_dict())
    (sliced, logged, state), (plain, plain_logged, plain_state) = runs[0.1], runs[0.0]
    for figures in ("this_process", "steady_state", "whole_run"):
        assert sliced[figures] == plain[figures], figures
    assert logged == plain_logged and state == plain_state and plain["bare_update"] is None
    bare = sliced["bare_update"]
    assert bare["slices"] == 1 and bare["pairs"][0]["beside_the_loop"] and bare["seconds_paused"] == 0.5
    assert bare["pairs"][0]["seconds"] == 1.0 and bare["pairs"][0]["loop_ms"] == 1000.0 and bare["ratio"] == 1000.0


@pytest.mark.slow
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
    assert report["totals"]["this_process"]["updates"] == 30
    assert report["totals"]["this_process"]["frames"] == cli.datamodule.frames > 0
    for figures in (report["this_process"], report["steady_state"]):
        assert sum(figures["fraction"].values()) == pytest.approx(1.0)
        assert figures["seconds"]["collect"] > 0 and figures["seconds"]["update"] > 0
        assert figures["frames_per_s"] > 0
    assert report["data"] == {"class": "ReplayDataModule", "num_envs": 8} and report["model"]["class"] == "DQN"
    assert "throughput/frames_per_s" in cli.trainer.logged_metrics
    assert "throughput/frames_per_s" not in cli.trainer.progress_bar_metrics  # the progress bar has its own rates
    assert (tmp_path / "out" / "learning_curve.png").exists()
    # The yardstick: a run shorter than one stretch (5 s) gets one bare slice at the end, against its steady state.
    bare, steady = report["bare_update"], report["steady_state"]
    assert bare["slices"] == 1 and bare["ms"] > 0 and bare["seconds_paused"] > 0
    assert bare["loop_ms_per_update"] == pytest.approx(1e3 * steady["wall_s"] / steady["updates"])
    assert bare["ratio"] == pytest.approx(bare["loop_ms_per_update"] / bare["ms"]) == bare["ratio_range"][0]
    assert f"{bare['ratio']:.2f}x" in (tmp_path / "out" / "throughput.md").read_text()


@pytest.mark.slow
def test_rates_are_logged_on_the_trainers_logging_steps_only_by_default(tmp_path, monkeypatch):
    """Lightning writes what is logged on its own logging steps only; a rate logged between them would cost its
    Python for nothing (and end a training step that could take more updates): by default the report logs on those
    steps, into the run's metrics.csv."""
    calls = []
    log_window = ThroughputReport._log_window
    monkeypatch.setattr(
        ThroughputReport,
        "_log_window",
        lambda self, trainer, *args: calls.append(trainer.global_step) or log_window(self, trainer, *args),
    )
    config = chain_config("dqn", tmp_path / "out")
    config["trainer"]["logger"] = {
        "class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path), "name": "run"}
    }  # fmt: skip
    cli = fit(
        write_config(config, tmp_path / "c.yaml"),
        "--trainer.max_steps", "40",
        "--trainer.log_every_n_steps", "8",
        "--trainer.callbacks+=callbacks.throughput.ThroughputReport",
        "--trainer.callbacks.bare_update_seconds", "0",
    )  # fmt: skip
    assert cli.trainer.global_step == 40
    assert calls == [8, 16, 24, 32, 40]
    with open(tmp_path / "run" / "version_0" / "metrics.csv") as file:
        written = [int(row["step"]) for row in csv.DictReader(file) if row.get("throughput/frames_per_s")]
    assert [step + 1 for step in written] == calls  # each logged rate was written (metrics.csv counts steps from 0)


@pytest.mark.slow
def test_the_yardstick_slices_sit_beside_the_loop_and_leave_its_figures_and_its_weights_alone(tmp_path):
    # Slices of 5 ms after every 20 ms of training: several in a run of 400 updates, which takes a few tenths of a
    # second here (2026-12-01: 0.34 s; with a slice every 0.1 s a fast hour left room for two). Each pairs the stretch
    # before it with its own time; the report's clock stops during them, and the run trains to the same weights as
    # without.
    config = chain_config("dqn", tmp_path / "out")
    share = "0.25"
    runs = {}
    for seconds in ("0.005", "0"):
        runs[seconds] = fit(
            write_config(config, tmp_path / f"{seconds}.yaml"),
            "--trainer.max_steps", "400", "--trainer.default_root_dir", str(tmp_path / seconds),
            "--trainer.callbacks+=callbacks.throughput.ThroughputReport",
            "--trainer.callbacks.bare_update_seconds", seconds, "--trainer.callbacks.bare_update_share", share,
            "--trainer.callbacks.report_dir", str(tmp_path / seconds),
        )  # fmt: skip
    sliced = json.loads((tmp_path / "0.005" / "throughput.json").read_text())
    bare = sliced["bare_update"]
    assert bare["slices"] >= 3 and bare["slices"] == len(bare["pairs"])
    stretch = 0.005 / float(share)
    assert all(pair["seconds"] >= stretch and pair["updates"] > 0 for pair in bare["pairs"])
    assert bare["ratio"] == pytest.approx(statistics.median(p["loop_ms"] / p["bare_ms"] for p in bare["pairs"]))
    # the stretches lie inside the steady state, whose clock left the slices out
    assert sum(pair["seconds"] for pair in bare["pairs"]) <= sliced["steady_state"]["wall_s"]
    assert bare["seconds_paused"] >= 0.005 * bare["slices"]
    assert json.loads((tmp_path / "0" / "throughput.json").read_text())["bare_update"] is None
    a, b = (run.model.state_dict() for run in runs.values())
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # Asynchronous workers would go on collecting during a slice: such a run gets its one slice at the end only.
    workers = {"class_path": "datamodules.collection.AsyncCollectorWorkers", "init_args": {"workers": 1}}
    config["data"]["init_args"].update(num_envs=2, collect_steps=4, collection=workers)
    fit(
        write_config(config, tmp_path / "async.yaml"),
        "--trainer.max_steps", "400", "--trainer.default_root_dir", str(tmp_path / "async"),
        "--trainer.callbacks+=callbacks.throughput.ThroughputReport",
        "--trainer.callbacks.bare_update_seconds", "0.005", "--trainer.callbacks.bare_update_share", share,
        "--trainer.callbacks.report_dir", str(tmp_path / "async"),
    )  # fmt: skip
    report = json.loads((tmp_path / "async" / "throughput.json").read_text())
    assert report["steady_state"]["wall_s"] > 3 * stretch  # long enough for several slices beside the loop
    assert report["bare_update"]["slices"] == 1 and not report["bare_update"]["pairs"][0]["beside_the_loop"]
    assert report["bare_update"]["pairs"][0]["seconds"] == pytest.approx(report["steady_state"]["wall_s"])


@pytest.mark.slow
def test_a_slice_of_sacs_yardstick_leaves_the_global_generator_and_the_agent_alone():
    # SAC's bare update samples actions from the global generator: a slice runs under a forked one, on copies.
    model, data = build(
        [str(ROOT / "configs" / "racing_sac.yaml")], ["--threads", "1", "--data.init_args.num_envs", "4"]
    )
    state = torch.get_rng_state()
    weights = {key: value.clone() for key, value in model.state_dict().items()}
    yardstick = BareYardstick(model, data)
    assert yardstick.slice_ms(0.02) > 0 and yardstick.slice_ms(0.02) > 0 and yardstick.calls >= 2
    assert torch.equal(torch.get_rng_state(), state)
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def probe_update(batch_size: int, seed: int = 0):
    """An independent bare update of the Snake reference's arithmetic, written here from its description: MLP
    300-256-256-4 on uint8 boards made float, double-DQN target (γ 0.99), MSE, clip 10, fused Adam 1e-3."""
    generator = torch.Generator().manual_seed(seed)

    def mlp():
        return torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(300, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 4),
        )

    online, target = mlp(), mlp().requires_grad_(False)
    target.load_state_dict(online.state_dict())
    parameters = list(online.parameters())
    adam = torch.optim.Adam(parameters, lr=1e-3, fused=True)

    def boards():
        return torch.randint(0, 2, (batch_size, 3, 10, 10), generator=generator, dtype=torch.uint8)

    batches = [
        (boards(), torch.randint(0, 4, (batch_size,), generator=generator), boards(), torch.randn(batch_size))
        for _ in range(8)
    ]

    def step(i: int) -> None:
        observation, action, next_observation, reward = batches[i % len(batches)]
        with torch.no_grad():
            best = online(next_observation.float()).argmax(-1, keepdim=True)
            y = reward + 0.99 * target(next_observation.float()).gather(-1, best).squeeze(-1)
        q = online(observation.float()).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        (q - y).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(parameters, 10.0, foreach=True)
        adam.step()
        adam.zero_grad(set_to_none=True)

    return step


@pytest.mark.slow
def test_the_yardstick_reads_what_an_independent_update_of_the_same_arithmetic_costs():
    # The built-in yardstick of the Snake reference setting (batch 128) against probe_update, alternated call by call
    # on one thread so that the machine's drift falls on both alike: within 10 %.
    model, data = build(
        [str(ROOT / "configs" / name) for name in ("snake_dqn.yaml", "bench/dqn_reference_ratio.yaml")], []
    )
    assert [tuple(layer.weight.shape) for layer in model.q_network.modules() if hasattr(layer, "weight")] == [
        (256, 300),
        (256, 256),
        (4, 256),
    ]  # the arithmetic probe_update writes out
    yardstick, probe = BareYardstick(model, data), probe_update(data.batch_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(20):  # first allocations, as the yardstick's first slice does
            probe(i)
        yardstick.slice_ms(0.05)  # its first slice draws its batches and warms up
        ratios = alternated_ratios(yardstick, probe, pairs=101)
    finally:
        torch.set_num_threads(threads)
    assert 0.9 <= statistics.median(ratios) <= 1.1, ratios


def alternated_ratios(yardstick: BareYardstick, probe, pairs: int) -> list[float]:
    """The yardstick's time for one update over ``probe``'s, ``pairs`` times, one call of each in turn (the yardstick's
    as a slice of one call). Each side's CPU time (this thread's: on one torch thread it does all the arithmetic), so
    that a neighbour that takes the core now and then, as the suite's other worker does, costs neither side; and one
    call each in turn, so that a neighbour that slows this core's arithmetic (sharing its caches) meets both sides of a
    pair alike: slices of a few tenths of a second each read a median 1.18 beside a busy neighbour."""
    ratios = []
    for i in range(pairs):
        calls, start = yardstick.calls, time.thread_time()
        yardstick.slice_ms(0.0)
        bare = time.thread_time() - start
        assert yardstick.calls == calls + 1
        start = time.thread_time()
        probe(i)
        ratios.append(bare / (time.thread_time() - start))
    return ratios


def nature_cnn_probe(batch_size: int, actions: int, seed: int = 0):
    """An independent bare update of a Nature-CNN DQN written here from its description: 4 stacked 84x84 uint8
    frames laid out channels-last (as the agent's network lays them out) and scaled to [0, 1], Conv 32-8/4, 64-4/2,
    64-3/1, Linear 512, Linear ``actions``; the plain DQN target (gamma 0.99), Huber loss, clip 10, fused Adam 1e-4."""
    generator = torch.Generator().manual_seed(seed)

    def cnn():
        return torch.nn.Sequential(
            torch.nn.Conv2d(4, 32, 8, stride=4),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 4, stride=2),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, stride=1),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(3136, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, actions),
        )

    online, target = cnn(), cnn().requires_grad_(False)
    parameters = list(online.parameters())
    adam = torch.optim.Adam(parameters, lr=1e-4, fused=True)

    def frames():
        stack = torch.randint(0, 256, (batch_size, 4, 84, 84), generator=generator, dtype=torch.uint8)
        return stack.contiguous(memory_format=torch.channels_last)

    batches = [
        (frames(), torch.randint(0, actions, (batch_size,), generator=generator), frames(), torch.randn(batch_size))
        for _ in range(4)
    ]

    def step(i: int) -> None:
        observation, action, next_observation, reward = batches[i % len(batches)]
        with torch.no_grad():
            y = reward + 0.99 * target(next_observation.float() / 255).max(-1).values
        q = online(observation.float() / 255).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        torch.nn.functional.smooth_l1_loss(q, y).backward()
        torch.nn.utils.clip_grad_norm_(parameters, 10.0, foreach=True)
        adam.step()
        adam.zero_grad(set_to_none=True)

    return step


@pytest.mark.slow
def test_the_yardstick_of_an_atari_dqn_reads_what_an_independent_cnn_update_costs_on_the_runs_threads(tmp_path):
    # The RL Zoo's Pong DQN as `lightrl zoo` writes it (its Nature CNN reads channels-last bytes), against
    # nature_cnn_probe, alternated call by call: within 10 % on one thread. Each slice runs on the run's own torch
    # threads (a CNN update takes about two thirds of its one-thread time on two: a yardstick on one thread read a
    # two-thread loop as faster than its own arithmetic).
    pytest.importorskip("ale_py")
    from app.zoo import config_text

    path = tmp_path / "pong_dqn.yaml"
    path.write_text(config_text("dqn", "PongNoFrameskip-v4", path))
    model, data = build([str(path)], ["--data.init_args.buffer_size", "1000"])
    assert [tuple(layer.weight.shape) for layer in model.q_network.modules() if hasattr(layer, "weight")] == [
        (32, 4, 8, 8),
        (64, 32, 4, 4),
        (64, 64, 3, 3),
        (512, 3136),
        (6, 512),
    ]  # the arithmetic nature_cnn_probe writes out
    assert (data.batch_size, model.hparams.double_dqn, model.optim.max_grad_norm) == (32, False, 10.0)
    yardstick, probe = BareYardstick(model, data), nature_cnn_probe(data.batch_size, 6)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        yardstick.slice_ms(0.01)  # its first slice draws its batches and warms up
        assert yardstick.threads == 2
        seen = []
        step = yardstick.step
        yardstick.step = lambda i: (seen.append(torch.get_num_threads()), step(i))[1]
        yardstick.slice_ms(0.01)
        assert seen and set(seen) == {2}  # the slice ran on the run's threads, not one
        yardstick.step = step
        torch.set_num_threads(1)
        for i in range(3):
            probe(i)
        ratios = alternated_ratios(yardstick, probe, pairs=31)
        assert yardstick.threads == 1
    finally:
        torch.set_num_threads(threads)
    assert 0.9 <= statistics.median(ratios) <= 1.1, ratios


def broken_yardstick(model, data, **options):
    """A bare reference update that cannot be built (as PPO's once failed on a GPU, its stand-in advantages on the
    CPU and its batches on the device)."""
    raise RuntimeError("Expected all tensors to be on the same device\nsecond line")


@pytest.mark.slow
def test_a_failing_bare_update_yardstick_leaves_the_run_and_its_report(tmp_path, monkeypatch):
    monkeypatch.setattr(bare_updates, "reference_dqn_update", broken_yardstick)
    config = chain_config("dqn", tmp_path / "out")
    with pytest.warns(UserWarning, match="the bare-update yardstick failed .RuntimeError: Expected all tensors"):
        cli = fit(
            write_config(config, tmp_path / "c.yaml"),
            "--trainer.max_steps", "12",
            "--trainer.callbacks+=callbacks.throughput.ThroughputReport",
            "--trainer.callbacks.skip_first_steps", "2",
            "--trainer.callbacks.log_every_n_steps", "4",  # steps end at updates 4 and 8: a steady state after 2
        )  # fmt: skip
    assert cli.trainer.global_step == 12
    report = json.loads((tmp_path / "out" / "throughput.json").read_text())
    assert report["bare_update"] == {"error": "RuntimeError: Expected all tensors to be on the same device"}
    assert report["steady_state"]["frames_per_s"] > 0
    assert "bare update: not timed, its yardstick failed" in (tmp_path / "out" / "throughput.md").read_text()


class SlowEvaluation(PeriodicEvaluation):
    """The real evaluation callback, made expensive: each evaluation also takes ``seconds`` more."""

    def __init__(self, seconds: float = 0.3, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def measure(self, trainer, pl_module):
        time.sleep(self.seconds)
        return super().measure(trainer, pl_module)


def with_report(config: dict, evaluation: dict, evaluation_first: bool = True) -> dict:
    """``config`` with ``evaluation`` and a ThroughputReport, in the given order, after its FrameCheckpoint."""
    report = {"class_path": "callbacks.throughput.ThroughputReport", "init_args": {"skip_first_steps": 5}}
    config["trainer"]["callbacks"] += [evaluation, report] if evaluation_first else [report, evaluation]
    return config


@pytest.mark.slow
@pytest.mark.parametrize("evaluation_first", [True, False], ids=["evaluation-first", "report-first"])
def test_evaluation_and_checkpoints_are_their_own_phases_whatever_the_callback_order(tmp_path, evaluation_first):
    config = chain_config("dqn", tmp_path / "out")
    config["trainer"]["callbacks"][0]["init_args"]["every_n_frames"] = 40  # a checkpoint every 40 frames
    slow = {
        "class_path": "tests.app.test_throughput.SlowEvaluation",
        "init_args": {"every_n_frames": 40, "episodes": 2},
    }
    cli = fit(
        write_config(with_report(config, slow, evaluation_first), tmp_path / "c.yaml"), "--trainer.max_steps", "30"
    )
    report = next(cb for cb in cli.trainer.callbacks if isinstance(cb, ThroughputReport)).report
    evaluation = next(cb for cb in cli.trainer.callbacks if isinstance(cb, SlowEvaluation))
    seconds, slept = report["this_process"]["seconds"], 0.3 * len(evaluation.history)
    assert len(evaluation.history) >= 4  # at the start, at 40 and 80 frames, and at the end
    assert seconds["eval"] >= slept
    # The update is what the model timed, nothing more: 30 small updates, far less than the evaluations' sleep.
    assert seconds["update"] == pytest.approx(cli.datamodule.timer.totals["update"]) and seconds["update"] < slept / 2
    assert seconds["checkpoint"] > 0 and seconds["collect"] > 0
    assert sum(report["this_process"]["fraction"].values()) == pytest.approx(1.0)


def evaluation_of(cli) -> PeriodicEvaluation:
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, PeriodicEvaluation))


@pytest.mark.slow
def test_a_resumed_run_writes_one_report_and_one_learning_curve_for_the_whole_run(tmp_path):
    evaluation = {"class_path": "callbacks.schedule.PeriodicEvaluation", "init_args": {"every_n_frames": 40}}
    config = write_config(with_report(chain_config("dqn", tmp_path), evaluation), tmp_path / "c.yaml")
    first = fit(config, "--trainer.max_steps", "30")
    first_report = json.loads((tmp_path / "throughput.json").read_text())  # no logger: default_root_dir
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["callbacks"]["PeriodicEvaluation"]["history"]
    resumed = fit(config, "--trainer.max_steps", "60", "--ckpt_path", str(checkpoint))

    report = json.loads((tmp_path / "throughput.json").read_text())
    this, whole = report["this_process"], report["whole_run"]
    assert this["updates"] == 30 and whole["updates"] == 60 and whole["processes"] == 2
    assert (
        whole["frames"] == resumed.datamodule.frames and report["totals"]["frames_at_start"] == first.datamodule.frames
    )
    assert this["frames"] == resumed.datamodule.frames - first.datamodule.frames
    # The first process counts up to its last checkpoint (before its final evaluation), the second in full.
    assert this["wall_s"] < whole["wall_s"] <= this["wall_s"] + first_report["this_process"]["wall_s"]
    assert all(whole["seconds"][phase] >= this["seconds"][phase] for phase in throughput.TIMED_PHASES)
    assert "in 2 processes" in (tmp_path / "throughput.md").read_text()

    # One learning curve: the evaluations saved in the checkpoint, then this process's, on one clock.
    history = evaluation_of(resumed).history
    assert history[: len(saved)] == saved and len(history) > len(saved)
    assert history[0]["frames"] == 0 and history[-1]["frames"] == resumed.datamodule.frames
    assert all(later["frames"] > earlier["frames"] for earlier, later in zip(history, history[1:], strict=False))
    assert all(later["time_s"] > earlier["time_s"] for earlier, later in zip(history, history[1:], strict=False))
    assert history[-1]["time_s"] <= whole["wall_s"] + 0.05
    # The random policy was measured once, in the first process, and its figures travelled with the checkpoint.
    assert [row for row in history if "eval/random_return_mean" in row] == history[:1]
    random = evaluation_of(resumed).random
    assert random == {key: value for key, value in history[0].items() if key.startswith("eval/random_")}
    spread = {f"eval/random_return_{figure}" for figure in ("std", "iqm", "ci_low", "ci_high")}
    assert set(random) == {"eval/random_return_mean", "eval/random_length_mean", *spread}  # the chain env: no food
    assert evaluation_of(first).random == random
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_the_report_names_the_program_without_the_machines_paths():
    """A report is copied into the documentation: its command says how the run started, not where the checkout or
    the virtual environment lie."""
    from callbacks.throughput import program

    assert program("/somewhere/checkout/app/__main__.py") == "python -m app"
    assert program("/somewhere/.venv/bin/lightrl") == "lightrl"
    assert program("benchmarks/update_cost.py") == "update_cost.py"


def test_the_ingest_benchmark_feeds_the_learner_its_premade_batches_and_reports_both_fits(tmp_path, monkeypatch):
    # benchmarks/learner_ingest.py on the chain env (128 frames a batch, 8 updates each): the premade fit trains on
    # copies of the 4 batches collected when it started, in turn; both fits' reports give the figures of ingest.json.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import learner_ingest

    monkeypatch.chdir(tmp_path)
    handed: dict[int, list] = {}  # each PremadeBatches (the warm-up fit's, the measured fit's): what it handed out
    collect = learner_ingest.PremadeBatches.collect

    def recorded(self, steps=0):
        batch = collect(self, steps)
        handed.setdefault(id(self), []).append((batch, batch.clone()))  # as handed out: the learner adds to it
        return batch

    monkeypatch.setattr(learner_ingest.PremadeBatches, "collect", recorded)
    config = write_config(evaluated_chain_config("ppo", every_n_frames=10**9, max_steps=8), tmp_path / "chain.yaml")
    result = learner_ingest.main(["--config", str(config), "--updates", "240", "--warmup-updates", "4", "--out", "out"])
    warmup, measured = handed.values()
    assert len(warmup) == 1 and len(measured) == 30  # 4 and 240 updates
    assert (measured[4][1] == measured[0][1]).all() and measured[4][0] is not measured[0][0]  # the first, a new copy
    assert not any((measured[0][1] == other).all() for _, other in measured[1:4])  # four different batches
    written = json.loads((tmp_path / "out" / "ingest.json").read_text())
    assert written == result and result["frames_per_batch"] == 128
    assert result["ingest_frames_per_s"] > 0 and result["collected_frames_per_s"] > 0
    assert result["ratio"] == result["premade_updates_per_s"] / result["collected_updates_per_s"]
    for kind in ("premade", "collected"):
        report = json.loads(next((tmp_path / "out" / kind).glob("version_*/throughput.json")).read_text())
        assert result[f"{kind}_updates_per_s"] == report["steady_state"]["updates_per_s"]
    assert result["torch_threads"] == torch.get_num_threads()  # no --threads: the fits ran on this process's


def test_the_env_speed_benchmark_counts_the_operations_and_host_reads_of_a_step(monkeypatch):
    # benchmarks/env_speed.py --count-ops on a step whose work is known: two host reads (a bool() and an .item()) and
    # five ATen operations of its own per step; then on the Snake torch backend, whose CPU path reads its masks.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import env_speed

    x = torch.arange(8)

    def known_step(action: torch.Tensor) -> None:
        if bool((x > action).any()):  # gt, any, a host read
            (x + action).sum().item()  # add, sum, a host read

    counted = env_speed.count_operations(known_step, torch.zeros(3, dtype=torch.long))
    assert counted["host_reads"] == 2
    assert counted["aten_ops"] >= 5  # the ops above and the reads' own (item, is_nonzero, _local_scalar_dense)
    report = env_speed.main(
        ["--env", "snake", "--backend", "torch", "--num-envs", "64", "--steps", "5"]
        + ["--repeats", "1", "--count-ops", "3"]
    )
    assert report["per_step"]["host_reads"] >= 1 and report["per_step"]["aten_ops"] > 100

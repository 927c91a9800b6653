"""Training-episode statistics (datamodules/episodes.py): the logged return, length and episode count are those of the
episodes that actually ended in the collected batches, counted step by step here, for every way of collecting."""

from __future__ import annotations

import csv
import math
import threading

import pytest
import torch
from tensordict import TensorDict

from checkpoints.files import save_atomically
from compat.torchrl import WORKER_KEY
from datamodules.episodes import EpisodeStatistics
from tests.helpers import chain_config, fit, write_config


def step_by_step(batches: list[TensorDict], metric_keys: tuple[str, ...] = ()) -> list[list[dict[str, float]]]:
    """Per batch, the episodes that ended in it, each ``{"return", "length", <metric>}``: every row's sums carried
    step by step across the batches (an asynchronous worker's batch continues that worker's rows only)."""
    running: dict[int, dict[str, float]] = {}
    ended_per_batch = []
    for batch in batches:
        steps = batch.shape[-1]
        done = batch["next", "done"].reshape(-1, steps)
        values = {"return": batch["next", "reward"].reshape(-1, steps), "length": torch.ones(done.shape)}
        values.update({key: batch["next", key].reshape(-1, steps) for key in metric_keys})
        offset = int(batch[WORKER_KEY].reshape(-1)[0]) * done.shape[0] if WORKER_KEY in batch.keys(True) else 0
        ended = []
        for row in range(done.shape[0]):
            sums = running.setdefault(offset + row, dict.fromkeys(values, 0.0))
            for t in range(steps):
                for key, value in values.items():
                    sums[key] += float(value[row, t])
                if done[row, t]:
                    ended.append(dict(sums))
                    sums.update(dict.fromkeys(values, 0.0))
        ended_per_batch.append(ended)
    return ended_per_batch


def test_the_sums_continue_across_batches_and_restart_at_every_episode_end():
    generator = torch.Generator().manual_seed(0)
    stats = EpisodeStatistics(("laps", "lap_time"), {"lap_time": "laps"}, rows=6, agents_per_env=1)
    batches = []
    for steps in (1, 5, 3, 8):
        shape = (6, steps, 1)
        done = torch.rand(shape, generator=generator) < 0.3
        laps = (torch.rand(shape, generator=generator) < 0.5).float() * done
        next_ = {"reward": torch.randn(shape, generator=generator), "done": done, "laps": laps}
        next_["lap_time"] = torch.rand(shape, generator=generator) * done
        batches.append(TensorDict({"next": next_}, batch_size=(6, steps)))
    reported = []
    for batch in batches:
        stats.observe(batch)
        stats.count()
        reported.append(stats.report())
    previous: dict[str, float] = {}  # the last report's means, which a report without ended episodes repeats
    for figures, ended in zip(reported, step_by_step(batches, ("laps", "lap_time")), strict=True):
        means = {key: value for key, value in figures.items() if key != "data/episodes"}
        if not ended:
            assert means == previous  # the same float objects: NaN included
            continue
        previous = means
        for key in ("return", "length", "laps"):
            assert figures[f"train/{key}_mean"] == pytest.approx(sum(e[key] for e in ended) / len(ended), abs=1e-5)
        lapped = [e["lap_time"] for e in ended if e["laps"] > 0]
        expected = sum(lapped) / len(lapped) if lapped else math.nan
        assert figures["train/lap_time_mean"] == pytest.approx(expected, abs=1e-5, nan_ok=True)
    assert reported[-1]["data/episodes"] == sum(len(ended) for ended in step_by_step(batches))


def test_a_checkpoint_written_while_a_feeder_thread_observes_is_the_state_it_was_taken_at(tmp_path):
    """Asynchronous workers' batches are observed in the feeder thread while the learner writes a checkpoint: the
    state handed to ``torch.save`` is a copy, so the file is whole (read back as written) and stays what it was."""
    stats = EpisodeStatistics((), {}, rows=4096, agents_per_env=1)
    batch = TensorDict(
        {"next": {"reward": torch.ones(4096, 4, 1), "done": torch.zeros(4096, 4, 1, dtype=torch.bool)}},
        batch_size=(4096, 4),
    )
    stats.observe(batch)
    state = stats.state_dict()
    taken = {key: value.clone() for key, value in state.items() if torch.is_tensor(value)}
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            stats.observe(batch)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        for attempt in range(20):
            save_atomically(stats.state_dict(), tmp_path / f"state{attempt}.pt", verify=True)
    finally:
        stop.set()
        feeder.join()
    assert stats.running[0, 0] > 4  # the feeder did run on
    for key, value in taken.items():
        assert torch.equal(state[key], value), key
    saved = torch.load(tmp_path / "state19.pt")
    assert bool((saved["running"][:, 0] == saved["running"][0, 0]).all())  # one moment's sums, not a torn mixture


COLLECTIONS = {
    "in_process_dqn": ("dqn", {}),
    "prefetch_dqn": ("dqn", {"class_path": "datamodules.collection.InProcess", "init_args": {"prefetch": True}}),
    "env_workers_dqn": ("dqn", {"class_path": "datamodules.collection.EnvWorkers", "init_args": {"workers": 2}}),
    "async_workers_dqn": (
        "dqn",
        {"class_path": "datamodules.collection.AsyncCollectorWorkers", "init_args": {"workers": 2, "learner_nice": 0}},
    ),
    "in_process_ppo": ("ppo", {}),
    "collector_workers_ppo": (
        "ppo",
        {"class_path": "datamodules.collection.CollectorWorkers", "init_args": {"workers": 2}},
    ),
    "multi_agent_recurrent_ppo": ("recurrent", {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COLLECTIONS))
def test_logged_episode_figures_are_those_of_the_episodes_that_ended(tmp_path, monkeypatch, name):
    agent, collection = COLLECTIONS[name]
    observed: list[TensorDict] = []
    observe = EpisodeStatistics.observe

    def record(self, batch):
        keys = [("next", "reward"), ("next", "done"), WORKER_KEY]
        observed.append(batch.select(*keys, strict=False).clone())
        observe(self, batch)

    monkeypatch.setattr(EpisodeStatistics, "observe", record)
    config = chain_config(agent, tmp_path, **({"collection": collection} if collection else {}))
    if agent != "recurrent":  # short chain episodes, so that many end in a short run
        config["data"]["init_args"]["env"] = {**config["data"]["init_args"]["env"], "init_args": {"max_steps": 7}}
    config["trainer"].update(max_steps=40, log_every_n_steps=10)
    config["trainer"]["logger"] = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(tmp_path / "runs"), "name": "chain"},
    }
    cli = fit(write_config(config, tmp_path / "c.yaml"))
    agents = cli.datamodule.agents_per_env

    with open(tmp_path / "runs/chain/version_0/metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row["train/loss"]]
    assert [int(row["step"]) for row in rows] == [9, 19, 29, 39]
    # The episodes in the order they were counted; each logged row covers those since the row before it.
    episodes = [episode for ended in step_by_step(observed) for episode in ended]
    reported = 0
    for row in rows:
        counted = round(float(row["data/episodes"]) * agents)  # an episode is every agent's of one environment
        since = episodes[reported:counted]
        if since:
            for key in ("return", "length"):
                expected = sum(e[key] for e in since) / len(since)
                assert float(row[f"train/{key}_mean"]) == pytest.approx(expected, abs=1e-5), (row["step"], key)
        else:
            assert row["train/return_mean"] == ""
        reported = counted
    assert reported > 0  # episodes ended, and not all alike:
    assert len({(row["train/return_mean"], row["train/length_mean"]) for row in rows}) > 1


def test_one_step_rounds_take_the_short_road_to_the_same_sums_to_the_bit():
    from datamodules import episodes

    generator = torch.Generator().manual_seed(1)
    running = torch.randn(64, 4, generator=generator) * 100
    running[:3] = torch.tensor([-0.0, float("inf"), float("nan"), 1.0])  # signed zero, infinities, NaN as they come
    values = torch.randn(64, 1, 4, generator=generator)
    done = torch.rand(64, 1, generator=generator) < 0.5
    general = (running, torch.cat([values, torch.zeros(64, 1, 4)], 1), torch.cat([done, torch.zeros_like(done)], 1))
    short = episodes._episode_sums(running, values, done)
    # The general road over two steps whose second adds nothing and ends nothing: its first step's ended sums, and
    # running sums that the second step's zeros leave as they were.
    long_running, long_ended = episodes._episode_sums(*general)
    for ours, theirs in ((short[0], long_running), (short[1], long_ended.reshape(64, 2, 4)[:, 0])):
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))  # bitwise, NaN and -0.0 included


@pytest.mark.parametrize("steps", [1, 4])
def test_a_batch_where_no_episode_ends_takes_the_short_road_to_the_same_sums_to_the_bit(steps):
    """On the CPU a batch in which no episode ends only carries the running sums on (two operations): the same bits
    as the whole-batch road (which a batch on an accelerator takes whatever its flags), and so the same sums for the
    episodes that end in the batches after it."""
    from datamodules import episodes

    generator = torch.Generator().manual_seed(2)
    batches = []
    for ends in (False, False, True, False):
        done = (torch.rand(8, steps, 1, generator=generator) < 0.4) & ends
        next_ = {"reward": torch.randn(8, steps, 1, generator=generator) * 7, "done": done}
        next_["laps"] = torch.rand(8, steps, 1, generator=generator)
        batches.append(TensorDict({"next": next_}, batch_size=(8, steps)))
    assert batches[2]["next", "done"].any()

    stats = EpisodeStatistics(("laps",), {}, rows=8, agents_per_env=1)
    running, pending = torch.zeros(8, 3), torch.zeros(4)
    for batch in batches:
        stats.observe(batch)
        # The whole-batch road, by hand: every batch through _episode_sums.
        done = batch["next", "done"].reshape(8, steps)
        columns = [batch["next", key].reshape(8, steps) for key in ("reward", "laps")]
        values = torch.stack([columns[0], torch.ones(8, steps), columns[1]], dim=-1)
        running, ended = episodes._episode_sums(running, values, done)
        pending += torch.cat([done.sum().float().reshape(1), ended.sum(0)])
        for ours, theirs in ((stats.running, running), (stats.pending, pending)):
            assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))  # bitwise
    assert stats.pending[0] == batches[2]["next", "done"].sum()  # the episodes that ended, counted once

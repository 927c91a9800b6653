"""Replay fed by asynchronous collector worker processes (datamodules/collection.py's AsyncCollectorWorkers) and
rollouts from workers in step with the learner (CollectorWorkers), on the chain world: real TorchRL multi-process
collectors and worker processes, a real Lightning loop."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tensordict import TensorDict
from torchrl.collectors import MultiAsyncCollector
from torchrl.envs import GymEnv
from torchrl.modules import QValueActor

import datamodules.workers
from app.cli import main
from datamodules.collection import AsyncCollectorWorkers, CollectorWorkers, _Feeder
from datamodules.episodes import EpisodeStatistics
from datamodules.evaluation import EvaluationOptions
from datamodules.replay import ReplayDataModule
from datamodules.workers import WorkerWatch, multi_process_collector, use_forkserver, worker_death_error
from envs.testing.chain import ChainEnv
from modules.dqn import DQN, ExplorationOptions
from modules.networks import NetworkOptions
from tests.app_process import start_app
from tests.helpers import CHAIN, ROOT, chain_config, fit, saved_replay, weights, write_config


def parallel_config(tmp_path, **data) -> dict:
    config = chain_config("dqn", tmp_path)
    init = config["data"]["init_args"]
    workers = {"class_path": "datamodules.collection.AsyncCollectorWorkers"}
    workers["init_args"] = {"workers": 2, "learner_nice": 0}
    init.update(num_envs=4, collect_steps=4, collection=workers, **data)
    return config


def async_replay(workers: int, **options) -> ReplayDataModule:
    """A replay module on the chain world fed by ``workers`` asynchronous workers of 2 environments each."""
    collection = AsyncCollectorWorkers(workers=workers, learner_nice=0)
    return ReplayDataModule(ChainEnv, num_envs=2 * workers, collection=collection, **options)


@pytest.mark.slow
def test_the_learner_trains_on_what_the_workers_deliver_and_stores_every_frame(tmp_path):
    config = parallel_config(tmp_path)
    config["trainer"]["max_steps"] = 40
    cli = fit(write_config(config, tmp_path / "c.yaml"))
    data = cli.datamodule
    assert cli.trainer.global_step == 40 and data.samples == 40 * data.batch_size
    # Every delivered frame is in the buffer (no drops), in batches of one worker: 2 environments x 4 steps.
    assert data.frames >= data.warmup_frames and data.frames % 8 == 0
    assert len(data.buffer) == data.frames
    # At most one update per frames_per_update frames (2): the learner waited for frames when it was faster.
    assert data.frames >= 2 * 40
    assert (tmp_path / "collector_workers" / "worker0.log").exists()


@pytest.mark.slow
def test_the_learners_weights_reach_the_workers_when_pushed_and_on_a_cpu_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = async_replay(2, collect_steps=2, warmup_frames=1, batch_size=1)
    network, exploration = NetworkOptions(hidden_sizes=(8,)), ExplorationOptions(eps_start=0.0, eps_end=0.0)
    model = DQN(data.observation_spec, data.action_spec, network=network, exploration=exploration)
    data.setup("fit")
    data.connect(model.policy(), batch_keys=model.batch_keys())
    bias = model.q_network[-1][-1].bias

    def set_weights(action: int) -> None:
        with torch.no_grad():
            model.q_network[-1][-1].weight.zero_()
            bias.copy_(torch.tensor([5.0, -5.0]) if action == 0 else torch.tensor([-5.0, 5.0]))

    def push(action: int) -> None:
        set_weights(action)
        data.sync_weights()

    try:
        set_weights(0)
        data._build_collector()
        logs = data.collection._log_dir  # no trainer, so no run folder: the workers log into a temporary folder
        assert logs.parent == Path(tempfile.gettempdir()) and (logs / "worker0.log").exists()
        for action, change in ((1, push), (0, push), (1, push), (0, set_weights)):
            change(action)
            # Batches already under way (in either worker, or queued) may hold the old weights' actions: wait for three
            # batches in a row that all act with the new ones. Never seeing them means the change did not arrive.
            in_a_row = 0
            for _ in range(100):
                batch, _ = data.collection.delivered(wait=True)
                in_a_row = in_a_row + 1 if bool((batch["action"] == action).all()) else 0
                if in_a_row == 3:
                    break
            assert in_a_row == 3, f"the workers still act with the old weights after the change to action {action}"
        # The last change was not pushed: on a CPU the workers act with the learner's parameters themselves (TorchRL's
        # shared-memory weight sync moved them there), so every update reaches them at once.
        assert all(parameter.is_shared() for parameter in model.q_network.parameters())
    finally:
        data.teardown("fit")
    assert not logs.exists()  # removed with the workers (a dead worker's would stay: its error names the log)


class ExplodingChainEnv(ChainEnv):
    """The chain world whose step raises after ``explode_after`` steps (in the worker process that runs it)."""

    def __init__(
        self,
        num_envs: int = 1,
        length: int = 5,
        max_steps: int = 20,
        seed: int = 0,
        device: str = "cpu",
        explode_after: int = 50,
    ) -> None:
        super().__init__(num_envs, length, max_steps, seed, device)
        self.explode_after, self.stepped = explode_after, 0

    def init_kwargs(self) -> dict:
        return {**super().init_kwargs(), "explode_after": self.explode_after}

    def _step(self, tensordict):
        self.stepped += 1
        if self.stepped > self.explode_after:
            raise RuntimeError("the emulator exploded")
        return super()._step(tensordict)


@pytest.mark.slow
def test_a_worker_that_raises_stops_the_run_naming_it_and_its_exception_and_the_checkpoint_is_intact(tmp_path):
    config = parallel_config(tmp_path)
    config["data"]["init_args"]["env"] = {
        "class_path": "tests.data.test_parallel.ExplodingChainEnv",
        "init_args": {**CHAIN["init_args"], "explode_after": 60},
    }
    config["trainer"]["max_steps"] = 10_000
    config["trainer"]["callbacks"][0]["init_args"]["every_n_frames"] = 64
    with pytest.raises(RuntimeError) as raised:
        fit(write_config(config, tmp_path / "c.yaml"))
    message = str(raised.value)
    # How the worker's process ended after its exception comes first (an exit code; seen once in a full suite run: a
    # forkserver worker ending by SIGABRT after raising, not yet explained), then the exception it raised.
    ended = r"died( \(exit code \d+\)|: killed by SIGABRT \(signal 6\))?"
    assert re.match(rf"collector worker \d {ended}: RuntimeError: the emulator exploded, at ", message), message
    assert "the last checkpoint is intact: continue from it with --ckpt_path last" in message
    checkpoint = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    assert checkpoint["global_step"] > 0 and checkpoint["ReplayDataModule"]["frames"] >= 64


@pytest.mark.slow
def test_an_error_in_the_learner_stops_the_workers_before_it_leaves_fit(tmp_path):
    # Lightning tears the data module down only when a stage ends normally; the workers are not daemon processes,
    # so unless the error stops them the interpreter waits for them at exit, forever.
    class LearnerBug(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step >= 5:  # a step may take several updates
                raise RuntimeError("a bug in the learner")

    config = parallel_config(tmp_path)
    config["trainer"]["max_steps"] = 10_000
    with pytest.raises(RuntimeError, match="a bug in the learner"):
        main(["fit", "--config", str(write_config(config, tmp_path / "c.yaml"))], extra_callbacks=[LearnerBug()])
    assert multiprocessing.active_children() == []


@pytest.mark.slow
@pytest.mark.parametrize("collection", ["CollectorWorkers", "EnvWorkers"])
def test_sigterm_to_the_runs_process_group_saves_and_stops_the_run_and_its_workers_with_the_signals_exit_status(
    tmp_path, collection
):
    # SIGTERM to every process of the run (`kill -TERM -- -PGID`, GNU timeout, a service manager stopping the job):
    # the learner gets what a scheduler's `kill` of it alone sends, and the workers, which leave stopping to the
    # learner, are still there when its checkpoint asks them for their state. Until 2026-12-01 they ended on the
    # signal and the run ended with status 1 and no checkpoint (EnvWorkers' learner even ignored SIGTERM).
    config = parallel_config(tmp_path)
    config["trainer"]["max_steps"] = 100_000
    config["data"]["init_args"]["collection"] = {
        "class_path": f"datamodules.collection.{collection}",
        "init_args": {"workers": 2},
    }
    path = write_config(config, tmp_path / "c.yaml")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = start_app("fit", "--config", str(path), cwd=tmp_path, env=env, new_session=True)  # a group the workers join
    deadline = time.monotonic() + 120
    while not (tmp_path / "collector_workers" / "worker1.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)  # the workers deliver and the learner updates (it stops after an update either way)
    assert run.poll() is None, run.stderr.read()
    os.killpg(run.pid, signal.SIGTERM)
    _, errors = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM, errors
    assert errors.strip().splitlines()[-1] == "stopped by SIGTERM: continue with --ckpt_path last"
    # A worker's log holds what the worker printed, not the learner's lines (ParallelEnv builds the first worker's
    # environments in the learner too, for their specs).
    assert "SIGTERM" not in (tmp_path / "collector_workers" / "worker0.log").read_text()
    # The run checkpointed where it stopped (its config's own interval is never reached), replay buffer beside.
    saved = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    assert saved["global_step"] > 0
    assert (tmp_path / "checkpoints" / saved["ReplayDataModule"]["buffer_folder"]).is_dir()
    deadline = time.monotonic() + 10  # the group empties once every worker has exited
    while time.monotonic() < deadline:
        try:
            os.killpg(run.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("collector workers outlived the run")


@pytest.mark.slow
def test_resume_continues_the_buffer_counters_and_weights(tmp_path):
    config = parallel_config(tmp_path)
    config["trainer"]["max_steps"] = 20
    path = write_config(config, tmp_path / "c.yaml")
    fit(path)
    saved = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    saved_storage, _ = saved_replay(tmp_path / "checkpoints/last.ckpt", saved["ReplayDataModule"])
    before = weights(tmp_path / "checkpoints/last.ckpt")
    cli = fit(path, "--trainer.max_steps", "35", "--ckpt_path", "last")
    data = cli.datamodule
    assert cli.trainer.global_step == 35
    # Frames, samples and the buffer continue from the checkpoint's (the workers start new episodes).
    state = saved["ReplayDataModule"]
    assert data.samples == state["samples"] + 15 * data.batch_size
    assert data.frames > state["frames"] and len(data.buffer) == data.frames
    stored = saved_storage["observation"][: state["frames"]]
    assert torch.equal(data.buffer.storage._storage["observation"][: state["frames"]], stored)
    after = weights(tmp_path / "checkpoints/last.ckpt")
    assert not torch.equal(before["q_network.1.0.weight"], after["q_network.1.0.weight"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        (
            "--data.init_args.collection.workers",
            "0",
            "--data.init_args.collection.init_args.workers must be >= 1, got 0",
        ),
        ("--data.init_args.buffer_size", "16", "--data.init_args.batch_size (32) must be <= buffer_size (16)"),
        (
            "--data.init_args.collection.learner_nice",
            "-1",
            "--data.init_args.collection.init_args.learner_nice must be >= 0, got -1",
        ),
    ],
)
def test_bad_options_are_one_error_line_naming_the_flag(tmp_path, capsys, flag, value, message):
    path = write_config(parallel_config(tmp_path), tmp_path / "c.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(path), flag, value])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}")


@pytest.mark.slow
def test_n_step_returns_are_refused_naming_the_flag(tmp_path):
    # Worker batches arrive interleaved, and TorchRL's n-step window is kept per batch row.
    config = parallel_config(tmp_path)
    config["model"]["init_args"]["n_steps"] = 3
    with pytest.raises(ValueError, match=r"^model.n_steps: n-step returns need the in-process collection"):
        fit(write_config(config, tmp_path / "c.yaml"))


def test_monitor_reports_the_buffer_the_queue_and_the_ended_episodes_metrics(tmp_path):
    from tensordict import TensorDict

    data = async_replay(1, warmup_frames=1, batch_size=1)
    data.episodes = EpisodeStatistics(("x_pos",), {}, rows=2, agents_per_env=1)  # Mario's metric
    done = torch.tensor([[False, True, False], [True, False, True]]).unsqueeze(-1)
    x_pos = torch.tensor([[0.0, 300.0, 0.0], [120.0, 0.0, 90.0]]).unsqueeze(-1)
    reward = torch.tensor([[1.0, 44.0, 0.0], [-3.0, 0.0, 12.0]]).unsqueeze(-1)
    worker = torch.zeros(2, 3, dtype=torch.long)
    batch = TensorDict({"next": {"done": done, "x_pos": x_pos, "reward": reward}}, batch_size=[2, 3])
    batch.set(("collector", "worker"), worker)
    data.episodes.observe(batch)
    data.episodes.count()
    figures = data.monitor()
    assert figures["data/episodes"] == 3 and figures["train/x_pos_mean"] == pytest.approx(170.0)
    assert figures["train/return_mean"] == pytest.approx(18.0)  # (45 - 3 + 12) / 3
    assert figures["train/length_mean"] == pytest.approx(5 / 3)  # 2, 1 and 2 steps
    assert figures["data/queued_batches"] == 0 and figures["data/buffer"] == 0
    # Each report covers the episodes ended since the one before; with none since, it repeats the last means (what
    # a logger shows until new ones come) and the episode count stays.
    again = data.monitor()
    assert again["data/episodes"] == 3 and again["train/x_pos_mean"] == figures["train/x_pos_mean"]


def _rollout_workers(tmp_path, monkeypatch, **options):
    """A PPO rollout module on the chain world collecting in 2 collector worker processes, ready to collect."""
    from datamodules.rollout import RolloutDataModule
    from modules.ppo import PPO

    monkeypatch.chdir(tmp_path)
    data = RolloutDataModule(
        ChainEnv,
        num_envs=4,
        collect_steps=8,
        minibatch_size=32,
        collection=CollectorWorkers(workers=2),
        evaluation=EvaluationOptions(episodes=1),
        **options,
    )
    torch.manual_seed(0)  # the same untrained network in every call
    model = PPO(data.observation_spec, data.action_spec, network=NetworkOptions(hidden_sizes=(8,)))
    data.setup("fit")
    data.connect(model.policy())
    data._build_collector()
    return data, model


@pytest.mark.slow
def test_collector_workers_act_with_the_latest_weights_in_every_batch(tmp_path, monkeypatch):
    # On-policy data: each batch is collected entirely with the weights the learner had when it asked for it.
    data, model = _rollout_workers(tmp_path, monkeypatch)
    last = [m for m in model.actor_network.modules() if isinstance(m, torch.nn.Linear)][-1]
    try:
        for action in (1, 0, 1, 0):
            with torch.no_grad():
                last.weight.zero_()
                last.bias.copy_(torch.tensor([20.0, -20.0]) if action == 0 else torch.tensor([-20.0, 20.0]))
            batch = data.collect()
            assert batch.shape == (4, 8) and bool((batch["action"] == action).all()), action
    finally:
        data.teardown("fit")


@pytest.mark.slow
def test_collector_workers_draw_their_own_exploration_noise(tmp_path, monkeypatch):
    # Every chain starts in the same cell and an untrained policy's probabilities are the same there: workers
    # drawing from the same generator state would play the same actions. Each worker's is seeded from its first
    # environment's seed, so the workers' environments play differently, and the same seed replays the same.
    first, _ = _rollout_workers(tmp_path, monkeypatch, seed=7)
    try:
        actions = first.collect()["action"]
    finally:
        first.teardown("fit")
    again, _ = _rollout_workers(tmp_path, monkeypatch, seed=7)
    try:
        assert torch.equal(again.collect()["action"], actions)
    finally:
        again.teardown("fit")
    assert not torch.equal(actions[:2], actions[2:])  # worker 0's two environments against worker 1's


def test_a_learner_far_behind_loses_the_oldest_queued_batches_not_memory():
    # The feeder holds at most a replay buffer's worth of worker batches (the learner could not sample more before the
    # buffer overwrote them): beyond that it drops the oldest, counting them and their frames. Their episodes were
    # played, so every batch, dropped or not, reaches the episode statistics.
    batches = [TensorDict(step=torch.full((4, 16), i), batch_size=[4, 16]) for i in range(7)]
    observed = []
    feeder = _Feeder(iter(batches), max_batches=3, observe=observed.append)
    feeder.start()
    feeder.join(timeout=30)
    kept = [int(feeder.batches.get_nowait()["step"][0, 0]) for _ in range(feeder.batches.qsize())]
    assert kept == [4, 5, 6] and feeder.dropped_batches == 4
    assert observed == batches
    assert feeder.take_dropped_frames() == 4 * 64 and feeder.take_dropped_frames() == 0


def _exits_at_once() -> None:
    pass


def _slow_to_stop() -> None:
    # A worker that takes longer to stop than TorchRL's fixed 0.1 s wait: one busy on a loaded machine.
    signal.signal(signal.SIGTERM, lambda *args: (time.sleep(0.5), os._exit(0)))
    time.sleep(60)


def test_a_dead_worker_is_named_even_when_the_others_are_slow_to_stop():
    # TorchRL's own check closed the survivors 0.1 s after terminating them, and a survivor still running made close()
    # raise ValueError, which hid the error naming the dead worker (a SIGKILLed collector worker in the fault soak).
    import torchrl.collectors._multi_sync

    from compat.torchrl import check_for_dead_worker

    assert torchrl.collectors._multi_sync._check_for_faulty_process is check_for_dead_worker  # datamodules.workers
    context = multiprocessing.get_context("fork")
    dead, slow = context.Process(target=_exits_at_once), context.Process(target=_slow_to_stop)
    dead.start(), slow.start()
    dead.join()
    time.sleep(0.2)  # the survivor's SIGTERM handler in place
    with pytest.raises(RuntimeError, match=r"worker 0 \(exit code 0\)"):
        check_for_dead_worker([dead, slow])
    with pytest.raises(ValueError):  # closed
        slow.is_alive()


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_the_watch_names_the_worker_killed_first_and_stops_the_others(start_method):
    # Spawned workers are this process's children (their exit code read by the watch); forkserver's are the server's
    # (their end seen in /proc, their code read from the process objects). Either way the watch sees the death,
    # kills the others so that no wait of the learner hangs, and the error names the first to die.
    context = multiprocessing.get_context(start_method)
    watch = WorkerWatch(poll_s=0.05)
    watch.start()
    workers = [context.Process(target=time.sleep, args=(60,)) for _ in range(3)]
    try:
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 30
        while len(watch.workers) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.workers == [worker.pid for worker in workers]
        os.kill(workers[1].pid, signal.SIGKILL)
        watch.join(timeout=10)
        for worker in workers:
            worker.join(timeout=10)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
    assert watch.death[0] == 1 and not watch.ended_together
    assert [worker.exitcode for worker in workers] == [-signal.SIGKILL] * 3
    # TorchRL's own check may then report a worker the watch killed (the first it finds ended): still worker 1.
    torchrl_report = RuntimeError("At least one process failed: worker 0 (exit code -9). Check for more infos.")
    error = worker_death_error(torchrl_report, None, 1024, watch, processes=workers)
    assert str(error).startswith("collector worker 1 died: killed by SIGKILL (signal 9"), error
    assert str(error).endswith("the last checkpoint is intact: continue from it with --ckpt_path last")
    # A run that had saved no checkpoint yet (and resumed from none) is not told to continue from one.
    early = worker_death_error(torchrl_report, None, 1024, watch, processes=workers, checkpointed=False)
    assert str(early).endswith(
        "training stopped before its first checkpoint, so there is nothing to continue: start it again"
    )


@pytest.mark.parametrize("numbered", [False, True], ids=["found among the children", "numbered by the learner"])
def test_a_worker_that_a_look_does_not_find_is_still_watched(numbered, monkeypatch):
    # A worker that is ending has no command line left before it becomes a zombie, so a look at the children in that
    # moment does not find it: the watch let it go, then saw the worker that TorchRL stopped after it end, and the error
    # named that one (worker 0 for a killed worker 1). Here every look misses worker 1 while it still runs; then it is
    # killed. Numbered (as the learner numbers its workers once they have started), a process started after is no
    # worker, and its end no death.
    context = multiprocessing.get_context("spawn")
    watch = WorkerWatch(poll_s=0.02)
    watch.start()
    workers = [context.Process(target=time.sleep, args=(60,)) for _ in range(2)]
    later = context.Process(target=time.sleep, args=(0.1,))
    try:
        for worker in workers:
            worker.start()
        pids = [worker.pid for worker in workers]
        deadline = time.monotonic() + 30
        while watch.workers != pids and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watch.workers == pids
        if numbered:
            watch.number(pids)
            later.start()
            later.join(timeout=30)
        every = datamodules.workers.worker_pids

        def without_worker_1(pid: int | None = None) -> list[int]:
            return [found for found in every(pid) if found != pids[1]]

        monkeypatch.setattr(datamodules.workers, "worker_pids", without_worker_1)
        time.sleep(0.3)  # looks that miss worker 1
        assert watch.workers == pids and watch.death is None
        os.kill(pids[1], signal.SIGKILL)
        watch.join(timeout=10)
    finally:
        for worker in workers:
            worker.kill()
            worker.join(timeout=10)
    assert watch.death == (1, -signal.SIGKILL) and not watch.ended_together


#: A forkserver whose preload starts a process of its own, as glfw does when TorchRL imports MuJoCo: the helper ends
#: while two workers run, and the watch must not take it for a worker that died.
HELPER_IN_THE_SERVER = """
import multiprocessing, sys, time
from datamodules.workers import WorkerWatch
if __name__ == "__main__":
    multiprocessing.set_forkserver_preload(["starts_a_helper"])
    context = multiprocessing.get_context("forkserver")
    watch = WorkerWatch(poll_s=0.02)
    watch.start()
    workers = [context.Process(target=time.sleep, args=(60,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    time.sleep(2.0)  # the helper (1 s) has come and gone
    print(watch.workers == [worker.pid for worker in workers], watch.death)
    for worker in workers:
        worker.kill()
"""


@pytest.mark.slow
def test_a_process_the_forkserver_starts_while_importing_is_no_worker(tmp_path):
    (tmp_path / "starts_a_helper.py").write_text(
        "import subprocess, sys\nhelper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1)'])\n"
    )
    (tmp_path / "run.py").write_text(HELPER_IN_THE_SERVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=99)
    assert done.stdout.split() == ["True", "None"], done.stdout + done.stderr


@pytest.mark.slow
def test_a_process_the_forkserver_forks_and_that_runs_a_program_later_is_no_worker(tmp_path):
    # Between its fork and its exec a process keeps the server's command line: a busy machine made that moment span a
    # look of the watch, which took the process for worker 0 and its end for a death. Here the moment spans several.
    (tmp_path / "starts_a_helper.py").write_text(
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(0.3)\n"
        "    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(1)'])\n"
    )
    (tmp_path / "run.py").write_text(HELPER_IN_THE_SERVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=99)
    assert done.stdout.split() == ["True", "None"], done.stdout + done.stderr


def test_of_workers_that_ended_together_the_error_names_the_one_killed_not_one_that_exited_cleanly():
    # Forkserver workers' codes are unknown to the watch: when it first sees two ended at once (the killed one and a
    # survivor that TorchRL's shutdown let exit cleanly), the error reads their codes and names the killed one,
    # whatever their order (a busy machine made the clean exit's worker 0 the one named).
    context = multiprocessing.get_context("forkserver")
    workers = [context.Process(target=time.sleep, args=(delay,)) for delay in (0, 60)]
    for worker in workers:
        worker.start()
    os.kill(workers[1].pid, signal.SIGKILL)
    for worker in workers:
        worker.join(timeout=30)
    assert [worker.exitcode for worker in workers] == [0, -signal.SIGKILL]
    watch = WorkerWatch()  # as its look at the two found them: both ended, codes unknown, by index
    watch.death, watch.ended = (0, None), [0, 1]
    error = worker_death_error(EOFError(), None, 1024, watch, processes=workers)
    assert str(error).startswith("collector worker 1 died: killed by SIGKILL (signal 9"), error


def test_a_worker_that_died_before_the_watch_saw_it_is_named_from_its_process_object():
    # A worker refusing a resumed checkpoint's state can start and die between two looks of the watch, which then
    # never sees it: the learner's closed pipe was a traceback (EOFError), the process then waiting at exit for good.
    context = multiprocessing.get_context("forkserver")
    workers = [context.Process(target=time.sleep, args=(60,)), context.Process(target=sys.exit, args=(3,))]
    for worker in workers:
        worker.start()
    try:
        workers[1].join(timeout=30)
        watch = WorkerWatch()  # it saw no death
        watch.start()
        started = time.monotonic()
        watch.settle(timeout_s=20.0, ending=True, processes=workers)  # the wait for an end it will never see: over
        assert time.monotonic() - started < 5 and watch.death is None
        error = worker_death_error(EOFError(), None, 1024, watch, processes=workers)
        watch.stop()
    finally:
        workers[0].kill()
    assert str(error).startswith("collector worker 1 died (exit code 3), at 1,024 frames; training stopped"), error
    assert worker_death_error(None, None, 1024, WorkerWatch(), processes=workers) is None  # no error, no death


EXITS_WITHOUT_SHUTDOWN = """
import os, signal
from datamodules.collection import CollectorWorkers
from datamodules.replay import ReplayDataModule
from envs.testing.chain import ChainEnv
from modules.dqn import DQN
from modules.networks import NetworkOptions

if __name__ == "__main__":
    data = ReplayDataModule(ChainEnv, num_envs=4, collection=CollectorWorkers(workers=2))
    model = DQN(data.observation_spec, data.action_spec, network=NetworkOptions(hidden_sizes=(8,)))
    data.setup("fit")
    data.connect(model.policy(), None, model.batch_keys())
    data._build_collector()
    for process in data.collection.collector.procs:  # the workers gone, as after a death the watch saw
        os.kill(process.pid, signal.SIGKILL)
        process.join()
    raise SystemExit(3)  # no teardown: the collector and its weight scheme are left to the interpreter's exit
"""


@pytest.mark.slow
def test_a_learner_ending_on_an_error_before_shutting_its_collector_down_exits(tmp_path):
    # TorchRL's weight scheme, cleaned up at the interpreter's exit, started a queue's thread then and waited for it
    # for good: a run that ended on an uncaught error with its workers dead never exited.
    script = tmp_path / "ends.py"
    script.write_text(EXITS_WITHOUT_SHUTDOWN)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment, timeout=90, capture_output=True)
    assert done.returncode == 3, done.stderr[-2000:]


@pytest.mark.skipif(sys.platform != "linux", reason="the forkserver is lightrl's choice on Linux only")
def test_workers_start_from_a_forkserver_although_importing_torchrl_chose_spawn():
    # Importing TorchRL sets `spawn` as the global start method; a worker collection replaces that default with a
    # forkserver that imported torch once (a program's own `fork` stays: the third line).
    script = (
        "import multiprocessing as mp, torchrl; from datamodules.workers import use_forkserver;"
        "print(mp.get_start_method()); use_forkserver(); print(mp.get_start_method());"
        "mp.set_start_method('fork', force=True); use_forkserver(); print(mp.get_start_method())"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["spawn", "forkserver", "fork"], done.stdout + done.stderr


def test_a_push_writes_the_weights_the_workers_share_once():
    """The workers on one device share one shared-memory copy of the policy's weights: a push writes it once, not
    once per worker (TorchRL 0.14.1 wrote it once per worker: 14 copies of Mario's network from the GPU a push).
    That the workers act with what a push wrote: test_the_learners_weights_reach_the_workers_when_pushed_..."""
    policy = QValueActor(torch.nn.Linear(4, 2), in_keys=["observation"], spec=GymEnv("CartPole-v1").action_spec)
    make_env = partial(GymEnv, "CartPole-v1")
    use_forkserver()  # the workers start as the collection strategies start theirs
    collector = multi_process_collector(MultiAsyncCollector, [make_env] * 2, policy, 8, torch.device("cpu"))
    try:
        next(iter(collector))
        with torch.profiler.profile() as profile:
            collector.update_policy_weights_()
        assert [event.name for event in profile.events()].count("aten::_foreach_copy_") == 1
    finally:
        collector.shutdown()

"""Issue 30: a worker killed as the out-of-memory killer kills (SIGKILL), or memory that a config cannot have, stops the
run with one line saying so, within seconds, and no worker left behind; a config whose stores cannot fit is refused at
start with the numbers (datamodules/memory.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from app.errors import fatal_error_line
from compat.torchrl import storage_contents
from datamodules.collection import CollectorWorkers
from datamodules.memory import WORKER_POOL, MemoryNeed, check_memory
from datamodules.replay import ReplayDataModule
from datamodules.workers import worker_pids
from envs.snake.env import SnakeEnv
from tests.app_process import AppProcess, run_app_process, start_app
from tests.helpers import ROOT, app_in_process, short_snake_fit

SNAKE_DQN = ROOT / "configs" / "snake_dqn.yaml"
#: A short Snake DQN run: a small buffer, an early first update, a checkpoint every 1,024 frames (the list of callbacks
#: replaced by a second config file), eager updates (no compilation wait).
SHORT = (
    "--threads", "1", "--trainer.max_time", "null", "--trainer.enable_progress_bar", "false",
    "--data.init_args.env.init_args.backend", "torch", "--model.init_args.compile", "false",
    "--data.init_args.buffer_size", "5000", "--data.init_args.warmup_frames", "600",
)  # fmt: skip
CHECKPOINTS = (
    "trainer:\n  callbacks:\n"
    "    - {class_path: callbacks.schedule.FrameCheckpoint, init_args: {every_n_frames: 1024}}\n"
)


def _group_ends(group: int, seconds: float = 10.0) -> list[str]:
    """The processes of ``group`` still running ``seconds`` after the run's own process ended (none, once its workers
    and multiprocessing's resource tracker, which exits when it sees the run's end, have gone): waited for, since
    a loaded machine schedules their exits late."""
    deadline = time.monotonic() + seconds
    while (alive := _alive_in_group(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _alive_in_group(group: int) -> list[str]:
    """Processes of process group ``group`` that are still running (zombies have ended)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            alive.append(f"{entry.name} {(entry / 'cmdline').read_bytes()[:80]!r}")
    return alive


def _fit_with_workers(tmp_path: Path, strategy: str, *flags: str) -> AppProcess:
    """``python -m app fit`` of the short Snake DQN run (``flags`` before the shortening ones) collected by 2
    ``strategy`` workers, started in ``tmp_path`` (on its module path: ``python -m``), in a process group of its own,
    which its workers join."""
    args = ["fit", "--config", str(SNAKE_DQN), *flags, *SHORT]
    args += ["--data.init_args.collection", strategy, "--data.init_args.collection.workers", "2"]
    return start_app(*args, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["EnvWorkers", "CollectorWorkers", "AsyncCollectorWorkers"])
def test_a_worker_killed_by_sigkill_stops_the_run_within_seconds_with_one_line(tmp_path, strategy):
    (tmp_path / "checkpoints.yaml").write_text(CHECKPOINTS)
    run = _fit_with_workers(tmp_path, strategy, "--config", "checkpoints.yaml")
    try:
        checkpoint = tmp_path / "runs/snake_dqn/version_0/checkpoints/last.ckpt"
        deadline = time.monotonic() + 180
        while not checkpoint.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = worker_pids(run.pid)  # spawned, or forked by the run's forkserver
        assert run.poll() is None and len(workers) == 2, run.stderr.read() if run.poll() is not None else workers
        os.kill(workers[1], signal.SIGKILL)  # what the out-of-memory killer sends
        killed = time.monotonic()
        _, errors = run.communicate(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 1, errors
    assert elapsed < 30, f"the run took {elapsed:.0f} s to stop"
    lines = [line for line in errors.splitlines() if line.startswith("error:")]
    # The error is the last line: nothing after it (multiprocessing's resource tracker warned of "leaked semaphore
    # objects" when the process ended without unlinking its workers' semaphores).
    assert len(lines) == 1 and lines == errors.strip().splitlines()[-1:] and "Traceback" not in errors, errors
    kind = "environment" if strategy == "EnvWorkers" else "collector"
    assert lines[0].startswith(f"error: {kind} worker 1 died: killed by SIGKILL (signal 9"), lines[0]
    assert "the last checkpoint is intact: continue from it with --ckpt_path last" in lines[0]
    assert _group_ends(run.pid) == []
    saved = torch.load(checkpoint, weights_only=True)  # whole: it loads
    assert saved["global_step"] > 0 and saved["ReplayDataModule"]["frames"] >= 1024


#: A process holding a worker's queue and lock (named semaphores, under the forkserver) when it ends on an error.
ENDS_ON_AN_ERROR = """
import multiprocessing
from app.errors import exit_now
if __name__ == "__main__":
    context = multiprocessing.get_context("forkserver")
    held = [context.Queue(), context.Lock(), context.Event()]
    exit_now("collector worker 1 died")
"""


def test_a_process_ending_on_an_error_prints_its_line_and_nothing_after_it(tmp_path):
    # exit_now ends the process at once (os._exit), which skips the unlinking of its named semaphores: multiprocessing's
    # resource tracker then unlinked them and printed a warning about "leaked semaphore objects" after the error line
    # (a MettaGrid run whose collector worker was killed: 23 of them).
    (tmp_path / "run.py").write_text(ENDS_ON_AN_ERROR)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == "error: collector worker 1 died\n", done.stderr


def _limit_address_space() -> None:
    # Far below the buffer asked for: had anything tried to allocate it, the run would fail another way.
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


@pytest.mark.slow
def test_a_buffer_that_cannot_fit_is_refused_at_start_naming_the_flag_with_the_numbers(tmp_path):
    args = ["fit", "--config", str(SNAKE_DQN), *SHORT[:-4], "--data.init_args.buffer_size", "10000000000"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_app_process(*args, cwd=tmp_path, env=env, timeout=120, preexec=_limit_address_space)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines == done.stderr.strip().splitlines()[-1:], done.stderr
    assert lines[0].startswith("error: --data.init_args.buffer_size 10000000000: the replay buffer needs ")
    assert " GB, this machine has " in lines[0] and "skip this check with --memory_check false" in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing written


def test_the_check_refuses_the_largest_need_and_warns_near_the_limit():
    cpu = torch.device("cpu")
    needs = [
        MemoryNeed("the replay buffer", "data.buffer_size 100", 70, cpu),
        MemoryNeed("the model and its optimizer", "--model", 15, cpu),
    ]
    assert check_memory(needs, {cpu: (1000, "MemAvailable")}) == []
    (warning,) = check_memory(needs, {cpu: (100, "MemAvailable")})
    assert "the run needs 0.1 kB of the 0.1 kB available on cpu" in warning and "buffer_size 100" in warning
    with pytest.raises(ValueError, match=r"^data.buffer_size 100: the replay buffer needs 0.1 kB, this"):
        check_memory(needs, {cpu: (80, "MemAvailable")})


@pytest.mark.slow
def test_the_estimate_of_a_shipped_configs_buffer_is_close_to_what_it_allocates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = short_snake_fit(
        "snake_dqn.yaml",
        "--trainer.max_steps", "5", "--trainer.logger", "false", "--model.init_args.compile", "false",
        "--data.init_args.buffer_size", "4096", "--data.init_args.warmup_frames", "600",
    )  # fmt: skip
    data = cli.datamodule
    allocated = storage_contents(data.buffer.storage).bytes()
    (estimate,) = [need.nbytes for need in data.memory_needs(data.device) if need.what == "the replay buffer"]
    # The estimate counts every entry a transition may have; the buffer keeps only those the update reads.
    assert allocated / 2 <= estimate <= allocated * 2, (estimate, allocated)


def test_memory_that_ran_out_is_one_line_saying_where_and_what_to_make_smaller():
    def update() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79 GiB total)")

    try:
        update()
    except torch.OutOfMemoryError as error:
        line = fatal_error_line(error)
    assert fatal_error_line(RuntimeError("a bug")) is None  # any other error keeps its traceback
    assert line.startswith("out of memory in tests/app/test_failures.py:")
    assert "--data.init_args.buffer_size" in line and "--data.init_args.batch_size" in line


def _snake_replay(workers: int | None) -> ReplayDataModule:
    """A small replay module of the shipped Snake environment (torch backend), collected by ``workers`` collector
    worker processes of 2 environments each (None: in this process)."""
    collection = {"collection": CollectorWorkers(workers)} if workers else {}
    env = partial(SnakeEnv, backend="torch")
    return ReplayDataModule(env, num_envs=2 * (workers or 1), buffer_size=64, batch_size=32, **collection)


def test_the_worker_processes_estimate_grows_by_each_workers_measured_cost_and_names_the_flag():
    data = _snake_replay(2)

    def need(collection: CollectorWorkers) -> MemoryNeed:
        (found,) = [need for need in collection.memory_needs(data) if need.what.startswith(WORKER_POOL)]
        return found

    two, four = need(data.collection), need(CollectorWorkers(4))  # the same 4 environments, the same measurement
    assert two.flag == "data.collection.workers 2" and two.device.type == "cpu"
    assert four.flag == "data.collection.workers 4"
    assert four.nbytes - two.nbytes >= 2 * data.worker_memory.process > 0
    assert two in data.memory_needs(data.device)
    # Each worker is at least an interpreter that imported torch: what one holds, measured.
    bare = subprocess.run(
        [sys.executable, "-c", "import torch; print(open('/proc/self/statm').read())"],
        capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    resident, shared = (int(pages) for pages in bare.stdout.split()[1:3])
    assert data.worker_memory.process >= (resident - shared) * os.sysconf("SC_PAGE_SIZE")
    in_process = _snake_replay(None)
    assert in_process.worker_memory is None
    assert all(not need.what.startswith(WORKER_POOL) for need in in_process.memory_needs(in_process.device))


#: Builds a Snake replay module with 2 collector workers, collects once (the workers have built and stepped their
#: environments), and prints the estimate of the worker processes and what they hold, as JSON.
WORKERS_AGAINST_ESTIMATE = """
import json, os, sys
from functools import partial
from pathlib import Path
import torch
from datamodules.collection import CollectorWorkers
from envs.snake.env import SnakeEnv
from datamodules.memory import WORKER_POOL
from datamodules.replay import ReplayDataModule
from modules.dqn import DQN
from modules.networks import NetworkOptions

torch.set_num_threads(1)
env = partial(SnakeEnv, backend="torch")
data = ReplayDataModule(env, num_envs=8, collection=CollectorWorkers(2), buffer_size=64, batch_size=32)
model = DQN(data.observation_spec, data.action_spec, network=NetworkOptions(hidden_sizes=(256, 256)))
data.setup("fit")
data.connect(model.policy(), batch_keys=model.batch_keys())
(need,) = [need.nbytes for need in data.memory_needs(data.device) if need.what.startswith(WORKER_POOL)]
data._build_collector()
data.collect()
page = os.sysconf("SC_PAGE_SIZE")
held = []
for process in data.collector.procs:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{process.pid}/status").read_text().splitlines())
    resident, shared = (int(pages) for pages in Path(f"/proc/{process.pid}/statm").read_text().split()[1:3])
    held.append({"VmRSS": int(status["VmRSS"].split()[0]) * 1024, "private": (resident - shared) * page})
data.teardown("fit")
print(json.dumps({"estimate": need, "workers": held}))
"""


@pytest.mark.slow
def test_the_worker_processes_estimate_is_close_to_what_the_real_workers_hold(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", WORKERS_AGAINST_ESTIMATE],
        cwd=tmp_path,  # a spawned worker imports what its parent's main module imports: here, nothing of pytest's
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    estimate, workers = measured["estimate"], measured["workers"]
    assert len(workers) == 2
    private, resident = sum(w["private"] for w in workers), sum(w["VmRSS"] for w in workers)
    print(f"estimate {estimate / 1e6:.0f} MB, the workers' own {private / 1e6:.0f} MB, VmRSS {resident / 1e6:.0f} MB "
          f"({time.monotonic() - started:.0f} s)")  # fmt: skip
    assert private / 1.5 <= estimate <= private * 1.5, measured
    assert resident / 2 <= estimate <= resident * 2, measured


def test_more_workers_than_the_memory_holds_is_refused_at_start_naming_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    workers = 1 << 16  # each an interpreter with torch imported: tens of terabytes
    result = app_in_process(
        capsys, "fit", "--config", str(SNAKE_DQN), *SHORT[:-4], "--data.init_args.num_envs", str(workers),
        "--data.init_args.collection", "CollectorWorkers", "--data.init_args.collection.workers", str(workers),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines == result.stderr.strip().splitlines()[-1:], result.stderr
    assert lines[0].startswith(
        f"error: --data.init_args.collection.init_args.workers {workers}: the pool of {workers} worker processes ("
    ), lines[0]
    assert " each) needs " in lines[0]
    assert " GB, this machine has " in lines[0] and "skip this check with --memory_check false" in lines[0]
    assert multiprocessing.active_children() == [] and not (tmp_path / "runs").exists()  # nothing started or written


#: A callback, loaded beside the run (``--trainer.callbacks+=learner_limit.LowerAddressSpace``), that lowers the
#: learner's address-space limit (RLIMIT_AS) to 32 MB above what it has mapped once the collector runs, that is once
#: its worker processes were spawned (they keep the limit they started with). The learner then cannot map anything
#: larger: the allocator itself fails (ENOMEM), as it does on a machine without the memory. It writes the workers' pids
#: and, when Lightning reports the exception, the time.
LEARNER_LIMIT = """
import resource
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class LowerAddressSpace(Callback):
    lowered = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        collector = trainer.datamodule.collector
        if self.lowered or collector is None:  # the first collection spawns the workers
            return
        workers = [process.pid for process in getattr(collector, "procs", None) or collector.env._workers]
        Path("workers").write_text(" ".join(map(str, workers)))
        mapped = int(Path("/proc/self/status").read_text().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (32 << 20), resource.RLIM_INFINITY))
        self.lowered = True

    def on_exception(self, trainer, pl_module, exception):
        Path("failed_at").write_text(repr(time.time()))
"""


@pytest.mark.slow
def test_a_learner_that_cannot_allocate_stops_the_run_and_its_workers_within_seconds_with_one_line(tmp_path):
    # Collector workers: processes that hold environments and a policy (the stop path is the one every strategy's
    # workers share, shown for each kind by the SIGKILL test above).
    strategy = "CollectorWorkers"
    (tmp_path / "learner_limit.py").write_text(LEARNER_LIMIT)
    # One hidden layer of 20,000 units: each activation of a 512-transition batch is 41 MB, above the 32 MB beyond
    # which glibc maps every allocation afresh, so the update's first one fails under the limit.
    limit = "--trainer.callbacks+=learner_limit.LowerAddressSpace"
    flags = ("--model.init_args.network.hidden_sizes", "[20000]", limit)
    run = _fit_with_workers(tmp_path, strategy, *flags)
    try:
        _, errors = run.communicate(timeout=180)
        ended = time.time()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 1, errors
    lines = [line for line in errors.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in errors, errors
    assert lines[0].startswith("error: out of memory in the update (modules/"), lines[0]
    allocator = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 40960000 bytes. Error code 12 ("
    assert f"): {allocator}Cannot allocate memory); make the run smaller" in lines[0], lines[0]  # whole, no prefix
    elapsed = ended - float((tmp_path / "failed_at").read_text())
    print(f"{strategy}: exited {elapsed:.2f} s after the failure")
    assert elapsed < 15, f"the run took {elapsed:.0f} s to stop"
    workers = [int(pid) for pid in (tmp_path / "workers").read_text().split()]
    assert len(workers) == 2
    assert _group_ends(run.pid) == []  # the workers (and the resource tracker) are gone too
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)

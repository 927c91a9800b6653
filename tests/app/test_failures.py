"""Issue 30: a worker killed as the out-of-memory killer kills (SIGKILL), or memory that a config cannot have, stops the
run with one line saying so, within seconds, and no worker left behind; a config whose stores cannot fit is refused at
start with the numbers (datamodules/memory.py)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from app.errors import fatal_error_line
from compat.torchrl import storage_contents
from datamodules.memory import MemoryNeed, check_memory
from tests.helpers import ROOT, short_snake_fit

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


def _spawned_children(pid: int) -> list[int]:
    """The multiprocessing worker processes (``spawn_main``) whose parent is ``pid``, in the order they started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if parent == pid and b"spawn_main" in command:
            found.append(int(entry.name))
    return sorted(found)


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


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["EnvWorkers", "CollectorWorkers", "AsyncCollectorWorkers"])
def test_a_worker_killed_by_sigkill_stops_the_run_within_seconds_with_one_line(tmp_path, strategy):
    (tmp_path / "checkpoints.yaml").write_text(CHECKPOINTS)
    command = [sys.executable, "-m", "app", "fit", "--config", str(SNAKE_DQN), "--config", "checkpoints.yaml", *SHORT]
    command += ["--data.init_args.collection", strategy, "--data.init_args.collection.workers", "2"]
    run = subprocess.Popen(
        command,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, which its workers join
    )
    try:
        checkpoint = tmp_path / "runs/snake_dqn/version_0/checkpoints/last.ckpt"
        deadline = time.monotonic() + 180
        while not checkpoint.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = _spawned_children(run.pid)
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
    assert len(lines) == 1 and "Traceback" not in errors, errors
    kind = "environment" if strategy == "EnvWorkers" else "collector"
    assert lines[0].startswith(f"error: {kind} worker 1 died: killed by SIGKILL (signal 9"), lines[0]
    assert "the last checkpoint is intact: continue from it with --ckpt_path last" in lines[0]
    time.sleep(0.5)
    assert _alive_in_group(run.pid) == []
    saved = torch.load(checkpoint, weights_only=True)  # whole: it loads
    assert saved["global_step"] > 0 and saved["ReplayDataModule"]["frames"] >= 1024


def _limit_address_space() -> None:
    # Far below the buffer asked for: had anything tried to allocate it, the run would fail another way.
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


@pytest.mark.slow
def test_a_buffer_that_cannot_fit_is_refused_at_start_naming_the_flag_with_the_numbers(tmp_path):
    command = [sys.executable, "-m", "app", "fit", "--config", str(SNAKE_DQN), *SHORT[:-4]]
    command += ["--data.init_args.buffer_size", "10000000000"]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_address_space,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines == done.stderr.strip().splitlines()[-1:], done.stderr
    assert lines[0].startswith("error: --data.init_args.buffer_size 10000000000: the replay buffer needs ")
    assert " GB, this machine has " in lines[0] and "skip this check with --memory_check false" in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing written


def test_the_check_refuses_the_largest_need_and_warns_near_the_limit():
    cpu = torch.device("cpu")
    needs = [
        MemoryNeed("the replay buffer", "--data.init_args.buffer_size 100", 70, cpu),
        MemoryNeed("the model and its optimizer", "--model", 15, cpu),
    ]
    assert check_memory(needs, {cpu: (1000, "MemAvailable")}) == []
    (warning,) = check_memory(needs, {cpu: (100, "MemAvailable")})
    assert "the run needs 0.1 kB of the 0.1 kB available on cpu" in warning and "buffer_size 100" in warning
    with pytest.raises(ValueError, match=r"^--data.init_args.buffer_size 100: the replay buffer needs 0.1 kB, this"):
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

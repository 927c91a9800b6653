"""Faults that must not lose a run: a full disk while checkpointing, a damaged newest checkpoint, and the k kept."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoints import files as checkpoint_files
from checkpoints.files import SUMS, TEMPORARY_MARK, checkpoint_damage, reserve
from datamodules import replay
from tests.app.test_resume import SHORT, fit_shipped, start_step
from tests.app_process import run_app_process
from tests.helpers import ROOT, chain_config, fill, fit, small_file_system, write_config

# ------------------------------------------------------------------------------------------------------------------
# A full disk: a real tmpfs of 40 MB (the size in the issue), mounted for the test; it needs root and mount rights.


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    with small_file_system(disk, 40) as refused:
        if refused:
            pytest.skip(f"cannot mount a tmpfs here: {refused}")
        yield disk


@pytest.mark.slow
def test_a_full_disk_at_the_end_of_fit_is_one_error_and_the_previous_checkpoint_resumes(small_disk):
    # The shipped config's replay folder is what fills the disk; its loss runs eagerly here, which spares the test
    # three compilations (the compiled loss's checkpoints resume in tests/app/test_resume.py).
    eager = ("--model.init_args.compile", "false")
    runs = small_disk / "runs"
    fit_shipped("snake_dqn", runs, "--trainer.max_steps", "20", *eager)
    folder = runs / "snake_dqn/version_0/checkpoints"
    buffer_bytes = (folder / "last.ckpt.replay-rank0-step20/buffer.pt").stat().st_size
    before = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    # Room for the run's small files, not for the next replay folder. As a separate process: a SIGBUS (writing
    # through a memory map onto a full tmpfs) would kill it with status 135 and no message.
    filler = fill(small_disk, buffer_bytes // 2)
    args = [*SHORT["snake_dqn"], "--threads", "1", "--trainer.logger.init_args.save_dir", str(runs)]
    args += ["--trainer.enable_progress_bar", "false", "--data.init_args.env.init_args.backend", "torch"]
    args += ["--trainer.max_steps", "40", "--ckpt_path", "last", *eager]
    result = run_app_process(
        "fit", "--config", "configs/snake_dqn.yaml", *args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )

    assert result.returncode == 1, result.stderr[-3000:]  # not 135 (128 + SIGBUS)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    match = re.fullmatch(
        rf"error: checkpoint not saved: not enough disk space in {re.escape(str(folder))}: ([\d,]+) bytes needed, "
        r"([\d,]+) free",
        errors[0],
    )
    assert match, errors[0]
    needed, free = (int(group.replace(",", "")) for group in match.groups())
    assert needed >= buffer_bytes * 0.99 and free < needed
    assert "Traceback" not in result.stderr
    # The previous checkpoint is whole, and nothing half-written is left.
    assert {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()} == before
    assert not [path for path in folder.iterdir() if ".tmp-" in path.name]
    assert checkpoint_damage(folder / "last.ckpt") is None

    filler.unlink()
    cli = fit_shipped("snake_dqn", runs, "--trainer.max_steps", "40", "--ckpt_path", "last", *eager)
    assert start_step(cli) == 20 and cli.trainer.global_step == 40
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 40


def test_the_space_a_file_needs_is_reserved_before_it_is_written(small_disk):
    # posix_fallocate: the blocks are the file's before any byte is written, and a disk without them refuses at once.
    with open(small_disk / "room", "wb") as file:
        reserve(file, 8 << 20)
        assert os.fstat(file.fileno()).st_blocks * 512 >= 8 << 20
    with open(small_disk / "no_room", "wb") as file, pytest.raises(OSError) as refused:
        reserve(file, 64 << 20)  # more than the 40 MB disk
    assert refused.value.errno == errno.ENOSPC


@pytest.mark.slow
def test_a_write_that_fails_after_the_space_check_is_the_same_one_error(tmp_path):
    # A file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes the kernel refuse the replay folder's write with EFBIG
    # after the free-space check has passed: the write itself fails, as on a disk filled by another process meanwhile.
    # A checkpoint keeps the rows written: 8,192 of warm-up are ~0.4 MB; everything else the run writes is < 0.1 MB.
    config = chain_config("dqn", tmp_path, buffer_size=100_000, warmup_frames=8192)
    path = write_config(config, tmp_path / "c.yaml")
    limit = 100_000
    program = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
        "from app.cli import main; main(sys.argv[1:])"
    )
    result = subprocess.run(
        [sys.executable, "-c", program, "fit", "--config", str(path), "--trainer.max_steps", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    folder = tmp_path / "checkpoints"
    assert len(errors) == 1 and re.fullmatch(
        rf"error: checkpoint not saved: cannot write in {re.escape(str(folder))} \(File too large\): [\d,]+ bytes "
        r"needed, [\d,]+ free",
        errors[0],
    ), result.stderr[-3000:]
    assert sorted(path.name for path in folder.iterdir()) == ["config.yaml"]  # no checkpoint, no temporary


def chain_run(tmp_path: Path, max_steps: int, *overrides: str):
    config = chain_config("dqn", tmp_path)
    config["trainer"]["callbacks"][0]["init_args"]["every_n_frames"] = 40
    return fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", str(max_steps), *overrides)


class NoSpace:
    """A file opened for writing on which every write fails as on a full disk (ENOSPC)."""

    def __init__(self, file) -> None:
        self.file = file

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def writelines(self, lines) -> None:
        self.write("")

    def __getattr__(self, name: str):
        return getattr(self.file, name)

    def __enter__(self) -> NoSpace:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


#: Each file a checkpoint writes, in order, as (the module that opens it, a test of the name it is opened under).
WRITE_POINTS = {
    "replay folder": (replay, lambda name: name == replay.BUFFER_FILE),
    "checkpoint": (checkpoint_files, lambda name: ".ckpt" in name and SUMS not in name),
    "checkpoint's checksum": (checkpoint_files, lambda name: SUMS in name),
    "replay folder's checksums": (checkpoint_files, lambda name: ".sums-rank" in name),
}


@pytest.mark.slow
@pytest.mark.parametrize("point", WRITE_POINTS)
def test_a_full_disk_at_each_write_of_a_checkpoint_is_one_error_and_keeps_the_previous_one(
    tmp_path, capsys, monkeypatch, point
):
    # Simulated: the write of one file fails with ENOSPC (the real full disk is the tmpfs test above).
    chain_run(tmp_path, 29)
    folder = tmp_path / "checkpoints"
    # Every checkpoint file (config.yaml is the run's config, which each fit writes anew).
    before = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file() and path.suffix != ".yaml"}
    module, chosen = WRITE_POINTS[point]
    real_open = open

    refused = []

    def open_without_space(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        if "w" in mode and chosen(Path(file).name.split(TEMPORARY_MARK)[0]):
            refused.append(Path(file).name)
            return NoSpace(opened)
        return opened

    monkeypatch.setattr(module, "open", open_without_space, raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        chain_run(tmp_path, 40, "--ckpt_path", "last")
    assert stopped.value.code == 1 and len(refused) == 1, refused  # the chosen file, the first time it was written
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.fullmatch(
        rf"error: checkpoint not saved: cannot write in {re.escape(str(folder))} \(No space left on device\): "
        r"[\d,]+ bytes needed, [\d,]+ free",
        errors[0],
    ), errors
    # What the previous checkpoint wrote is untouched and resumes; nothing half-written is left.
    assert {name: (folder / name).read_bytes() for name in before} == before
    assert not [path for path in folder.rglob("*") if TEMPORARY_MARK in path.name]
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 29
    assert checkpoint_damage(folder / "last.ckpt") is None
    monkeypatch.undo()
    cli = chain_run(tmp_path, 40, "--ckpt_path", "last")
    assert cli.trainer.global_step == 40 and checkpoint_damage(folder / "last.ckpt") is None


# ------------------------------------------------------------------------------------------------------------------
# Damaged checkpoints, and the k kept.


def test_keep_last_keeps_exactly_the_newest_checkpoints_with_their_files(tmp_path):
    # A checkpoint every 40 frames (8 per collect, 2 per update after 64 warm-up frames: a Lightning step takes the 4
    # updates a collect earns) and at the end of fit: the last two are those of updates 32 (the step whose collect
    # passed 120 frames) and 40, which stay, each with its replay folder and manifests.
    chain_run(tmp_path, 40)
    folder = tmp_path / "checkpoints"
    assert sorted(path.name for path in folder.iterdir()) == sorted(
        ["last.ckpt", "config.yaml"]
        + [f"last-step{step}.ckpt{suffix}" for step in (32, 40) for suffix in ("", ".sha256")]
        + [f"last.ckpt.{kind}-rank0-step{step}" for step in (32, 40) for kind in ("replay", "sums")]
    )
    assert os.path.samefile(folder / "last.ckpt", folder / "last-step40.ckpt")
    assert checkpoint_damage(folder / "last-step32.ckpt") is None and checkpoint_damage(folder / "last.ckpt") is None


def test_keep_last_1_keeps_only_last_ckpt(tmp_path):
    chain_run(tmp_path, 40, "--trainer.callbacks.init_args.keep_last", "1")
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == [
        "config.yaml",
        "last.ckpt",
        "last.ckpt.replay-rank0-step40",
        "last.ckpt.sha256",
        "last.ckpt.sums-rank0-step40",
    ]


def truncate(path: Path) -> None:
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) // 2)


def flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as file:
        file.seek(os.path.getsize(path) // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize(
    ("damaged", "damage", "reason"),
    [
        ("last.ckpt", truncate, r"not a readable checkpoint \(\w+\)"),
        ("last.ckpt", flip_a_byte, r"does not match its checksum in last-step40\.ckpt\.sha256"),
        (
            "last.ckpt.replay-rank0-step40/buffer.pt",
            flip_a_byte,
            r"last\.ckpt\.replay-rank0-step40/buffer\.pt does not match its checksum in last\.ckpt\.sums-rank0-step40",
        ),
    ],
    ids=["checkpoint-truncated", "checkpoint-flipped", "replay-flipped"],
)
def test_ckpt_path_last_skips_a_damaged_checkpoint_for_the_previous_one(tmp_path, capsys, damaged, damage, reason):
    chain_run(tmp_path, 40)
    folder = tmp_path / "checkpoints"
    damage(folder / damaged)
    capsys.readouterr()
    cli = chain_run(tmp_path, 60, "--ckpt_path", "last")

    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and re.fullmatch(
        rf"warning: --ckpt_path last: skipped {re.escape(str(folder / 'last-step40.ckpt'))} \({reason}\); "
        rf"resuming from {re.escape(str(folder / 'last-step32.ckpt'))}",
        warnings[0],
    ), warnings
    # It continued from update 32, not 40, with the frames of update 32: those of an uninterrupted run at 60.
    assert cli.trainer.global_step == 60 and cli.datamodule.frames == 64 + (60 - 4) * 2
    # The damaged one's future was abandoned with it: the kept ones are those the resumed run wrote (at 160 frames
    # and at the end).
    kept = sorted(path.name for path in folder.glob("last-step*.ckpt"))
    assert kept == ["last-step50.ckpt", "last-step60.ckpt"]
    assert not list(folder.glob("*step40*"))


def test_an_explicit_damaged_checkpoint_is_one_error(tmp_path, capsys):
    chain_run(tmp_path, 40)
    checkpoint = tmp_path / "checkpoints/last-step32.ckpt"
    flip_a_byte(checkpoint)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        chain_run(tmp_path, 60, "--ckpt_path", str(checkpoint))
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --ckpt_path {checkpoint}: does not match its checksum in last-step32.ckpt.sha256"]


# ------------------------------------------------------------------------------------------------------------------
# The fault-injection soak (benchmarks/fault_soak.py), short: one fault of each kind on the shipped Snake DQN.


@pytest.mark.slow
def test_a_short_fault_soak_ends_with_the_uninterrupted_runs_state(tmp_path):
    # One SIGKILL, one SIGTERM and one full disk (a real tmpfs filled by a file) at moments drawn from seed 0, each
    # followed by the same command with --ckpt_path last: the final weights, optimizer, data module, replay buffer
    # and metrics.csv equal the uninterrupted run's, and every process ended as the docs say its fault ends it.
    result = subprocess.run(
        [sys.executable, "benchmarks/fault_soak.py", "--collection", "in_process", "--faults", "3", "--seed", "0"]
        + ["--max-steps", "100", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "soak.json").read_text())
    kinds = {"sigkill", "sigterm"} if report["disk_full_skipped"] else {"sigkill", "sigterm", "disk_full"}
    assert {kind for kind, count in report["faults_by_kind"].items() if count} == kinds  # no disk: where no tmpfs
    assert report["faults"] == 3
    assert report["held"] == {
        name: True
        for name in ("updates", "weights", "optimizer", "data_state", "replay_buffer", "metrics", "no_temporaries")
    }
    assert report["unexpected_endings"] == [] and report["passed"]

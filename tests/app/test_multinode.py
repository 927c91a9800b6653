"""Several machines through Lightning's multi-node DDP: two nodes of one process each, started by ``torchrun`` against a
rendezvous on this machine (gloo), as a cluster's launcher starts them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from app.cli import RENDEZVOUS_VARIABLES
from tests.app.test_resume import assert_same
from tests.helpers import ROOT, app_in_process, chain_config, write_config


class TerminateAgentAt(pl.Callback):
    """Sends SIGTERM to this rank's ``torchrun`` agent after update ``step``, as a cluster's scheduler does to every
    node of a job it ends; the agent passes it on to its worker."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getppid(), signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_two_nodes(config: Path, *overrides: str) -> list[subprocess.CompletedProcess]:
    """``torchrun --nnodes 2 --node_rank r ... -m app fit --config config --trainer.num_nodes 2`` for r = 0 and 1,
    side by side."""
    port = str(free_port())
    nodes = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
        command += ["--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", port]
        command += ["-m", "app", "fit", "--config", str(config), "--trainer.strategy", "ddp"]
        command += ["--trainer.num_nodes", "2", "--trainer.devices", "1", "--trainer.accelerator", "cpu", *overrides]
        nodes.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return [subprocess.CompletedProcess(node.args, node.wait(timeout=300), node.communicate()[0]) for node in nodes]


@pytest.mark.slow
def test_two_nodes_stopped_by_sigterm_resume_to_the_uninterrupted_runs_weights(tmp_path):
    def config_in(folder: str, *callbacks: dict) -> Path:
        config = chain_config("dqn", tmp_path / folder)
        config["trainer"]["callbacks"] = [
            {"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": {"every_n_frames": 10**9}},
            {"class_path": "tests.app.test_resume.DumpRankWeights", "init_args": {"dirpath": str(tmp_path / folder)}},
            *callbacks,
        ]
        return write_config(config, tmp_path / f"{folder}.yaml")

    full = run_two_nodes(config_in("full"), "--trainer.max_steps", "60")
    assert [node.returncode for node in full] == [0, 0], full[0].stdout[-3000:] + full[1].stdout[-3000:]

    stop = {"class_path": "tests.app.test_multinode.TerminateAgentAt", "init_args": {"step": 20}}
    stopped = run_two_nodes(config_in("stopped", stop), "--trainer.max_steps", "60")
    assert all(node.returncode != 0 for node in stopped)  # the agents end on the signal
    # Every rank stopped at the same update and says how to continue; each saved its own state beside the checkpoint.
    for node in stopped:
        assert "stopped by SIGTERM: continue with --ckpt_path last" in node.stdout, node.stdout[-3000:]
    checkpoints = tmp_path / "stopped" / "checkpoints"
    step = torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"]
    assert 20 <= step < 60
    assert (checkpoints / f"last.ckpt.rank1-step{step}").exists()
    assert (checkpoints / f"last.ckpt.replay-rank1-step{step}").exists()

    # The same command, continued: every rank restores its own collection, buffer and generators.
    resumed = run_two_nodes(config_in("stopped"), "--trainer.max_steps", "60", "--ckpt_path", "last")
    assert [node.returncode for node in resumed] == [0, 0], resumed[0].stdout[-3000:] + resumed[1].stdout[-3000:]
    for rank in (0, 1):
        assert_same(
            torch.load(tmp_path / f"full/rank{rank}.pt", weights_only=True),
            torch.load(tmp_path / f"stopped/rank{rank}.pt", weights_only=True),
            f"rank {rank} weights",
        )
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 60


def test_several_nodes_without_a_launcher_are_one_line_not_a_wait_for_nodes_that_never_come(
    tmp_path, capsys, monkeypatch
):
    for name in RENDEZVOUS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    config = write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml")
    nodes = ["--trainer.strategy", "ddp", "--trainer.num_nodes", "2", "--trainer.devices", "1"]
    done = app_in_process(capsys, "fit", "--config", str(config), *nodes)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --trainer.num_nodes 2: no rendezvous to meet the other nodes at; start this command on every node "
        "with torchrun (--nnodes, --node_rank, --master_addr, --master_port) or srun under SLURM "
        "(docs/guide/multi-gpu.md)"
    )

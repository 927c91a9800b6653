"""DDP across processes and machines: two ranks on one node, as Lightning launches them, and two nodes of one process
each, started by ``torchrun`` against a rendezvous on this machine (gloo), as a cluster's launcher starts them. Every
rank's data-module state is its own, saved beside the checkpoint and restored by that rank."""

from __future__ import annotations

import json
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
from tests.app_process import run_app_process
from tests.helpers import RESEEDED, ROOT, app_in_process, assert_same, chain_config, saved_replay, write_config


class DumpRankWeights(pl.Callback):
    """Saves each rank's weights at the end of fit, as ``rank<r>.pt`` in ``dirpath``."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)

    def on_train_end(self, trainer, pl_module):
        torch.save(pl_module.state_dict(), self.dirpath / f"rank{trainer.global_rank}.pt")


def fit_ddp(config: Path, *overrides: str) -> None:
    """``python -m app fit`` of ``config`` on two CPU ranks of this machine (Lightning starts the second, in a fresh
    interpreter)."""
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    result = run_app_process("fit", "--config", str(config), *ddp, *overrides, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]


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
def test_ddp_ranks_resume_their_own_state_on_one_node_and_after_sigterm_across_two(tmp_path):
    # One 2-rank run on one node, 40 updates, a checkpoint every 96 frames (rank 1 writes its own state beside each):
    # the reference. Its ranks explore on their own and hold one set of weights, and the throughput report counts
    # both. A run resumed from its checkpoint of update 20, as if killed after it, ends with its weights,
    # data and buffers; so does the same config as two nodes (the same global ranks), stopped by SIGTERM to both
    # agents and continued by the same command with --ckpt_path last.
    def config_in(folder: str, checkpoints: dict, *callbacks: dict) -> tuple[dict, Path]:
        config = chain_config("dqn", tmp_path / folder)
        config["trainer"]["callbacks"] = [
            {"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": checkpoints},
            {"class_path": f"{__name__}.DumpRankWeights", "init_args": {"dirpath": str(tmp_path / folder)}},
            *callbacks,
        ]
        return config, write_config(config, tmp_path / f"{folder}.yaml")

    report = {"class_path": "callbacks.throughput.ThroughputReport", "init_args": {"bare_update_seconds": 0}}
    config, full_config = config_in("full", {"every_n_frames": 96, "save_top_k": -1}, report)
    fit_ddp(full_config, "--trainer.max_steps", "40")
    full = tmp_path / "full/checkpoints"
    weights = [torch.load(tmp_path / f"full/rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert_same(weights[0], weights[1], "the ranks' weights")  # gradients all-reduced: one set of weights
    written = json.loads((tmp_path / "full" / "throughput.json").read_text())
    assert written["machine"]["world_size"] == 2 and [rank["rank"] for rank in written["per_rank"]] == [0, 1]
    assert sum(rank["frames"] for rank in written["per_rank"]) == written["this_process"]["frames"] > 0
    assert "| rank | frames | frames/s |" in (tmp_path / "full" / "throughput.md").read_text()
    middle = full / "frames=96.ckpt"
    # 64 warm-up frames, then 8 frames per 4 updates, which one step takes: 96 frames in the step of updates 17-20, and
    # the end of fit at 136 frames.
    assert torch.load(middle, weights_only=True)["global_step"] == 20
    # Rank 1's state beside each checkpoint, one per checkpoint: the two `last` ones are kept (keep_last 2), so
    # last.ckpt's of update 20 stays beside last-step20.ckpt.
    assert sorted(path.name for path in full.glob("*.rank*")) == [
        "frames=136.ckpt.rank1-step40",
        "frames=96.ckpt.rank1-step20",
        "last.ckpt.rank1-step20",
        "last.ckpt.rank1-step40",
    ]
    assert sorted(path.name for path in full.glob("last-step*.ckpt")) == ["last-step20.ckpt", "last-step40.ckpt"]
    # Each rank's replay buffer beside each checkpoint, likewise, and each rank's manifest of its files.
    kept = (("frames=136.ckpt", 40), ("frames=96.ckpt", 20), ("last.ckpt", 20), ("last.ckpt", 40))
    for kind in ("replay", "sums"):
        assert sorted(path.name for path in full.glob(f"*.{kind}-*")) == sorted(
            f"{checkpoint}.{kind}-rank{rank}-step{step}" for checkpoint, step in kept for rank in (0, 1)
        )
    config["trainer"]["default_root_dir"] = str(tmp_path / "resumed")
    config["trainer"]["callbacks"][1]["init_args"]["dirpath"] = str(tmp_path / "resumed")
    resumed_config = write_config(config, tmp_path / "resumed.yaml")
    fit_ddp(
        resumed_config,
        "--trainer.max_steps",
        "40",
        "--ckpt_path",
        str(middle),
        *RESEEDED,
    )
    resumed = tmp_path / "resumed/checkpoints"

    for rank in (0, 1):
        assert_same(
            torch.load(tmp_path / f"full/rank{rank}.pt", weights_only=True),
            torch.load(tmp_path / f"resumed/rank{rank}.pt", weights_only=True),
            f"rank {rank} weights",
        )
    full_last = torch.load(full / "last.ckpt", weights_only=True)
    resumed_last = torch.load(resumed / "last.ckpt", weights_only=True)
    assert full_last["global_step"] == resumed_last["global_step"] == 40
    rank0 = {"full": full_last["ReplayDataModule"], "resumed": resumed_last["ReplayDataModule"]}
    rank1 = {
        run: torch.load(folder / "last.ckpt.rank1-step40", weights_only=True)
        for run, folder in (("full", full), ("resumed", resumed))
    }
    # Rank by rank: frames, environments, carried observations, update credit, RNG states, and the replay buffer
    # each rank keeps in its own folder beside the checkpoint.
    assert_same(rank0["full"], rank0["resumed"], "rank 0 data")
    assert_same(rank1["full"], rank1["resumed"], "rank 1 data")
    buffers = {}
    for rank, states in (("0", rank0), ("1", rank1)):
        assert states["resumed"]["buffer_folder"] == f"last.ckpt.replay-rank{rank}-step40"
        full_buffer, resumed_buffer = (
            saved_replay(folder / "last.ckpt", states[run]) for run, folder in (("full", full), ("resumed", resumed))
        )
        assert_same(full_buffer, resumed_buffer, f"rank {rank} replay buffer")
        buffers[rank] = resumed_buffer[0]
    # ...and the ranks still explore on their own.
    assert not torch.equal(buffers["0"]["action"], buffers["1"]["action"])
    assert not torch.equal(rank0["resumed"]["rng"]["torch"], rank1["resumed"]["rng"]["torch"])

    # The same ranks as two nodes of one process each: SIGTERM to both agents after update 12, as a scheduler ends a
    # job, then the same command continued. (The config's own checkpoints never come: the one saved at the stop is
    # what continues.)
    never = {"every_n_frames": 10**9}
    stop = {"class_path": f"{__name__}.TerminateAgentAt", "init_args": {"step": 12}}
    stopped = run_two_nodes(config_in("nodes", never, stop)[1], "--trainer.max_steps", "40")
    assert all(node.returncode != 0 for node in stopped)  # the agents end on the signal
    # Every rank stopped at the same update and says how to continue; each saved its own state beside the checkpoint.
    for node in stopped:
        assert "stopped by SIGTERM: continue with --ckpt_path last" in node.stdout, node.stdout[-3000:]
    checkpoints = tmp_path / "nodes" / "checkpoints"
    step = torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"]
    assert 12 <= step < 40
    assert (checkpoints / f"last.ckpt.rank1-step{step}").exists()
    assert (checkpoints / f"last.ckpt.replay-rank1-step{step}").exists()
    # Every rank restores its own collection, buffer and generators: the one-node run's weights, rank by rank.
    continued = run_two_nodes(config_in("nodes", never)[1], "--trainer.max_steps", "40", "--ckpt_path", "last")
    assert [node.returncode for node in continued] == [0, 0], continued[0].stdout[-3000:] + continued[1].stdout[-3000:]
    for rank in (0, 1):
        assert_same(
            torch.load(tmp_path / f"full/rank{rank}.pt", weights_only=True),
            torch.load(tmp_path / f"nodes/rank{rank}.pt", weights_only=True),
            f"rank {rank} weights across two nodes",
        )
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 40


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

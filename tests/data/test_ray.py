"""Collection across machines (datamodules/remote.py's RayCollectors and AsyncRayCollectors): TorchRL's
RayCollector on a real Ray cluster that the tests start on this machine, a head node and a worker node whose CPUs hold
every collector actor, as a cluster of collector machines would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sys
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from app.cli import main
from app.errors import fatal_error_line
from compat.torchrl import WORKER_KEY
from datamodules.workers import CannotCollect, WorkerDied
from tests.helpers import ROOT, AfterUpdate, app_in_process, chain_config, fit, saved_replay, weights, write_config

ray = pytest.importorskip("ray", reason='the distributed extra: pip install -e ".[distributed]"')
from ray.cluster_utils import Cluster  # noqa: E402 - only once Ray is known to be installed

WORKERS = 2
#: Where each strategy lives: the local ones in datamodules/collection.py, Ray's in datamodules/remote.py.
MODULES = {"RayCollectors": "remote", "AsyncRayCollectors": "remote"} | dict.fromkeys(
    ["CollectorWorkers", "AsyncCollectorWorkers"], "collection"
)


@pytest.fixture(scope="module")
def cluster():
    """A head node that runs no actors and a worker node with a CPU per collector actor; this process joins it.

    The nodes are started from this process, as ``ray start`` would start them from a shell of their own: a node
    started in a process sets its SIGTERM handler (drain the node, then exit 1), which a shell's would not pass on to
    the run, so this process keeps its own."""
    handler = signal.getsignal(signal.SIGTERM)
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes.add_node(num_cpus=WORKERS)
    nodes.wait_for_nodes()
    signal.signal(signal.SIGTERM, handler)
    yield nodes
    ray.shutdown()
    nodes.shutdown()


def collection(kind: str, address: str | None = None) -> dict:
    init = {"workers": WORKERS, **({"address": address} if address else {})}
    return {"class_path": f"datamodules.{MODULES[kind]}.{kind}", "init_args": init}


def ppo_config(tmp_path, name: str, kind: str, address: str | None = None):
    # 4 environments, 2 per worker; 64 frames a rollout, 4 updates each.
    config = chain_config("ppo", tmp_path / name, num_envs=4, collection=collection(kind, address))
    return write_config(config, tmp_path / f"{name}.yaml")


@pytest.mark.slow
def test_ray_collectors_collect_what_collector_workers_do_and_a_checkpoint_of_either_continues_with_the_other(
    tmp_path, cluster
):
    # The actors seed their generators and environments as local collector workers do and get the learner's weights
    # before each batch, so the same config trains to the same weights with either; the per-worker state in the
    # checkpoint is the same too, so a run stopped with Ray collectors continues with local workers, and one stopped
    # with local workers continues with Ray collectors, to the bit. (Ray continuing Ray's own checkpoint is the
    # asynchronous test's.)
    fit(ppo_config(tmp_path, "local", "CollectorWorkers"), "--trainer.max_steps", "24")
    # Stopped as a scheduler stops a job: SIGTERM after update 12 (Ray's driver would end the process at once; the
    # run's handler stops after the update and saves).
    on_ray = ppo_config(tmp_path, "ray", "RayCollectors", cluster.address)
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(on_ray), "--trainer.max_steps", "24"], extra_callbacks=[TerminateAt(12)])
    assert exited.value.code == 128 + signal.SIGTERM
    # The collectors ran on the worker node: an actor takes a CPU, and the head has none to give.
    assert sorted(node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]) == [0, WORKERS]

    saved = torch.load(tmp_path / "ray/checkpoints/last.ckpt", weights_only=True)
    workers_state = saved["RolloutDataModule"]["workers"]
    assert sorted(workers_state) == ["frames", "iter", *(f"worker{w}" for w in range(WORKERS))]  # as CollectorWorkers'
    assert workers_state["frames"] == 3 * 64  # 12 updates: 3 rollouts of 4 environments x 16 steps
    # The checkpoint continued with local workers ends with the uninterrupted local run's weights.
    continued = ppo_config(tmp_path, "ray", "CollectorWorkers")
    resumed = fit(continued, "--trainer.max_steps", "24", "--ckpt_path", "last")
    assert resumed.trainer.global_step == 24
    # And the other way: a run stopped with local workers, continued with Ray collectors.
    with pytest.raises(SystemExit):
        local_half = ppo_config(tmp_path, "local_half", "CollectorWorkers")
        main(["fit", "--config", str(local_half), "--trainer.max_steps", "24"], extra_callbacks=[TerminateAt(12)])
    on_ray = ppo_config(tmp_path, "local_half", "RayCollectors", cluster.address)
    assert fit(on_ray, "--trainer.max_steps", "24", "--ckpt_path", "last").trainer.global_step == 24
    a = weights(tmp_path / "local/checkpoints/last.ckpt")
    for run in ("ray", "local_half"):
        b = weights(tmp_path / run / "checkpoints/last.ckpt")
        for key in a:
            assert torch.equal(a[key], b[key]), (run, key)


def dqn_config(tmp_path, name: str, kind: str, address: str | None = None):
    # A replay config: 4 environments, 2 per worker, batches of 4 steps (8 frames) from each worker as it fills one.
    init = {"workers": WORKERS, **({"address": address} if address else {})}
    if kind == "AsyncCollectorWorkers":
        init["learner_nice"] = 0
    strategy = {"class_path": f"datamodules.{MODULES[kind]}.{kind}", "init_args": init}
    config = chain_config("dqn", tmp_path / name, num_envs=4, collect_steps=4, collection=strategy)
    return write_config(config, tmp_path / f"{name}.yaml")


class WatchDeliveries(Callback):
    """Records which worker delivered each batch the feeder takes, from the collector's start (the batch's tag: the
    episode statistics go by it)."""

    def __init__(self) -> None:
        self.workers: list[list[int]] = []

    def on_fit_start(self, trainer, *args) -> None:
        episodes = trainer.datamodule.episodes  # the feeder hands every batch to its observe, bound when it starts
        observe = episodes.observe

        def watched(batch):
            self.workers.append(batch[WORKER_KEY].unique().tolist())
            observe(batch)

        episodes.observe = watched


@pytest.mark.slow
def test_async_ray_collectors_feed_the_replay_as_asynchronous_workers_do_and_resume_with_either(tmp_path, cluster):
    # Ray actors that never wait for the learner: each batch is one actor's, tagged with it; every delivered frame goes
    # into the buffer; a run stopped by SIGTERM continues from its checkpoint with Ray actors (in a copy of its folder)
    # and with local asynchronous workers, its buffer and counters kept (the workers start new episodes).
    watch = WatchDeliveries()
    on_ray = dqn_config(tmp_path, "ray", "AsyncRayCollectors", cluster.address)
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(on_ray), "--trainer.max_steps", "40"], extra_callbacks=[TerminateAt(20), watch])
    assert exited.value.code == 128 + signal.SIGTERM
    checkpoint = tmp_path / "ray/checkpoints/last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["ReplayDataModule"]
    assert saved["samples"] == 20 * 32 and saved["frames"] % 8 == 0 and saved["frames"] >= 2 * 20
    stored, _ = saved_replay(checkpoint, saved)
    shutil.copytree(tmp_path / "ray", tmp_path / "ray_again")
    continued = {
        "ray_again": dqn_config(tmp_path, "ray_again", "AsyncRayCollectors", cluster.address),
        "ray": dqn_config(tmp_path, "ray", "AsyncCollectorWorkers"),
    }
    for run, config in continued.items():
        args = ["fit", "--config", str(config), "--trainer.max_steps", "40", "--ckpt_path", "last"]
        data = main(args, extra_callbacks=[watch] if run == "ray_again" else []).datamodule
        assert data.trainer.global_step == 40 and data.samples == 40 * 32, run
        assert data.frames > saved["frames"] and len(data.buffer) == data.frames, run  # every frame delivered, kept
        kept = data.buffer.storage._storage["observation"][: saved["frames"]]
        assert torch.equal(kept, stored["observation"][: saved["frames"]]), run
    # Each batch is one actor's; over the two Ray runs (their warm-up or restored buffer, and the feeder collecting
    # beside every update) both actors delivered. (Within a few updates one actor can outrun the other on a busy
    # machine: the chain's batches take microseconds.)
    assert watch.workers and all(len(tags) == 1 for tags in watch.workers)
    assert {tags[0] for tags in watch.workers} == set(range(WORKERS))


class TerminateAt(AfterUpdate):
    def __init__(self, step: int) -> None:
        self.step = step

    def after_update(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class KillActorAt(Callback):
    """SIGKILLs collector actor 1's process after update ``step``, as a lost node or the memory killer would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            actor = trainer.datamodule.collection.collector.remote_collectors[1]
            pid = ray.get(actor.where.remote())[0]
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_ray_collector_stops_the_run_with_one_line_naming_it(tmp_path, cluster):
    config = chain_config("ppo", tmp_path / "run", num_envs=4, collection=collection("RayCollectors", cluster.address))
    config["trainer"]["callbacks"].append({"class_path": "tests.data.test_ray.KillActorAt", "init_args": {"step": 8}})
    with pytest.raises(WorkerDied) as stopped:
        fit(write_config(config, tmp_path / "c.yaml"))
    line = fatal_error_line(stopped.value)  # what the command line prints, exit status 1 (tests/app/test_failures.py)
    assert re.fullmatch(
        r"Ray collector 1 \(process \d+ on [\d.]+\) died: The actor died unexpectedly .* At 128 frames; training "
        r"stopped: no checkpoint to continue from",
        line,
    ), line  # two rollouts of 64 frames: the kill came after the second one's updates; no checkpoint was due yet


@pytest.mark.slow
def test_a_killed_asynchronous_ray_collector_stops_the_run_with_one_line_naming_it(tmp_path, cluster):
    # The feeder thread meets the dead actor: the learner raises the same line (frames: whatever was delivered).
    config = yaml.safe_load(dqn_config(tmp_path, "run", "AsyncRayCollectors", cluster.address).read_text())
    config["trainer"]["callbacks"].append({"class_path": "tests.data.test_ray.KillActorAt", "init_args": {"step": 8}})
    with pytest.raises(WorkerDied) as stopped:
        fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "100000")
    line = fatal_error_line(stopped.value)
    assert re.fullmatch(
        r"Ray collector 1 \(process \d+ on [\d.]+\) died: The actor died unexpectedly .* At [\d,]+ frames; training "
        r"stopped: no checkpoint to continue from",
        line,
    ), line


@pytest.mark.slow
def test_more_actors_than_the_cluster_has_cpus_for_is_one_line_not_a_wait(tmp_path, cluster):
    config = chain_config("ppo", tmp_path, num_envs=8, collection=collection("RayCollectors", cluster.address))
    config["data"]["init_args"]["collection"]["init_args"]["workers"] = 4
    with pytest.raises(CannotCollect) as refused:
        fit(write_config(config, tmp_path / "c.yaml"))
    assert fatal_error_line(refused.value) == (
        "--data.init_args.collection.init_args.workers 4: 4 actors of 1 CPUs need 4 CPUs, the Ray cluster has 2 "
        "(fewer workers, a smaller --data.init_args.collection.init_args.cpus_per_worker, or more nodes)"
    )


def test_an_address_where_no_cluster_answers_is_one_line_naming_the_flag(tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    config = chain_config("ppo", tmp_path, num_envs=4, collection=collection("RayCollectors", address))
    done = app_in_process(capsys, "fit", "--config", str(write_config(config, tmp_path / "c.yaml")))
    assert done.returncode == 2  # refused when the config is read, before anything runs
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: --data.init_args.collection.init_args.address {address}: no Ray cluster answers")


@pytest.mark.parametrize("kind", ["RayCollectors", "AsyncRayCollectors"])
def test_without_ray_the_strategy_is_one_line_with_the_install_command(tmp_path, capsys, monkeypatch, kind):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the distributed extra were not installed
    config = chain_config("dqn", tmp_path, num_envs=4, collection=collection(kind))
    done = app_in_process(capsys, "fit", "--config", str(write_config(config, tmp_path / "c.yaml")))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f'error: --data.init_args.collection {kind}: Ray is not installed; pip install -e ".[distributed]"'
    )


def test_asynchronous_ray_collectors_for_an_on_policy_config_are_one_line_saying_why(tmp_path, capsys):
    config = chain_config("ppo", tmp_path, num_envs=4, collection=collection("AsyncRayCollectors"))
    done = app_in_process(capsys, "fit", "--config", str(write_config(config, tmp_path / "c.yaml")))
    assert done.returncode == 2  # refused when the config is read, before Ray or anything else starts
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --data.init_args.collection AsyncRayCollectors: RolloutDataModule has no replay buffer to feed "
        "(asynchronous workers need datamodules.replay.ReplayDataModule; RayCollectors collects in step with the "
        "learner)"
    )


def test_the_example_ray_cluster_file_is_one_ray_up_accepts_and_its_command_is_valid(capsys, tmp_path, monkeypatch):
    # `ray up` itself needs the machines (SSH to each): here the file is checked against the schema Ray's launcher
    # checks it with, completed with Ray's defaults as `ray up` completes it, and the command it documents is parsed.
    import jsonschema
    import yaml
    from ray.autoscaler.sdk import fillout_defaults

    example = ROOT / "examples" / "ray-cluster.yaml"
    config = yaml.safe_load(example.read_text())
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    filled = fillout_defaults(config)
    assert filled["provider"]["type"] == "local" and filled["max_workers"] == len(config["provider"]["worker_ips"])
    assert any("--num-cpus=0" in command for command in filled["head_start_ray_commands"])  # the learner's cores
    lines = [line.lstrip("# ").rstrip(" \\") for line in example.read_text().splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if "lightrl fit" in line)
    command = " ".join([lines[start].split("lightrl ", 1)[1], *lines[start + 1 : start + 3]]).split()
    assert command[:3] == ["fit", "--config", "configs/metta_ppo.yaml"] and "RayCollectors" in command
    monkeypatch.chdir(ROOT)
    done = app_in_process(capsys, *command, "--print_config")
    assert done.returncode == 0, done.stderr
    collection = yaml.safe_load(done.stdout)["data"]["init_args"]["collection"]
    assert collection["class_path"].endswith("RayCollectors") and collection["init_args"]["address"] == "auto"

"""Collection on other machines: the collection strategies whose collectors are Ray actors (TorchRL's
``RayCollector``), on any machine of a Ray cluster, beside the local ones of :mod:`datamodules.collection`.

- :class:`RayCollectors`: ``workers`` Ray actors as collector workers are, in step with the learner; their checkpoint
  state is collector workers' own, so a run continues with either.
- :class:`AsyncRayCollectors`: the same actors, delivering as asynchronous collector workers do. Replay modules only.

Both need the ``distributed`` extra (``pip install -e ".[distributed]"``); Ray is imported when a strategy is
checked, never before.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import threading
from functools import partial
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from compat.torchrl import WORKER_KEY, RayPushedWeights, transformed
from datamodules.collection import OPTION, AsynchronousDelivery, Collection, CollectionHost
from datamodules.workers import CannotCollect, ResumableCollector, WorkerDied


class RayCollectors(Collection):
    """``workers`` Ray actors, each a collector with its own ``num_envs / workers`` environments and its own copy of
    the policy (TorchRL's ``RayCollector``), in step with the learner as :class:`CollectorWorkers` are: the latest
    weights reach every actor through Ray's object store before each batch, and a batch is all actors' environments
    in the order of one in-process batch. The actors run wherever the Ray cluster has room: on the other machines of
    a cluster joined with ``address``, or on this machine in a cluster this run starts and stops (``address: null``).
    Each actor's generator is seeded from its environments' seed, as a collector worker's is.

    A dead actor (its process killed, its node lost) ends the run with one line naming it; actors are not restarted
    (a restarted actor's environments would not continue the episodes the checkpointed run was playing). Resumes
    exactly, and the checkpoint's per-worker state is :class:`CollectorWorkers`' own: a run checkpointed with Ray
    collectors continues with local collector workers of the same count, and the other way round.

    Needs the ``distributed`` extra (``pip install -e ".[distributed]"``).

    Args:
        workers: Ray collector actors; must divide ``num_envs``.
        address: the Ray cluster to join: ``"auto"`` (the one ``ray start`` started on this machine), ``host:port``
            of its head, or ``"ray://host:10001"`` (Ray Client); None: start a cluster on this machine for the run.
        cpus_per_worker: CPUs each actor reserves in the cluster (its environments and acting run on one thread).
    """

    def __init__(self, workers: int, address: str | None = None, cpus_per_worker: float = 1.0) -> None:
        super().__init__()
        self.workers, self.address, self.cpus_per_worker = workers, address, cpus_per_worker
        self._started_ray = False  # this run started the cluster (address None): it stops it too
        self._actors: list[Any] = []  # the collector actors' handles
        self._places: list[tuple[int, str, str]] = []  # each actor's process id, node address and actor id

    def _options(self) -> dict[str, Any]:
        return {"workers": self.workers, "address": self.address, "cpus_per_worker": self.cpus_per_worker}

    def check(self, data: CollectionHost) -> None:
        self._check_workers(data, self.workers)
        if self.cpus_per_worker <= 0:
            raise ValueError(f"{OPTION}.cpus_per_worker must be > 0, got {self.cpus_per_worker}")
        ray_module(type(self).__name__)  # the extra is installed: said before anything runs
        if self.address not in (None, "auto"):  # Ray itself retries an address that does not answer for minutes
            host, _, port = self.address.removeprefix("ray://").rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=_RAY_CONNECT_S):
                    pass
            except (OSError, ValueError) as error:
                raise ValueError(f"{OPTION}.address {self.address}: no Ray cluster answers there ({error})") from None

    def build(self, data: CollectionHost) -> None:
        self._build_ray_collector(data, sync=True, frames_per_batch=data.frames_per_batch)
        self._iterator = iter(self.collector)

    def _build_ray_collector(self, data: CollectionHost, sync: bool, frames_per_batch: int) -> None:
        """TorchRL's ``RayCollector`` over ``workers`` actors: in step (``sync``, ``frames_per_batch`` all actors'
        together) or each on its own (``frames_per_batch`` each, the batch tagged with the actor's index); the learner's
        weights go to an actor before each of its batches."""
        from torchrl.collectors.distributed import RayCollector

        ray = ray_module()
        self._data = data
        if not ray.is_initialized():
            self._join(ray, type(data))
        needed, cpus = self.workers * self.cpus_per_worker, ray.cluster_resources().get("CPU", 0.0)
        if needed > cpus:  # Ray would wait for the room forever
            raise CannotCollect(
                f"{OPTION}.workers {self.workers}: {self.workers} actors of {self.cpus_per_worker:g} CPUs need "
                f"{needed:g} CPUs, the Ray cluster has {cpus:g} (fewer workers, a smaller "
                f"{OPTION}.cpus_per_worker, or more nodes)",
                type(data),
            )
        per_worker, seed = data.num_envs // self.workers, data.rank_seed
        make_envs = [
            partial(
                _ray_worker_env,
                data.declared.env_class,
                data.env_transform,
                num_envs=per_worker,
                seed=seed + w * per_worker,
                device=data.device,
                **dict(data.declared.options),
            )
            for w in range(self.workers)
        ]
        self.collector = RayCollector(
            make_envs,
            data.policy,
            frames_per_batch=frames_per_batch,
            total_frames=_NO_END,  # RayCollector takes -1 for no frames at all, not for no end
            device=data.device,
            collector_class=RayActorCollector,
            collector_kwargs={"trust_policy": True, "auto_register_policy_transforms": False, "tag_worker": not sync},
            sync=sync,
            remote_configs={"num_cpus": self.cpus_per_worker},
            update_after_each_batch=True,  # the latest weights before every batch
            weight_updater=RayPushedWeights(),
        )
        self.collector.update_policy_weights_()  # the first batch acts with the learner's weights too
        # The actors and where each runs (its process and node), for the line that names one that died.
        self._actors = list(self.collector.remote_collectors)
        self._places = ray.get([actor.where.remote() for actor in self._actors])

    def _join(self, ray: Any, owner: type) -> None:
        """Join the cluster at ``address`` (one that answers: :meth:`check`), or start one on this machine (``address``
        None)."""
        # Ray's driver ends the process on SIGTERM (exit status 1): the run's own handler, which stops after the
        # current update and saves, is put back.
        handler = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        try:
            if self.address is None:
                # As many CPUs as the actors reserve, at least: on a small machine they share its cores.
                cpus = max(os.cpu_count() or 1, math.ceil(self.workers * self.cpus_per_worker))
                ray.init(num_cpus=cpus, include_dashboard=False, logging_level="warning")
                self._started_ray = True
                return
            try:
                ray.init(address=self.address, logging_level="warning")
            except ConnectionError as error:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                message = f"{OPTION}.address {self.address}: no Ray cluster to join ({reason})"
                raise CannotCollect(message, owner) from None
        finally:
            if handler is not None:
                signal.signal(signal.SIGTERM, handler)

    def collect(self, steps: int = 0) -> TensorDictBase:
        # [workers, envs per worker, ...] -> [num_envs, ...]: one in-process batch's order (rounds as usual: the
        # actors step their environments)
        return super().collect(steps).flatten(0, 1)

    def sync_weights(self, device: torch.device) -> None:
        """Nothing: the actors get the latest weights before each batch."""

    def state_dict(self) -> dict[str, Any]:
        # As MultiSyncCollector writes its own (CollectorWorkers): each worker's, and the collector's counters.
        workers = {f"worker{w}": state for w, state in enumerate(self.collector.state_dict())}
        frames = self.collector.collected_frames
        return {"workers": {**workers, "frames": frames, "iter": frames // self.collector.frames_per_batch}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "workers" in state:
            workers = state["workers"]
            self.collector.load_state_dict([workers[f"worker{w}"] for w in range(self.workers)])
            self.collector.collected_frames = int(workers["frames"])

    def check_workers_alive(self, error: BaseException | None, frames: int) -> None:
        """One line naming the actor that died (each is asked whether it is alive: Ray's error may not say which),
        where it ran, and Ray's reason, when ``error`` is Ray's report of a dead actor."""
        ray = ray_module()
        if not isinstance(error, ray.exceptions.RayActorError):
            return
        actors = self._actors  # RayCollector empties its own list when an actor dies
        ids = [actor_id for _, _, actor_id in self._places]
        dead = ids.index(error.actor_id) if error.actor_id in ids else None
        for index, actor in enumerate(actors if dead is None else []):
            try:
                ray.get(actor.where.remote(), timeout=_RAY_CONNECT_S)
            except ray.exceptions.RayActorError:
                dead = index
                break
            except ray.exceptions.GetTimeoutError:  # alive, and busy: not the one
                continue
        if dead is None:
            name = "a Ray collector"
        else:
            pid, node, _ = self._places[dead]
            name = f"Ray collector {dead} (process {pid} on {node})"
        # Ray's first line, and how the process ended (not the paragraph of common causes after it).
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
        detail = next((line for line in lines if "exit detail:" in line), "").split(" Some common causes")[0]
        reason = " ".join(filter(None, (lines[0], detail)))
        self._died = True
        continuation = "continue with --ckpt_path last" if self._checkpointed() else "no checkpoint to continue from"
        raise WorkerDied(f"{name} died: {reason} At {frames:,} frames; training stopped: {continuation}")

    def teardown(self) -> None:
        if self.collector is not None:
            with contextlib.suppress(Exception):  # an actor already dead refuses to be asked to stop
                self.collector.shutdown()
            self.collector = None
        self._iterator = None
        if self._started_ray:
            ray_module().shutdown()
            self._started_ray = False


#: Frames a RayCollector collects before it ends: never, for a run.
_NO_END = 2**62
#: Seconds an address's head has to answer before the run says there is no Ray cluster there.
_RAY_CONNECT_S = 5.0


class RayActorCollector(ResumableCollector):
    """A Ray actor's collector: a worker's, named in one line (Ray prefixes the actor's log lines with its ``repr``).
    With ``tag_worker`` its batches say which actor delivered them, in :data:`~compat.torchrl.WORKER_KEY`, as an
    asynchronous collector worker's do (:class:`~compat.torchrl.WorkerTaggedAsyncCollector`)."""

    def __init__(self, *args: Any, tag_worker: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tag_worker = tag_worker

    def __repr__(self) -> str:
        return f"collector worker {self.worker_idx}"

    def next(self) -> TensorDictBase | None:
        batch = super().next()
        if self.tag_worker and batch is not None:
            batch.set(WORKER_KEY, torch.full(batch.shape, self.worker_idx, dtype=torch.long, device=batch.device))
        return batch

    def where(self) -> tuple[int, str, str]:
        """The actor's process id, the address of its node and its Ray actor id."""
        ray = ray_module()
        return os.getpid(), ray.util.get_node_ip_address(), ray.get_runtime_context().get_actor_id()


def ray_module(strategy: str = "RayCollectors") -> Any:
    """Ray, or one line saying how to install it (naming ``strategy``)."""
    try:
        import ray
    except ImportError:
        raise ValueError(f'{OPTION} {strategy}: Ray is not installed; pip install -e ".[distributed]"') from None
    return ray


def _ray_worker_env(env_class: type, transform: Any, **options: Any) -> EnvBase:
    """Builds a Ray actor's environments in its process: its generator seeded as a collector worker's is (the seed of
    its first environment), its standard error Ray's to keep (the actor may run on another machine)."""
    torch.manual_seed(options["seed"])
    env = env_class(**options)
    return env if transform is None else transformed(env, transform.clone())


class AsyncRayCollectors(AsynchronousDelivery, RayCollectors):
    """``workers`` Ray actors as :class:`RayCollectors` runs them, on any machine of a Ray cluster, that never wait
    for the learner, as :class:`AsyncCollectorWorkers` do: each actor starts its next batch of ``num_envs / workers
    × collect_steps`` frames as soon as it delivered one, with the learner's latest weights sent to it first. Delivery
    and resume as :class:`AsynchronousDelivery` says (a resumed run's actors start new episodes); a dead actor ends
    the run with one line naming it, as with :class:`RayCollectors`. Replay data modules only.

    Needs the ``distributed`` extra (``pip install -e ".[distributed]"``).

    Args:
        workers: Ray collector actors; must divide ``num_envs``.
        address: the Ray cluster to join, as :class:`RayCollectors`' (None: a cluster on this machine for the run).
        cpus_per_worker: CPUs each actor reserves in the cluster.
    """

    def check(self, data: CollectionHost) -> None:
        super().check(data)
        self._check_replay(data)

    def build(self, data: CollectionHost) -> None:
        self._data = data
        self._build_ray_collector(data, sync=False, frames_per_batch=self.envs_per_worker * data.collect_steps)
        self._start_feeder(data)

    def state_dict(self) -> dict[str, Any]:
        return {}  # the actors' episodes do not continue (AsynchronousDelivery)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing: the actors start new episodes."""

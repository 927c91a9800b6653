"""Replay fed by collector worker processes: for environments that cost milliseconds a step (emulators).

Each worker process runs its own environments and its own copy of the acting policy (TorchRL's
``MultiAsyncCollector``, or ``MultiSyncCollector`` with ``collector: sync``), one thread each. A feeder thread in the
training process takes their batches as they arrive and queues them, so the workers never wait for the learner:
collection overlaps learning (the seed's "a queue per collector, merged by a consolidation thread"). Before each
update the learner moves every queued batch into the replay buffer and samples from it. Weights reach the workers
through TorchRL's shared-memory weight sync: with the learner on a CPU its parameters themselves live in shared memory,
so the workers act with every update's weights at once; with the learner on a GPU they are copied to the workers'
shared memory every ``weight_sync_interval`` updates.

The replay ratio is a ceiling, not a schedule: there is at most one batch per ``frames_per_update`` frames (the
learner waits for frames when it is faster), and when the learner is slower the workers still collect at full speed
and the learner samples the freshest buffer (it never owes updates for frames it could not keep up with). The queue
holds at most a replay buffer's worth of transitions: a learner so far behind that more are waiting would overwrite
the oldest of them in the buffer before it could sample them, so the feeder drops those oldest batches instead of
holding them in memory (counted in ``data/dropped``, and in the frame counter: they were collected).

**A worker that dies** (a crash in the emulator, an exception in its step, a kill) stops the run at once with one
error naming it and its exception (each worker's stderr is also kept in ``<run>/collector_workers/worker<i>.log``);
nothing is saved after it, so the last checkpoint is intact. Workers are not restarted: a run continues from its
checkpoint with ``--ckpt_path last``.

**Resume** restores the replay buffer, the frame and update counters and the learner's RNG, not the workers'
episodes: a resumed run's workers start new episodes. (The order in which asynchronous workers deliver is not
reproducible anyway; the in-process :class:`~datamodules.replay.ReplayDataModule` resumes exactly.)
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from tensordict import TensorDictBase
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import Compose, EnvBase, RewardSum

from datamodules.base import check_positive
from datamodules.replay import ReplayDataModule
from datamodules.workers import multi_process_collector, worker_death_error, worker_env_factories, workers_log_dir

# The workers step their emulators and act on the CPU whatever the learner's device: a CUDA context per worker costs
# seconds to start and hundreds of MB each, and their small acting batches gain nothing from a GPU. A learner on a GPU
# pushes its weights to their shared memory every weight_sync_interval updates; its batches move to it when stored.
WORKER_DEVICE = torch.device("cpu")
_POLL_S = 1.0  # how often a waiting learner checks that the workers and the feeder are alive


def default_workers() -> int:
    """The machine's cores less one for the learner, at least 1."""
    return max(1, (os.cpu_count() or 1) - 1)


class ParallelReplayDataModule(ReplayDataModule):
    """:class:`~datamodules.replay.ReplayDataModule` whose collection runs in worker processes, overlapping learning.

    Args:
        env: environment factory (see :class:`~datamodules.base.RLDataModule`); rebuilt in each worker from its class
            and options (its ``init_kwargs()``).
        num_workers: collector worker processes; default: the machine's cores less one, at least 1.
        envs_per_worker: environments each worker steps together (``num_envs`` is ``num_workers`` times this).
        collector: ``async`` (each worker delivers as soon as its batch is full: TorchRL's ``MultiAsyncCollector``)
            or ``sync`` (one batch of every worker at a time: ``MultiSyncCollector``).
        collect_steps: environment steps in a worker's batch (``envs_per_worker * collect_steps`` frames).
        weight_sync_interval: updates between pushes of the learner's weights to the workers, when the learner is on a
            GPU (on a CPU the workers share its parameters: every update reaches them at once).
        learner_nice: the training thread's niceness while the workers run (restored at the end), so that on a
            machine without a spare core the learner takes only the CPU time the collectors leave (they must never
            wait for it: the seed's rule). Linux gives each thread its own priority, so the workers and the feeder,
            started before, keep theirs. 0: leave it.
        num_envs, env_workers, collector_workers: not options here (``num_workers`` and ``envs_per_worker`` are);
            refused when set.
        **kwargs: the replay options (``buffer_size``, ``batch_size``, ``frames_per_update``, ``priority_alpha``, ...)
            and the base ones (``seed``, ``eval_episodes``, ...).
    """

    def __init__(
        self,
        env: Callable[..., EnvBase],
        num_workers: int | None = None,
        envs_per_worker: int = 1,
        collector: Literal["async", "sync"] = "async",
        collect_steps: int = 16,
        weight_sync_interval: int = 1,
        learner_nice: int = 10,
        num_envs: int | None = None,
        env_workers: int = 0,
        collector_workers: int = 0,
        **kwargs: Any,
    ) -> None:
        num_workers = default_workers() if num_workers is None else num_workers
        if num_workers < 1:
            raise ValueError(
                f"--data.init_args.num_workers must be >= 1, got {num_workers} (datamodules.replay.ReplayDataModule "
                "collects in the training process)"
            )
        check_positive("envs_per_worker", envs_per_worker)
        if collector not in ("async", "sync"):
            raise ValueError(f"--data.init_args.collector must be async or sync, got {collector!r}")
        if kwargs.get("prefetch"):
            raise ValueError(
                "--data.init_args.prefetch: a ParallelReplayDataModule already collects beside the learner (its worker "
                "processes); prefetch is datamodules.replay.ReplayDataModule's"
            )
        if num_envs is not None or env_workers or collector_workers:
            raise ValueError(
                "--data.init_args.num_envs/env_workers/collector_workers: a ParallelReplayDataModule has num_workers x "
                "envs_per_worker environments, in its own worker processes; set those instead"
            )
        super().__init__(
            env,
            num_envs=num_workers * envs_per_worker,
            collect_steps=collect_steps,
            weight_sync_interval=weight_sync_interval,
            **kwargs,
        )
        check_positive("learner_nice", learner_nice, allow_zero=True)
        self.num_workers, self.envs_per_worker, self.collector_kind = num_workers, envs_per_worker, collector
        self.learner_nice = learner_nice
        self.log_dir: Path | None = None  # each worker's stderr, set from the run's folder when collection starts
        self._learner_priority: int | None = None  # the training thread's niceness before collection started
        self._feeder: _Feeder | None = None
        self._episodes_ended, self._episodes_reported = 0, 0  # training episodes that ended, for monitor()
        self._episode_sums: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------- collection
    def connect(
        self, policy: Any, postprocess: Any = None, batch_keys: Any = None, store_transform: Any = None
    ) -> None:
        if store_transform is not None:
            # TorchRL's MultiStepTransform keeps a window of steps per batch row, and batches of different workers
            # arrive interleaved: their episodes would be summed together.
            raise ValueError(
                "--model.init_args.n_steps: n-step returns need the in-process datamodules.replay.ReplayDataModule "
                "(worker batches arrive interleaved); use n_steps 1 with worker processes"
            )
        super().connect(policy, postprocess, batch_keys, store_transform)

    def _build_collector(self) -> None:
        if self.policy is None:
            raise RuntimeError("the model must call datamodule.connect(policy) in its setup before training starts")
        self.log_dir = workers_log_dir(self.trainer)
        # Each worker's environments sum their episodes' rewards (TorchRL's RewardSum): the training episodes' return,
        # which monitor() reports with their other metrics.
        episode_return = RewardSum()
        transform = (
            episode_return if self.env_transform is None else Compose(self.env_transform.clone(), episode_return)
        )
        make_envs = worker_env_factories(
            self.log_dir,
            self._env_class,
            self._env_options,
            transform,
            self.num_workers,
            self.envs_per_worker,
            self.rank_seed,
            WORKER_DEVICE,
        )
        asynchronous = self.collector_kind == "async"
        self.collector = multi_process_collector(
            MultiAsyncCollector if asynchronous else MultiSyncCollector,
            make_envs,
            self.policy,
            frames_per_batch=(self.envs_per_worker if asynchronous else self.num_envs) * self.collect_steps,
            device=WORKER_DEVICE,
        )
        self._feeder = _Feeder(self.collector, max_batches=-(-self.buffer_size // self.worker_batch_frames))
        self._feeder.start()
        if self.learner_nice:  # after the workers and the feeder started: they keep the priority they had
            self._learner_priority = os.getpriority(os.PRIO_PROCESS, 0)  # Linux: this thread's
            os.setpriority(os.PRIO_PROCESS, 0, max(self._learner_priority, self.learner_nice))
        if self.trainer is not None and self.trainer.world_size > 1:
            torch.manual_seed(self.rank_seed)  # see RLDataModule._build_collector

    def delivered(self, wait: bool) -> TensorDictBase | None:
        """The next batch a worker delivered, shaped ``[envs_per_worker, collect_steps]`` (``[num_envs,
        collect_steps]`` with ``collector: sync``); None when none is waiting and ``wait`` is false."""
        with self.timer.phase("collect"):
            while True:
                try:
                    item = self._feeder.batches.get(timeout=_POLL_S if wait else 0)
                    break
                except queue.Empty:
                    if not wait:
                        return None
                    if not self._feeder.is_alive():
                        raise RuntimeError("the collector feeder thread stopped without a word") from None
        if isinstance(item, BaseException):
            self._raise_worker_death(item)
        self.frames += item.numel() + self._feeder.take_dropped_frames()
        return item

    def _batches(self) -> Iterator[TensorDictBase]:
        while True:
            # Everything delivered since the last update goes into the buffer; wait only while the buffer is short
            # of its warm-up or the learner is a whole update ahead of the frames.
            while True:
                wait = self.frames < self.warmup_frames or self.update_credit < 1.0
                batch = self.delivered(wait)
                if batch is None:
                    break
                self._count_episodes(batch)
                with self.timer.phase("buffer_write"):
                    self._store(batch.to(self.device))
                if self.frames >= self.warmup_frames:
                    self.update_credit += batch.numel() / self.frames_per_update
            # A learner slower than the workers does not owe the updates it could not take: it samples the freshest
            # buffer instead. (At most one worker batch's worth of updates is kept as credit.)
            self.update_credit = min(self.update_credit, max(1.0, self.worker_batch_frames / self.frames_per_update))
            if self.prioritized:
                self.buffer.sampler.beta = self.importance_beta(self.trainer.global_step if self.trainer else 0)
            with self.timer.phase("sample"):
                sample = self.buffer.sample(self.batch_size)
            self.update_credit -= 1.0
            self.samples += sample.numel()
            if self.prioritized:
                self._served_indices.append(sample["index"])
            yield sample

    def _count_episodes(self, batch: TensorDictBase) -> None:
        """Add the training episodes that ended in ``batch`` to the figures :meth:`monitor` reports (their episode
        metrics, e.g. Mario's ``x_pos``, which the environment writes on an episode's last step)."""
        done = batch.get(("next", "done")).reshape(-1)
        ended = int(done.sum())
        if ended:
            for key, name in (("episode_reward", "return"), *((key, key) for key in self.episode_metric_keys)):
                self._episode_sums[name] = self._episode_sums.get(name, 0.0) + float(
                    batch.get(("next", key)).reshape(-1)[done].sum()
                )
        self._episodes_ended += ended

    def monitor(self) -> dict[str, float]:
        """The seed's monitoring: replay buffer fill, worker batches queued for the buffer, experiences collected,
        training episodes ended, and their return and episode metrics (means over those ended since the last report:
        ``train/return_mean``, and e.g. Mario's ``train/x_pos_mean``)."""
        figures = {
            "data/buffer": float(len(self.buffer)) if self.buffer is not None else 0.0,
            "data/queued_batches": float(self.queued_batches),
            "data/dropped": float(self._feeder.dropped_batches) if self._feeder is not None else 0.0,
            "data/experiences": float(self.frames),
        }
        ended = self._episodes_ended - self._episodes_reported
        if ended:
            figures.update({f"train/{key}_mean": total / ended for key, total in self._episode_sums.items()})
        figures["data/episodes"] = float(self._episodes_ended)
        self._episodes_reported, self._episode_sums = self._episodes_ended, {}
        return figures

    @property
    def worker_batch_frames(self) -> int:
        per_batch = self.envs_per_worker if self.collector_kind == "async" else self.num_envs
        return per_batch * self.collect_steps * self.agents_per_env

    @property
    def queued_batches(self) -> int:
        """Worker batches delivered and not yet in the replay buffer."""
        return 0 if self._feeder is None else self._feeder.batches.qsize()

    def sync_weights(self) -> None:
        self.collector.update_policy_weights_()

    def _raise_worker_death(self, error: BaseException) -> None:
        """One error naming the worker and the exception it printed; the last checkpoint is left as it was."""
        death = worker_death_error(error, self.log_dir, self.frames)
        if death is None:  # not a death TorchRL reported: the feeder's own error, as it is
            raise RuntimeError(f"collecting from the workers failed: {error}") from error
        raise death from error

    def teardown(self, stage: str) -> None:
        if self._feeder is not None:
            self._feeder.stopping = True
        super().teardown(stage)  # shuts the collector down, which ends the feeder
        if self._feeder is not None:
            self._feeder.join(timeout=5 * _POLL_S)
            self._feeder = None
        if self._learner_priority is not None:
            with contextlib.suppress(PermissionError):  # only a privileged user may lower a niceness again
                os.setpriority(os.PRIO_PROCESS, 0, self._learner_priority)
            self._learner_priority = None

    # ------------------------------------------------------------------------------------------- checkpoints
    def collection_state(self) -> dict[str, Any]:
        return {}  # the workers' episodes are not resumed (module docstring)


class _Feeder(threading.Thread):
    """Iterates the multi-process collector (each ``next`` also tells the delivering worker to go on) and queues what
    arrives, or the exception that ended it, for the learner; beyond ``max_batches`` waiting, the oldest is dropped."""

    def __init__(self, collector: Any, max_batches: int) -> None:
        super().__init__(name="collector-feeder", daemon=True)
        self.collector, self.max_batches = collector, max_batches
        self.batches: queue.Queue = queue.Queue()
        self.stopping = False  # set before shutting the collector down: what breaks then is not an error
        self.dropped_batches = 0
        self._dropped_frames = 0  # not yet added to the learner's frame counter
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            for batch in self.collector:
                while self.batches.qsize() >= self.max_batches:  # only batches are queued before an exception
                    try:
                        oldest = self.batches.get_nowait()
                    except queue.Empty:
                        break
                    with self._lock:
                        self.dropped_batches += 1
                        self._dropped_frames += oldest.numel()
                self.batches.put(batch)
        except BaseException as error:  # noqa: BLE001 - handed to the learner, which raises it with context
            if not self.stopping:
                self.batches.put(error)

    def take_dropped_frames(self) -> int:
        """Frames of the batches dropped since the last call."""
        with self._lock:
            frames, self._dropped_frames = self._dropped_frames, 0
        return frames

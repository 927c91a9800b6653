"""How experience is collected: one strategy object per way, chosen by the data module's ``collection`` option.

- :class:`InProcess` (the default): the environments step in the training process and the policy acts on the whole
  batch; ``prefetch: true`` prepares the next round in a background thread beside the updates (replay modules).
- :class:`EnvWorkers`: ``workers`` processes step the environments (TorchRL's ``ParallelEnv``); the policy acts in
  the training process on the whole batch; ``prefetch`` as above.
- :class:`CollectorWorkers`: ``workers`` processes, each with its environments and a copy of the policy (TorchRL's
  ``MultiSyncCollector``), in step with the learner: every batch collected with the latest weights, resumed exactly.
- :class:`AsyncCollectorWorkers`: ``workers`` processes as above (``MultiAsyncCollector``) that never wait for the
  learner: a feeder thread queues what they deliver for the replay buffer (emulators: Mario). Replay modules only.
- ``RayCollectors`` and ``AsyncRayCollectors`` (:mod:`datamodules.remote`): Ray actors on any machine of a Ray
  cluster, in step with the learner or delivering as asynchronous workers do.

In a config::

    data:
      init_args:
        num_envs: 32                # all the workers' environments together
        collection:
          class_path: datamodules.collection.CollectorWorkers
          init_args: {workers: 16}

and on the command line ``--data.init_args.collection CollectorWorkers --data.init_args.collection.workers 16``
(``--data.init_args.collection.prefetch true`` for the default :class:`InProcess`). What cannot be combined cannot
be written: prefetch is an option of the two strategies that collect in this process only, and each kind of worker
is its own strategy. The rest is checked against the data module when it is built (:meth:`Collection.check`).

Each strategy builds its collector (:meth:`Collection.build`), hands out batches (:meth:`Collection.collect`), chooses
how a replay data module's rounds reach the updates (:meth:`Collection.replay_delivery`: inline, prepared in the
background, or as asynchronous workers deliver; ``datamodules/delivery.py``), holds what continues its collection
exactly (:meth:`Collection.state_dict`), stops its processes and threads (:meth:`Collection.teardown`) and turns a
dead worker into one error naming it (:meth:`Collection.check_workers_alive`). Nothing outside a strategy and its
delivery asks which strategy it is (``tests/app/test_layout.py``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import EnvBase, ParallelEnv

from checkpoints.files import CheckpointMismatch, from_plain, to_plain
from compat.torchrl import (
    WorkerTaggedAsyncCollector,
    collector_carrier,
    parallel_env_load_state,
    parallel_env_lower_done_flags,
    parallel_env_processes,
    round_on_carrier,
)
from datamodules.delivery import BackgroundRounds, DeliveredRounds, InlineRounds
from datamodules.workers import (
    ResumableCollector,
    WorkerWatch,
    error_chain,
    logged_env,
    multi_process_collector,
    remove_temporary_logs,
    stateful_env,
    use_forkserver,
    worker_death_error,
    worker_env_factories,
    workers_log_dir,
)

if TYPE_CHECKING:
    from datamodules.delivery import ReplayHost
    from datamodules.episodes import EpisodeStatistics
    from datamodules.memory import MemoryNeed, WorkerMemory
    from envs.base import EnvDeclaration

OPTION = "data.collection"

# AsyncCollectorWorkers' workers step their emulators and act on the CPU whatever the learner's device: a CUDA context
# per worker costs seconds to start and hundreds of MB each, and their small acting batches gain nothing from a GPU. A
# learner on a GPU pushes its weights to their shared memory every weight_sync_interval updates; its batches move to
# it when stored.
WORKER_DEVICE = torch.device("cpu")
_POLL_S = 1.0  # how often a waiting learner checks that the workers and the feeder are alive
#: How long a learner that saw a worker's pipe close waits for that worker's end before it reports the error as is.
_ENDING_S = 20.0


class CollectionHost(Protocol):
    """What a strategy is built from: its data module's environments, policy and batch geometry, and nothing else of
    it (:class:`~datamodules.base.RLDataModule` is one; this module imports none, so the two do not import each other).

    Attributes:
        declared: the environment's class and options (what a worker process rebuilds it from) and declarations.
        policy: the acting policy (None until the model connects).
        env_transform: the transform every environment the policy acts in carries (a recurrent state's primer).
        num_envs, collect_steps, agents_per_env: the batch: ``num_envs`` environments of ``agents_per_env`` agents,
            ``collect_steps`` steps a collector call.
        device: where environments and collected batches live.
        frames: frames collected so far (for error messages).
        trainer: the run's trainer (its folder keeps the workers' logs), or None.
        worker_memory: what one worker process holds, measured when the data module was built (None: no workers).
        episodes: the training episodes' statistics, which every collected batch updates.
        buffer_size: the replay buffer's transitions (a replay data module's: asynchronous workers feed only those).
        accepts_store_transform: whether the data module stores transitions (a replay buffer).
        accepts_prefetch: whether the data module makes replay rounds that may be prepared in the background.
    """

    declared: EnvDeclaration
    policy: TensorDictModuleBase | None
    env_transform: Any
    num_envs: int
    collect_steps: int
    agents_per_env: int
    device: torch.device
    frames: int
    trainer: Any
    worker_memory: WorkerMemory | None
    episodes: EpisodeStatistics
    buffer_size: int
    accepts_store_transform: bool
    accepts_prefetch: bool

    @property
    def frames_per_batch(self) -> int: ...

    @property
    def rank_seed(self) -> int: ...

    def make_env(self, num_envs: int, seed: int, options: dict[str, Any] | None = None) -> EnvBase: ...

    def with_env_transform(self, env: EnvBase) -> EnvBase: ...


class Collection:
    """How a data module collects: the base of the strategies (the module docstring lists them).

    A strategy is configured first (its constructor: only its own options), then checked against the data module
    that owns it (:meth:`check`, in the data module's constructor), then built when the first batch is asked for
    (:meth:`build`). One strategy object serves one data module.
    """

    #: prepares the next round in a background thread (:class:`InProcess`, :class:`EnvWorkers` with ``prefetch``)
    prefetch: bool = False
    #: whether a resumed run's environments continue the episodes the checkpoint's were playing (where the
    #: environment's state is exact); asynchronous workers start new ones
    continues_episodes: bool = True
    #: whether collection goes on while the learner pauses (asynchronous workers): a pause of the learner then changes
    #: what each update sees, so the throughput report times its yardstick only after such a run
    runs_beside_learner: bool = False

    def __init__(self) -> None:
        self.collector: Collector | MultiSyncCollector | MultiAsyncCollector | None = None
        self._iterator: Any = None
        self._log_dir: Path | None = None  # collector workers' stderr, under the run's folder
        self._died = False  # a worker died (check_workers_alive raised)
        self._watch: WorkerWatch | None = None  # the worker processes' liveness (strategies with workers)

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self._options().items())
        return f"{type(self).__name__}({options})"

    def _options(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------------------------------- lifecycle
    def check(self, data: CollectionHost) -> None:
        """Refuse, with one line naming the flag, what this strategy cannot do for ``data`` (before anything runs)."""
        if self.prefetch and not data.accepts_prefetch:
            raise ValueError(
                f"{OPTION}.prefetch: prepares replay rounds in the background; "
                f"{type(data).__name__} has none (datamodules.replay.ReplayDataModule has)"
            )

    def replay_delivery(self, replay: ReplayHost) -> InlineRounds:
        """How ``replay``'s rounds reach its updates (``datamodules/delivery.py``): in the training thread, or with
        ``prefetch`` in a background thread."""
        return BackgroundRounds(replay) if self.prefetch else InlineRounds()

    def build(self, data: CollectionHost) -> None:
        """Build the collector for ``data`` (connected: it has the model's policy)."""
        raise NotImplementedError

    #: whether the collector and its environments' carrier live in this process, so that its rounds can be stepped
    #: on the carrier directly, of any number of steps (:meth:`collect`)
    rounds_of_any_length = False

    def collect(self, steps: int = 0) -> TensorDictBase:
        """The next collected batch (the training thread, or the prefetch thread): a round of the data module's
        ``collect_steps``, or with ``steps`` (for rounds no update waits on: the warm-up) a round of that many steps of
        every environment, where the strategy steps its environments from this process; the others collect their
        usual round. Those rounds are stepped on the collector's carrier (:func:`compat.torchrl.round_on_carrier`):
        the same steps as its own rounds, to the bit, without its per-round bookkeeping, a noticeable share of a
        round of a few small steps (docs/history/gymnasium.md, "Rounds on the collector's carrier, and a Lightning step
        over several rounds", measures it)."""
        try:
            if self.rounds_of_any_length:
                batch = round_on_carrier(self.collector, steps or self._data.collect_steps)
                if batch is not None:
                    return batch
            return next(self._iterator)
        except Exception as error:
            self.check_workers_alive(error, self._frames())
            raise

    def load_state_watched(self, state: dict[str, Any]) -> None:
        """:meth:`load_state_dict`, a worker that dies meanwhile one error naming it (:meth:`check_workers_alive`)."""
        try:
            self.load_state_dict(state)
        except Exception as error:
            self.check_workers_alive(error, self._frames())
            raise

    def sync_weights(self, device: torch.device) -> None:
        """Push the learner's weights to the collector's policy, where it does not share them (another device)."""
        if self.collector.policy_device != device:
            self.collector.update_policy_weights_()

    def state_dict(self) -> dict[str, Any]:
        """What continues collection exactly (entries of the data module's state)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` wrote (``state`` is the data module's whole state)."""

    def teardown(self) -> None:
        """Stop the collector and whatever runs beside it; the strategy can be built again after."""
        if self._watch is not None:  # the workers' exits from here on are not deaths
            self._watch.stop()
            self._watch = None
        if self.collector is not None:
            self.collector.shutdown()
            self.collector = None
        self._iterator = None
        if not self._died:  # a dead worker's error names its log, which stays
            remove_temporary_logs(self._log_dir)

    def check_workers_alive(self, error: BaseException | None, frames: int) -> None:
        """Raise one error naming the worker (and how it died) when a worker process died: the watch saw it, or
        ``error`` reports it. Nothing is saved after it, so the last checkpoint is the one to continue from. (Workers
        are not restarted: a restarted worker's environments would not continue the episodes the checkpointed run was
        playing.) Strategies without workers have nothing to check."""
        if self._watch is None:
            return
        processes = self._processes()
        if error is not None:  # the learner's wait may have ended (a closed pipe) before the watch's next look
            closed = any(isinstance(cause, EOFError | ConnectionError) for cause in error_chain(error))
            self._watch.settle(timeout_s=_ENDING_S if closed else 2.0, ending=closed, processes=processes)
        death = worker_death_error(
            error, self._log_dir, frames, self._watch, self.worker_kind, processes, self._checkpointed()
        )
        if death is not None:
            self._died = True
            raise death from (None if isinstance(death, CheckpointMismatch) else error)

    #: how the error names a worker: "environment" (env workers) or "collector"
    worker_kind = "collector"

    def _processes(self) -> list[Any]:
        """The workers' ``multiprocessing`` process objects, by index: TorchRL's multi-process collectors'."""
        return list(getattr(self.collector, "procs", None) or [])

    def build_watched(self, data: CollectionHost) -> None:
        """:meth:`build`, with the worker processes it starts watched from their start (:class:`WorkerWatch`): a
        worker that dies while the collector is being built is one error naming it too."""
        if self.uses_workers:
            use_forkserver()
            self._watch = WorkerWatch()
            self._watch.start()
        try:
            self.build(data)
        except Exception as error:
            self.check_workers_alive(error, data.frames)
            raise
        if self._watch is not None:
            self._watch.number([process.pid for process in self._processes()])

    #: whether the strategy starts worker processes
    uses_workers = False
    #: how many (a strategy with workers sets it from its ``workers`` option)
    workers = 0

    def memory_needs(self, data: CollectionHost) -> list[MemoryNeed]:
        """The memory its worker processes will hold, each an interpreter with ``num_envs / workers`` environments
        (``data.worker_memory``, measured when ``data`` was built: ``datamodules/memory.py``); none without workers."""
        if not self.uses_workers or data.worker_memory is None:
            return []
        flag = f"{OPTION}.workers {self.workers}"
        return [data.worker_memory.need(self.workers, data.num_envs // self.workers, flag)]

    def monitor(self) -> dict[str, float]:
        """Figures about the collection that the model logs with its losses. Default: none."""
        return {}

    # ------------------------------------------------------------------------------------------- shared parts
    _data: CollectionHost | None = None

    def _frames(self) -> int:
        return self._data.frames if self._data is not None else 0

    def _checkpointed(self) -> bool:
        """Whether the run has a checkpoint to continue from: it resumed from one, or saved one (True when unknown)."""
        trainer = self._data.trainer if self._data is not None else None
        if trainer is None:
            return True
        return bool(trainer.ckpt_path) or bool(getattr(trainer.checkpoint_callback, "last_model_path", ""))

    def _check_workers(self, data: CollectionHost, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"{OPTION}.workers must be >= 1, got {workers}")
        if data.num_envs % workers:
            raise ValueError(f"{OPTION}.workers ({workers}) must divide data.num_envs ({data.num_envs})")

    def _in_process_collector(self, data: CollectionHost, env: EnvBase) -> None:
        self._data = data
        self.collector = Collector(
            env,
            data.policy,
            frames_per_batch=data.frames_per_batch,
            total_frames=-1,
            device=data.device,
            policy_device=data.device,  # the model's own device: the collector then runs the policy in place
            trust_policy=True,
            track_traj_ids=False,
            auto_register_policy_transforms=False,
        )
        self._iterator = iter(self.collector)

    def _in_process_state(self) -> dict[str, Any]:
        return {
            "env": dict(stateful_env(self.collector.env).state_dict()),
            "carrier": to_plain(collector_carrier(self.collector).exclude("collector")),
        }

    def _load_in_process_state(self, state: dict[str, Any]) -> None:
        if "env" not in state:
            return
        env = stateful_env(self.collector.env)
        try:
            if isinstance(env, ParallelEnv):  # ends at a worker's death, not after TorchRL's timeout per worker
                parallel_env_load_state(env, state["env"])
            else:
                env.load_state_dict(state["env"])
        except RuntimeError as error:  # torch's own refusal (another number of environments, say): many lines
            reason = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
            raise CheckpointMismatch(f"its environment state does not fit this run's environment: {reason}") from None
        if isinstance(env, ParallelEnv):
            # TorchRL 0.14's workers raise their shared "step done" flag after loading a state and nothing lowers
            # it, so the next step would read the workers' buffers before they are written (the ParallelEnv resume
            # test fails if this moves).
            parallel_env_lower_done_flags(env)
        # The collector carries the last observations (and recurrent states) between calls; with them restored
        # too, collection continues exactly where the checkpointed run stood. An environment without an exact state
        # (BatchedEnv.exact_state) ended its episodes on loading: the collector carries its reset's observations
        # (and fresh recurrent states) instead.
        if self._data.declared.exact_state:
            carrier = from_plain(state["carrier"], batch_dims=1, device=self.collector.env.device)
        else:
            carrier = self.collector.env.reset()
        collector_carrier(self.collector).update(carrier)


class InProcess(Collection):
    """The environments step in the training process and the policy acts on the whole batch (the default).

    Args:
        prefetch: prepare the next collection's round (collect, write, draw the batches of the updates it earns) in a
            background thread while the model takes this round's updates (replay data modules only; see
            :class:`~datamodules.replay.ReplayDataModule`). The round acts with a copy of the weights taken after
            the current round's first update, the same in every run, so runs repeat and resume exactly.
    """

    rounds_of_any_length = True

    def __init__(self, prefetch: bool = False) -> None:
        super().__init__()
        self.prefetch = prefetch

    def _options(self) -> dict[str, Any]:
        return {"prefetch": self.prefetch} if self.prefetch else {}

    def build(self, data: CollectionHost) -> None:
        self._in_process_collector(data, data.make_env(data.num_envs, data.rank_seed))

    def state_dict(self) -> dict[str, Any]:
        return self._in_process_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_in_process_state(state)


class EnvWorkers(Collection):
    """The training environments step in ``workers`` processes (TorchRL's ``ParallelEnv``, one thread each,
    ``num_envs / workers`` environments per worker, seeded as one batch would be); the policy acts in the training
    process on the whole batch (on the trainer's GPU, if any). For environments whose step holds the GIL (C++
    simulators such as MettaGrid). Evaluation environments stay in the training process. Resumes exactly.

    Args:
        workers: environment worker processes; must divide ``num_envs``.
        prefetch: as :class:`InProcess`'s.
    """

    uses_workers = True
    worker_kind = "environment"
    rounds_of_any_length = True

    def __init__(self, workers: int, prefetch: bool = False) -> None:
        super().__init__()
        self.workers, self.prefetch = workers, prefetch

    def _options(self) -> dict[str, Any]:
        return {"workers": self.workers, **({"prefetch": True} if self.prefetch else {})}

    def check(self, data: CollectionHost) -> None:
        super().check(data)
        self._check_workers(data, self.workers)

    def build(self, data: CollectionHost) -> None:
        # Worker w runs environments w * num_envs / workers ... of the batch with their own seeds, so the batch plays
        # what one in-process batch would.
        per_worker, seed = data.num_envs // self.workers, data.rank_seed
        self._log_dir = workers_log_dir(data.trainer)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        env = ParallelEnv(
            self.workers,
            [
                partial(
                    logged_env,
                    self._log_dir / f"worker{w}.log",
                    data.declared.env_class,
                    os.getpid(),
                    num_envs=per_worker,
                    seed=seed + w * per_worker,
                    device=data.device,
                    **data.declared.options,
                )
                for w in range(self.workers)
            ],
            num_threads=torch.get_num_threads(),  # ParallelEnv would otherwise change this process's threads
            num_sub_threads=1,
        )
        self._in_process_collector(data, data.with_env_transform(env))

    def state_dict(self) -> dict[str, Any]:
        return self._in_process_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_in_process_state(state)

    def _processes(self) -> list[Any]:
        return [] if self.collector is None else parallel_env_processes(stateful_env(self.collector.env))


class CollectorWorkers(Collection):
    """``workers`` processes, each with its own ``num_envs / workers`` environments and its own copy of the policy
    (TorchRL's ``MultiSyncCollector``, one thread each), in step with the learner: the latest weights reach them
    through shared memory before every batch, so the data stays on-policy, and a batch is all workers' environments
    in the order of one in-process batch. Each worker's generator is seeded from its environments' seed. Resumes
    exactly: the checkpoint holds each worker's environments, carried observations (and recurrent states) and
    generator. Each worker's stderr is kept in ``<run>/collector_workers/worker<i>.log``.

    Args:
        workers: collector worker processes; must divide ``num_envs``.
    """

    uses_workers = True

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers

    def _options(self) -> dict[str, Any]:
        return {"workers": self.workers}

    def check(self, data: CollectionHost) -> None:
        self._check_workers(data, self.workers)

    def build(self, data: CollectionHost) -> None:
        self._data = data
        self._log_dir = workers_log_dir(data.trainer)
        self.collector = multi_process_collector(
            MultiSyncCollector,
            worker_env_factories(
                self._log_dir,
                data.declared.env_class,
                dict(data.declared.options),
                data.env_transform,
                self.workers,
                data.num_envs // self.workers,
                data.rank_seed,
                data.device,
            ),
            data.policy,
            data.frames_per_batch,
            data.device,
            collector_class=ResumableCollector,
            cat_results=0,  # [num_envs, ...]: the workers' environments in the order of one in-process batch
            use_buffers=True,  # each worker writes its batch into shared memory (TorchRL's default, said)
            update_at_each_batch=True,  # the latest weights before every batch: on-policy data, fewest pushes
        )
        self._iterator = iter(self.collector)

    def sync_weights(self, device: torch.device) -> None:
        """Nothing: the workers get the latest weights before each batch (``update_at_each_batch``)."""

    def state_dict(self) -> dict[str, Any]:
        return {"workers": self.collector.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "workers" in state:
            self.collector.load_state_dict(state["workers"])


class AsynchronousDelivery:
    """What the strategies whose collectors never wait for the learner share (:class:`AsyncCollectorWorkers`,
    :class:`AsyncRayCollectors`): a feeder thread takes each worker's batch as it arrives and queues it (the
    reference's "a queue per collector, merged by a consolidation thread"); before each update the learner moves every
    queued batch into the replay buffer (:class:`~datamodules.delivery.DeliveredRounds`). The replay ratio is then a
    ceiling: at most one batch per ``frames_per_update`` frames (a learner faster than collection waits; a slower one
    samples the freshest buffer and never holds the workers up). The queue holds at most a replay buffer's worth of
    transitions: a learner so far behind that more are waiting would overwrite the oldest of them in the buffer before
    it could sample them, so the feeder drops those oldest batches instead (counted in ``data/dropped``, and in the
    frame counter: they were collected). The feeder hands every batch, dropped ones too, to the data module's
    training-episode statistics (``datamodules/episodes.py``), tagged with the worker that delivered it.

    **Resume** restores the replay buffer, the frame and update counters and the learner's RNG, not the workers'
    episodes: a resumed run's workers start new episodes (the order in which asynchronous workers deliver is not
    reproducible anyway)."""

    runs_beside_learner = True
    continues_episodes = False
    workers: int
    collector: Any
    _data: CollectionHost | None
    _watch: WorkerWatch | None
    _feeder: _Feeder | None = None

    def _check_replay(self, data: CollectionHost) -> None:
        if not data.accepts_store_transform:
            name = type(self).__name__
            raise ValueError(
                f"{OPTION} {name}: {type(data).__name__} has no replay buffer to feed (asynchronous workers need "
                f"datamodules.replay.ReplayDataModule; {name.removeprefix('Async')} collects in step with the learner)"
            )

    @property
    def envs_per_worker(self) -> int:
        return self._data.num_envs // self.workers

    @property
    def batch_frames(self) -> int:
        """Frames of one worker's batch."""
        return self.envs_per_worker * self._data.collect_steps * self._data.agents_per_env

    def _start_feeder(self, data: CollectionHost) -> None:
        self._feeder = _Feeder(
            self.collector, max_batches=-(-data.buffer_size // self.batch_frames), observe=data.episodes.observe
        )
        self._feeder.start()

    def replay_delivery(self, replay: ReplayHost) -> DeliveredRounds:
        """Rounds of what the workers delivered: one batch per update, at most one per ``frames_per_update``
        frames."""
        return DeliveredRounds(self)

    def collect(self, steps: int = 0) -> TensorDictBase:
        raise RuntimeError(f"{type(self).__name__} delivers batches as the workers fill them: use delivered()")

    def delivered(self, wait: bool) -> tuple[TensorDictBase, int] | None:
        """The next batch a worker delivered, shaped ``[num_envs / workers, collect_steps]``, and the frames of the
        batches dropped since the last call; None when none is waiting and ``wait`` is false."""
        while True:
            try:
                item = self._feeder.batches.get(timeout=_POLL_S if wait else 0)
                break
            except queue.Empty:
                # A dead worker can leave the feeder waiting on TorchRL's queue for good: the watch is asked too.
                if self._watch is not None and self._watch.death is not None:
                    self._raise_death_reported_by_feeder()
                if not wait:
                    return None
                if not self._feeder.is_alive():
                    raise RuntimeError("the collector feeder thread stopped without a word") from None
        if isinstance(item, BaseException):
            self.check_workers_alive(item, self._frames())
            # not a death TorchRL reported: the feeder's own error, as it is
            raise RuntimeError(f"collecting from the workers failed: {item}") from item
        return item, self._feeder.take_dropped_frames()

    def _raise_death_reported_by_feeder(self) -> None:
        """The watch saw a worker die: raise the error naming it, with TorchRL's report of it (which has its exit
        code when TorchRL collected the worker first) if the feeder queues one within a moment."""
        try:
            report = self._feeder.batches.get(timeout=2.0)
        except queue.Empty:
            report = None
        self.check_workers_alive(report if isinstance(report, BaseException) else None, self._frames())

    @property
    def queued_batches(self) -> int:
        """Worker batches delivered and not yet in the replay buffer."""
        return 0 if self._feeder is None else self._feeder.batches.qsize()

    def monitor(self) -> dict[str, float]:
        """Worker batches queued for the buffer and dropped."""
        return {
            "data/queued_batches": float(self.queued_batches),
            "data/dropped": float(self._feeder.dropped_batches) if self._feeder is not None else 0.0,
        }

    def teardown(self) -> None:
        """The strategy's own teardown, the feeder told first that what breaks now is not an error, and joined after
        the collector's shutdown ended it."""
        if self._feeder is not None:
            self._feeder.stopping = True
        super().teardown()
        if self._feeder is not None:
            self._feeder.join(timeout=5 * _POLL_S)
            self._feeder = None


class AsyncCollectorWorkers(AsynchronousDelivery, Collection):
    """``workers`` processes, each stepping ``num_envs / workers`` environments with its own copy of the policy, one
    thread each (TorchRL's ``MultiAsyncCollector``), that never wait for the learner: for environments that cost
    milliseconds a step (emulators). Replay data modules only; delivery and resume as :class:`AsynchronousDelivery`
    says.

    The workers act on the CPU whatever the learner's device; with the learner on a CPU its parameters themselves
    live in shared memory, so every update reaches them at once; with the learner on a GPU the weights are copied
    to them every ``weight_sync_interval`` updates.

    Args:
        workers: collector worker processes; must divide ``num_envs``.
        learner_nice: the training thread's niceness while the workers run (restored at the end), so that on a
            machine without a spare core the learner takes only the CPU time the collectors leave (they must never
            wait for it: the reference's rule). Linux gives each thread its own priority, so the workers and the feeder,
            started before, keep theirs. 0: leave it.
    """

    uses_workers = True

    def __init__(self, workers: int, learner_nice: int = 10) -> None:
        super().__init__()
        self.workers, self.learner_nice = workers, learner_nice
        self._learner_priority: int | None = None  # the training thread's niceness before collection started

    def _options(self) -> dict[str, Any]:
        return {"workers": self.workers, "learner_nice": self.learner_nice}

    def check(self, data: CollectionHost) -> None:
        self._check_workers(data, self.workers)
        if self.learner_nice < 0:
            raise ValueError(f"{OPTION}.learner_nice must be >= 0, got {self.learner_nice}")
        self._check_replay(data)

    def build(self, data: CollectionHost) -> None:
        self._data = data
        self._log_dir = workers_log_dir(data.trainer)
        make_envs = worker_env_factories(
            self._log_dir,
            data.declared.env_class,
            dict(data.declared.options),
            data.env_transform,
            self.workers,
            self.envs_per_worker,
            data.rank_seed,
            WORKER_DEVICE,
        )
        self.collector = multi_process_collector(
            WorkerTaggedAsyncCollector,  # the episode statistics continue each worker's environments' sums
            make_envs,
            data.policy,
            frames_per_batch=self.envs_per_worker * data.collect_steps,
            device=WORKER_DEVICE,
        )
        self._start_feeder(data)
        if self.learner_nice:  # after the workers and the feeder started: they keep the priority they had
            self._learner_priority = os.getpriority(os.PRIO_PROCESS, 0)  # Linux: this thread's
            os.setpriority(os.PRIO_PROCESS, 0, max(self._learner_priority, self.learner_nice))

    def sync_weights(self, device: torch.device) -> None:
        self.collector.update_policy_weights_()

    def teardown(self) -> None:
        super().teardown()
        if self._learner_priority is not None:
            with contextlib.suppress(PermissionError):  # only a privileged user may lower a niceness again
                os.setpriority(os.PRIO_PROCESS, 0, self._learner_priority)
            self._learner_priority = None


class _Feeder(threading.Thread):
    """Iterates the multi-process collector (each ``next`` also tells the delivering worker to go on), hands each
    batch to ``observe`` (the training-episode statistics: a dropped batch's episodes were played too) and queues it,
    or the exception that ended it, for the learner; beyond ``max_batches`` waiting, the oldest is dropped."""

    def __init__(self, collector: Any, max_batches: int, observe: Callable[[TensorDictBase], None]) -> None:
        super().__init__(name="collector-feeder", daemon=True)
        self.collector, self.max_batches, self.observe = collector, max_batches, observe
        self.batches: queue.Queue = queue.Queue()
        self.stopping = False  # set before shutting the collector down: what breaks then is not an error
        self.dropped_batches = 0
        self._dropped_frames = 0  # not yet added to the learner's frame counter
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            for batch in self.collector:
                self.observe(batch)
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


#: ``act_precision`` values and the autocast dtype each acts in (None: no autocast).
ACT_DTYPES: dict[str, torch.dtype | None] = {"32": None, "bf16": torch.bfloat16}


class AutocastPolicy(TensorDictModuleBase):
    """Runs ``policy`` under ``torch.autocast(device_type, dtype)``; the floating-point entries it writes come back in
    float32, so collected batches keep the dtypes the update expects. The weights stay ``policy``'s own (float32,
    shared with the learner as before); autocast casts them per call."""

    def __init__(self, policy: TensorDictModuleBase, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.policy, self.device_type, self.dtype = policy, device_type, dtype
        self.in_keys, self.out_keys = policy.in_keys, policy.out_keys

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.policy(tensordict)
        for key in self.out_keys:
            value = out.get(key, None)
            if isinstance(value, torch.Tensor) and value.dtype == self.dtype:
                out.set(key, value.float())
        return out

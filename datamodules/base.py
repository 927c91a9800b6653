"""RLDataModule: where experience comes from.

The data module owns the environments, the TorchRL collector and whatever store sits between collection and the
update (a replay buffer, a rollout). The model never steps an environment: it hands its acting policy over once
(:meth:`RLDataModule.connect`) and receives whole TensorDict batches from ``train_dataloader``.

Loops count frames, not epochs: :attr:`RLDataModule.frames` is the number of environment frames this rank has
collected, and everything that must survive an interruption (frame counter, environment state, store contents, RNG
states, the position inside the current batch schedule) is in :meth:`state_dict`, which Lightning saves in every
checkpoint.

That state is per rank: with DDP each rank explores with its own seed, environments and store. Lightning writes only
rank 0's into the checkpoint, so every other rank writes its own file beside it (:meth:`RLDataModule.save_beside`,
called by ``FrameCheckpoint``) and reads it back in :meth:`load_state_dict`; the files' names and atomic writes are
``checkpoints/files.py``'s.

How the experience is collected (in this process, environment workers, collector workers, a prefetch thread) is the
``collection`` option, a strategy object (``datamodules/collection.py``); the evaluation episodes are
``datamodules/evaluation.py``'s. This module keeps the lifecycle: specs, ``connect``, the frame counter, the state.
"""

from __future__ import annotations

import glob
import os
import random
import sys
from collections.abc import Callable, Container, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import lightning.pytorch as pl
import numpy as np
import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch.utils.data import DataLoader, IterableDataset
from torchrl.collectors import Collector
from torchrl.data import Composite, TensorSpec
from torchrl.envs import EnvBase, Transform

from checkpoints.files import (
    beside_base,
    rank_state_path,
    remove_path,
    save_atomically,
    sums_path,
    updates_in_name,
    write_sums,
)
from compat.jsonargparse import lazy_instance
from compat.torchrl import transformed
from datamodules.collection import ACT_DTYPES, AutocastPolicy, Collection, InProcess
from datamodules.episodes import EpisodeStatistics
from datamodules.evaluation import Evaluation, EvaluationOptions, fixed_seed
from datamodules.memory import MemoryNeed, WorkerMemory, transition_bytes
from datamodules.remote import AsyncRayCollectors, RayCollectors  # noqa: F401 - strategies the CLI names
from datamodules.timing import PhaseTimer
from envs.base import BatchedEnv, EnvDeclaration

__all__ = [
    "RLDataModule",
    "EnvSpecs",
    "AutocastPolicy",
    "check_positive",
    "fixed_seed",
    "rng_state",
    "send",
    "set_rng_state",
]

T = TypeVar("T", torch.Tensor, TensorDictBase)


#: ``collection``'s default: collect in the training process. A lazy instance, so that the command line can set its
#: options alone (``--data.init_args.collection.prefetch true``) and the resolved config shows it.
DEFAULT_COLLECTION: Collection = lazy_instance(InProcess, sys.modules[__name__])


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise a ValueError naming the option (``data.<name>``: the command line spells it as its flag) when ``value``
    is out of range."""
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"data.{name} must be {bound}, got {value}")


def resolve_device(device: str | None, trainer: pl.Trainer | None = None) -> torch.device:
    """``"auto"``/None follows the trainer (each DDP rank its own GPU); anything else must exist on this machine."""
    if device in (None, "auto"):
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"data.device {device!r} is not available on this machine (no CUDA device)")
    return resolved


def send(values: T, device: torch.device) -> T:
    """Host tensors (a tensor or a tensordict) to ``device`` without waiting for the work already queued there.

    A plain copy from the host to a GPU waits for every kernel queued before it: in the training thread, for the
    update just launched, so the host's next work (storing a batch) could not overlap the update's kernels. From
    pinned memory the copy is queued behind them instead. Anything else (to the CPU, from a device) is a plain ``to``.
    """
    if device.type == "cuda" and values.device is not None and values.device.type == "cpu":
        return values.pin_memory().to(device, non_blocking=True)
    return values.to(device)


def rng_state() -> dict[str, Any]:
    """All global RNG states as plain tensors and tuples, so checkpoints load with ``weights_only=True``."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (
            kind,
            torch.from_numpy(keys.astype(np.int64)),
            pos,
            has_gauss,
            cached,
        ),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _nested_key_order(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _identity(batch: Any) -> Any:
    # Batches are already whole TensorDicts: the default collate would try to split them into rows.
    return batch


class _BatchStream(IterableDataset):
    """Infinite stream of training batches produced by a data module's ``_batches`` generator."""

    def __init__(self, make_iterator: Callable[[], Iterator[TensorDictBase]]) -> None:
        self.make_iterator = make_iterator

    def __iter__(self) -> Iterator[TensorDictBase]:
        return self.make_iterator()


class EnvSpecs:
    """The specs of one environment of a factory, which the CLI links into the model to size its networks."""

    _observation_spec: Composite
    _action_spec: TensorSpec

    def _probe(self, env: Callable[..., EnvBase], seed: int) -> BatchedEnv:
        """A throw-away environment of ``env`` (building it also validates its options); keeps the specs of one
        agent: a multi-agent environment's batch is ``[num_envs, num_agents]``, and its agents share one policy."""
        probe = env(num_envs=1, seed=seed, device="cpu")
        if not isinstance(probe, BatchedEnv):
            probe.close()
            raise ValueError(
                f"data.env: {type(probe).__module__}.{type(probe).__qualname__} is not a "
                "envs.base.BatchedEnv (the environment contract: docs/extending/environment.md)"
            )
        one_agent = (0,) * len(probe.batch_size)
        self._observation_spec = probe.observation_spec[one_agent].clone()
        self._action_spec = probe.action_spec[one_agent].clone()
        #: agents per environment (the batch dimensions after the first); 1 for single-agent environments.
        self.agents_per_env = probe.batch_size[1:].numel()
        return probe

    @property
    def observation_spec(self) -> Composite:
        """Observation spec of one environment (no batch dimension); linked into the model by the CLI."""
        return self._observation_spec

    @property
    def action_spec(self) -> TensorSpec:
        """Action spec of one environment (no batch dimension); linked into the model by the CLI."""
        return self._action_spec


class RLDataModule(EnvSpecs, Evaluation, pl.LightningDataModule):
    """Base data module: builds environments, exposes their specs, runs the collection, counts frames.

    Args:
        env: environment factory, ``class_path`` + ``init_args`` in YAML; called as
            ``env(num_envs=..., seed=..., device=...)``, so those three are set here, not in ``init_args``.
        num_envs: environments stepped together in one batch (per rank; with worker processes, all the workers'
            environments together).
        collect_steps: environment steps per collector call; one call yields ``num_envs * collect_steps`` frames.
        device: where environments, collector output and stored experience live: ``auto`` (the trainer's device),
            ``cpu`` or ``cuda[:i]``.
        seed: base seed; rank ``r`` seeds its environments with ``seed + r * num_envs``. None: the run's
            ``seed_everything`` (the command line fills it in; 0 for a data module built in code), so that one seed
            seeds the whole run; a value sets the environments' seed apart from it.
        evaluation: the greedy evaluations' episodes and their environments' options
            (:class:`~datamodules.evaluation.EvaluationOptions`).
        weight_sync_interval: updates between pushes of the latest weights to the collector's policy. The policy is
            shared in memory when collector and model are on the same device, so this only matters across devices.
        collection: how experience is collected (``datamodules/collection.py``): ``InProcess`` (the default; with
            ``prefetch``), ``EnvWorkers``, ``CollectorWorkers``, ``AsyncCollectorWorkers``, ``RayCollectors`` or
            ``AsyncRayCollectors``, each with its own
            options (``class_path`` + ``init_args`` in YAML; ``--data.init_args.collection CollectorWorkers
            --data.init_args.collection.workers 2`` on the command line).
        act_precision: ``"32"``: the collector's policy acts in float32; ``"bf16"``: its forward pass runs under
            bfloat16 autocast (:class:`AutocastPolicy`), what it writes returned in float32. For networks whose
            acting forward pass is a large share of collection, on a CPU with native bfloat16 arithmetic (Mario's
            CNN: docs/history/mario.md, "Again, after cheaper frames and bfloat16 acting"); the update and
            evaluation keep the trainer's precision, so acting can pick another action than float32 would only where
            two action values are within bfloat16's rounding.
    """

    def __init__(
        self,
        env: Callable[..., EnvBase],
        num_envs: int = 16,
        collect_steps: int = 1,
        device: str = "auto",
        seed: int | None = None,
        evaluation: EvaluationOptions = EvaluationOptions(),
        weight_sync_interval: int = 1,
        collection: Collection = DEFAULT_COLLECTION,
        act_precision: str = "32",
    ) -> None:
        super().__init__()
        if act_precision not in ACT_DTYPES:
            raise ValueError(f"data.act_precision must be one of {', '.join(ACT_DTYPES)}, got {act_precision!r}")
        check_positive("num_envs", num_envs)
        check_positive("collect_steps", collect_steps)
        check_positive("weight_sync_interval", weight_sync_interval)
        if seed is not None and seed < 0:  # environments take non-negative seeds (Gymnasium refuses others mid-run)
            raise ValueError(f"data.seed must be >= 0, got {seed}")
        self.num_envs = num_envs
        # The default is one object for every data module built without the option: each gets its own strategy.
        self.collection: Collection = InProcess() if collection is DEFAULT_COLLECTION else collection
        self.collection.check(self)  # e.g. its workers must divide num_envs
        resolve_device(device)  # fail now, before any output folder exists, if the device is missing
        self.env_factory = env
        self.collect_steps = collect_steps
        self.device_name = device
        self.seed = seed = 0 if seed is None else seed
        self.evaluation = evaluation
        self.weight_sync_interval = weight_sync_interval
        self.act_precision = act_precision
        # A throw-away environment: its specs size the model's networks, and building it validates the env options.
        probe = self._probe(env, seed)
        #: what the environment tells the rest (its metrics, physics, token layout, drawing, state) and the class and
        #: options that rebuild it in a worker process, plain and picklable (the command line's factory is bound to
        #: objects of this process): :class:`envs.base.EnvDeclaration`.
        self.declared: EnvDeclaration = probe.declaration()
        #: what each worker process will hold (``datamodules/memory.py``), measured now, before any store exists and
        #: with the throw-away environment built; None without workers.
        self.worker_memory: WorkerMemory | None = None
        if self.collection.uses_workers:
            self.worker_memory = WorkerMemory.measure(partial(env, num_envs=1, seed=seed + 1, device="cpu"))
        probe.close()
        if evaluation.env_options:
            try:  # fail now, not at the first evaluation
                env(num_envs=1, seed=seed, device="cpu", **evaluation.env_options).close()
            except (TypeError, ValueError) as error:
                raise ValueError(f"data.evaluation.env_options: {error}") from error

        self.timer = PhaseTimer()
        #: the training episodes' return, length and metrics, from every batch collected (datamodules/episodes.py)
        self.episodes = EpisodeStatistics(
            self.declared.episode_metric_keys,
            self.declared.episode_metric_over,
            num_envs * self.agents_per_env,
            self.agents_per_env,
        )
        self.frames = 0  # environment frames collected by this rank
        self.samples = 0  # transitions handed to the model by this rank
        self.device = torch.device("cpu")
        self.policy: TensorDictModuleBase | None = None
        self.postprocess: Callable[[TensorDictBase], Any] | None = None
        self.batch_keys: list[NestedKey] | None = None
        self.store_transform: Transform | None = None
        self.env_transform: Transform | None = None
        self._eval_env: EnvBase | None = None
        self._pending_state: dict[str, Any] | None = None
        self._beside_name: str | None = None  # the checkpoint name its files beside start with (save_beside)
        self._updates_since_sync = 0

    #: Whether batches carry priorities that :meth:`after_update` takes back (prioritized replay overrides it).
    prioritized: bool = False
    #: The length of the sequences a batch holds (a rollout data module's ``bptt``); 0: single transitions.
    bptt: int = 0
    #: Whether :meth:`connect` takes a store transform (a data module with a replay buffer).
    accepts_store_transform = False
    #: Whether the collection may prepare the next round in a background thread (a replay data module).
    accepts_prefetch = False

    @property
    def prefetch(self) -> bool:
        """Whether the next round is prepared in a background thread (the collection's ``prefetch``)."""
        return self.collection.prefetch

    @property
    def collector(self) -> Collector | None:
        """The collection's TorchRL collector (None until the first batch is asked for, and after teardown)."""
        return self.collection.collector

    @property
    def frames_per_batch(self) -> int:
        """Frames of one collector call: every environment's (and agent's) ``collect_steps`` steps."""
        return self.num_envs * self.agents_per_env * self.collect_steps

    def largest_round_frames(self) -> int:
        """Frames of the largest batch collected at once: a round (a replay module's warm-up may collect longer
        ones)."""
        return self.frames_per_batch

    # ------------------------------------------------------------------------------------------------ lifecycle
    @property
    def rank_seed(self) -> int:
        rank = self.trainer.global_rank if self.trainer is not None else 0
        return self.seed + rank * self.num_envs

    def setup(self, stage: str) -> None:
        self.device = resolve_device(self.device_name, self.trainer)

    def connect(
        self,
        policy: TensorDictModuleBase,
        postprocess: Callable[[TensorDictBase], Any] | None = None,
        batch_keys: Sequence[NestedKey] | None = None,
        store_transform: Transform | None = None,
    ) -> None:
        """Receive the model's acting policy, an optional in-place transform of each collected batch (e.g. GAE), the
        keys its update reads (a store may keep only those; None: everything collected), and an optional TorchRL
        replay-buffer transform of the transitions before they are stored (n-step returns; replay stores only).

        Called once by the model in its ``setup``; the collector itself is built lazily in ``train_dataloader``.
        """
        dtype = ACT_DTYPES[self.act_precision]
        self.policy = policy if dtype is None else AutocastPolicy(policy, self.device.type, dtype)
        self.postprocess = postprocess
        # In one order whatever the process's string hashing (a loss's `in_keys` is often a set): a compiled loss's
        # graph inputs, and so its AOTAutograd cache key, are then the same in every run, and a new process reuses it.
        self.batch_keys = None if batch_keys is None else sorted(batch_keys, key=_nested_key_order)
        if store_transform is not None and not self.accepts_store_transform:
            raise ValueError(
                f"{type(self).__name__} stores no transitions: the model's n-step returns (or other store transform) "
                "need a replay data module (datamodules.replay.ReplayDataModule)"
            )
        self.store_transform = store_transform

    def use_env_transform(self, transform: Transform | None) -> None:
        """A transform the model's policy needs on every environment it acts in, training and evaluation alike (a
        recurrent policy's ``InitTracker`` and state primer, PPO's observation normaliser and action clip); called by
        the model in its ``setup``, at every stage. Each environment gets a clone, which shares the transform's
        buffers (a normaliser's statistics)."""
        self.env_transform = transform
        self.close_evaluation_env()  # built without it

    def make_env(self, num_envs: int, seed: int, options: dict[str, Any] | None = None) -> EnvBase:
        """``num_envs`` environments seeded from ``seed`` in this process, with the model's env transform (worker
        processes build theirs through the collection strategy). ``options`` replace some of the environment's
        own."""
        env = self.env_factory(num_envs=num_envs, seed=seed, device=self.device, **(options or {}))
        return self.with_env_transform(env)

    def with_env_transform(self, env: EnvBase) -> EnvBase:
        """``env`` with the model's env transform (a recurrent policy's state primer), if it has one."""
        if self.env_transform is None:
            return env
        return transformed(env, self.env_transform.clone())

    def _build_collector(self) -> None:
        if self.policy is None:
            raise RuntimeError("the model must call datamodule.connect(policy) in its setup before training starts")
        self.collection.build_watched(self)  # a worker that dies meanwhile is one error naming it
        if self.trainer is not None and self.trainer.world_size > 1:
            # seed_everything gives every rank the same global RNG; exploration noise (ε-greedy draws, sampled
            # actions, buffer sampling) must differ per rank like the environments' seeds do.
            torch.manual_seed(self.rank_seed)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_BatchStream(self._stream), batch_size=None, collate_fn=_identity)

    def _stream(self) -> Iterator[TensorDictBase]:
        # Built here, when the first batch is asked for, rather than in train_dataloader: building the collector
        # resets the environments and DataLoader.__iter__ draws a seed, and both consume random numbers that a
        # restored checkpoint's RNG state must come after.
        if self.collector is None:
            self._build_collector()
        if self._pending_state is not None:
            self._restore_collection_state(self._pending_state)
            self._pending_state = None
        yield from self._batches()

    def val_dataloader(self) -> DataLoader:
        # `validate` plays greedy evaluation episodes; the single item only makes Lightning call validation_step once.
        return DataLoader([0], batch_size=None, collate_fn=_identity)

    def on_exception(self, exception: BaseException) -> None:
        # Lightning calls `teardown` only when a stage ends normally. After an error, Ctrl-C or SIGTERM the collector
        # must stop here: its worker processes are not daemons, so the interpreter would wait for them at exit forever.
        self.teardown(self.trainer.state.fn if self.trainer is not None else "fit")

    def teardown(self, stage: str) -> None:
        self.settle()
        self.collection.teardown()
        self.close_evaluation_env()

    def memory_needs(self, device: torch.device) -> list[MemoryNeed]:
        """What this data module will allocate on ``device`` (its store's), estimated from the specs before anything
        is (``datamodules/memory.py`` checks the sum against the machine). The base: the collector's batch of
        ``num_envs x collect_steps`` transitions, twice with worker processes (their shared-memory copy), and the
        worker processes themselves (:meth:`~datamodules.collection.Collection.memory_needs`)."""
        per_frame = transition_bytes(self.observation_spec, self.action_spec)
        copies = 2 if self.collection.uses_workers else 1
        return [
            MemoryNeed(
                "the collector's batches",
                f"data.num_envs {self.num_envs}",
                copies * self.largest_round_frames() * per_frame,
                device,
            ),
            *self.collection.memory_needs(self),
        ]

    # ------------------------------------------------------------------------------------------- collection
    def collect(self) -> TensorDictBase:
        """One collector call: ``collect_steps`` steps of every environment (and agent), shaped
        ``[num_envs, collect_steps]`` (``[num_envs, num_agents, collect_steps]`` for a multi-agent environment)."""
        batch = self.collect_uncounted(self.timer)
        self.frames += batch.numel()
        self.episodes.count()
        return batch

    def collect_uncounted(self, timer: PhaseTimer, steps: int = 0) -> TensorDictBase:
        """:meth:`collect` without adding to ``frames``, timed into ``timer``: for collection off the training thread
        (:class:`~datamodules.replay.ReplayDataModule`'s prefetch), whose frames count when the training thread takes
        them, and so do the training episodes that end in it: ``EpisodeStatistics.count``). ``steps``: a longer round
        where the strategy can step one (:meth:`~datamodules.collection.Collection.collect`)."""
        with timer.phase("collect"):
            # a dead worker is one error naming it (Collection.check_workers_alive)
            batch = self.collection.collect(steps)
            self.episodes.observe(batch)
        if self.postprocess is not None:
            with timer.phase("advantage"):
                self.postprocess(batch)
        return batch

    def after_update(self, priority: torch.Tensor | None = None) -> None:
        """Called by the model after each optimizer step, with the update's per-sample absolute TD errors when its
        loss gives them (a prioritized replay store takes them as new priorities): push weights to the collector when
        they live elsewhere."""
        self._updates_since_sync += 1
        if self._updates_since_sync >= self.weight_sync_interval and self.collector is not None:
            self._updates_since_sync = 0
            self.sync_weights()

    def sync_weights(self) -> None:
        """Push the learner's weights to the collector's policy, where it does not share them (another device).
        Collector workers get them before each batch instead (``update_at_each_batch``)."""
        self.collection.sync_weights(self.device)

    def monitor(self) -> dict[str, float]:
        """Figures about the data path that the model logs with its losses (the logged steps only): the
        collection's, and the training episodes ended since the last call (``EpisodeStatistics.report``:
        ``train/return_mean``, ``train/length_mean``, ``train/<metric>_mean``, ``data/episodes``)."""
        return {**self.collection.monitor(), **self.episodes.report()}

    def settle(self) -> None:
        """Wait for collection running off the training thread, if any (see ReplayDataModule's ``prefetch``): before
        a checkpoint, an evaluation or shutting down. Default: there is none."""

    @property
    def updates_per_rollout(self) -> int | None:
        """The updates each on-policy rollout serves; None: batches drawn from a replay buffer (the default)."""
        return None

    @property
    def batches_ready(self) -> int:
        """Training batches that can be served without collecting: the model takes their updates in the same
        Lightning step (:meth:`modules.base.RLModule.training_step`), taking them with :meth:`next_ready_batch`.
        Default: none, one update per step."""
        return 0

    def next_ready_batch(self) -> TensorDictBase:
        """The next ready batch (see :attr:`batches_ready`)."""
        raise RuntimeError(f"{type(self).__name__} has no batches ready outside its training stream")

    def next_batch(self) -> TensorDictBase:
        """The next training batch: a ready one, else the first of the next round's (collecting it). Subclasses decide
        how collected frames turn into batches. The training stream serves these one by one; a model's step that
        goes on to a further round takes its batches here directly (:meth:`modules.base.RLModule.training_step`),
        past Lightning's fetcher and DataLoader, whose per-batch wrapping costs about as much as a round of one
        frame's collection (docs/history/gymnasium.md, "Replay written and drawn entry by entry, and subnormal
        floats flushed")."""
        raise NotImplementedError

    def _batches(self) -> Iterator[TensorDictBase]:
        """Yield training batches forever (:meth:`next_batch`)."""
        while True:
            yield self.next_batch()

    # ------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        self.settle()
        state = {"frames": self.frames, "samples": self.samples, "rng": rng_state()}
        state["episodes"] = self.episodes.state_dict()
        if self.trainer is not None:
            # The update this state belongs to names the other ranks' files (rank_state_path).
            state.update(updates=self.trainer.global_step, world_size=self.trainer.world_size)
        if self._beside_name is not None:
            # The name the files beside this checkpoint start with (``last.ckpt``), which a kept checkpoint's own
            # name (``last-step1200.ckpt``) no longer tells.
            state["beside"] = self._beside_name
        if self.collector is not None:
            # What continues collection exactly: the environments' state and the observations (and recurrent states)
            # the collector carries between calls; with collector workers, each worker's (and its generator's).
            state.update(self.collection.state_dict())
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore this rank's own state: rank 0's is the checkpoint's, any other rank's is in its file beside it."""
        trainer = self.trainer
        if trainer is not None and trainer.global_rank > 0:
            path = rank_state_path(
                beside_base(trainer.ckpt_path, state_dict), trainer.global_rank, state_dict.get("updates", -1)
            )
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"--ckpt_path {trainer.ckpt_path}: rank {trainer.global_rank} has no state beside it ({path.name});"
                    f" the checkpoint was written by {state_dict.get('world_size', 1)} rank(s)"
                )
            state_dict = trainer.strategy.checkpoint_io.load_checkpoint(path, weights_only=True)
        self._load_state(state_dict)

    def save_beside(self, checkpoint_path: str | Path, digests: dict[str, str] | None = None) -> None:
        """Write what this rank keeps beside the checkpoint at ``checkpoint_path``, before the checkpoint is written:
        on ranks > 0, the rank's whole state (rank 0's is inside the checkpoint); then the manifest of this rank's
        files (``<checkpoint>.sums-rank<r>-step<N>``) with their SHA-256. Subclasses with large stores write them
        first and pass their files' ``digests`` on (see ``ReplayDataModule``)."""
        self._beside_name = Path(checkpoint_path).name
        rank, step = self.trainer.global_rank, self.trainer.global_step
        digests = dict(digests or {})
        if rank > 0:
            path = rank_state_path(checkpoint_path, rank, step)
            digests[path.name] = save_atomically(self.state_dict(), path)
        if digests:
            write_sums(sums_path(checkpoint_path, rank, step), digests)

    def remove_beside(self, checkpoint_path: str | Path, keep_updates: Container[int] | None = None) -> None:
        """Delete this rank's files and folders beside ``checkpoint_path``, except those written at the updates
        ``keep_updates`` (all of them without it: the checkpoint itself is being removed)."""
        checkpoint, rank = Path(checkpoint_path), self.trainer.global_rank
        for path in checkpoint.parent.glob(f"{glob.escape(checkpoint.name)}.*rank{rank}-step*"):
            if keep_updates is None or updates_in_name(path) not in keep_updates:
                remove_path(path)

    def _load_state(self, state_dict: dict[str, Any]) -> None:
        """Subclasses restore their own parts here, then call this (the base parts)."""
        # Lightning restores the data module before training starts; environment, carrier and RNG states are applied
        # when the batch stream starts (see _stream), after everything else that draws random numbers.
        self.frames = state_dict["frames"]
        self.samples = state_dict["samples"]
        self._pending_state = state_dict

    def _restore_collection_state(self, state: dict[str, Any]) -> None:
        self.collection.load_state_watched(state)
        if "episodes" in state:
            # The running episodes' sums continue only where the environments continue their episodes.
            continues = self.declared.exact_state and self.collection.continues_episodes
            self.episodes.load_state_dict(state["episodes"], running=continues, device=self.device)
        set_rng_state(state["rng"])

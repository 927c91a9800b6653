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
called by ``FrameCheckpoint``; named by :func:`rank_state_path`) and reads it back in :meth:`load_state_dict`.
Stores too large to pickle into a checkpoint (replay buffers) go beside it the same way, as memory-mapped folders.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch.utils.data import DataLoader, IterableDataset
from torchrl.collectors import Collector, MultiSyncCollector, RandomPolicy
from torchrl.data import Composite, TensorSpec
from torchrl.envs import EnvBase, ParallelEnv, Transform, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type, step_mdp

from compat.torchrl import collector_carrier, parallel_env_lower_done_flags
from datamodules.envs.base import BatchedEnv
from datamodules.timing import PhaseTimer
from datamodules.workers import (
    DEAD_WORKER,
    ResumableCollector,
    multi_process_collector,
    stateful_env,
    worker_death_error,
    worker_env_factories,
    workers_log_dir,
)

# Seeds of the evaluation environments are offset so they never replay a training episode.
EVAL_SEED_OFFSET = 1_000_003


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise a ValueError naming the command-line flag when ``value`` is out of range."""
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"--data.init_args.{name} must be {bound}, got {value}")


def resolve_device(device: str | None, trainer: pl.Trainer | None = None) -> torch.device:
    """``"auto"``/None follows the trainer (each DDP rank its own GPU); anything else must exist on this machine."""
    if device in (None, "auto"):
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--data.init_args.device {device!r} is not available on this machine (no CUDA device)")
    return resolved


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


@contextmanager
def fixed_seed(seed: int, device: torch.device) -> Iterator[None]:
    """Draw from the global generators (CPU, and ``device`` when it is a GPU) seeded with ``seed``, then put them back.

    For measurements that must be repeatable and must not move the training run's random stream (an exact resume
    replays that stream).
    """
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


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
                f"--data.init_args.env: {type(probe).__module__}.{type(probe).__qualname__} is not a "
                "datamodules.envs.base.BatchedEnv (the environment contract: README, 'Adding an environment')"
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


class RLDataModule(EnvSpecs, pl.LightningDataModule):
    """Base data module: builds environments, exposes their specs, runs the collector, counts frames.

    Args:
        env: environment factory, ``class_path`` + ``init_args`` in YAML; called as
            ``env(num_envs=..., seed=..., device=...)``, so those three are set here, not in ``init_args``.
        num_envs: environments stepped together in one batch (per rank).
        collect_steps: environment steps per collector call; one call yields ``num_envs * collect_steps`` frames.
        device: where environments, collector output and stored experience live: ``auto`` (the trainer's device),
            ``cpu`` or ``cuda[:i]``.
        seed: base seed; rank ``r`` seeds its environments with ``seed + r * num_envs``.
        eval_episodes: greedy episodes per evaluation (one evaluation environment each).
        eval_env_options: options of the evaluation environments that differ from ``env``'s ``init_args`` (Mario:
            ``{noop_max: 8}``, random no-op starts so that greedy episodes in a deterministic game differ, where
            training explores with ε and needs none).
        weight_sync_interval: updates between pushes of the latest weights to the collector's policy. The policy is
            shared in memory when collector and model are on the same device, so this only matters across devices.
        env_workers: step the training environments in this many worker processes (TorchRL's ``ParallelEnv``, one
            thread each, ``num_envs / env_workers`` environments per worker, seeded as one batch would be); for
            environments whose step holds the GIL (C++ simulators such as MettaGrid). 0: in this process. The
            policy still runs here, on the whole batch (on the trainer's GPU, if any); evaluation environments stay
            in this process.
        act_precision: ``"32"``: the collector's policy acts in float32; ``"bf16"``: its forward pass runs under
            bfloat16 autocast (:class:`AutocastPolicy`), what it writes returned in float32. For networks whose
            acting forward pass is a large share of collection (Mario's CNN: 3.5 instead of 5.9 ms for 4 emulators
            on this project's AVX-512 CPU); the update and evaluation keep the trainer's precision, so acting can
            pick another action than float32 would only where two action values are within bfloat16's rounding.
    """

    def __init__(
        self,
        env: Callable[..., EnvBase],
        num_envs: int = 16,
        collect_steps: int = 1,
        device: str = "auto",
        seed: int = 0,
        eval_episodes: int = 32,
        eval_env_options: dict[str, Any] | None = None,
        weight_sync_interval: int = 1,
        env_workers: int = 0,
        collector_workers: int = 0,
        act_precision: str = "32",
    ) -> None:
        super().__init__()
        if act_precision not in ACT_DTYPES:
            raise ValueError(
                f"--data.init_args.act_precision must be one of {', '.join(ACT_DTYPES)}, got {act_precision!r}"
            )
        check_positive("num_envs", num_envs)
        check_positive("collect_steps", collect_steps)
        check_positive("eval_episodes", eval_episodes)
        check_positive("weight_sync_interval", weight_sync_interval)
        check_positive("env_workers", env_workers, allow_zero=True)
        check_positive("collector_workers", collector_workers, allow_zero=True)
        for name, workers in (("env_workers", env_workers), ("collector_workers", collector_workers)):
            if workers and num_envs % workers:
                raise ValueError(
                    f"--data.init_args.{name} ({workers}) must divide --data.init_args.num_envs ({num_envs})"
                )
        if env_workers and collector_workers:
            raise ValueError(
                "--data.init_args.env_workers and collector_workers: choose one (environments alone in worker "
                "processes, or environments with a copy of the policy)"
            )
        resolve_device(device)  # fail now, before any output folder exists, if the device is missing
        self.env_factory = env
        self.num_envs = num_envs
        self.collect_steps = collect_steps
        self.device_name = device
        self.seed = seed
        self.eval_episodes = eval_episodes
        self.eval_env_options = dict(eval_env_options or {})
        self.weight_sync_interval = weight_sync_interval
        self.env_workers = env_workers
        self.collector_workers = collector_workers
        self.act_precision = act_precision
        # A throw-away environment: its specs size the model's networks, and building it validates the env options.
        probe = self._probe(env, seed)
        # What a worker process rebuilds the environment from: its class and options, plain and picklable (the
        # command line's factory is bound to objects of this process).
        self._env_class, self._env_options = type(probe), probe.init_kwargs()
        # What the environment declares (datamodules.envs.base.BatchedEnv's class attributes), handed on.
        self.episode_metric_keys: tuple[str, ...] = tuple(probe.episode_metric_keys)
        #: metrics averaged only over the episodes where another metric is positive (racing: a lap's time over the
        #: episodes that completed a lap), ``{metric: the metric that marks them}``.
        self.episode_metric_over: dict[str, str] = dict(probe.episode_metric_over)
        #: the environment's dynamics for physics-informed losses (``datamodules.envs.safety.physics``), when it has
        #: them.
        self.physics: Any = probe.physics
        #: how token observations decode into a grid (``datamodules.envs.mettagrid.tokens.ObservationLayout``), for
        #: token environments.
        self.observation_layout: Any = probe.observation_layout
        probe.close()
        if self.eval_env_options:
            try:  # fail now, not at the first evaluation
                env(num_envs=1, seed=seed, device="cpu", **self.eval_env_options).close()
            except (TypeError, ValueError) as error:
                raise ValueError(f"--data.init_args.eval_env_options: {error}") from error

        self.timer = PhaseTimer()
        self.frames = 0  # environment frames collected by this rank
        self.samples = 0  # transitions handed to the model by this rank
        self.device = torch.device("cpu")
        self.policy: TensorDictModuleBase | None = None
        self.postprocess: Callable[[TensorDictBase], Any] | None = None
        self.batch_keys: list[NestedKey] | None = None
        self.store_transform: Transform | None = None
        self.env_transform: Transform | None = None
        self.collector: Collector | None = None
        self._collector_iter: Iterator[TensorDictBase] | None = None
        self._eval_env: EnvBase | None = None
        self._pending_state: dict[str, Any] | None = None
        self._updates_since_sync = 0
        self._workers_log_dir: Path | None = None  # collector workers' stderr, under the run's folder

    #: Whether :meth:`connect` takes a store transform (a data module with a replay buffer).
    accepts_store_transform = False

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
        self.batch_keys = None if batch_keys is None else list(batch_keys)
        if store_transform is not None and not self.accepts_store_transform:
            raise ValueError(
                f"{type(self).__name__} stores no transitions: the model's n-step returns (or other store transform) "
                "need a replay data module (datamodules.replay.ReplayDataModule)"
            )
        self.store_transform = store_transform

    def use_env_transform(self, transform: Transform | None) -> None:
        """A transform the model's policy needs on every environment it acts in, training and evaluation alike (a
        recurrent policy's ``InitTracker`` and state primer); called by the model in its ``setup``, at every stage."""
        self.env_transform = transform
        if self._eval_env is not None:  # built without it
            self._eval_env.close()
            self._eval_env = None

    def make_env(self, num_envs: int, seed: int, workers: int = 0, options: dict[str, Any] | None = None) -> EnvBase:
        """``num_envs`` environments seeded from ``seed`` (with the model's env transform), in this process or split
        over ``workers`` processes: worker ``w`` runs environments ``w * num_envs / workers ...`` of the batch with
        their own seeds, so the batch plays what one in-process batch would. ``options`` replace some of the
        environment's own."""
        options = options or {}
        if workers:
            per_worker = num_envs // workers
            env = ParallelEnv(
                workers,
                [
                    partial(
                        self._env_class,
                        num_envs=per_worker,
                        seed=seed + w * per_worker,
                        device=self.device,
                        **{**self._env_options, **options},
                    )
                    for w in range(workers)
                ],
                num_threads=torch.get_num_threads(),  # ParallelEnv would otherwise change this process's threads
                num_sub_threads=1,
            )
        else:
            env = self.env_factory(num_envs=num_envs, seed=seed, device=self.device, **options)
        if self.env_transform is None:
            return env
        return TransformedEnv(env, self.env_transform.clone())

    def _build_collector(self) -> None:
        if self.policy is None:
            raise RuntimeError("the model must call datamodule.connect(policy) in its setup before training starts")
        frames_per_batch = self.num_envs * self.agents_per_env * self.collect_steps
        if self.collector_workers:
            self._workers_log_dir = workers_log_dir(self.trainer)
            per_worker = self.num_envs // self.collector_workers
            self.collector = multi_process_collector(
                MultiSyncCollector,
                worker_env_factories(
                    self._workers_log_dir,
                    self._env_class,
                    self._env_options,
                    self.env_transform,
                    self.collector_workers,
                    per_worker,
                    self.rank_seed,
                    self.device,
                ),
                self.policy,
                frames_per_batch,
                self.device,
                collector_class=ResumableCollector,
                cat_results=0,  # [num_envs, ...]: the workers' environments in the order of one in-process batch
                use_buffers=True,  # each worker writes its batch into shared memory (TorchRL's default, said)
                update_at_each_batch=True,  # the latest weights before every batch: on-policy data, fewest pushes
            )
        else:
            env = self.make_env(self.num_envs, self.rank_seed, self.env_workers)
            self.collector = Collector(
                env,
                self.policy,
                frames_per_batch=frames_per_batch,
                total_frames=-1,
                device=self.device,
                policy_device=self.device,  # the model's own device: the collector then runs the policy in place
                trust_policy=True,
                track_traj_ids=False,
                auto_register_policy_transforms=False,
            )
        self._collector_iter = iter(self.collector)
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
        if self.collector is not None:
            self.collector.shutdown()
            self.collector = None
        if self._eval_env is not None:
            self._eval_env.close()
            self._eval_env = None

    # ------------------------------------------------------------------------------------------- collection
    def collect(self) -> TensorDictBase:
        """One collector call: ``collect_steps`` steps of every environment (and agent), shaped
        ``[num_envs, collect_steps]`` (``[num_envs, num_agents, collect_steps]`` for a multi-agent environment)."""
        batch = self.collect_uncounted(self.timer)
        self.frames += batch.numel()
        return batch

    def collect_uncounted(self, timer: PhaseTimer) -> TensorDictBase:
        """:meth:`collect` without adding to ``frames``, timed into ``timer``: for collection off the training thread
        (:class:`~datamodules.replay.ReplayDataModule`'s prefetch), whose frames count when the training thread takes
        them."""
        with timer.phase("collect"):
            try:
                batch = next(self._collector_iter)
            except Exception as error:
                self._raise_if_a_worker_died(error)
                raise
        if self.postprocess is not None:
            with timer.phase("advantage"):
                self.postprocess(batch)
        return batch

    def _raise_if_a_worker_died(self, error: BaseException) -> None:
        """A dead worker process stops the run with one clear error: nothing is saved after it, so the last checkpoint
        written is the one to continue from. (Workers are not restarted: a restarted worker's environments would not
        continue the episodes the checkpointed run was playing.)

        TorchRL's ``ParallelEnv`` and multi-process collectors notice the death, close their workers and raise
        "worker i (exit code c)" somewhere in the exception chain; that is what is matched. A collector worker's
        error also names the exception it printed (from its log, ``<run>/collector_workers/worker<i>.log``).
        """
        if self.collector is None:
            return
        if self.collector_workers:
            death = worker_death_error(error, self._workers_log_dir, self.frames)
            if death is not None:
                raise death from error
        if not self.env_workers:
            return
        while error is not None:
            found = DEAD_WORKER.search(str(error))
            if found:
                raise RuntimeError(
                    f"environment worker process died: {found.group(0)}, at {self.frames:,} frames; training stopped "
                    "without saving, so the last checkpoint is intact: continue from it with --ckpt_path last"
                ) from error
            error = error.__cause__ or error.__context__

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
        if not self.collector_workers and self.collector.policy_device != self.device:
            self.collector.update_policy_weights_()

    def monitor(self) -> dict[str, float]:
        """Figures about the data path that the model logs with its losses (the logged steps only). Default: none."""
        return {}

    def settle(self) -> None:
        """Wait for collection running off the training thread, if any (see ReplayDataModule's ``prefetch``): before
        a checkpoint, an evaluation or shutting down. Default: there is none."""

    @property
    def batches_ready(self) -> int:
        """Training batches that can be served without collecting: the model takes their updates in the same
        Lightning step (:meth:`modules.base.RLModule.training_step`), taking them with :meth:`next_ready_batch`.
        Default: none, one update per step."""
        return 0

    def next_ready_batch(self) -> TensorDictBase:
        """The next ready batch (see :attr:`batches_ready`)."""
        raise RuntimeError(f"{type(self).__name__} has no batches ready outside its training stream")

    def _batches(self) -> Iterator[TensorDictBase]:
        """Yield training batches forever; subclasses decide how collected frames turn into batches."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(
        self,
        policy: Callable[[TensorDictBase], TensorDictBase],
        episodes: int | None = None,
    ) -> dict[str, float]:
        """Play one episode of ``policy`` in each of ``episodes`` evaluation environments, always from the same seeds.

        Returns ``return_mean``, ``length_mean`` and ``<key>_mean`` for each of the env's ``episode_metric_keys``
        (for Snake, ``food_mean``: food eaten per game). A key the env's ``episode_metric_over`` maps to another is
        averaged over the episodes where that one is positive (racing: ``lap_time_mean`` over the episodes that
        completed a lap; NaN if none did). Policies with exploration act deterministically here.

        In a multi-agent environment an episode is one environment's, and every figure is per agent: ``return_mean``
        is the mean over its agents of each agent's return; the episode lasts until all its agents are done.
        """
        self.settle()  # nothing else may draw from the global generator while an evaluation seeds it
        env = self._evaluation_env(episodes)
        episodes = env.batch_size[0]
        sums = {key: torch.zeros(episodes, device=env.device) for key in ("reward", *self.episode_metric_keys)}
        length = torch.zeros(episodes, device=env.device)
        running = torch.ones(episodes, dtype=torch.bool, device=env.device)
        td = env.reset()
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            while bool(running.any()):
                td = env.step(policy(td))
                for key, total in sums.items():
                    total += td["next", key].reshape(episodes, -1).mean(-1) * running
                length += running
                running &= ~td["next", "done"].reshape(episodes, -1).all(-1)
                td = step_mdp(td)
        metrics = {
            "return_mean": sums.pop("reward").mean().item(),
            "length_mean": length.mean().item(),
        }
        for key, total in sums.items():
            counted = sums[self.episode_metric_over[key]] > 0 if key in self.episode_metric_over else None
            if counted is None:
                metrics[f"{key}_mean"] = total.mean().item()
            else:  # NaN when no episode counts: a missing point of the curve, not a zero
                metrics[f"{key}_mean"] = total[counted].mean().item() if bool(counted.any()) else float("nan")
        return metrics

    def evaluate_random(self, episodes: int | None = None) -> dict[str, float]:
        """:meth:`evaluate` with uniformly random actions (TorchRL's ``RandomPolicy`` over the action spec).

        The baseline a learned policy is measured against: same boards, same metrics. The actions are drawn from a
        generator seeded like the boards, so the figure is the same at every call, and the training run's own random
        stream is left where it was.
        """
        self.settle()
        env = self._evaluation_env(episodes)
        with fixed_seed(self.seed + EVAL_SEED_OFFSET, env.device):
            return self.evaluate(RandomPolicy(env.action_spec), episodes)

    def _evaluation_env(self, episodes: int | None) -> EnvBase:
        """One environment per episode, reset to the same start states at every evaluation."""
        episodes = episodes or self.eval_episodes
        if self._eval_env is None or self._eval_env.batch_size[0] != episodes:
            self._eval_env = self.make_env(episodes, self.seed + EVAL_SEED_OFFSET, options=self.eval_env_options)
        self._eval_env.set_seed(self.seed + EVAL_SEED_OFFSET)
        return self._eval_env

    # ------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        self.settle()
        state = {"frames": self.frames, "samples": self.samples, "rng": rng_state()}
        if self.trainer is not None:
            # The update this state belongs to names the other ranks' files (rank_state_path).
            state.update(updates=self.trainer.global_step, world_size=self.trainer.world_size)
        if self.collector is not None:
            state.update(self.collection_state())
        return state

    def collection_state(self) -> dict[str, Any]:
        """What continues collection exactly: the environments' state and the observations (and recurrent states)
        the collector carries between calls; with collector workers, each worker's (and its generator's)."""
        if self.collector_workers:
            return {"workers": self.collector.state_dict()}
        return {
            "env": dict(self._stateful_env().state_dict()),
            "carrier": to_plain(collector_carrier(self.collector).exclude("collector")),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore this rank's own state: rank 0's is the checkpoint's, any other rank's is in its file beside it."""
        trainer = self.trainer
        if trainer is not None and trainer.global_rank > 0:
            path = rank_state_path(trainer.ckpt_path, trainer.global_rank, state_dict.get("updates", -1))
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"--ckpt_path {trainer.ckpt_path}: rank {trainer.global_rank} has no state beside it ({path.name});"
                    f" the checkpoint was written by {state_dict.get('world_size', 1)} rank(s)"
                )
            state_dict = trainer.strategy.checkpoint_io.load_checkpoint(path, weights_only=True)
        self._load_state(state_dict)

    def save_beside(self, checkpoint_path: str | Path) -> None:
        """Write what this rank keeps beside the checkpoint at ``checkpoint_path``, before the checkpoint is written:
        on ranks > 0, the rank's whole state (rank 0's is inside the checkpoint). Subclasses with large stores write
        them first (see ``ReplayDataModule``)."""
        if self.trainer.global_rank > 0:
            path = rank_state_path(checkpoint_path, self.trainer.global_rank, self.trainer.global_step)
            self.trainer.strategy.checkpoint_io.save_checkpoint(self.state_dict(), path)

    def remove_beside(self, checkpoint_path: str | Path, keep_updates: int | None = None) -> None:
        """Delete this rank's files and folders beside ``checkpoint_path``, except those written at update
        ``keep_updates`` (all of them without it: the checkpoint itself is being removed)."""
        checkpoint, rank = Path(checkpoint_path), self.trainer.global_rank
        for path in checkpoint.parent.glob(f"{glob.escape(checkpoint.name)}.*rank{rank}-step*"):
            if keep_updates is None or not path.name.endswith(f"rank{rank}-step{keep_updates}"):
                remove_path(path)

    def _load_state(self, state_dict: dict[str, Any]) -> None:
        """Subclasses restore their own parts here, then call this (the base parts)."""
        # Lightning restores the data module before training starts; environment, carrier and RNG states are applied
        # when the batch stream starts (see _stream), after everything else that draws random numbers.
        self.frames = state_dict["frames"]
        self.samples = state_dict["samples"]
        self._pending_state = state_dict

    def _restore_collection_state(self, state: dict[str, Any]) -> None:
        if "workers" in state:
            self.collector.load_state_dict(state["workers"])
        elif "env" in state:
            env = self._stateful_env()
            env.load_state_dict(state["env"])
            if isinstance(env, ParallelEnv):
                # TorchRL 0.14's workers raise their shared "step done" flag after loading a state and nothing lowers
                # it, so the next step would read the workers' buffers before they are written (the ParallelEnv
                # resume test fails if this moves).
                parallel_env_lower_done_flags(env)
            # The collector carries the last observations (and recurrent states) between calls; with them restored
            # too, collection continues exactly where the checkpointed run stood.
            carrier = from_plain(state["carrier"], batch_dims=1, device=self.collector.env.device)
            collector_carrier(self.collector).update(carrier)
        set_rng_state(state["rng"])

    def _stateful_env(self) -> EnvBase:
        return stateful_env(self.collector.env)


def rank_state_path(checkpoint_path: str | Path, rank: int, updates: int | None) -> Path:
    """The file beside a checkpoint that holds rank ``rank``'s data-module state, written at update ``updates``.

    The update is part of the name so that a run killed between writing the ranks' files and the checkpoint itself
    never pairs a checkpoint with newer files: the older ones are deleted only once the newer checkpoint is in place.
    """
    return Path(f"{checkpoint_path}.rank{rank}-step{updates}")


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


def beside_path(checkpoint_path: str | Path, kind: str, rank: int, updates: int) -> Path:
    """A folder beside a checkpoint holding rank ``rank``'s store ``kind`` (e.g. ``replay``) at update ``updates``:
    ``last.ckpt.replay-rank0-step1200``. Named like :func:`rank_state_path`, for the same reason."""
    return Path(f"{checkpoint_path}.{kind}-rank{rank}-step{updates}")


TEMPORARY_MARK = ".tmp-"  # files and folders being written: .<name>.tmp-<pid of the writing process>


def remove_path(path: Path) -> None:
    """Delete ``path``, a file or a folder with everything in it (nothing if it is gone already)."""
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def write_folder_atomically(folder: Path, write: Callable[[Path], None]) -> None:
    """``write(temporary)`` fills a temporary folder beside ``folder``, whose files are then flushed to disk and
    which is renamed into place (one rename: a process killed meanwhile leaves either no folder or a whole one; its
    temporary is deleted by ``FrameCheckpoint`` when the next fit starts)."""
    temporary = folder.with_name(f".{folder.name}{TEMPORARY_MARK}{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir(parents=True)
        write(temporary)
        for file in temporary.rglob("*"):
            if file.is_file():
                descriptor = os.open(file, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)
        if folder.exists():  # the same update written again (a run resumed from an earlier checkpoint)
            shutil.rmtree(folder)
        os.replace(temporary, folder)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def to_plain(td: TensorDictBase | None) -> dict | None:
    """A TensorDict as nested dicts of tensors, so checkpoints stay loadable with ``weights_only=True``."""
    return None if td is None else td.to_dict()


def from_plain(data: dict | None, batch_dims: int, device: torch.device) -> TensorDictBase | None:
    return None if data is None else TensorDict.from_dict(data, batch_dims=batch_dims, device=device)

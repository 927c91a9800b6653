"""TorchRL's private API: the state an exact resume must carry, which TorchRL keeps in private attributes with no
accessor, and two private hooks.

- a ``Collector`` carries the last observations (and recurrent states) between calls in ``_carrier`` and counts in
  ``_frames`` and ``_iter``; its own ``state_dict`` holds neither the carrier nor the environments' state; its rounds
  act with ``_wrapped_policy`` and merge its ``_policy_output_keys`` (:func:`round_on_carrier` steps one as they do);
- a ``MultiStepTransform`` keeps each environment's last n steps in ``_buffer``;
- a ``ParallelEnv`` signals "step done" through shared flags, ``_shm_done_flags``, which loading a state leaves up;
- a replay buffer hands its sampler the generator to draw with as ``Sampler._rng``;
- a ``TensorStorage`` holds its whole preallocated tensordict in ``_storage`` (a benchmark measures its bytes);
- a ``TensorDictReplayBuffer`` of uniform draws writes through its ``_writer`` (``_cursor``, ``_write_count``) into its
  ``_storage`` (``_len``, ``_set_last_cursor``, ``_bump_mutation_revision``), and draws with the storage's ``_rng``,
  all under ``_replay_lock`` and ``_write_lock``: :class:`DirectReplay` does what ``extend`` and ``sample`` do there,
  entry by entry;
- ``EnvBase._step_proc_data`` completes a step's output (rewards, dones) against the specs;
- ``EnvBase.step_and_maybe_reset`` goes through ``step``, ``_step_mdp`` (a cached ``_StepMDP``, whose key trees say
  what the next step's input keeps) and the optional ``_post_step_mdp_hooks``, native autoreset and compiled
  variants, which :class:`FastStepAndMaybeReset` reads to take a shorter road when none is in play;
- ``TransformedEnv._step`` runs the chain's ``inv`` (``Transform._inv_call``), the base environment's ``_step``, its
  ``_complete_done`` and the chain's ``Transform._step``: :class:`FastTransformedEnv` skips what does nothing when no
  transform has an inverse;
- a ``MultiAsyncCollector`` takes each worker's batch, and the worker's index, from its queue in ``_get_from_queue``;
- a ``RayWeightUpdater`` counts each actor's batches since its last weights in ``_batches_since_weight_update`` and
  sends them in ``_sync_weights_with_worker`` (:class:`RayPushedWeights`);
- the multi-process collectors find a dead worker with ``torchrl._utils._check_for_faulty_process``, which this module
  replaces (:func:`install_dead_worker_check`);
- a ``SharedMemTransport`` keeps the shared-memory weight buffers it writes on each push in ``_unique_weights``
  (:class:`SharedWeights` writes the one buffer the workers share once).

The resume tests (tests/app/test_resume.py, tests/data/test_replay.py, tests/data/test_parallel.py) fail if any of
these changes meaning; tests/app/test_compat.py fails first, when TorchRL's minor version moves or a name is gone.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_non_tensor
from torchrl.collectors import Collector, MultiAsyncCollector
from torchrl.collectors.weight_update import RayWeightUpdater
from torchrl.data import RandomSampler, TensorDictReplayBuffer, TensorDictRoundRobinWriter, TensorStorage
from torchrl.data.replay_buffers.storages.utils import _collate_id
from torchrl.envs import Compose, EnvBase, ParallelEnv, Transform, TransformedEnv
from torchrl.envs.utils import set_exploration_type
from torchrl.weight_update import SharedMemWeightSyncScheme
from torchrl.weight_update._shared import SharedMemTransport

from compat.tensordict import set_unchecked, stack_steps, tensor_leaves, tensordict_unchecked, top_level_entries

DISTRIBUTION = "torchrl"
#: The TorchRL version every function here was written against (tests/app/test_compat.py: same minor version, any
#: patch).
WRITTEN_AGAINST = "0.14.1"

#: Every private name used here: (where it lives, the name, the function of this module that uses it).
PRIVATE_API = (
    ("torchrl.collectors.Collector", "_carrier", "collector_carrier, round_on_carrier"),
    ("torchrl.collectors.Collector", "_frames", "collector_counters, set_collector_counters"),
    ("torchrl.collectors.Collector", "_iter", "collector_counters, set_collector_counters"),
    ("torchrl.collectors.Collector", "_wrapped_policy", "round_on_carrier"),
    ("torchrl.collectors.Collector", "_policy_output_keys", "round_on_carrier"),
    ("torchrl.collectors.Collector", "_cast_to_policy_device", "round_on_carrier"),
    ("torchrl.collectors.Collector", "_cast_to_env_device", "round_on_carrier"),
    ("torchrl.collectors.Collector", "_carrier_has_no_device", "round_on_carrier"),
    ("torchrl.collectors.Collector", "_compact_next_keys", "round_on_carrier"),
    ("torchrl.collectors.Collector", "_exclude_private_keys", "round_on_carrier"),
    ("torchrl.envs.MultiStepTransform", "_buffer", "multistep_window, set_multistep_window"),
    ("torchrl.envs.ParallelEnv", "_shm_done_flags", "parallel_env_lower_done_flags"),
    ("torchrl.envs.ParallelEnv", "_workers", "parallel_env_processes"),
    ("torchrl.envs.ParallelEnv", "_events", "parallel_env_load_state"),
    ("torchrl.envs.ParallelEnv", "_timeout", "parallel_env_load_state"),
    ("torchrl.data.replay_buffers.samplers.Sampler", "_rng", "sampler_generator"),
    ("torchrl.data.TensorStorage", "_storage", "storage_contents, DirectReplay"),
    ("torchrl.data.TensorStorage", "_len", "DirectReplay"),
    ("torchrl.data.TensorStorage", "_storage_keys", "DirectReplay"),
    ("torchrl.data.TensorStorage", "_rng", "DirectReplay"),
    ("torchrl.data.TensorStorage", "_set_last_cursor", "DirectReplay"),
    ("torchrl.data.TensorStorage", "_bump_mutation_revision", "DirectReplay"),
    ("torchrl.data.TensorStorage", "_attached_entities", "DirectReplay"),
    ("torchrl.data.TensorDictRoundRobinWriter", "_cursor", "DirectReplay"),
    ("torchrl.data.TensorDictRoundRobinWriter", "_write_count", "DirectReplay"),
    ("torchrl.data.TensorDictRoundRobinWriter", "_generation", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_writer", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_storage", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_sampler", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_transform", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_sample_unit", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_prefetch", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_pin_memory", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_collate_fn", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_replay_lock", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_write_lock", "DirectReplay"),
    ("torchrl.data.TensorDictReplayBuffer", "_sample_dependency", "DirectReplay"),
    ("torchrl.data.replay_buffers.storages.utils", "_collate_id", "DirectReplay"),
    ("torchrl.envs.EnvBase", "_step_proc_data", "StepOutputComplete, FastStepAndMaybeReset"),
    ("torchrl.envs.EnvBase", "_step_mdp", "FastStepAndMaybeReset, next_step_input"),
    ("torchrl.envs.EnvBase", "_post_step_mdp_hooks", "FastStepAndMaybeReset"),
    ("torchrl.envs.TransformedEnv", "_post_step_mdp_hooks", "FastTransformedEnv"),
    ("torchrl.envs.TransformedEnv", "_transform", "FastTransformedEnv"),
    ("torchrl.envs.Transform", "_post_step_mdp_hooks", "FastTransformedEnv"),
    ("torchrl.envs.EnvBase", "_complete_done", "FastTransformedEnv"),
    ("torchrl.envs.EnvBase", "_simple_done", "FastTransformedEnv"),
    ("torchrl.envs.EnvBase", "_reset_check_done", "FastTransformedEnv"),
    ("torchrl.envs.EnvBase", "_supports_set_state", "FastTransformedEnv"),
    ("torchrl.envs.Transform", "_reset_env_preprocess", "FastTransformedEnv"),
    ("torchrl.envs.Transform", "_reset", "FastTransformedEnv"),
    ("torchrl.envs.EnvBase", "_reset", "FastTransformedEnv"),
    ("torchrl.envs.Transform", "_inv_call", "FastTransformedEnv"),
    ("torchrl.envs.Transform", "_step", "FastTransformedEnv"),
    ("torchrl.envs.utils", "_StepMDP", "FastStepAndMaybeReset"),
    ("torchrl.collectors.MultiAsyncCollector", "_get_from_queue", "WorkerTaggedAsyncCollector"),
    ("torchrl", "_utils", "install_dead_worker_check"),
    ("torchrl._utils", "_check_for_faulty_process", "install_dead_worker_check"),
    ("torchrl.collectors", "_multi_async", "install_dead_worker_check"),
    ("torchrl.collectors", "_multi_base", "install_dead_worker_check"),
    ("torchrl.collectors", "_multi_sync", "install_dead_worker_check"),
    ("torchrl.collectors.weight_update.RayWeightUpdater", "_batches_since_weight_update", "RayPushedWeights"),
    ("torchrl.collectors.weight_update.RayWeightUpdater", "_sync_weights_with_worker", "RayPushedWeights"),
    ("torchrl.weight_update", "_shared", "SharedWeights"),
    ("torchrl.weight_update._shared.SharedMemTransport", "_unique_weights", "SharedWeights"),
)


def collector_carrier(collector: Collector) -> TensorDictBase:
    """The tensordict ``collector`` carries between calls (last observations, recurrent states); update it in place
    to restore them."""
    # Collector._carrier (private; torchrl 0.14.1): made in the collector's constructor and replaced by the next
    # step's output at every step of a round, so read it at each call, never kept.
    carrier = getattr(collector, "_carrier", None)
    if carrier is None:
        raise RuntimeError("this torchrl version's Collector has no `_carrier`: exact resume is not supported")
    return carrier


def collector_counters(collector: Collector) -> tuple[int, int]:
    """``collector``'s frame and batch counters, ``(frames, iterations)``."""
    # Collector._frames, Collector._iter (private; torchrl 0.14.1).
    return collector._frames, collector._iter


def set_collector_counters(collector: Collector, frames: int, iterations: int) -> None:
    """Restore the counters :func:`collector_counters` read."""
    # Collector._frames, Collector._iter (private; torchrl 0.14.1).
    collector._frames, collector._iter = frames, iterations


def round_on_carrier(collector: Collector, steps: int) -> TensorDictBase | None:
    """``steps`` steps of every environment of ``collector`` from where it stands, stepped as its own rounds step them,
    in one batch ``[*environments, steps]``; its next round continues where they end (its frame and round counters
    do not move: nothing in this process reads them). None where its rounds do more than this (moving data between
    devices, a compiled policy, trajectory ids, random frames, a replay buffer of its own...): then only its own
    rounds collect.

    What a round of ``Collector.rollout`` does at each step, in the case this handles: the policy acts on the carrier
    (in place, or its outputs merged in) under the collector's exploration type, ``step_and_maybe_reset`` sets the
    step's ``"next"`` on it and gives the next carrier; the round is the steps stacked, private (``_``) entries
    dropped. It costs none of the collector's per-round bookkeeping (its preallocated output, the copy of it, the
    post-processing pass), and a round of many steps one stack and one pass over its entries. An environment with a
    ``step_round`` method (the Gymnasium family's: ``envs/gym/copies.py``) steps the round itself, writing each step
    into the round's arrays: the same batch and carrier, or None, and then the steps are taken here.
    """
    # Collector._carrier, _wrapped_policy, _policy_output_keys, _cast_to_policy_device, _cast_to_env_device,
    # _carrier_has_no_device, _compact_next_keys, _exclude_private_keys (private; torchrl 0.14.1): what
    # Collector.rollout and its post-processing read.
    if (
        collector._cast_to_policy_device
        or collector._cast_to_env_device
        or collector._carrier_has_no_device
        or collector._compact_next_keys
        or collector.compiled_policy
        or collector.cudagraphed_policy
        or collector.track_traj_ids
        or collector.reset_at_each_iter
        or collector.init_random_frames
        or collector.replay_buffer is not None
        or collector.split_trajs
        or collector.postproc is not None
        or collector.interruptor is not None
        or collector.storing_device not in (None, collector.env_device)
        or collector.pre_collect_hook is not None
        or collector.post_collect_hook is not None
    ):
        return None
    policy, env, carrier = collector._wrapped_policy, collector.env, collector._carrier
    # An environment that writes a round as it steps gives the same round (envs/gym/copies.py, CopyBatchEnv.step_round).
    step_round = getattr(type(env), "step_round", None)
    with torch.no_grad(), set_exploration_type(collector.exploration_type):
        stepped = None if step_round is None else step_round(env, policy, carrier, steps, collector._policy_output_keys)
        if stepped is None:
            steps_taken = []
            for _ in range(steps):
                acted = policy(carrier)
                if acted is not carrier:
                    carrier.update(acted, keys_to_update=collector._policy_output_keys)
                step, following = env.step_and_maybe_reset(carrier)
                if step is not carrier:
                    carrier.set("next", step.get("next"))
                steps_taken.append(carrier)
                carrier = following
            stepped = stack_steps(steps_taken), carrier
    batch, collector._carrier = stepped
    if collector._exclude_private_keys:
        private = _private_keys(batch)
        batch = batch.exclude(*private) if private else batch
    return batch


def _private_keys(batch: TensorDictBase) -> list[str | tuple[str, ...]]:
    """The entries of ``batch`` whose key path has a part starting with ``_`` (what a collector drops)."""
    leaves = tensor_leaves(batch)
    if leaves is None:  # not a plain tensordict: its own key walk
        return [key for key in batch.keys(True) if any(part.startswith("_") for part in _key_parts(key))]
    private = {}
    for path, _ in leaves:  # the outermost private part of each leaf's path: that entry goes, and all below it
        for depth, part in enumerate(path):
            if part.startswith("_"):
                private[path[: depth + 1]] = None
                break
    return [path[0] if len(path) == 1 else path for path in private]


def _key_parts(key: str | tuple[str, ...]) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else key


def multistep_window(transform: Transform) -> TensorDictBase | None:
    """The last n steps of each environment a ``MultiStepTransform`` holds between calls (None before its first)."""
    # MultiStepTransform._buffer (private; torchrl 0.14.1).
    if not hasattr(transform, "_buffer"):
        raise RuntimeError(f"this torchrl version's {type(transform).__name__} has no `_buffer`: exact resume fails")
    return transform._buffer


def set_multistep_window(transform: Transform, window: TensorDictBase | None) -> None:
    """Restore the window :func:`multistep_window` read."""
    multistep_window(transform)  # the same check
    # MultiStepTransform._buffer (private; torchrl 0.14.1).
    transform._buffer = window


def parallel_env_lower_done_flags(env: ParallelEnv) -> None:
    """Lower every worker's shared "step done" flag of ``env``.

    TorchRL 0.14's workers raise it after loading a state and nothing lowers it, so the next step would read the
    workers' buffers before they are written.
    """
    # ParallelEnv._shm_done_flags (private; torchrl 0.14.1): one shared byte per worker.
    for worker in range(env.num_workers):
        env._shm_done_flags[worker] = 0


def parallel_env_load_state(env: ParallelEnv, state: dict[str, Any], poll_s: float = 0.1) -> None:
    """``env.load_state_dict(state)``, ended as soon as a worker process is no longer alive.

    TorchRL 0.14's waits for each worker's "loaded" event up to the env's pipe timeout (10 s) and then goes on as if it
    had loaded: a worker that refused the state (a checkpoint of another environment) and died of it cost the user
    10 s per worker before the error line. Raises ConnectionError naming the first worker found ended.
    """
    # ParallelEnv.parent_channels, _events, _timeout (private; torchrl 0.14.1): load_state_dict sends each worker
    # ("load_state_dict", its state) and waits on each worker's event, which the worker sets once loaded.
    if env.is_closed:
        env.start()
    if "worker0" not in state:
        state = {f"worker{index}": state for index in range(env.num_workers)}
    for index, channel in enumerate(env.parent_channels):
        channel.send(("load_state_dict", state[f"worker{index}"]))
    processes = parallel_env_processes(env)
    for event in env._events:
        deadline = time.monotonic() + env._timeout
        while not event.wait(poll_s) and time.monotonic() < deadline:
            ended = [index for index, process in enumerate(processes) if not process.is_alive()]
            if ended:
                raise ConnectionError(f"environment worker {ended[0]} ended while loading its state")
        event.clear()


def parallel_env_processes(env: ParallelEnv) -> list:
    """The ``multiprocessing`` process objects of ``env``'s workers, by index (none before they start)."""
    # ParallelEnv._workers (private; torchrl 0.14.1): set when the workers start, deleted when they are closed.
    return list(getattr(env, "_workers", []))


def sampler_generator(sampler: Any) -> torch.Generator | None:
    """The generator a replay buffer gave ``sampler`` to draw with (None: the global one), as TorchRL's own samplers
    read it."""
    # Sampler._rng (private; torchrl 0.14.1): set by ReplayBuffer.set_rng, None by default.
    return sampler._rng


def storage_contents(storage: Any) -> TensorDictBase:
    """The whole tensordict a ``TensorStorage`` preallocated (every slot, filled or not), not a copy."""
    # TensorStorage._storage (private; torchrl 0.14.1).
    return storage._storage


class DirectReplay:
    """``buffer.extend(batch)`` and ``buffer.sample(n)`` of a ``TensorDictReplayBuffer`` of uniform draws, entry by
    entry: the same slots written, the same counters moved and the same indices drawn from the same generator as
    TorchRL's own calls, for a fraction of their cost. Those calls go through a transform pass, the writer, the
    storage's generic tensordict assignment and indexing, and the sample's metadata, which a loop of one frame and
    one update pays at every frame (docs/history/gymnasium.md, "Replay written and drawn entry by entry, and
    subnormal floats flushed").

    It applies to the buffer :class:`~datamodules.replay.ReplayDataModule` builds for uniform replay (a
    ``LazyTensorStorage`` of one batch dimension, the round-robin writer, ``RandomSampler``, no transform, no
    prefetch or pinned memory), once the storage holds its first batch; elsewhere (a prioritized sampler, a frame
    store's transform, a storage not yet allocated, a batch whose entries are not the storage's) ``extend`` returns
    False and ``sample`` None, and the caller takes TorchRL's own. tests/data/test_replay.py checks both against
    TorchRL's calls, slot for slot and draw for draw.
    """

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self._planned: Any = None  # the storage tensordict the plan below was made for (replaced on loading a state)
        self._leaves: list[tuple[tuple[str, ...], torch.Tensor]] = []  # each stored entry: (key path, its tensor)
        self._index: torch.Tensor | None = None  # the stored "index" entry (each slot's own number)
        self._drawn: list[tuple[tuple[str, ...], torch.Tensor | None]] = []  # every entry, "index" as None

    def _plan(self) -> bool:
        """Whether the direct path applies now; (re)reads the storage's entries when its tensordict changed."""
        # TensorDictReplayBuffer._writer, _storage, _sampler, _transform, _sample_unit, _prefetch, _pin_memory,
        # _collate_fn; TensorStorage._storage, _storage_keys, _attached_entities; RoundRobinWriter._generation
        # (private; torchrl 0.14.1): what extend and sample branch on. The storage's one attached entity is the buffer,
        # whose mark_update after each write is its sampler's, a no-op for RandomSampler.
        buffer = self.buffer
        storage, writer = buffer._storage, buffer._writer
        contents = getattr(storage, "_storage", None)
        if contents is not None and contents is self._planned:
            return True
        if not (
            type(buffer) is TensorDictReplayBuffer
            and type(writer) is TensorDictRoundRobinWriter
            and not writer.tracks_generations
            and writer._generation is None
            and type(buffer._sampler) is RandomSampler
            and isinstance(storage, TensorStorage)
            and storage.initialized
            and storage.ndim == 1
            and type(contents) is TensorDict
            and storage._storage_keys is None
            and all(entity is buffer for entity in storage._attached_entities)  # the buffer: its sampler's no-op
            and isinstance(contents.get("index", None), torch.Tensor)
            and (buffer._transform is None or len(buffer._transform) == 0)
            and buffer._sample_unit is None
            and not buffer._prefetch
            and not buffer._pin_memory
            and buffer._collate_fn is _collate_id
            and buffer.dim_extend == 0
        ):
            return False
        # The writer stores each transition's slot as its "index" entry; the rest are the batches' entries.
        stored = tensor_leaves(contents)
        if stored is None:
            return False
        self._leaves = [(path, value) for path, value in stored if path != ("index",)]
        self._index = contents.get("index")
        self._drawn = [(path, None if path == ("index",) else value) for path, value in stored]  # in stored order
        self._planned = contents
        return True

    def extend(self, batch: TensorDictBase) -> bool:
        """Write ``batch``'s transitions at the writer's cursor, as ``buffer.extend(batch.reshape(-1))`` would
        (without the ``"index"`` entry it adds to its argument); False, writing nothing, where this path does not
        apply."""
        if not self._plan():
            return False
        given = tensor_leaves(batch)
        if given is None or len(given) != len(self._leaves):
            return False
        given = dict(given)
        dims, count = batch.batch_dims, batch.batch_size.numel()
        sources = []
        for path, stored in self._leaves:
            value = given.get(path)
            if value is None or value.shape[dims:] != stored.shape[1:]:
                return False  # not the storage's entries: TorchRL's own write says what is wrong
            sources.append(value.reshape(count, *stored.shape[1:]))
        # TensorDictReplayBuffer._replay_lock, _write_lock, _writer, _storage; RoundRobinWriter._cursor, _write_count;
        # TensorStorage._len, _set_last_cursor, _bump_mutation_revision (private; torchrl 0.14.1): the writer's and the
        # storage's steps of an extend, in their order.
        buffer = self.buffer
        storage, writer = buffer._storage, buffer._writer
        capacity = storage.max_size
        with buffer._replay_lock, buffer._write_lock:
            cursor = writer._cursor
            index = torch.arange(cursor, cursor + count, dtype=torch.long, device=batch.device) % capacity
            rows = slice(cursor, cursor + count) if cursor + count <= capacity else index
            writer._cursor = (cursor + count) % capacity
            writer._write_count += count
            storage._set_last_cursor(index)
            storage._len = min(storage._len + count, capacity)
            for (_, stored), source in zip(self._leaves, sources, strict=True):
                stored[rows] = source
            self._index[rows] = index
            storage._bump_mutation_revision()
        return True

    def sample(self, count: int, parts: int = 1) -> list[TensorDictBase] | None:
        """``buffer.sample(count)``: ``count`` transitions drawn uniformly with the storage's generator, with their
        ``"index"``, as ``parts`` batches of ``count // parts`` in the order drawn (what ``split`` of the one sample
        gives, without its pass over the entries); None where this path does not apply."""
        buffer = self.buffer
        # TensorDictReplayBuffer._sample_dependency (private; torchrl 0.14.1): a pending write a sample must wait for.
        if not self._plan() or getattr(buffer, "_sample_dependency", None) is not None:
            return None
        storage = buffer._storage
        # TensorStorage._rng, _len (private; torchrl 0.14.1): Storage._rand_given_ndim's draw.
        with buffer._replay_lock, buffer._write_lock:
            if storage._len == 0:
                raise RuntimeError("Cannot sample from an empty storage.")
            index = torch.randint(0, storage._len, (count,), generator=storage._rng, device=storage.device)
            # The stored "index" entry holds each slot's number: the drawn indices themselves, which TorchRL sets again.
            drawn = [(path, index if stored is None else stored.index_select(0, index)) for path, stored in self._drawn]
        size, device = count // parts, self._planned.device
        if parts == 1:
            return [_nested(drawn, torch.Size([size]), device)]
        split = [(path, value.split(size)) for path, value in drawn]
        return [
            _nested([(path, pieces[part]) for path, pieces in split], torch.Size([size]), device)
            for part in range(parts)
        ]


def _nested(leaves: list[tuple[tuple[str, ...], torch.Tensor]], batch_size: torch.Size, device: Any) -> TensorDict:
    """A tensordict of ``leaves`` (key path, tensor) with their nesting, built without checks (the caller's tensors
    have ``batch_size`` and ``device``)."""
    tree: dict[str, Any] = {}
    for path, value in leaves:
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value

    def build(node: dict[str, Any]) -> TensorDict:
        entries = {key: build(value) if isinstance(value, dict) else value for key, value in node.items()}
        return tensordict_unchecked(entries, batch_size, device)

    return build(tree)


class StepOutputComplete:
    """Mixin, before ``EnvBase`` in an environment's bases: its ``_step`` output already holds every reward and done
    entry of the specs, in their shapes and dtypes, so TorchRL's completion pass over it (a large part of what the
    MettaGrid wrapper added to a step: docs/results/mettagrid.md, "The wrapper, trimmed") is skipped unless type
    checks are on."""

    # EnvBase._step_proc_data (private; torchrl 0.14.1): called by EnvBase.step on _step's output.
    def _step_proc_data(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return super()._step_proc_data(next_tensordict) if self.run_type_checks else next_tensordict  # type: ignore[misc]


def next_step_input(env: EnvBase, tensordict: TensorDictBase) -> TensorDictBase:
    """The input of ``env``'s next step after a ``step`` that gave ``tensordict``: what ``step_mdp`` keeps of it (the
    observations and done flags of ``"next"``, the entries the step does not replace), without its reset."""
    # EnvBase._step_mdp (private; torchrl 0.14.1): the _StepMDP of env's keys, built once and cached until the specs
    # change; the public step_mdp function builds one per call, which costs more than a cheap task's whole step.
    return env._step_mdp(tensordict)


class FastStepAndMaybeReset:
    """Mixin, before ``EnvBase`` in an environment's bases: ``step_and_maybe_reset``, the call a collector makes at
    every step, with the same result as TorchRL's in a few dict operations instead of its per-key passes.

    TorchRL's version validates each entry it sets and walks key trees entry by entry to build the next step's input
    (``_StepMDP``): about 20 µs a batch step, more than a cheap task's whole step (docs/results/gymnasium.md, "The
    collectors' step without TorchRL's per-key passes").
    Here, in the plain case (a ``TensorDict`` input on the environment's device and batch, no ``"next"`` or
    ``"_step"`` entry in it, ``step_mdp``'s keys all top-level, none of TorchRL's step hooks, native autoreset or
    compiled variant set), the step's output is set as ``"next"`` unchecked, and the next input is one dict: the
    input's entries but those ``step_mdp`` drops (``"next"``, the reward and done entries, ``"_reset"``), then the
    output's observations and done flags; sub-tensordicts are shallow-copied as TorchRL does. Any other case is
    TorchRL's own. tests/envs/test_env_contract.py compares the two on every environment.
    """

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        keys = self._plain_step_keys(tensordict)
        if keys is None:
            return super().step_and_maybe_reset(tensordict)  # type: ignore[misc]
        dropped, from_next = keys
        # EnvBase._step_proc_data (private; torchrl 0.14.1): what EnvBase.step does with _step's output.
        next_tensordict = self._step_proc_data(self._step(tensordict))  # type: ignore[attr-defined]
        if type(next_tensordict) is not TensorDict:  # a lazy stack, say: TorchRL's step_mdp handles it
            tensordict.set("next", next_tensordict)
            return tensordict, self.maybe_reset(self._step_mdp(tensordict))  # type: ignore[attr-defined]
        set_unchecked(tensordict, "next", next_tensordict)
        following = {
            key: value if isinstance(value, torch.Tensor) else value.copy()
            for key, value in top_level_entries(tensordict).items()
            if key not in dropped
        }
        outputs = top_level_entries(next_tensordict)
        for key in from_next:
            value = outputs.get(key)
            if value is not None:
                following[key] = value if isinstance(value, torch.Tensor) else _grabbed(value)
        following_td = tensordict_unchecked(following, tensordict.batch_size, tensordict.device)
        return tensordict, self.maybe_reset(following_td)  # type: ignore[attr-defined]

    def _plain_step_keys(self, tensordict: TensorDictBase) -> tuple[frozenset[str], tuple[str, ...]] | None:
        """``(dropped, from_next)`` of the plain case (class docstring), or None where TorchRL's road is needed."""
        if type(tensordict) is not TensorDict or tensordict.device != self.device:  # type: ignore[attr-defined]
            return None
        if tensordict.batch_size != self.batch_size:  # type: ignore[attr-defined]
            return None  # TorchRL's step raises its error
        entries = top_level_entries(tensordict)
        if "next" in entries or "_step" in entries:
            return None
        # EnvBase._post_step_mdp_hooks (private; torchrl 0.14.1): None unless a transform hooks in.
        if self._post_step_mdp_hooks is not None:  # type: ignore[attr-defined]
            return None
        # The instance entries EnvBase.step_and_maybe_reset reads (torchrl 0.14.1): a compiled step, native autoreset.
        if "_compiled_step_and_maybe_reset" in self.__dict__ or self.__dict__.get("_torchrl_native_autoreset", False):
            return None
        # EnvBase._step_mdp (private; torchrl 0.14.1): a _StepMDP, cached until the specs change.
        mdp = self._step_mdp  # type: ignore[attr-defined]
        cached = self.__dict__.get("_plain_step_mdp")
        if cached is None or cached[0] is not mdp:
            cached = (mdp, _flat_step_mdp_keys(mdp))
            self.__dict__["_plain_step_mdp"] = cached
        return cached[1]


class FastTransformedEnv(FastStepAndMaybeReset, TransformedEnv):
    """TorchRL's ``TransformedEnv`` whose ``step_and_maybe_reset`` takes :class:`FastStepAndMaybeReset`'s road when no
    transform of its chain hooks into what follows ``step_mdp`` (an observation normaliser's, a recurrent state's
    primer): TorchRL's ``TransformedEnv`` always reports its chain's hook, which calls every transform's, so the
    plain case would never be seen. The transforms themselves run as TorchRL runs them (``_step`` and ``_reset``).

    Its ``_step`` is TorchRL's without the passes that do nothing when no transform of the chain has an inverse and
    each transforms only the step's output (``Transform._step``, ``_call`` on ``"next"``; the observation
    normaliser's case): the input's shallow copy that the inverse transforms would write into, the chain's inverse
    call, the partial-step bookkeeping (no ``"_step"`` entry) and, after an environment whose output is complete
    (:class:`StepOutputComplete`), the completion of its done entries. The base environment's ``_step`` then sees the
    input as it sees it without transforms.

    Its base environment, its transform and a ``Compose``'s list of transforms are submodules, which attribute lookup
    finds only after a miss, through ``nn.Module.__getattr__`` (and ``TransformedEnv.__getattr__`` before it): TorchRL
    reads them about thirty times a step. Each is also kept in its owner's instance dictionary, where lookup finds it
    first; assigning a module to the name again (``nn.Module.__setattr__``: a move to a device does) removes the copy,
    so it cannot go stale, and the next step keeps the new one.
    """

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        if "_transform" not in self.__dict__:
            self._keep_submodules_direct()
        return super().step_and_maybe_reset(tensordict)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if type(tensordict) is not TensorDict or not _outputs_only(self.transform):
            return super()._step(tensordict)
        entries = top_level_entries(tensordict)
        if "next" in entries or "_step" in entries:  # a preset output, a partial step: TorchRL's handling
            return super()._step(tensordict)
        base = self.base_env
        next_tensordict = base._step(tensordict)
        # EnvBase._complete_done (private; torchrl 0.14.1): what TransformedEnv._step does after the base's _step.
        if not isinstance(base, StepOutputComplete) or base.run_type_checks:
            base._complete_done(base.full_done_spec, next_tensordict)
        return self.transform._step(tensordict, next_tensordict)

    def maybe_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        """TorchRL's ``maybe_reset`` (``EnvBase.maybe_reset``, ``reset(select_reset_only=True)``,
        ``TransformedEnv._reset`` and ``_update_during_reset``), the same calls into the base environment and the chain
        and the same merge, without the generic passes around them (the spec and key walks, the tensordict-wide masked
        merge): in a task with short episodes and a normalised observation, a reset cost several steps.

        The plain case: a ``TensorDict`` of tensors on the environment's device and batch, one top-level ``"done"``
        group (the ``"_reset"`` key alone), no state entries and no ``set_state`` support. The finished rows are reset
        through the chain as TorchRL's ``_reset`` does; in the merge a row that reset takes the reset's entries and
        zeros for what the reset does not give (the policy's outputs), and the other rows keep theirs, as TorchRL's
        ``where(..., pad=0)`` leaves them. Any other case is TorchRL's own."""
        entries = top_level_entries(tensordict) if self._plain_reset(tensordict) else {}
        done = entries.get("done")
        if done is None:
            return super().maybe_reset(tensordict)
        if not bool(done.any()):  # most steps: checked before the per-entry test below
            return tensordict
        if not all(isinstance(value, torch.Tensor) for value in entries.values()):  # a sub-tensordict: TorchRL's merge
            return super().maybe_reset(tensordict)
        request = tensordict_unchecked({"_reset": done.clone()}, tensordict.batch_size, tensordict.device)
        # TransformedEnv._reset (torchrl 0.14.1), with no state entries to select; Transform._reset_env_preprocess,
        # Transform._reset and EnvBase._complete_done (private): what it calls.
        request = self.transform._reset_env_preprocess(request)
        base = self.base_env
        reset = base._reset(request)
        if not isinstance(base, StepOutputComplete) or base.run_type_checks:
            base._complete_done(base.full_done_spec, reset)
        reset = self.transform._reset(request, reset)
        # EnvBase._reset_check_done (private): TorchRL's check that the rows it reset are not done.
        self._reset_check_done(request, reset)
        return _merged_after_reset(tensordict, reset, request.get("_reset"))

    def _plain_reset(self, tensordict: TensorDictBase) -> bool:
        """Whether the environment and ``tensordict``'s form allow :meth:`maybe_reset`'s plain case (its docstring;
        the entries are checked to be tensors there, at a step that resets)."""
        if type(tensordict) is not TensorDict or tensordict.device != self.device:
            return False
        if tensordict.batch_size != self.batch_size:
            return False
        # EnvBase._step_mdp (private): rebuilt when the specs change, so it keys the cached answer about them.
        mdp = self._step_mdp
        cached = self.__dict__.get("_plain_reset_specs")
        if cached is None or cached[0] is not mdp:
            # EnvBase._simple_done (private; torchrl 0.14.1): one "done" group with "done" and "terminated".
            plain = (
                self._simple_done
                and list(self.reset_keys) == ["_reset"]
                and not list(self.state_spec.keys(True, True))
                and not self._supports_set_state
            )
            cached = (mdp, plain)
            self.__dict__["_plain_reset_specs"] = cached
        return cached[1]

    def _keep_submodules_direct(self) -> None:
        # TransformedEnv._transform (private; torchrl 0.14.1): what its `transform` property returns.
        self.__dict__["base_env"], self.__dict__["_transform"] = self.base_env, self.transform
        if isinstance(self.transform, Compose):
            self.transform.__dict__["transforms"] = self.transform.transforms

    @property
    def _post_step_mdp_hooks(self) -> Any:
        # TransformedEnv._post_step_mdp_hooks (private; torchrl 0.14.1): a method, the chain's hooks then the base
        # environment's; Transform._post_step_mdp_hooks passes the tensordicts through.
        if _hooks_after_step_mdp(self.transform) or self.base_env._post_step_mdp_hooks is not None:
            return partial(TransformedEnv._post_step_mdp_hooks, self)
        return None


def transformed(env: EnvBase, transform: Transform) -> TransformedEnv:
    """``env`` under ``transform``, stepped by collectors on :class:`FastStepAndMaybeReset`'s road where it can be."""
    return FastTransformedEnv(env, transform)


def _hooks_after_step_mdp(transform: Transform) -> bool:
    """Whether ``transform`` (a ``Compose``: any of its chain) overrides ``Transform._post_step_mdp_hooks``."""
    if isinstance(transform, Compose):
        return any(_hooks_after_step_mdp(each) for each in transform.transforms)
    return type(transform)._post_step_mdp_hooks is not Transform._post_step_mdp_hooks


def _merged_after_reset(tensordict: TensorDict, reset: TensorDictBase, flags: torch.Tensor) -> TensorDict:
    """``tensordict`` with ``reset``'s rows where ``flags`` is set, as TorchRL's ``_update_during_reset`` merges one
    top-level reset (``where(~flags, other=reset, pad=0)``): an entry of both takes the reset's value in the flagged
    rows, an entry of one only is zero in the rows the other would give; new tensors, the old ones untouched (they
    are also the last step's ``"next"`` entries)."""
    fresh = {key: value for key, value in top_level_entries(reset).items() if key != "_reset"}
    if bool(flags.all()):
        tensordict.update(fresh)
        return tensordict
    flags = flags.reshape(tensordict.batch_size)
    keep = ~flags
    own = top_level_entries(tensordict)
    for key in [*own, *(key for key in fresh if key not in own)]:
        mine, theirs = own.get(key), fresh.get(key)
        if mine is None:
            value = torch.where(
                _right(flags, theirs), theirs, torch.zeros((), dtype=theirs.dtype, device=theirs.device)
            )
        elif theirs is None:
            value = torch.where(_right(keep, mine), mine, torch.zeros((), dtype=mine.dtype, device=mine.device))
        else:
            value = torch.where(_right(keep, mine), mine, theirs)
        set_unchecked(tensordict, key, value)
    return tensordict


def _right(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``mask`` (batch-shaped) with trailing dimensions of size 1, to broadcast over ``like``'s."""
    return mask.reshape(*mask.shape, *(1,) * (like.ndim - mask.ndim))


def _outputs_only(transform: Transform) -> bool:
    """Whether ``transform`` (a ``Compose``: each of its chain) has no inverse and transforms only a step's output:
    TorchRL's own ``inv``, ``_inv_call`` and ``_step``, and no inverse keys."""
    if isinstance(transform, Compose):
        return all(_outputs_only(each) for each in transform.transforms)
    kind = type(transform)
    # Transform._inv_call, Transform._step (private; torchrl 0.14.1): what a transform overrides to act on a step's
    # input and to read it.
    return (
        kind.inv is Transform.inv
        and kind._inv_call is Transform._inv_call
        and kind._step is Transform._step
        and not transform.in_keys_inv
    )


def _flat_step_mdp_keys(mdp: Any) -> tuple[frozenset[str], tuple[str, ...]] | None:
    """What a ``_StepMDP`` drops from the input and takes from the output, when every key is top-level (else None)."""
    # _StepMDP.keep_other, .exclude_from_root, .keys_from_next (private; torchrl 0.14.1): trees of dicts whose leaves
    # are None; EnvBase._step_mdp keeps every other entry of the input (keep_other) and the action.
    trees = (mdp.exclude_from_root, mdp.keys_from_next)
    if not mdp.keep_other or any(subtree is not None for tree in trees for subtree in tree.values()):
        return None
    return frozenset(mdp.exclude_from_root), tuple(mdp.keys_from_next)


def _grabbed(value: Any) -> Any:
    """An output entry that is not a tensor, as ``_StepMDP`` places it: non-tensor data cloned, a tensordict copied."""
    return value.clone() if is_non_tensor(value) else value.copy()


#: Where :class:`WorkerTaggedAsyncCollector` writes the index of the worker that delivered a batch.
WORKER_KEY = ("collector", "worker")


class WorkerTaggedAsyncCollector(MultiAsyncCollector):
    """A ``MultiAsyncCollector`` whose batches say which worker delivered them, in :data:`WORKER_KEY`: its
    batches arrive interleaved, and what continues over a worker's batches (the training episodes' running sums,
    ``datamodules/episodes.py``) must know whose they are. TorchRL reads the index and drops it."""

    # MultiAsyncCollector._get_from_queue (private; torchrl 0.14.1): returns (worker index, batch count, batch).
    def _get_from_queue(self, timeout: float | None = None) -> tuple[int, int, TensorDictBase]:
        worker, count, batch = super()._get_from_queue(timeout)
        batch.set(WORKER_KEY, torch.full(batch.shape, worker, dtype=torch.long, device=batch.device))
        return worker, count, batch


def check_for_dead_worker(processes: list) -> None:
    """TorchRL's check for a dead collector worker (``_check_for_faulty_process``), its survivors joined before they
    are closed.

    TorchRL's own terminates the survivors, waits a fixed 0.1 s and closes them: a survivor still exiting then (a
    loaded machine) makes ``close()`` raise ``ValueError: Cannot close a process while it is still running``, which
    hides the error naming the dead worker, so a SIGKILLed worker ended the run with a traceback instead of one line
    (found by benchmarks/fault_soak.py). The message is TorchRL's, which ``datamodules.workers.DEAD_WORKER`` reads.
    """
    for index, process in enumerate(processes):
        if _alive(process) is not False:
            continue
        failed = f"worker {index} (exit code {process.exitcode})"
        for survivor in processes:
            if _alive(survivor):
                survivor.terminate()
                survivor.join(timeout=10)
                if survivor.is_alive():
                    survivor.kill()
                    survivor.join()
                survivor.close()
        raise RuntimeError(f"At least one process failed: {failed}. Check for more infos in the log.")


def _alive(process) -> bool | None:
    """Whether a worker process runs; None once it is closed (``is_alive`` refuses a closed one)."""
    try:
        return process.is_alive()
    except ValueError:
        return None


def install_dead_worker_check() -> None:
    """Put :func:`check_for_dead_worker` in place of TorchRL's ``_check_for_faulty_process``, in every module of
    TorchRL that imported it by name."""
    import torchrl._utils
    from torchrl.collectors import _multi_async, _multi_base, _multi_sync

    for module in (torchrl._utils, _multi_async, _multi_base, _multi_sync):
        if hasattr(module, "_check_for_faulty_process"):
            module._check_for_faulty_process = check_for_dead_worker


class RayPushedWeights(RayWeightUpdater):
    """TorchRL's Ray weight updater (the learner's weights put in Ray's object store, sent to every actor before its
    next batch), given the collector's weights and actors when the collector registers it: they do not exist before.
    (RayCollector's default instead opens a gloo group between the learner and the actors, which needs ports between
    the machines that a cluster's Ray ports do not open.)"""

    def __init__(self) -> None:
        super().__init__(policy_weights=TensorDict(), remote_collectors=[])

    def register_collector(self, collector: Any) -> None:
        super().register_collector(collector)
        self.policy_weights, self.remote_collectors = collector.policy_weights, collector.remote_collectors
        self._batches_since_weight_update = [0] * len(self.remote_collectors)

    def _sync_weights_with_worker(self, worker_id: int, server_weights: Any) -> None:
        # RayWeightUpdater's own passes `policy_weights=`, a name TorchRL 0.14 warns is deprecated in every actor.
        self.remote_collectors[worker_id].update_policy_weights_.remote(policy_or_weights=server_weights)
        self._batches_since_weight_update[worker_id] = 0


class _OnePushTransport(SharedMemTransport):
    """TorchRL's shared-memory transport, writing each distinct buffer once per push. TorchRL 0.14.1 keeps one entry
    per worker even when every worker shares one buffer (its check compares the ids of copies it has just made), so
    a push wrote the same weights once per worker: on the H200, 14 device-to-host copies of Mario's 38-MB network in
    every update (docs/results/gpu.md, run E)."""

    def register_weights(self, params_map: dict, init_queues: dict, per_worker: bool = False) -> None:
        super().register_weights(params_map, init_queues, per_worker)
        if not per_worker:  # one entry per storage the workers read
            distinct: dict[tuple[int, ...], TensorDictBase] = {}
            for weights in self._unique_weights:
                distinct.setdefault(tuple(t.data_ptr() for t in weights.values(True, True)), weights)
            self._unique_weights = list(distinct.values())


class SharedWeights(SharedMemWeightSyncScheme):
    """``SharedMemWeightSyncScheme`` whose push writes the workers' shared buffer once (:class:`_OnePushTransport`)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.shared_transport = _OnePushTransport()

    def __del__(self) -> None:
        # TorchRL's clean-up puts "stop" on the workers' instruction queues; at the interpreter's exit (a run that
        # ended on an error before its collector was shut down) a queue whose feeder thread never started starts one
        # then, and the process waited for that thread for good. Its workers have ended by then (the worker watch,
        # or their own pipe to the learner closing).
        if not sys.is_finalizing():
            super().__del__()

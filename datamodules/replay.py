"""Off-policy data path: collector → TensorDict replay buffer → sampled batches."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer
from torchrl.envs import EnvBase, Transform

from checkpoints.files import (
    beside_path,
    from_plain,
    save_hashed,
    tensor_bytes,
    to_plain,
    write_folder_atomically,
)
from compat.torchrl import DirectReplay, multistep_window, set_multistep_window
from datamodules.base import RLDataModule, check_positive, send
from datamodules.delivery import Round
from datamodules.frames import FRAME_IDS, FrameStackStore, ring_capacity
from datamodules.memory import MemoryNeed, spec_bytes, transition_bytes
from datamodules.prioritized import ProportionalSampler
from datamodules.timing import PhaseTimer

BUFFER_FILE = "buffer.pt"  # the replay folder's one file: the buffer's state and its frame ring

# The batches of every update one collection earns are drawn in one call, larger than the buffer's batch size (which
# stays the size of one update's batch); TorchRL warns about the difference on every such call.
warnings.filterwarnings("ignore", message="Got conflicting batch_sizes in constructor")


@dataclass(frozen=True)
class PriorityOptions:
    """Prioritized replay (Schaul et al., "Prioritized Experience Replay", ICLR 2016): ``priority:`` in a
    ReplayDataModule's ``init_args``.

    Args:
        alpha: the priorities' exponent α (``P(i) ∝ |δ_i|^α``); 0: uniform replay.
        beta: the importance weights' exponent β at the first update.
        beta_updates: updates over which β rises linearly to 1.
    """

    alpha: float = field(default=0.0, metadata={"formerly": "priority_alpha"})
    beta: float = field(default=0.5, metadata={"formerly": "priority_beta"})
    beta_updates: int = field(default=100_000, metadata={"formerly": "priority_beta_updates"})

    def __post_init__(self) -> None:
        check_positive("priority.alpha", self.alpha, allow_zero=True)
        if not 0 <= self.beta <= 1:
            raise ValueError(f"data.priority.beta must be in [0, 1], got {self.beta}")
        check_positive("priority.beta_updates", self.beta_updates)


#: The most one warm-up round holds (its transitions, counted as the memory check counts them):
#: :meth:`ReplayDataModule.warmup_steps` collects the warm-up in rounds of at most this much.
WARMUP_ROUND_BYTES = 64 * 2**20


def in_round_order(batch: TensorDictBase, steps: int) -> TensorDictBase:
    """A batch of several rounds' steps side by side (``[*environments, k x steps]``: a warm-up round) as ``k`` rounds
    of ``steps`` one after the other (``[k, *environments, steps]``), the order in which those rounds would have been
    written; a batch of one round as it is."""
    rounds = batch.shape[-1] // steps
    if rounds <= 1:
        return batch
    lead = batch.batch_dims - 1
    split = batch.reshape(*batch.shape[:-1], rounds, steps)
    return split.permute(lead, *range(lead), lead + 1)


class ReplayDataModule(RLDataModule):
    """Collects into a replay buffer on the training device and samples fixed-size batches from it.

    The replay ratio is ``frames_per_update``: the reference's "train every 4 steps" is ``frames_per_update: 4``. With
    ``num_envs * collect_steps`` frames per collector call, each call earns ``frames / frames_per_update`` updates;
    fractional credit carries over, so any ratio is honoured exactly on average. A model's store transform (DQN's
    n-step returns) turns each collected batch into the transitions written; its window of recent steps is part of
    this module's checkpointed state.

    With ``priority: {alpha: > 0}`` the replay is prioritized (:class:`~datamodules.prioritized.ProportionalSampler`):
    batches carry ``index`` and ``priority_weight`` (the importance weights, which TorchRL's ``DQNLoss`` applies), and
    the model hands each update's absolute TD errors back through :meth:`after_update` as the sampled transitions'
    new priorities. The batches of every update a collection earns are drawn together, so they are drawn with the
    priorities as of that collection.

    Checkpoints written by ``FrameCheckpoint`` keep the buffer beside them, not pickled inside: a folder
    ``<checkpoint>.replay-rank<r>-step<N>/`` with the storage memory-mapped by TorchRL's storage checkpointer, the
    sampler's and writer's state, and the frame store's ring memory-mapped too (written whole before the checkpoint,
    then renamed into place; the checkpoint names it). A checkpoint saved any other way holds the buffer inline.

    Args:
        env: environment factory (see :class:`RLDataModule`).
        buffer_size: transitions kept; the oldest are overwritten first.
        batch_size: transitions per update.
        warmup_frames: frames collected (with the exploring policy) before the first update; where the collection
            steps its environments in this process, in rounds as long as memory allows (:meth:`warmup_steps`).
        frames_per_update: environment frames collected per gradient update (the replay ratio's inverse).
        priority: prioritized replay (:class:`PriorityOptions`); its default ``alpha`` 0 is uniform replay.
        store_frames_once: keep each frame of stacked-frame observations (``[stack, H, W]`` uint8, Mario's) once, and
            per transition only the ids of its frames (:class:`~datamodules.frames.FrameStackStore`): about one frame
            per transition instead of two whole stacks.
        frame_capacity: frames that store holds, more than ``buffer_size``; default 1.25 × ``buffer_size``, at least
            ``buffer_size`` + 4,096 (:func:`datamodules.frames.ring_capacity`).
        **kwargs: the base options (``num_envs``, ``collect_steps``, ``device``, ``seed``, ``collection``, ...).

    Where and when a round is made is the collection strategy's choice (``datamodules/delivery.py``): in the training
    thread when the updates need it; with ``prefetch: true``, in a background thread while the updates take the one
    before (:class:`~datamodules.delivery.BackgroundRounds`; not with models whose update draws random numbers from
    the global generator, such as SAC: both threads would draw from it in an order that varies); with asynchronous
    collector workers, from what they delivered, one batch per update at most one per ``frames_per_update`` frames
    (:class:`~datamodules.delivery.DeliveredRounds`).
    """

    accepts_store_transform = True
    accepts_prefetch = True

    def __init__(
        self,
        env: Callable[..., EnvBase],
        buffer_size: int = 100_000,
        batch_size: int = 128,
        warmup_frames: int = 1_000,
        frames_per_update: float = 4.0,
        priority: PriorityOptions = PriorityOptions(),
        store_frames_once: bool = False,
        frame_capacity: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(env, **kwargs)
        check_positive("buffer_size", buffer_size)
        check_positive("batch_size", batch_size)
        check_positive("warmup_frames", warmup_frames, allow_zero=True)
        check_positive("frames_per_update", frames_per_update)
        if batch_size > buffer_size:
            raise ValueError(f"data.batch_size ({batch_size}) must be <= buffer_size ({buffer_size})")
        self.buffer_size = buffer_size
        self.batch_size = batch_size
        # Batches are drawn with replacement, so a buffer holding fewer transitions than a batch serves one already
        # (as Stable-Baselines3's does from its learning_starts on); the first collection fills it before any draw.
        self.warmup_frames = warmup_frames
        self.frames_per_update = frames_per_update
        self.priority = priority
        shape = self.observation_spec["observation"].shape
        if store_frames_once and (len(shape) != 3 or self.observation_spec["observation"].dtype != torch.uint8):
            raise ValueError(
                "data.store_frames_once needs stacked uint8 frames [stack, height, width], got "
                f"{tuple(shape)} {self.observation_spec['observation'].dtype}"
            )
        self.store_frames_once = store_frames_once
        self.frame_capacity = ring_capacity(buffer_size, frame_capacity)
        # The buffer slots of the batches served since the last update (one per batch it accumulates), in order.
        self._served_indices: list[torch.Tensor] = []
        self.buffer: TensorDictReplayBuffer | None = None
        self.direct_replay: DirectReplay | None = None  # the buffer's writes and uniform draws, entry by entry
        self.frame_store: FrameStackStore | None = None  # the buffer's transform, with store_frames_once
        self._buffer_beside: tuple[int, str] | None = None  # (update, folder) of the buffer just written beside
        self.update_credit = 0.0  # updates earned by collected frames and not yet taken
        self.pending: list[TensorDictBase] | None = None  # batches drawn for the coming updates, served in order
        self._round_updates = 0  # updates taken from the current round
        #: how rounds reach the updates: the collection strategy's choice (datamodules/delivery.py)
        self.delivery = self.collection.replay_delivery(self)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.buffer is None:
            sampler = (
                ProportionalSampler(self.buffer_size, self.priority.alpha, self.priority.beta, device=self.device)
                if self.prioritized
                else RandomSampler()
            )
            self.frame_store = frames = (
                FrameStackStore.for_buffer(
                    self.buffer_size, self.observation_spec["observation"].shape, self.frame_capacity, self.device
                )
                if self.store_frames_once
                else None
            )
            self.buffer = TensorDictReplayBuffer(
                # compilable: the storage keeps its length as a plain int. The default keeps it in a multiprocessing
                # Value, which its setter replaces by an int whenever torch.compiler.is_compiling() reads True; that
                # flag is process-wide, so a compilation in the training thread (a recompiled loss) broke a prefetch
                # thread's writes ("'int' object has no attribute 'value'"). The buffer is never shared between
                # processes, which is what the Value is for.
                storage=LazyTensorStorage(self.buffer_size, device=self.device, compilable=True),
                sampler=sampler,
                priority_key="td_error",
                batch_size=self.batch_size,
                transform=frames,
            )
            self.direct_replay = DirectReplay(self.buffer)

    def memory_needs(self, device: torch.device) -> list[MemoryNeed]:
        """The replay buffer (``buffer_size`` transitions: both observations, the action, the reward and the flags;
        with ``store_frames_once`` the frames' ids instead of the stacks, and the frame ring beside), and the base's."""
        needs = super().memory_needs(device)
        buffer_flag = f"data.buffer_size {self.buffer_size}"
        if not self.store_frames_once:
            per_transition = transition_bytes(self.observation_spec, self.action_spec)
            return [MemoryNeed("the replay buffer", buffer_flag, self.buffer_size * per_transition, device), *needs]
        stack, height, width = self.observation_spec["observation"].shape
        others = spec_bytes(self.observation_spec) - spec_bytes(self.observation_spec["observation"])
        ids = 2 * stack * torch.empty((), dtype=torch.long).element_size()  # FRAME_IDS per transition
        per_transition = ids + 2 * others + spec_bytes(self.action_spec) + 7
        ring = self.frame_capacity * (height * width + 8)  # each frame and the id of the frame in its slot
        return [
            MemoryNeed("the replay buffer", buffer_flag, self.buffer_size * per_transition, device),
            MemoryNeed(
                f"the frame ring ({FRAME_IDS} point into it)",
                f"data.frame_capacity {self.frame_capacity} (from {buffer_flag})",
                ring,
                device,
            ),
            *needs,
        ]

    @property
    def prioritized(self) -> bool:
        return self.priority.alpha > 0

    def importance_beta(self, updates: int) -> float:
        """β after ``updates`` updates: ``priority.beta`` rising linearly to 1 over ``priority.beta_updates``."""
        beta = self.priority.beta
        return beta + (1.0 - beta) * min(updates / self.priority.beta_updates, 1.0)

    def connect(
        self,
        policy: TensorDictModuleBase,
        postprocess: Any = None,
        batch_keys: Any = None,
        store_transform: Transform | None = None,
    ) -> None:
        policy = self.delivery.acting_policy(policy, store_transform)
        super().connect(policy, postprocess, batch_keys, store_transform)

    @property
    def batches_ready(self) -> int:
        # The rest of the round: the model's step takes them (Lightning's per-step work is then paid once per
        # collection); the next round is collected through the training stream.
        return len(self.pending) if self.pending is not None else 0

    @property
    def background_timer(self) -> PhaseTimer | None:
        """The phases of the rounds prepared off the training thread (prefetch; the training thread's ``collect`` is
        its wait for them); None when rounds are made in it."""
        return self.delivery.background_timer

    def next_batch(self) -> TensorDictBase:
        if self.pending is None:
            self.pending = self._take_round()
        return self.next_ready_batch()

    def next_ready_batch(self) -> TensorDictBase:
        """The next of the batches already drawn (``batches_ready`` > 0). The training stream serves them one by one;
        a model's step takes the rest of a round here directly, past Lightning's DataLoader wrapping, whose per-batch
        cost is a noticeable share of a small update (docs/results/snake.md, "The update against its bare
        arithmetic")."""
        sample = self.pending.pop(0)
        if not self.pending:
            self.pending = None
        self.update_credit -= 1.0
        self.samples += sample.numel()
        if self.prioritized:
            self._served_indices.append(sample["index"])
        return sample

    def _take_round(self) -> list[TensorDictBase]:
        """The batches of the updates the next round earns, as the delivery makes it."""
        taken = self.delivery.take(self)
        self.frames, self.update_credit = taken.frames, taken.credit
        self.episodes.count()  # the round's training episodes count with its frames
        self._round_updates = 0
        return taken.batches

    def prepare_round(self, frames: int, credit: float, timer: PhaseTimer) -> Round:
        """Collect until an update is earned, write it all to the buffer, and draw the earned updates' batches. Reads
        and writes no counter of this module (a delivery may call it in a background thread): they come in and go
        out."""
        while credit < 1.0:
            batch = self.collect_uncounted(timer, self.warmup_steps(frames))
            frames += batch.numel()
            with timer.phase("buffer_write"):
                self.store(batch)
            if frames >= self.warmup_frames:
                credit += batch.numel() / self.frames_per_update
        return Round(self.draw(int(credit), timer), frames, credit)

    def warmup_steps(self, frames: int) -> int:
        """Steps of every environment to collect in one round from ``frames`` on: during the warm-up, the whole rounds
        before the one that ends it (as many as :data:`WARMUP_ROUND_BYTES` holds), when there are two or more; else 0,
        a round as usual. No update waits on those rounds and the weights do not move between them, so one longer
        round plays what they play, transition for transition, and :meth:`store` writes them in their order; a round
        costs a collector call, a stack and a write whatever its length (docs/results/gymnasium.md, "A warm-up in long
        rounds"). Not where the collection steps its rounds elsewhere (worker processes), nor with a store transform
        (n-step returns) or frames stored once, whose windows follow the rounds."""
        if not self.collection.rounds_of_any_length or self.store_transform is not None or self.store_frames_once:
            return 0
        rounds_left = -(-(self.warmup_frames - frames) // self.frames_per_batch)  # the last one ends the warm-up
        if rounds_left < 3:  # every round after the warm-up: nothing more to work out
            return 0
        per_frame = transition_bytes(self.observation_spec, self.action_spec)
        rounds = min(rounds_left - 1, max(1, WARMUP_ROUND_BYTES // (self.frames_per_batch * per_frame)))
        return rounds * self.collect_steps if rounds > 1 else 0

    def largest_round_frames(self) -> int:
        return max(self.frames_per_batch, self.warmup_steps(0) // self.collect_steps * self.frames_per_batch)

    def draw(self, updates: int, timer: PhaseTimer) -> list[TensorDictBase]:
        """The batches of ``updates`` updates, drawn from the buffer in one call: the buffer does not change until
        the next collection, so these are the same uniform draws as one call per update, for a fraction of the
        replay buffer's per-call cost, which is the same whatever the batch size and more than the Snake network's
        forward pass (docs/results/snake.md, "The update against its bare arithmetic")."""
        if self.prioritized:
            self.buffer.sampler.beta = self.importance_beta(self.trainer.global_step if self.trainer else 0)
        with timer.phase("sample"):
            batches = self.direct_replay.sample(updates * self.batch_size, parts=updates)
            if batches is not None:
                return batches
            # prioritized, a frame store's transform, the first draws: TorchRL's own (one batch: without a split)
            sample = self.buffer.sample(updates * self.batch_size)
            return [sample] if updates == 1 else list(sample.split(self.batch_size))

    def stored(self) -> int:
        """Transitions in the buffer."""
        return len(self.buffer) if self.buffer is not None else 0

    def settle(self) -> None:
        self.delivery.settle(self.timer)

    def teardown(self, stage: str) -> None:
        self.delivery.close()
        super().teardown(stage)

    def after_update(self, priority: torch.Tensor | None = None) -> None:
        super().after_update(priority)
        self._round_updates += 1
        self.delivery.update_taken(self, self._round_updates)
        if self.prioritized:
            if priority is None:
                raise ValueError(
                    f"data.priority.alpha {self.priority.alpha}: prioritized replay needs the model's "
                    "per-sample TD errors (a `td_error` entry in its losses, as DQN and PhysicsInformedDQN give)"
                )
            served, self._served_indices = self._served_indices, []
            self.buffer.update_priority(served[0] if len(served) == 1 else torch.cat(served), priority)

    def monitor(self) -> dict[str, float]:
        """The base's figures and the delivery's (asynchronous workers: the buffer's fill, experiences collected)."""
        return {**super().monitor(), **self.delivery.monitor(self)}

    def store(self, batch: TensorDictBase) -> None:
        """Write a collected batch's transitions to the buffer (through the model's store transform, if any)."""
        # Only what the update reads (Snake-DQN: 6 of the 14 collected entries): every entry costs memory and an
        # indexing op per write and per sample.
        keep = batch.select(*self.batch_keys, strict=False) if self.batch_keys else batch.exclude("collector")
        if self.store_transform is not None:
            # n-step returns: the transform holds each environment's last n steps and gives back, per call, the
            # transitions whose n-step window is now complete (None until n steps are in).
            keep = self.store_transform.inv(keep)
            if keep is None:
                return
            keep = keep.select(*self.batch_keys) if self.batch_keys else keep
        if self.frame_store is None:  # a frame store reads the stacks where they are and sends only what it keeps
            keep = send(keep, self.device)
        keep = in_round_order(keep, self.collect_steps)
        if not self.direct_replay.extend(keep):  # the first write allocates the storage: TorchRL's own
            self.buffer.extend(keep.reshape(-1))

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["update_credit"] = self.update_credit
        state["pending"] = None if self.pending is None else [to_plain(batch) for batch in self.pending]
        state["round_updates"] = self._round_updates
        state.update(self.delivery.state_dict())  # a round prepared in the background (settled by the base's)
        if self.buffer is not None and len(self.buffer) > 0:
            beside = self._buffer_beside
            if beside is not None and beside[0] == self.trainer.global_step:
                state["buffer_folder"] = beside[1]
            else:
                state["buffer"] = filled_rows(self.buffer.state_dict())
        if self.store_transform is not None:
            state["store_window"] = to_plain(multistep_window(self.store_transform))
        return state

    def _load_state(self, state_dict: dict[str, Any]) -> None:
        self.update_credit = state_dict["update_credit"]
        pending = state_dict["pending"]
        self.pending = None if pending is None else [from_plain(b, batch_dims=1, device=self.device) for b in pending]
        self._round_updates = state_dict.get("round_updates", 0)
        self.delivery.load_state_dict(state_dict, self.device)
        if ("buffer" in state_dict or "buffer_folder" in state_dict) and self.buffer is None:
            raise RuntimeError("the replay buffer is created in setup(); load the data module state after it")
        if "buffer" in state_dict:
            self.buffer.load_state_dict(at_capacity(state_dict["buffer"], self.buffer.storage.max_size))
        elif "buffer_folder" in state_dict and self.trainer.state.fn == "fit":  # validation does not replay
            self._load_buffer(Path(self.trainer.ckpt_path).parent / state_dict["buffer_folder"])
        if self.store_transform is not None:
            # A checkpoint written without the transform (or before its first call) has no window: start empty. So
            # does an environment whose episodes end on loading (BatchedEnv.exact_state): the window's last steps
            # would otherwise be summed with the next episodes' first ones.
            window = state_dict.get("store_window") if self.declared.exact_state else None
            set_multistep_window(self.store_transform, from_plain(window, batch_dims=2, device=self.device))
        super()._load_state(state_dict)

    # ------------------------------------------------------------------------------ the buffer beside checkpoints
    def save_beside(self, checkpoint_path: str | Path, digests: dict[str, str] | None = None) -> None:
        self._buffer_beside = None
        self.settle()  # a round being prepared in the background writes to the buffer
        digests = dict(digests or {})
        if self.buffer is not None and len(self.buffer) > 0:
            step = self.trainer.global_step
            folder = beside_path(checkpoint_path, "replay", self.trainer.global_rank, step)
            contents = self._buffer_contents()
            written = write_folder_atomically(
                folder, lambda into: self._dump_buffer(into, contents), tensor_bytes(contents)
            )
            digests.update({f"{folder.name}/{name}": digest for name, digest in written.items()})
            self._buffer_beside = (step, folder.name)
        super().save_beside(checkpoint_path, digests)  # ranks > 0: their state, which names the folder

    def remove_beside(self, checkpoint_path: str | Path, keep_updates: Container[int] | None = None) -> None:
        super().remove_beside(checkpoint_path, keep_updates)
        self._buffer_beside = None  # the checkpoint that names it is written: later states hold their own

    def _buffer_contents(self) -> dict[str, Any]:
        # TorchRL's own state of the buffer (the storage, the sampler's priorities, the writer's cursor) and, with
        # store_frames_once, the frame ring: views of the buffer's memory, nothing copied.
        contents = {"buffer": filled_rows(self.buffer.state_dict())}
        if self.frame_store is not None:
            contents["frames"] = self.frame_store.state_dict()
        return contents

    def _dump_buffer(self, folder: Path, contents: dict[str, Any] | None = None) -> dict[str, str]:
        # Plain writes (torch.save), not TorchRL's memory-mapped storage checkpointer: writing through a memory map
        # turns a full disk into SIGBUS, which kills the process with no word of why; a plain write fails with an
        # error that is reported. Returns each file's SHA-256, hashed as it was written.
        contents = self._buffer_contents() if contents is None else contents
        with open(folder / BUFFER_FILE, "wb") as file:
            return {BUFFER_FILE: save_hashed(contents, file)}

    def _load_buffer(self, folder: Path) -> None:
        if not folder.is_dir():
            raise FileNotFoundError(
                f"--ckpt_path {self.trainer.ckpt_path}: its replay buffer is missing ({folder.name}, a folder that "
                "must stay beside the checkpoint)"
            )
        if (folder / BUFFER_FILE).is_file():
            # Memory-mapped while read: copied into the buffer's own memory, the file left alone.
            contents = torch.load(folder / BUFFER_FILE, map_location=self.device, mmap=True, weights_only=True)
            self.buffer.load_state_dict(at_capacity(contents["buffer"], self.buffer.storage.max_size))
            if self.frame_store is not None:
                self.frame_store.load_state_dict(contents["frames"])
            return
        # A folder written before the buffer was saved with plain writes: TorchRL's memory-mapped checkpointers.
        self.buffer.storage.loads(folder / "storage")
        self.buffer.sampler.loads(folder / "sampler")
        self.buffer.writer.loads(folder / "writer")
        if self.frame_store is not None:
            self.frame_store.load_state_dict(TensorDict.load_memmap(folder / "frames").to_dict())


def filled_rows(state: dict[str, Any]) -> dict[str, Any]:
    """A replay buffer's state (``state_dict()``) with its storage cut to the rows written. The writer fills the
    storage from row 0 until it is full, and the rows beyond are memory never written: an early checkpoint of a run with
    a million-transition buffer would otherwise write the whole allocation (gigabytes for a MuJoCo humanoid's 376
    numbers an observation) to keep a few thousand transitions. :func:`at_capacity` grows it back on load."""
    storage = state["_storage"]
    rows = storage["_len"]
    if not isinstance(storage["_storage"], dict) or rows == _leading(storage["_storage"]):
        return state  # full (or a storage of another form): saved as it is, no copy
    cut = _map_tensors(storage["_storage"], lambda tensor: tensor[:rows].clone())  # a clone: a view saves it all
    return {**state, "_storage": {**storage, "_storage": cut}}


def at_capacity(state: dict[str, Any], capacity: int) -> dict[str, Any]:
    """The inverse of :func:`filled_rows`: a saved storage of fewer rows than ``capacity`` grown to it with rows left
    unset, as a fresh buffer's are (never read: the buffer samples only its first ``_len``), so the restored buffer
    writes on as the saved one did."""
    storage = state["_storage"]
    if not isinstance(storage["_storage"], dict) or _leading(storage["_storage"]) in (None, capacity):
        return state

    def grow(tensor: torch.Tensor) -> torch.Tensor:
        full = tensor.new_empty((capacity, *tensor.shape[1:]))
        full[: tensor.shape[0]] = tensor
        return full

    return {**state, "_storage": {**storage, "_storage": _map_tensors(storage["_storage"], grow)}}


def _map_tensors(tree: dict[str, Any], function: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    mapped = copy.copy(tree)  # the same mapping type and attributes: a TensorDict's state keeps its `_metadata` there
    for key, value in tree.items():
        if isinstance(value, dict):
            mapped[key] = _map_tensors(value, function)
        elif isinstance(value, torch.Tensor):
            mapped[key] = function(value)
    return mapped


def _leading(tree: dict[str, Any]) -> int | None:
    """The storage's rows: the first dimension of its tensors (None when it holds none)."""
    for value in tree.values():
        found = (
            _leading(value) if isinstance(value, dict) else value.shape[0] if isinstance(value, torch.Tensor) else None
        )
        if found is not None:
            return found
    return None

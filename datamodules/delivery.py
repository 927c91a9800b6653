"""How replay rounds reach the updates: each collection strategy chooses how (``Collection.replay_delivery``).

A *round* is what one collection earns: the batches of its updates, and the frame counter and update credit after it.
The replay data module (:class:`ReplayHost`) offers the parts — collect until an update is earned and store it
(``prepare_round``), store one batch, draw batches — and serves each round's batches one per update; a delivery
decides where and when a round is made:

- :class:`InlineRounds`: in the training thread, when the updates need it (every strategy without the options below).
- :class:`BackgroundRounds`: the next round is prepared in a background thread while the updates take this one
  (``prefetch: true`` of ``InProcess`` and ``EnvWorkers``).
- :class:`DeliveredRounds`: what asynchronous workers delivered since the last update is stored, and one batch drawn
  (``AsyncCollectorWorkers``).

Nothing outside a strategy and its delivery asks which strategy collects.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import Transform

from checkpoints.files import from_plain, to_plain
from compat.tensordict import own_interaction_type
from datamodules.timing import PhaseTimer

if TYPE_CHECKING:
    from datamodules.episodes import EpisodeStatistics

OPTION = "data.collection"


class Round(NamedTuple):
    """What one collection earns: the batches of its updates, and the frame counter and update credit after it (the
    credit counts these batches until they are served)."""

    batches: list[TensorDictBase]
    frames: int
    credit: float


class ReplayHost(Protocol):
    """What a delivery is given of its replay data module (:class:`~datamodules.replay.ReplayDataModule` is one).

    Attributes:
        frames: frames collected and counted so far; update_credit: updates earned and not yet taken.
        pending: the batches of the current round not yet served (None: none).
        warmup_frames, frames_per_update: the replay's warm-up and ratio; device: where the buffer lives.
        prioritized: whether batches carry priorities; timer: the training thread's phase timer.
        episodes: the training episodes' statistics (their frames are counted when a round is taken).
    """

    frames: int
    update_credit: float
    pending: list[TensorDictBase] | None
    warmup_frames: int
    frames_per_update: float
    device: torch.device
    timer: PhaseTimer
    episodes: EpisodeStatistics

    @property
    def prioritized(self) -> bool: ...

    def prepare_round(self, frames: int, credit: float, timer: PhaseTimer) -> Round: ...

    def store(self, batch: TensorDictBase) -> None:
        """Write a batch (on any device) into the buffer on :attr:`device`."""

    def draw(self, updates: int, timer: PhaseTimer) -> list[TensorDictBase]: ...

    def stored(self) -> int: ...


class InlineRounds:
    """Each round collected, stored and drawn in the training thread when the updates need it."""

    #: the phases of rounds prepared off the training thread (a :class:`BackgroundRounds`' own); None: none are
    background_timer: PhaseTimer | None = None

    def acting_policy(self, policy: TensorDictModuleBase, store_transform: Transform | None) -> TensorDictModuleBase:
        """The policy the collector acts with, given the model's (the same one here)."""
        return policy

    def take(self, replay: ReplayHost) -> Round:
        """The next round."""
        return replay.prepare_round(replay.frames, replay.update_credit, replay.timer)

    def update_taken(self, replay: ReplayHost, round_updates: int) -> None:
        """After each update; ``round_updates``: the updates taken from the current round so far."""

    def settle(self, timer: PhaseTimer) -> None:
        """Wait for a round being made off the training thread, if any (before a checkpoint or an evaluation)."""

    def close(self) -> None:
        """Stop whatever runs beside the training thread, without raising its error again."""

    def monitor(self, replay: ReplayHost) -> dict[str, float]:
        """Figures about the delivery that the update logs with its losses."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What continues the delivery exactly (entries of the data module's state)."""
        return {}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Restore what :meth:`state_dict` wrote (``state`` is the data module's whole state)."""


def _start_background_thread(threads: int) -> None:
    """The prefetch thread's start: its own interaction type, and the training thread's intra-op thread count (a new
    thread starts with OpenMP's default, not the one --threads set).

    Every TorchRL loss sets the process-wide interaction type (TorchRL's exploration type) to "deterministic" for the
    length of its forward pass: a collection running in another thread meanwhile would act greedily (and a loss could
    read a collector's "random"). The prefetch thread gets a value of its own (compat.tensordict says how); the
    training thread, and compiled code, read and write the process-wide one as before."""
    own_interaction_type(None)  # TorchRL's default: explore
    torch.set_num_threads(threads)


class BackgroundRounds(InlineRounds):
    """The next round (collect, store, draw the batches of the updates it earns) prepared in a background thread
    while the model takes this round's updates, so that on a machine with a spare core the update does not wait for
    the data path.

    The round is collected with a copy of the weights (and ε) taken after the current round's first update, where
    inline it is collected after the round's last: a lag of one round of updates, the same at every run, so runs stay
    reproducible and resume exactly (a round prepared and not yet taken is part of the checkpoint). Not with
    prioritized replay: the next round would be drawn before this round's new priorities are written.
    """

    def __init__(self, replay: ReplayHost) -> None:
        if replay.prioritized:
            raise ValueError(
                f"{OPTION}.prefetch: not with prioritized replay (priority.alpha > 0): the "
                "next round would be drawn before this round's new priorities are written"
            )
        self.background_timer = PhaseTimer()
        self._executor: ThreadPoolExecutor | None = None
        self._next: Future | None = None  # the round being prepared
        self._prepared: Round | None = None  # a round prepared and not yet taken
        self._live_params: TensorDictBase | None = None  # the model's acting policy's weights and buffers (ε) ...
        self._acting_params: TensorDictBase | None = None  # ... and those of the copy the collector acts with

    def acting_policy(self, policy: TensorDictModuleBase, store_transform: Transform | None) -> TensorDictModuleBase:
        # The collector acts with a copy, whose weights are set at fixed points (see _start), never while an update
        # writes them.
        acting = copy.deepcopy(policy)
        self._live_params, self._acting_params = TensorDict.from_module(policy), TensorDict.from_module(acting)
        return acting

    def take(self, replay: ReplayHost) -> Round:
        self.settle(replay.timer)
        if self._prepared is not None:
            taken, self._prepared = self._prepared, None
            return taken
        return super().take(replay)

    def update_taken(self, replay: ReplayHost, round_updates: int) -> None:
        # From the end of a round's first update (not before it: the first update of a process compiles the loss, and
        # while it compiles, torch.compiler.is_compiling() reads True in every thread, which TorchRL's code consults).
        if round_updates == 1 and self._next is None and self._prepared is None:
            self._start(replay)

    def _start(self, replay: ReplayHost) -> None:
        """Prepare the next round in the background, acting with the weights (and ε) the model has now."""
        with torch.no_grad():
            self._acting_params.update_(self._live_params)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="replay-prefetch",
                initializer=_start_background_thread,
                initargs=(torch.get_num_threads(),),
            )
        # The credit left once this round's batches are served is where the next round's collection starts from.
        credit = replay.update_credit - len(replay.pending or ())
        self._next = self._executor.submit(replay.prepare_round, replay.frames, credit, self.background_timer)

    def settle(self, timer: PhaseTimer) -> None:
        if self._next is not None:
            with timer.phase("collect"):  # the training thread's wait for the background round
                self._prepared, self._next = self._next.result(), None

    def close(self) -> None:
        if self._next is not None:  # after an error too: wait for the thread, without raising its error again
            self._next.exception()
            self._next = None
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def state_dict(self) -> dict[str, Any]:
        if self._prepared is None:  # settled by the data module's state_dict
            return {}
        prepared = self._prepared
        batches = [to_plain(batch) for batch in prepared.batches]
        return {"prepared": {"batches": batches, "frames": prepared.frames, "credit": prepared.credit}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        prepared = state.get("prepared")
        self._prepared = None
        if prepared is not None:
            batches = [from_plain(batch, batch_dims=1, device=device) for batch in prepared["batches"]]
            self._prepared = Round(batches, prepared["frames"], prepared["credit"])


class AsynchronousWorkers(Protocol):
    """What :class:`DeliveredRounds` asks of its strategy (``AsyncCollectorWorkers``)."""

    @property
    def batch_frames(self) -> int: ...

    def delivered(self, wait: bool) -> tuple[TensorDictBase, int] | None: ...


class DeliveredRounds(InlineRounds):
    """Rounds of asynchronous workers: what they delivered since the last update goes into the buffer, and one batch
    is drawn per update, at most one per ``frames_per_update`` frames (the replay ratio is a ceiling). n-step returns
    are refused: TorchRL's ``MultiStepTransform`` keeps a window of steps per batch row, and batches of different
    workers arrive interleaved, so their episodes would be summed together."""

    def __init__(self, workers: AsynchronousWorkers) -> None:
        self.workers = workers

    def acting_policy(self, policy: TensorDictModuleBase, store_transform: Transform | None) -> TensorDictModuleBase:
        if store_transform is not None:
            raise ValueError(
                "model.n_steps: n-step returns need the in-process collection or workers in step with the "
                "learner (asynchronous worker batches arrive interleaved); use n_steps 1 with AsyncCollectorWorkers"
            )
        return policy

    def take(self, replay: ReplayHost) -> Round:
        frames, credit = replay.frames, replay.update_credit
        # Everything delivered since the last update goes into the buffer; wait only while the buffer is short of its
        # warm-up or the learner is a whole update ahead of the frames.
        while True:
            with replay.timer.phase("collect"):
                delivered = self.workers.delivered(wait=frames < replay.warmup_frames or credit < 1.0)
            if delivered is None:
                break
            batch, dropped_frames = delivered
            frames += batch.numel() + dropped_frames  # the dropped batches were collected too
            replay.episodes.count()  # what the feeder observed, delivered or dropped
            with replay.timer.phase("buffer_write"):
                replay.store(batch)  # from the host: the store sends what it keeps, without waiting for the update
            if frames >= replay.warmup_frames:
                credit += batch.numel() / replay.frames_per_update
        # A learner slower than the workers does not owe the updates it could not take: it samples the freshest buffer
        # instead. (At most one worker batch's worth of updates is kept as credit.)
        credit = min(credit, max(1.0, self.workers.batch_frames / replay.frames_per_update))
        return Round(replay.draw(1, replay.timer), frames, credit)

    def monitor(self, replay: ReplayHost) -> dict[str, float]:
        """The reference's monitoring: replay buffer fill and experiences collected."""
        return {"data/buffer": float(replay.stored()), "data/experiences": float(replay.frames)}

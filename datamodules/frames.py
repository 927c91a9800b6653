"""Stacked frames stored once: a replay-buffer transform that keeps each frame one time, however many stacks hold it.

An observation of ``S`` stacked frames shares ``S − 1`` of them with the observation before it, and the next
observation is the observation shifted by one frame. Stored as they come, a transition holds ``2 S`` frames; the
Mario reference's 50k transitions of two 8 × 128 × 128 stacks take 13 GB. :class:`FrameStackStore` writes each distinct
frame once into a ring of frames and keeps per transition only the ids of its ``2 S`` frames (128 bytes), so the
buffer takes about one frame per transition (≈ 0.8 GB for those 50k) plus its small entries.

It works by content, not by assuming an order of arrival, so it serves any collector (in-process or worker
processes delivering in any order) and n-step transitions alike:

- a stack equal to the next stack of one of the last ``_OPEN_ENDS`` transitions written (the previous step of the
  same episode, in whichever batch it came, however many workers' batches arrived in between) reuses its frame ids,
  if they are among the last ``reuse_window`` frames written; candidates are found by a fingerprint of the stack (a
  few thousand of its bytes), then compared whole. The age limit matters in a deterministic game: later episodes
  show stacks of earlier ones, and a transition that took their old ids (and the transitions after it, theirs)
  would outlive those frames in the ring;
- a next stack that is the observation shifted by one frame writes only its newest frame;
- anything else (an episode's first observation, an n-step next observation) writes its frames, each distinct frame
  of the stack once (a reset stack repeats one frame ``S`` times: one frame is written).

The bookkeeping runs on the host. With the ring on a GPU, a copy of it in host memory serves the comparisons (which
read frames back by content), and each call's new frames go to the device in one non-blocking copy from pinned memory
at its end: written per transition on the GPU, the comparisons and copies were about a thousand synchronisations per
update, 60 % of Mario's wall time on the H200 (docs/results/gpu.md, run E).

The ring holds ``capacity`` frames and overwrites the oldest. Each slot remembers the id of the frame in it, so a
sample whose frames were overwritten (a ring too small for the buffer) is an error naming the option, never a wrong
picture. As a TorchRL replay-buffer transform: ``extend`` calls :meth:`FrameStackStore.inv` (stacks → ids),
``sample`` calls :meth:`FrameStackStore.forward` (ids → stacks). Its state (the ring and its bookkeeping) is part of
the replay buffer's ``state_dict``; ``ReplayDataModule`` checkpoints it memory-mapped beside the checkpoint, with the
buffer's storage.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.envs import Transform

from datamodules.base import send

FRAME_IDS = "frame_ids"  # [stack] ids of the observation's frames, then [stack] of the next observation's
# Recent next stacks an incoming observation is matched against. A worker's batch continues its environments' episodes
# from its previous batch, with the other workers' batches in between: 64 was too few for two workers of 64-step
# batches (each batch's first steps missed, wrote whole stacks, and the ring overflowed; docs/history/mario.md, "Two
# workers, a starved learner").
_OPEN_ENDS = 8192
_FINGERPRINT_STRIDE = 61  # bytes of a stack between two that its fingerprint reads
# Frames beyond one per stored transition that a buffer's store keeps at least. Half of them bounds how old a matched
# stack's frames may be; a worker's episode continues after the other workers' batches (14 workers of 8 emulators × 16
# steps put 1,792 frames between), so a quarter of a small buffer would miss those matches and write whole stacks.
MIN_SPARE_FRAMES = 4096


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two host tensors hold the same values: NumPy's comparison, which on stacks of frames is many times
    faster than ``torch.equal``'s on the CPU (the bookkeeping makes two of these per stored transition)."""
    return a.shape == b.shape and bool(np.array_equal(a.numpy(), b.numpy()))


def ring_capacity(transitions: int, capacity: int | None = None) -> int:
    """The frames a store for ``transitions`` stored transitions holds: ``capacity``, which must exceed them, or by
    default a quarter more, at least :data:`MIN_SPARE_FRAMES` more."""
    if capacity is None:
        return transitions + max(transitions // 4, MIN_SPARE_FRAMES)
    if capacity <= transitions:
        raise ValueError(
            f"data.frame_capacity ({capacity}) must be > buffer_size ({transitions}): about one frame per "
            "stored transition, plus room for the episodes' first frames"
        )
    return capacity


class FrameStackStore(Transform):
    """Replay-buffer transform: ``observation`` and ``("next", "observation")`` stacks ``[N, S, H, W]`` ⇄ frame ids.

    Args:
        capacity: frames the ring holds; give it room for about one frame per stored transition plus the episodes'
            first frames (``ReplayDataModule`` uses 1.25 × its buffer size).
        frame_shape: ``(S, H, W)``, the stacked observation's shape.
        key: the observation's key (the next one is ``("next", key)``).
        flag: the option that sets ``capacity``, named in the error when the ring is too small.
        device: where the ring lives.
        reuse_window: how recent (in frames written) the frames of a matched stack must be to be reused, so that a
            new transition's frames stay in the ring for as long as the buffer keeps it: at most the ring's room
            beyond one frame per stored transition, ``capacity − transitions``, less what the episodes' first frames
            take of that room (``ReplayDataModule`` uses half of it).
        host_copy: keep the bookkeeping's copy of the ring in host memory and send new frames to the ring in one copy
            per call (default: when ``device`` is not the CPU; on the CPU it runs the same path, for tests).
    """

    def __init__(
        self,
        capacity: int,
        frame_shape: Sequence[int],
        key: NestedKey = "observation",
        flag: str = "data.frame_capacity",
        device: torch.device | str = "cpu",
        *,
        reuse_window: int,
        host_copy: bool | None = None,
    ) -> None:
        super().__init__(in_keys=[], out_keys=[])
        stack, height, width = frame_shape
        if capacity < 2 * stack:
            raise ValueError(f"{flag} must be >= {2 * stack} (two stacks of frames), got {capacity}")
        self.capacity, self.stack, self.key, self.flag = capacity, stack, key, flag
        self.reuse_window = min(reuse_window, capacity)
        self.register_buffer("frames", torch.zeros(capacity, height, width, dtype=torch.uint8, device=device))
        self.register_buffer("slot_id", torch.full((capacity,), -1, dtype=torch.long, device=device))
        self.register_buffer("written", torch.zeros((), dtype=torch.long))  # frames written so far: the next id
        self.register_buffer("open_ends", torch.full((_OPEN_ENDS, stack), -1, dtype=torch.long))
        self.register_buffer("open_keys", torch.zeros(_OPEN_ENDS, dtype=torch.long))  # the open ends' fingerprints
        self.register_buffer("open_count", torch.zeros((), dtype=torch.long))
        # The host's view of the ring and of its slots' ids: the buffers themselves on a CPU, else copies in host
        # memory, with the slots written since the last copy to the device (_send_written).
        self._host_frames, self._host_slot_id = self.frames, self.slot_id
        self._unsent: list[torch.Tensor] = []
        if host_copy if host_copy is not None else self.frames.device.type != "cpu":
            self._host_frames, self._host_slot_id = self.frames.cpu().clone(), self.slot_id.cpu().clone()
        self.register_load_state_dict_post_hook(FrameStackStore._copy_to_host)
        sampled = len(range(0, stack * height * width, _FINGERPRINT_STRIDE))
        # Fixed odd multipliers (no random state): a weighted sum of the sampled bytes, wrapping in int64.
        self._fingerprint_weights = np.arange(sampled, dtype=np.int64) * 2_654_435_761 + 1

    @classmethod
    def for_buffer(
        cls,
        transitions: int,
        frame_shape: Sequence[int],
        capacity: int | None = None,
        device: torch.device | str = "cpu",
    ) -> FrameStackStore:
        """The store of a replay buffer of ``transitions`` (:func:`ring_capacity` frames): of its room beyond one frame
        per transition, half bounds the age of reused frames and half is for the episodes' first frames."""
        capacity = ring_capacity(transitions, capacity)
        return cls(capacity, frame_shape, device=device, reuse_window=(capacity - transitions) // 2)

    # ------------------------------------------------------------------------------------------- writing
    def _write(self, frames: torch.Tensor) -> torch.Tensor:
        """Write ``frames`` ``[k, H, W]``; returns their ids."""
        first = int(self.written)
        ids = torch.arange(first, first + frames.shape[0], dtype=torch.long)
        slots = ids % self.capacity
        self._host_frames[slots], self._host_slot_id[slots] = frames, ids
        if self._host_frames is not self.frames:
            self._unsent.append(slots)
        self.written += frames.shape[0]
        return ids

    def _send_written(self) -> None:
        """The frames written on the host since the last call, and their slots' ids, to the device ring: one copy each
        from pinned memory, queued behind the device's work without waiting for it."""
        if not self._unsent:
            return
        slots = torch.cat(self._unsent).unique()  # a slot written twice in one call sends its last frame, once
        self._unsent = []
        device = self.frames.device
        on_device = send(slots, device)
        self.frames[on_device], self.slot_id[on_device] = (
            send(self._host_frames[slots], device),
            send(self._host_slot_id[slots], device),
        )

    def _copy_to_host(self, *_: object) -> None:
        """After a state was loaded into the device ring: the host's copies follow it."""
        if self._host_frames is not self.frames:
            self._host_frames.copy_(self.frames)
            self._host_slot_id.copy_(self.slot_id)
            self._unsent = []

    def _write_stack(self, stack: torch.Tensor) -> torch.Tensor:
        """Write a stack ``[S, H, W]``, each distinct consecutive frame once; returns the stack's ``S`` ids."""
        same = torch.zeros(self.stack, dtype=torch.bool)
        same[1:] = (stack[1:] == stack[:-1]).flatten(1).all(1).cpu()
        new = self._write(stack[~same])
        # each frame takes the id of the last distinct frame at or before it
        return new[torch.cumsum((~same).long(), 0) - 1]

    def _fingerprint(self, stack: torch.Tensor) -> int:
        # In NumPy: a few operations on a host array, each a fraction of a torch operation's fixed cost.
        sampled = stack.numpy().reshape(-1)[::_FINGERPRINT_STRIDE].astype(np.int64)
        return int(np.dot(sampled, self._fingerprint_weights))  # wraps in int64, as the sum of products always did

    def _matching_open_end(self, stack: torch.Tensor, key: int) -> torch.Tensor | None:
        """The ids of a recent next stack equal to ``stack`` (fingerprint ``key``; its frames among the last
        ``reuse_window`` written), or None. Candidates with the same fingerprint are compared whole, the most recent
        first."""
        count = int(self.open_count)
        rows = (self.open_keys[: min(count, _OPEN_ENDS)] == key).nonzero().flatten().tolist()
        for row in sorted(rows, key=lambda row: (count - 1 - row) % _OPEN_ENDS):
            ids = self.open_ends[row]
            if int(ids.min()) >= int(self.written) - self.reuse_window and _same(self._read(ids), stack):
                return ids.clone()
        return None

    def _remember(self, ids: torch.Tensor, key: int) -> None:
        row = int(self.open_count) % _OPEN_ENDS
        self.open_ends[row], self.open_keys[row] = ids, key
        self.open_count += 1

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._inv_call(tensordict)

    @torch.no_grad()
    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Transitions ``[N]`` with both stacks → the same with ``frame_ids`` ``[N, 2 S]`` instead, on the ring's device
        (on ``extend``; a replay buffer's ``Compose`` calls ``_inv_call``). Transitions on the host (asynchronous
        workers' batches) are read where they are: only their new frames and the small entries travel."""
        # The comparisons below read single values: on the host, each is a read, not a device synchronisation.
        observations, nexts = tensordict.get(self.key).cpu(), tensordict.get(("next", self.key)).cpu()
        ids = torch.empty(observations.shape[0], 2 * self.stack, dtype=torch.long)
        for i, (observation, following) in enumerate(zip(observations, nexts, strict=True)):
            current = self._matching_open_end(observation, self._fingerprint(observation))
            if current is None:
                current = self._write_stack(observation)
            following_key = self._fingerprint(following)
            if _same(following[:-1], observation[1:]):
                upcoming = torch.cat((current[1:], self._write(following[-1:])))
            else:
                upcoming = self._matching_open_end(following, following_key)
                upcoming = self._write_stack(following) if upcoming is None else upcoming
            ids[i, : self.stack], ids[i, self.stack :] = current, upcoming
            self._remember(upcoming, following_key)
        self._send_written()
        out = tensordict.exclude(self.key, ("next", self.key))
        out.set(FRAME_IDS, ids.to(tensordict.device) if tensordict.device is not None else ids)
        return send(out, self.frames.device)

    # ------------------------------------------------------------------------------------------- reading
    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        """The frames ``ids`` on the host (the comparisons' reads): ``index_select`` copies whole frames, where
        indexing's general kernel goes element by element, many times slower."""
        return self._host_frames.index_select(0, ids % self.capacity)

    @torch.no_grad()
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Sampled transitions with ``frame_ids`` → both stacks rebuilt (on ``sample``)."""
        ids = tensordict.get(FRAME_IDS)
        if not torch.equal(self.slot_id[(ids % self.capacity).to(self.slot_id.device)], ids.to(self.slot_id.device)):
            raise RuntimeError(
                f"{self.flag} ({self.capacity} frames) is too small for the replay buffer: frames of stored "
                "transitions were overwritten; raise it (about 1.25 frames per stored transition)"
            )
        frames = self.frames[(ids % self.capacity).to(self.frames.device)].to(ids.device)
        tensordict.set(self.key, frames[..., : self.stack, :, :])
        tensordict.set(("next", self.key), frames[..., self.stack :, :, :])
        return tensordict

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.forward(tensordict)

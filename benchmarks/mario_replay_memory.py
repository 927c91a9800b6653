"""Memory of the Mario replay buffer (the reference's 50k transitions) with frames stored once, against whole stacks.

    python benchmarks/mario_replay_memory.py --steps 300

Builds the data module of ``configs/mario_ddqn.yaml`` (``store_frames_once: true``, ``buffer_size: 50000``), plays
``--steps`` steps of random buttons on 4 emulators in this process and writes them to its replay buffer the way
training does. TorchRL's storage allocates all its slots at the first write and the frame ring is allocated whole,
so the bytes they hold are those of the full buffer. Also reports the frames written per transition in the played
sample (one per transition plus one per episode start) and the bytes the same 50k transitions would take with both
8 × 128 × 128 stacks stored in each (what storing the collected transitions as they are costs).

Then the buffer's checkpoint, as ``FrameCheckpoint`` writes it: the folder beside the checkpoint (memory-mapped
storage and frame ring, flushed to disk, renamed into place) with its size and write time, the time to load it into a
fresh data module (checked equal), and, for comparison, the same buffer pickled inline with ``torch.save``.

The played steps are written in batches of 16 steps of the 4 emulators, as a worker delivers them, and the writes are
timed: milliseconds per transition of the learner's buffer write (the frame store's bookkeeping on the host and the
storage's write), on 1 torch thread.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli import build  # noqa: E402
from checkpoints.files import write_folder_atomically  # noqa: E402
from compat.torchrl import storage_contents  # noqa: E402

MIB = 2**20
BATCH_STEPS = 16  # steps of each emulator per written batch: a worker's batch of the shipped config (collect_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="steps of each of the 4 emulators")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, data = build([str(ROOT / "configs/mario_ddqn.yaml")], ["--data.init_args.collection.workers", "1"])
    data.setup("fit")
    data.batch_keys = model.batch_keys()
    env = data.make_env(4, seed=0)
    td, start, storing, steps = env.reset(), time.perf_counter(), 0.0, []
    for step in range(args.steps):
        td["action"] = env.action_spec.rand()
        out, td = env.step_and_maybe_reset(td)
        steps.append(out)
        if len(steps) == BATCH_STEPS or step == args.steps - 1:
            batch = torch.stack(steps, 1)  # [envs, steps], as a worker's batch
            steps, started = [], time.perf_counter()
            data.store(batch)
            storing += time.perf_counter() - started
    played = time.perf_counter() - start
    storage = storage_contents(data.buffer.storage)
    store = data.frame_store  # the buffer's transform
    slots = data.buffer_size
    entries = sum(leaf.nbytes for leaf in storage.values(include_nested=True, leaves_only=True))
    ring = store.frames.nbytes + store.slot_id.nbytes
    transitions = len(data.buffer)
    frame_bytes = store.frames[0].nbytes
    stacks = slots * 2 * 8 * frame_bytes
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.platform()}, {torch.get_num_threads()} torch thread",
        "buffer_slots": slots,
        "transitions_played": transitions,
        "episode_start_frames": store.written.item() - transitions,
        "frames_written_per_transition": store.written.item() / transitions,
        "frame_ring_frames": store.capacity,
        "entries_MiB": entries / MIB,
        "frame_ring_MiB": ring / MIB,
        "total_MiB": (entries + ring) / MIB,
        "whole_stacks_MiB": (stacks + entries - slots * 2 * 8 * 8) / MIB,  # the frame ids' 128 bytes become stacks
        "seconds_played": played,
        # The learner's write of the played batches: the frame store's bookkeeping on the host, then the storage.
        "store_ms_per_transition": storing / transitions * 1e3,
    }
    result.update(checkpoint_costs(data))
    for key, value in result.items():
        print(f"{key}: {value:,.3f}" if isinstance(value, float) else f"{key}: {value}")


def checkpoint_costs(data) -> dict:
    """Write, size and load of the buffer's folder beside a checkpoint; the same buffer pickled inline."""
    with tempfile.TemporaryDirectory(prefix="replay-checkpoint-") as scratch:
        folder = Path(scratch) / "last.ckpt.replay-rank0-step0"
        start = time.perf_counter()
        write_folder_atomically(folder, data._dump_buffer)
        written = time.perf_counter() - start
        size = sum(file.stat().st_size for file in folder.rglob("*") if file.is_file())
        _, fresh = build([str(ROOT / "configs/mario_ddqn.yaml")], ["--data.init_args.collection.workers", "1"])
        fresh.setup("fit")
        start = time.perf_counter()
        fresh._load_buffer(folder)
        loaded = time.perf_counter() - start
        stored = len(data.buffer)  # the slots past it were never written: whatever memory they were allocated with
        same = len(fresh.buffer) == stored and all(
            torch.equal(a, b)
            for a, b in [
                (
                    storage_contents(fresh.buffer.storage)["frame_ids"][:stored],
                    storage_contents(data.buffer.storage)["frame_ids"][:stored],
                ),
                (fresh.frame_store.frames, data.frame_store.frames),
                (fresh.buffer.sampler._priority, data.buffer.sampler._priority),
            ]
        )
        inline = Path(scratch) / "inline.pt"
        start = time.perf_counter()
        with open(inline, "wb") as file:
            torch.save(data.buffer.state_dict(), file)
            file.flush()
            os.fsync(file.fileno())
        pickled = time.perf_counter() - start
        return {
            "beside_folder_MiB": size / MIB,
            "beside_write_seconds": written,
            "beside_load_seconds": loaded,
            "beside_loaded_equal": same,
            "inline_torch_save_MiB": inline.stat().st_size / MIB,
            "inline_torch_save_seconds": pickled,
        }


if __name__ == "__main__":
    main()

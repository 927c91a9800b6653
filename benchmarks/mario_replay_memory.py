"""Memory of the Mario replay buffer (the seed's 50k transitions) with frames stored once, against whole stacks.

    python benchmarks/mario_replay_memory.py --steps 300

Builds the data module of ``configs/mario_ddqn.yaml`` (``store_frames_once: true``, ``buffer_size: 50000``), plays
``--steps`` steps of random buttons on 4 emulators in this process and writes them to its replay buffer the way
training does. TorchRL's storage allocates all its slots at the first write and the frame ring is allocated whole,
so the bytes they hold are those of the full buffer. Also reports the frames written per transition in the played
sample (one per transition plus one per episode start) and the bytes the same 50k transitions would take with both
8 × 128 × 128 stacks stored in each (what storing the collected transitions as they are costs).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli import build  # noqa: E402

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="steps of each of the 4 emulators")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, data = build([str(ROOT / "configs/mario_ddqn.yaml")], ["--data.init_args.num_workers", "1"])
    data.setup("fit")
    data.batch_keys = model.batch_keys()
    env = data.make_env(4, seed=0)
    td, start = env.reset(), time.perf_counter()
    for _ in range(args.steps):
        td["action"] = env.action_spec.rand()
        out, td = env.step_and_maybe_reset(td)
        data._store(out.unsqueeze(1))  # [envs, 1 step], as a collector batch
    played = time.perf_counter() - start
    storage = data.buffer.storage._storage
    store = data.buffer._transform[0]
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
    }
    for key, value in result.items():
        print(f"{key}: {value:,.3f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()

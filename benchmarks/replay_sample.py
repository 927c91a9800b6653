"""Replay sampling alone: one ``sample()`` call of the replay data module's buffer, uniform against prioritized.

    python benchmarks/replay_sample.py --capacity 200000 --draws 2048 --threads 1
    python benchmarks/replay_sample.py --capacity 50000 --draws 2048 --device cuda

The buffer is full of Snake-DQN-sized transitions (the 6 entries the update reads: two 10×10×3 uint8 boards, the
action, reward and end flags). The prioritized buffer's priorities are random |TD errors|; after each draw it takes
new ones for the first batch (what the model hands back after an update). The two buffers alternate in 0.5 s slices
so that the machine's drift hits both alike; medians over the slices are reported, in ms per call.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules.prioritized import ProportionalSampler  # noqa: E402


def filled_buffer(capacity: int, device: torch.device, prioritized: bool) -> TensorDictReplayBuffer:
    sampler = ProportionalSampler(capacity, alpha=0.6, beta=0.4, device=device) if prioritized else RandomSampler()
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, device=device), sampler=sampler)
    board = torch.randint(0, 2, (capacity, 10, 10, 3), dtype=torch.uint8, device=device)
    flags = torch.zeros(capacity, 1, dtype=torch.bool, device=device)
    rb.extend(
        TensorDict(
            observation=board,
            action=torch.randint(0, 4, (capacity,), device=device),
            next=TensorDict(
                observation=board,
                reward=torch.zeros(capacity, 1, device=device),
                done=flags,
                terminated=flags.clone(),
                batch_size=[capacity],
            ),
            batch_size=[capacity],
        )
    )
    if prioritized:
        rb.update_priority(torch.arange(capacity, device=device), torch.rand(capacity, device=device))
    return rb


def time_slice(rb: TensorDictReplayBuffer, draws: int, batch: int, seconds: float, device: torch.device) -> float:
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sample = rb.sample(draws)
        if "priority_weight" in sample:
            rb.update_priority(sample["index"][:batch], torch.rand(batch, device=device))
        calls += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1e3 * (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", type=int, default=200_000)
    parser.add_argument(
        "--draws", type=int, default=2048, help="indices per sample() call (all batches of a collection)"
    )
    parser.add_argument("--batch", type=int, default=512, help="priorities written back after each call")
    parser.add_argument("--slices", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    buffers = {name: filled_buffer(args.capacity, device, name == "prioritized") for name in ("uniform", "prioritized")}
    for rb in buffers.values():  # first allocations
        time_slice(rb, args.draws, args.batch, 0.1, device)
    times: dict[str, list[float]] = {name: [] for name in buffers}
    for _ in range(args.slices):
        for name, rb in buffers.items():
            times[name].append(time_slice(rb, args.draws, args.batch, 0.5, device))
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/replay_sample.py", *sys.argv[1:]],
        "machine": {"platform": platform.platform(), "threads": args.threads, "device": str(device)},
        "ms_per_call": {name: statistics.median(values) for name, values in times.items()},
        "ms_per_call_range": {name: [min(values), max(values)] for name, values in times.items()},
    }
    uniform, prioritized = result["ms_per_call"]["uniform"], result["ms_per_call"]["prioritized"]
    print(
        f"replay sample, {args.draws} of {args.capacity:,} on {device} ({args.threads} thread(s)): uniform "
        f"{uniform:.3f} ms, prioritized {prioritized:.3f} ms (with {args.batch} priorities written back) per call"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

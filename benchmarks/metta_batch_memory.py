"""Memory of one full rollout of the ultra-fast preset: 512 environments × 16 agents × 32 steps = 262,144 steps.

    python benchmarks/metta_batch_memory.py            # one rollout, in this process

Collects one rollout with the untrained policy of ``configs/metta_ultra_fast.yaml`` (LSTM 256) through the data
module's own path (collector, GAE, the cut into 32-step segments), environments in this process, and reports the
bytes of what the collector returns and of what the rollout keeps for the update (``RecurrentPPO.batch_keys``:
tokens, the stored LSTM state, the action and its log-probability, the advantage and value target), entry by entry,
with the process's peak resident memory.
"""

from __future__ import annotations

import platform
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli import build  # noqa: E402

CONFIG = "configs/metta_ultra_fast.yaml"


def megabytes(td) -> float:
    return td.bytes() / 2**20


def main() -> None:
    torch.set_num_threads(1)
    model, data = build([CONFIG], ["--data.init_args.collection", "InProcess"])
    data.setup("fit")
    data.use_env_transform(model.env_transform())
    data.connect(model.policy(), model.postprocess, model.batch_keys())
    data._build_collector()
    start = time.perf_counter()
    with torch.no_grad():
        batch = data.collect()
        kept = data._units(batch)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    data.teardown("fit")

    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"{stamp} · `python benchmarks/metta_batch_memory.py` · 1 thread · torch {torch.__version__} · ")
    print(f"{platform.machine()} · one rollout of {batch.numel():,} agent steps collected in {seconds:.1f} s\n")
    print("| | shape | MiB | bytes per agent step |\n|---|---|---:|---:|")
    print(
        f"| collector output | {list(batch.shape)} | {megabytes(batch):,.0f} | {batch.bytes() / batch.numel():,.0f} |"
    )
    print(f"| kept for the update | {list(kept.shape)} | {megabytes(kept):,.0f} | {kept.bytes() / kept.numel():,.0f} |")
    for key in kept.keys(include_nested=True, leaves_only=True):
        tensor = kept.get(key)
        size = tensor.numel() * tensor.element_size()
        print(f"| · {key} | {list(tensor.shape[2:])} {str(tensor.dtype).removeprefix('torch.')} | ", end="")
        print(f"{size / 2**20:,.0f} | {size / kept.numel():,.0f} |")
    print(f"\npeak resident memory of the process: {peak:,.0f} MiB")


if __name__ == "__main__":
    main()

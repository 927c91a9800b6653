"""Wall-clock accounting of the phases of a training step, shared by the data modules and the throughput callback."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Accumulates wall time per named phase (``collect``, ``buffer_write``, ``sample``, ``advantage``...).

    Args:
        cuda_sync: synchronise the GPU at each phase boundary so GPU work is charged to the phase that launched it.
            Off by default: a host sync in the hot loop costs more than it measures.
    """

    def __init__(self, cuda_sync: bool = False) -> None:
        self.cuda_sync = cuda_sync and torch.cuda.is_available()
        self.totals: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.cuda_sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda_sync:
                torch.cuda.synchronize()
            self.totals[name] += time.perf_counter() - start

    def total(self) -> float:
        return sum(self.totals.values())

    def reset(self) -> None:
        self.totals.clear()

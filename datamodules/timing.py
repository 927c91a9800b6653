"""Wall-clock accounting of the phases of a training step, shared by the data modules and the throughput callback."""

from __future__ import annotations

import time
from collections import defaultdict

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

    def phase(self, name: str) -> _Phase:
        """A context that adds its wall time to ``name``'s total (timed once per update of a small one: a plain
        object's enter and exit, not a generator's)."""
        return _Phase(self, name)

    def total(self) -> float:
        return sum(self.totals.values())

    def reset(self) -> None:
        self.totals.clear()


class _Phase:
    """One timed stretch of :meth:`PhaseTimer.phase`."""

    __slots__ = ("timer", "name", "start")

    def __init__(self, timer: PhaseTimer, name: str) -> None:
        self.timer, self.name = timer, name

    def __enter__(self) -> None:
        if self.timer.cuda_sync:
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.timer.cuda_sync:
            torch.cuda.synchronize()
        self.timer.totals[self.name] += time.perf_counter() - self.start

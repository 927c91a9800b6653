"""A window of training updates under ``torch.profiler``, as a Lightning callback (the GPU suite's Mario item)."""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback


class ProfileWindow(Callback):
    """A Lightning callback: ``torch.profiler`` (CPU, and CUDA on a GPU; every thread of the process) from update
    ``start`` for ``updates`` updates. Writes ``<path>.trace.json.gz`` (Chrome / Perfetto trace) and ``<path>.txt``
    (the operators by self time on the device and on the host), and keeps a summary for the item's figures."""

    def __init__(self, path: Path, start: int, updates: int) -> None:
        self.path, self.start, self.updates = path, start, updates
        self.profiler: Any = None
        self.summary: dict | None = None

    def on_train_batch_start(self, trainer: Any, *_: Any) -> None:
        if self.profiler is None and self.summary is None and trainer.global_step >= self.start:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            self.first, self.began = trainer.global_step, time.perf_counter()

    def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
        if self.profiler is not None and trainer.global_step >= self.first + self.updates:
            self.stop(trainer.global_step)

    def on_train_end(self, trainer: Any, *_: Any) -> None:
        if self.profiler is not None:
            self.stop(trainer.global_step)

    def stop(self, step: int) -> None:
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self.began
        self.profiler.__exit__(None, None, None)
        profiler, self.profiler = self.profiler, None
        updates = max(1, step - self.first)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        trace = self.path.with_suffix(".trace.json")
        profiler.export_chrome_trace(str(trace))
        with trace.open("rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        trace.unlink()
        averages = profiler.key_averages()
        tables = [f"{updates} updates in {seconds:.3f} s of wall time ({1e3 * seconds / updates:.1f} ms each)", ""]
        for key in (["self_device_time_total"] if cuda else []) + ["self_cpu_time_total"]:
            tables += [f"by {key}:", averages.table(sort_by=key, row_limit=40, max_name_column_width=70), ""]
        self.path.with_suffix(".txt").write_text("\n".join(tables))
        self.summary = {
            "updates": updates,
            "wall_ms_per_update": 1e3 * seconds / updates,
            "host_ms_per_update": sum(e.self_cpu_time_total for e in averages) / 1e3 / updates,
            "device_ms_per_update": (sum(e.self_device_time_total for e in averages) / 1e3 / updates) if cuda else None,
            "files": [f"{trace.name}.gz", self.path.with_suffix(".txt").name],
        }

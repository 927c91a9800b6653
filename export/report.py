"""The export benchmark: eager against traced samples/s per batch size, beside the PIRL reference's figures.

:func:`export.tracing.export_policy` measures each batch size with :func:`samples_per_s` and writes
``export_benchmark.json`` and ``export_benchmark.md`` through :func:`write_benchmark`. Each figure is the best of
``REPEATS`` runs after a warm-up, with the machine's load recorded beside it: on a small shared machine other
processes move multi-thread figures far more than the backends differ.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BENCHMARK = "export_benchmark"
# The PIRL reference's figures for its 16→32→32→32→25 MLP: samples/s on 4 CPU cores and on AWS Neuron, and the speedup
# it reported (from unrounded figures, so not exactly the ratio of the rounded ones).
REFERENCE = {512: (2.3e6, 3.2e6, 1.37), 1024: (3.6e6, 6.1e6, 1.71), 2048: (5.8e6, 10.8e6, 1.87)}
REFERENCE_PARAMETERS = 3481
REPEATS = 3  # a benchmark figure is the best of this many runs, which filters out another process taking the core


def samples_per_s(function: Callable, observation: torch.Tensor, seconds: float) -> float:
    """Samples per second of ``function`` on ``observation``: best of ``REPEATS`` runs sharing ``seconds``, after a
    warm-up (first calls allocate, and TorchScript optimises its graph on the second call)."""
    with torch.inference_mode():
        for _ in range(5):
            function(observation)
        best = 0.0
        for _ in range(REPEATS):
            calls, start = 0, time.perf_counter()
            while True:
                function(observation)
                calls += 1
                elapsed = time.perf_counter() - start
                if elapsed >= seconds / REPEATS:
                    break
            best = max(best, calls * observation.shape[0] / elapsed)
    return best


def format_rate(samples_per_second: float) -> str:
    """A rate for people: ``1.23M`` from a million, ``45.6k`` from a thousand, else whole samples (a CNN on Atari
    frames serves thousands a second, which ``0.00M`` would hide)."""
    if samples_per_second >= 1e6:
        return f"{samples_per_second / 1e6:.2f}M"
    if samples_per_second >= 1e3:
        return f"{samples_per_second / 1e3:.1f}k"
    return f"{samples_per_second:.0f}"


def machine() -> dict[str, Any]:
    """The platform, CPU count, torch threads and load average, recorded beside every figure."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # Other processes' load: on a small shared machine it moves multi-thread figures more than the backends differ.
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def benchmark_row(batch: int, artifact: dict[str, Any], eager: float, traced: float) -> dict[str, Any]:
    """One table row: both rates, the speedup, and the reference's figures at that batch size (None where it has
    none)."""
    reference_cpu, reference_neuron, reference_speedup = REFERENCE.get(batch, (None, None, None))
    return {
        "batch_size": batch,
        "backend": artifact["backend"],
        "backend_choice": artifact.get("choice", {}).get("reason"),  # why `auto` kept it, when it chose
        "eager_samples_per_s": eager,
        "traced_samples_per_s": traced,
        "speedup": traced / eager,
        "reference_cpu_samples_per_s": reference_cpu,
        "reference_neuron_samples_per_s": reference_neuron,
        "reference_speedup": reference_speedup,
    }


def write_benchmark(
    dirpath: Path, metadata: dict[str, Any], rows: list[dict[str, Any]], seconds: float, command: list[str]
) -> dict[str, Any]:
    """Writes ``export_benchmark.json`` and ``.md`` in ``dirpath`` for an export's ``metadata`` and benchmark rows;
    returns the report."""
    report = {
        "date": metadata["date"],
        "command": command,
        "machine": metadata["machine"],
        "torch": torch.__version__,
        "parameters": metadata["parameters"],
        "input": metadata["input"],
        "seconds_per_figure": seconds,
        "repeats": REPEATS,
        "rows": rows,
    }
    (dirpath / f"{BENCHMARK}.json").write_text(json.dumps(report, indent=2) + "\n")
    (dirpath / f"{BENCHMARK}.md").write_text(benchmark_markdown(report))
    return report


def benchmark_markdown(report: dict[str, Any]) -> str:
    """The benchmark as a short page: context lines, the table beside the reference's figures, and honest notes."""

    def rate(value: float | None) -> str:
        return "—" if value is None else format_rate(value)

    machine_ = report["machine"]
    backends = sorted({row["backend"] for row in report["rows"]})
    shape = ", ".join(map(str, report["input"]["shape"]))
    lines = [
        "# Policy export benchmark",
        "",
        f"- date: {report['date']}",
        f"- command: `{' '.join(report['command'])}`",
        f"- machine: {machine_['platform']}, {machine_['processor']}, {machine_['cpu_count']} CPUs, "
        f"torch threads: **{machine_['torch_threads']}**, load average before the run: "
        f"{machine_.get('load_average_1min')}",
        f"- torch {report['torch']}; backend: {', '.join(backends)}",
        f"- network: {report['parameters']:,} parameters, input [batch, {shape}] {report['input']['dtype']}",
        f"- each figure: samples/s (batch × calls / s), best of {report['repeats']} runs sharing "
        f"{report['seconds_per_figure']:g} s, after warm-up, under `torch.inference_mode()`",
        "",
        "| batch | eager samples/s | traced samples/s | speedup | reference CPU (4 cores) | reference Neuron "
        "| reference speedup |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        reference_speedup = "—" if row["reference_speedup"] is None else f"{row['reference_speedup']:.2f}x"
        lines.append(
            f"| {row['batch_size']} | {rate(row['eager_samples_per_s'])} | {rate(row['traced_samples_per_s'])} "
            f"({row['backend']}) | {row['speedup']:.2f}x | {rate(row['reference_cpu_samples_per_s'])} | "
            f"{rate(row['reference_neuron_samples_per_s'])} | {reference_speedup} |"
        )
    lines += ["", "Notes:", ""]
    same = "this network is" if report["parameters"] == REFERENCE_PARAMETERS else "this network is not"
    lines.append(
        f"- The reference's columns are its own measurements of its {REFERENCE_PARAMETERS:,}-parameter "
        "16→32→32→32→25 MLP "
        f"(4 CPU cores; AWS Neuron via torch_neuronx), not rerun here; {same} that size."
    )
    for row in report["rows"]:
        if row["backend_choice"]:
            lines.append(f"- Batch {row['batch_size']}: `auto` kept {row['backend']}, {row['backend_choice']}.")
        if row["speedup"] <= 1:
            lines.append(
                f"- At batch {row['batch_size']} the traced module ({row['backend']}) is not faster than eager: "
                f"{row['speedup']:.2f}x."
            )
    return "\n".join(lines) + "\n"

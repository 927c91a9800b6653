"""PolicyExport: trace the trained policy network for fixed-batch inference, check it, benchmark it, load it back.

The PIRL seed traced its 3,481-parameter MLP with AWS ``torch_neuronx.trace`` at batch sizes 512/1024/2048 and
compared CPU and Neuron throughput. This does the same for any agent's ``RLModule.export_network()``, after ``fit`` or
from a checkpoint alone: on Neuron when ``torch_neuronx`` imports (``pip install ".[neuron]"``), otherwise with a
portable CPU backend, TorchScript (``torch.jit.trace`` + ``freeze``) or AOTInductor (the network compiled to C++).

Commands::

    python -m app fit --config configs/snake_dqn.yaml --trainer.callbacks+=callbacks.export.PolicyExport
    python -m callbacks.export --checkpoint runs/snake_dqn/version_0/checkpoints/last.ckpt --threads 1
    python -m callbacks.export --checkpoint last.ckpt --config configs/snake_dqn.yaml --batch-sizes 256 --out export

Files in the export folder:

- ``policy_b{N}.pt``: one traced module per batch size, since traced shapes are fixed (Neuron, TorchScript:
  ``torch.jit.load``; Neuron modules need ``import torch_neuronx`` first), or ``policy_b{N}.pt2``, an AOTInductor
  package (``torch._inductor.aoti_load_package``).
- ``eager.pt2``: the network as a ``torch.export`` program with a dynamic batch dim, which loads on any CPU without
  this code (``torch.export.load(path).module()``; same or compatible torch version, recorded in the metadata).
  A network ``torch.export`` cannot capture is saved as TorchScript instead, ``eager.pt``, and the metadata says why.
- ``export.json``: per artifact the backend, input and output spec, sha256, max |traced - eager|; versions, machine.
- ``export_benchmark.json`` and ``.md``: eager vs traced samples/s per batch size, beside the seed's figures.

``callbacks.traced_policy.TracedPolicy.load(folder)`` runs any batch size on the traced modules, or on ``eager.pt2``
when they cannot load.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from callbacks.traced_policy import EAGER, METADATA, load_artifact, log, neuron, quiet, sha256

Backend = Literal["auto", "neuron", "torchscript", "aot"]
BACKENDS = ("auto", "neuron", "torchscript", "aot")
BENCHMARK = "export_benchmark"
# The PIRL seed's figures for its 16→32→32→32→25 MLP: samples/s on 4 CPU cores and on AWS Neuron, and the speedup
# it reported (from unrounded figures, so not exactly the ratio of the rounded ones).
SEED = {512: (2.3e6, 3.2e6, 1.37), 1024: (3.6e6, 6.1e6, 1.71), 2048: (5.8e6, 10.8e6, 1.87)}
SEED_PARAMETERS = 3481
# neuronx-cc (in some releases by default) casts fp32 matrix multiplies to bf16, whose 3 significant digits would fail
# the check against eager at fp32's 1e-6: keep every op in the model's own dtype.
NEURON_COMPILER_ARGS = ["--auto-cast", "none"]
# `auto` times each portable backend this long before keeping the faster: enough to rank them, cheap beside a compile.
SELECTION_SECONDS = 0.3
REPEATS = 3  # a benchmark figure is the best of this many runs, which filters out another process taking the core


class ExportMismatchError(RuntimeError):
    """A traced module's outputs differ from the eager network's by more than the tolerance."""


# ------------------------------------------------------------------------------------------------------ helpers
def check_options(
    batch_sizes: Sequence[int],
    backend: str,
    check_batches: int,
    tolerance: float,
    benchmark_seconds: float,
    flag: Callable[[str], str] = str,
) -> list[int]:
    """Validates the export options; ``flag`` turns an argument name into the flag the user typed. Returns the batch
    sizes sorted and without repeats."""
    sizes = list(batch_sizes) if isinstance(batch_sizes, Sequence) and not isinstance(batch_sizes, str) else None
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"{flag('batch_sizes')} must be positive integers, got {batch_sizes!r}")
    if backend not in BACKENDS:
        raise ValueError(f"{flag('backend')} must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "neuron" and neuron() is None:
        raise ValueError(
            f"{flag('backend')} is neuron but torch_neuronx does not import: pip install '.[neuron]' "
            "--extra-index-url https://pip.repos.neuron.amazonaws.com, or use auto"
        )
    if check_batches < 1:
        raise ValueError(f"{flag('check_batches')} must be >= 1, got {check_batches}")
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"{flag('tolerance')} must be a finite number >= 0, got {tolerance}")
    if not benchmark_seconds > 0:
        raise ValueError(f"{flag('benchmark_seconds')} must be > 0, got {benchmark_seconds}")
    return sorted(set(sizes))


def random_inputs(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Observations for the checks: uniform in [-1, 1] for float inputs, 0/1 for integer ones (one-hot or binary
    planes, like Snake's and the chain's)."""
    if dtype.is_floating_point:
        return (torch.rand(tuple(shape), generator=generator) * 2 - 1).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=generator).bool()
    return torch.randint(0, 2, tuple(shape), generator=generator, dtype=dtype)


def _artifact_path(dirpath: Path, backend: str, batch: int) -> Path:
    # AOTInductor insists on the .pt2 suffix of its packages.
    return dirpath / f"policy_b{batch}.{'pt2' if backend == 'aot' else 'pt'}"


def _compile(network: nn.Module, example: torch.Tensor, backend: str, path: Path) -> None:
    """Trace ``network`` at ``example``'s exact shape and dtype with ``backend``, and save the result at ``path``."""
    if backend == "neuron":
        traced = neuron().trace(network, example, compiler_args=NEURON_COMPILER_ARGS)
        torch.jit.save(traced, str(path))
    elif backend == "torchscript":
        # freeze inlines the weights as constants and folds them; optimize_for_inference is left out: on the seed's
        # MLP it was faster at some batch sizes and slower at others, within the run-to-run noise.
        with quiet(), torch.no_grad():
            traced = torch.jit.freeze(torch.jit.trace(network, example).eval())
            torch.jit.save(traced, str(path))
    elif backend == "aot":
        program = torch.export.export(network, (example,))
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    else:
        raise ValueError(f"unknown export backend {backend!r}")


def _max_abs_diff(
    traced: Callable, network: nn.Module, shape: Sequence[int], dtype: torch.dtype, batches: int
) -> float:
    generator = torch.Generator().manual_seed(shape[0])  # fresh inputs, never the example the tracer saw
    worst = 0.0
    with torch.inference_mode():
        for _ in range(batches):
            observation = random_inputs(shape, dtype, generator)
            expected, actual = network(observation).float(), traced(observation).float()
            if actual.shape != expected.shape:
                return math.inf
            difference = (actual - expected).abs().max().item()
            worst = max(worst, difference if math.isfinite(difference) else math.inf)
    return worst


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


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # Other processes' load: on a small shared machine it moves multi-thread figures by 10x or more.
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


# --------------------------------------------------------------------------------------------------- export
def export_policy(
    network: nn.Module,
    input_shape: Sequence[int],
    input_dtype: torch.dtype,
    batch_sizes: Sequence[int] = (512, 1024, 2048),
    dirpath: str | Path = "export",
    backend: Backend = "auto",
    check_batches: int = 3,
    tolerance: float = 1e-6,
    benchmark: bool = True,
    benchmark_seconds: float = 1.0,
    command: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Traces ``network`` at each batch size, checks each traced module against it, benchmarks both, writes the files.

    Args:
        network: ``observation [batch, *input_shape] -> [batch, num_actions]``, on CPU, eval mode, fp32.
        input_shape: one observation's shape (no batch dim).
        input_dtype: the observations' dtype (the traced modules accept exactly this one).
        batch_sizes: one traced module each.
        dirpath: output folder (created).
        backend: ``neuron``, ``torchscript``, ``aot``, or ``auto``: Neuron when ``torch_neuronx`` imports, else the
            faster portable backend at each batch size (both are compiled and timed; an AOT compile takes 5-20 s on
            2 cores, so ``auto`` costs that per batch size).
        check_batches: random input batches on which traced and eager outputs are compared.
        tolerance: largest allowed max |traced - eager|; beyond it :class:`ExportMismatchError` is raised.
        benchmark: time eager and traced inference and write ``export_benchmark.json`` / ``.md``.
        benchmark_seconds: time per figure (each the best of 3 runs).
        command: recorded in the benchmark report; default ``sys.argv``.
        progress: called with one line per batch size (``print`` in the command line).

    Returns:
        The metadata written to ``export.json``, plus the benchmark (``"benchmark"``) when it ran.
    """
    sizes = check_options(batch_sizes, backend, check_batches, tolerance, benchmark_seconds)
    dirpath = Path(dirpath)
    dirpath.mkdir(parents=True, exist_ok=True)
    # One export per folder: an earlier export's modules would otherwise sit beside metadata that no longer lists them.
    for stale in [*dirpath.glob("policy_b*.pt"), *dirpath.glob("policy_b*.pt2"), *dirpath.glob("eager.pt*")]:
        stale.unlink()
    input_shape = tuple(int(d) for d in input_shape)
    network = network.eval()
    portable = ["torchscript", "aot"]
    candidates = [backend] if backend != "auto" else ["neuron"] if neuron() is not None else portable
    artifacts, rows, machine_before = [], [], machine()  # the load average before this process adds its own
    for batch in sizes:
        shape = (batch, *input_shape)
        example = random_inputs(shape, input_dtype, torch.Generator().manual_seed(0))
        artifact, loaded = _export_one(network, example, candidates, dirpath, check_batches, tolerance)
        with torch.inference_mode():
            output = network(example)
        artifact.update(
            input={"shape": list(shape), "dtype": str(input_dtype).removeprefix("torch.")},
            output={"shape": list(output.shape), "dtype": str(output.dtype).removeprefix("torch.")},
        )
        artifacts.append(artifact)
        line = (
            f"batch {batch}: traced ({artifact['backend']}, {artifact['compile_s']:.1f} s), "
            f"checked (max |traced - eager| {artifact['max_abs_diff']:.2g} on {check_batches} random batches)"
        )
        if benchmark:
            eager_rate = samples_per_s(network, example, benchmark_seconds)
            traced_rate = samples_per_s(loaded, example, benchmark_seconds)
            rows.append(_benchmark_row(batch, artifact, eager_rate, traced_rate))
            line += f", benchmarked (eager {eager_rate / 1e6:.2f}M, traced {traced_rate / 1e6:.2f}M samples/s)"
        if progress is not None:
            progress(line)

    metadata = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "machine": machine_before,
        "backend_requested": backend,
        "parameters": sum(p.numel() for p in network.parameters()),
        "input": {"shape": list(input_shape), "dtype": str(input_dtype).removeprefix("torch.")},
        "output": {"shape": artifacts[0]["output"]["shape"][1:], "dtype": artifacts[0]["output"]["dtype"]},
        "check_batches": check_batches,
        "tolerance": tolerance,
        "artifacts": artifacts,
        "eager": _save_eager(network, input_shape, input_dtype, dirpath, tolerance),
    }
    (dirpath / METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
    if benchmark:
        report = {
            "date": metadata["date"],
            "command": list(sys.argv if command is None else command),
            "machine": metadata["machine"],
            "torch": torch.__version__,
            "parameters": metadata["parameters"],
            "input": metadata["input"],
            "seconds_per_figure": benchmark_seconds,
            "repeats": REPEATS,
            "rows": rows,
        }
        (dirpath / f"{BENCHMARK}.json").write_text(json.dumps(report, indent=2) + "\n")
        (dirpath / f"{BENCHMARK}.md").write_text(benchmark_markdown(report))
        metadata["benchmark"] = report
    return metadata


def _export_one(
    network: nn.Module,
    example: torch.Tensor,
    candidates: list[str],
    dirpath: Path,
    check_batches: int,
    tolerance: float,
) -> tuple[dict[str, Any], Callable]:
    """Compiles, reloads and checks each candidate backend at ``example``'s batch size; keeps the fastest passing."""
    batch, passed, failures, errors = example.shape[0], {}, {}, {}
    for backend in candidates:
        path = _artifact_path(dirpath, backend, batch)
        start = time.perf_counter()
        try:
            _compile(network, example, backend, path)
            loaded = load_artifact(backend, path)  # check what was saved, not the object still in memory
        except Exception as error:
            if len(candidates) == 1:
                raise
            # `auto` on a machine without a C++ compiler, or a network one tracer rejects: the other one may do.
            errors[backend] = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
            log.warning("export: the %s backend failed at batch %d (%s)", backend, batch, errors[backend])
            continue
        compile_s = time.perf_counter() - start
        diff = _max_abs_diff(loaded, network, example.shape, example.dtype, check_batches)
        if diff > tolerance:
            failures[backend] = diff
            path.unlink(missing_ok=True)
            continue
        passed[backend] = (path, loaded, compile_s, diff)
    if not passed:
        if failures:
            worst = ", ".join(f"{name} by up to {diff:.3g}" for name, diff in failures.items())
            raise ExportMismatchError(
                f"at batch {batch} the traced network differs from the eager one ({worst}; tolerance "
                f"{tolerance:g}) on random {example.dtype} inputs: not exported. Raise the tolerance or try another "
                "backend"
            )
        raise RuntimeError(f"no export backend worked at batch {batch}: {errors}")

    choice: dict[str, Any] = {}
    if len(passed) > 1:
        rates = {name: samples_per_s(entry[1], example, SELECTION_SECONDS) for name, entry in passed.items()}
        chosen = max(rates, key=rates.get)
        for name, entry in passed.items():
            if name != chosen:
                entry[0].unlink(missing_ok=True)
        summary = ", ".join(f"{name} {rate / 1e6:.2f}M" for name, rate in rates.items())
        choice = {"samples_per_s": rates, "reason": f"fastest in a {SELECTION_SECONDS} s measurement ({summary})"}
    else:
        chosen = next(iter(passed))
        if len(candidates) > 1:
            choice = {"reason": "the only backend that compiled and passed the check"}
    if errors or failures:
        choice.update(errors=errors, over_tolerance=failures)
    path, loaded, compile_s, diff = passed[chosen]
    artifact = {
        "batch_size": batch,
        "backend": chosen,
        "file": path.name,
        "sha256": sha256(path),
        "max_abs_diff": diff,
        "compile_s": round(compile_s, 3),
    }
    if choice:
        artifact["choice"] = choice
    return artifact, loaded


def _save_eager(
    network: nn.Module, input_shape: tuple[int, ...], dtype: torch.dtype, dirpath: Path, tolerance: float
) -> dict[str, Any]:
    # Batch 2, not 1: torch.export specialises a dim it sees as 1, which would defeat the dynamic batch.
    example = random_inputs((2, *input_shape), dtype, torch.Generator().manual_seed(0))
    try:
        program = torch.export.export(network, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        path, entry = dirpath / EAGER, {"format": "torch.export", "dynamic_batch": True}
        torch.export.save(program, str(path))
        loaded = torch.export.load(str(path)).module()
    except Exception as error:
        # A network torch.export cannot capture (data-dependent control flow, say): TorchScript traces it anyway.
        # The traced graph is still batch-generic for per-sample networks, which is what the loader assumes.
        log.warning("export: torch.export failed (%s); saving the eager fallback as TorchScript", error)
        path, entry = dirpath / "eager.pt", {"format": "torchscript", "dynamic_batch": True, "export_error": str(error)}
        with quiet(), torch.no_grad():
            torch.jit.save(torch.jit.trace(network, example), str(path))
        loaded = load_artifact("torchscript", path)
    # Checked at batch sizes unlike the example's, since any batch size is its promise.
    diff = max(_max_abs_diff(loaded, network, (n, *input_shape), dtype, 1) for n in (1, 3, 67))
    if diff > tolerance:
        raise ExportMismatchError(f"the eager fallback {path.name} differs from the network by {diff:.3g}")
    return {"file": path.name, **entry, "sha256": sha256(path), "max_abs_diff": diff}


def _benchmark_row(batch: int, artifact: dict[str, Any], eager: float, traced: float) -> dict[str, Any]:
    seed_cpu, seed_neuron, seed_speedup = SEED.get(batch, (None, None, None))
    return {
        "batch_size": batch,
        "backend": artifact["backend"],
        "backend_choice": artifact.get("choice", {}).get("reason"),  # why `auto` kept it, when it chose
        "eager_samples_per_s": eager,
        "traced_samples_per_s": traced,
        "speedup": traced / eager,
        "seed_cpu_samples_per_s": seed_cpu,
        "seed_neuron_samples_per_s": seed_neuron,
        "seed_speedup": seed_speedup,
    }


def benchmark_markdown(report: dict[str, Any]) -> str:
    """The benchmark as a short page: context lines, the table beside the seed's figures, and honest notes."""

    def rate(value: float | None) -> str:
        return "—" if value is None else f"{value / 1e6:.2f}M"

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
        "| batch | eager samples/s | traced samples/s | speedup | seed CPU (4 cores) | seed Neuron | seed speedup |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        seed_speedup = "—" if row["seed_speedup"] is None else f"{row['seed_speedup']:.2f}x"
        lines.append(
            f"| {row['batch_size']} | {rate(row['eager_samples_per_s'])} | {rate(row['traced_samples_per_s'])} "
            f"({row['backend']}) | {row['speedup']:.2f}x | {rate(row['seed_cpu_samples_per_s'])} | "
            f"{rate(row['seed_neuron_samples_per_s'])} | {seed_speedup} |"
        )
    lines += ["", "Notes:", ""]
    same = "this network is" if report["parameters"] == SEED_PARAMETERS else "this network is not"
    lines.append(
        f"- The seed's columns are its own measurements of its {SEED_PARAMETERS:,}-parameter 16→32→32→32→25 MLP "
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


# --------------------------------------------------------------------------------------------------- callback
def export_network_of(module: pl.LightningModule) -> tuple[nn.Module, tuple[int, ...], torch.dtype]:
    """A CPU, fp32, eval-mode copy of the module's export network (training state untouched) and its input spec."""
    network = copy.deepcopy(module.export_network()).to("cpu", torch.float32).eval().requires_grad_(False)
    spec = module.observation_spec["observation"]
    return network, tuple(spec.shape), spec.dtype


class PolicyExport(Callback):
    """After ``fit``, traces the policy network at fixed batch sizes, checks it against eager, and benchmarks it.

    Runs :func:`export_policy` on ``pl_module.export_network()`` (a CPU, fp32, eval-mode copy) on rank zero, in
    ``on_fit_end``, after the final checkpoint: if the export fails, ``python -m callbacks.export --checkpoint``
    redoes it from that checkpoint. Load the result with :class:`callbacks.traced_policy.TracedPolicy`.

    Usage::

        python -m app fit --config configs/snake_dqn.yaml --trainer.callbacks+=callbacks.export.PolicyExport

    Args:
        batch_sizes: one traced module per batch size (Neuron and TorchScript shapes are fixed).
        dirpath: output folder; default ``<log_dir>/export`` (``default_root_dir`` without a logger).
        backend: ``auto`` (Neuron when ``torch_neuronx`` imports, else the faster of TorchScript and AOTInductor at
            each batch size: AOT compiles take seconds each), ``neuron``, ``torchscript`` or ``aot``.
        check_batches: random input batches per batch size on which traced and eager outputs are compared.
        tolerance: largest allowed max |traced - eager| (fp32); beyond it the export stops with an error.
        benchmark: time eager and traced inference at each batch size (``export_benchmark.json`` / ``.md``).
        benchmark_seconds: time per benchmark figure.
    """

    def __init__(
        self,
        batch_sizes: Sequence[int] = (512, 1024, 2048),
        dirpath: str | None = None,
        backend: Backend = "auto",
        check_batches: int = 3,
        tolerance: float = 1e-6,
        benchmark: bool = True,
        benchmark_seconds: float = 1.0,
    ) -> None:
        self.batch_sizes = check_options(
            batch_sizes,
            backend,
            check_batches,
            tolerance,
            benchmark_seconds,
            flag=lambda name: f"--trainer.callbacks.init_args.{name}",
        )
        self.dirpath, self.backend, self.check_batches, self.tolerance = dirpath, backend, check_batches, tolerance
        self.benchmark, self.benchmark_seconds = benchmark, benchmark_seconds
        self.metadata: dict[str, Any] | None = None  # the last export, for callers and tests

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            pl_module.export_network()  # an agent without one fails now, not after the whole training run

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Resolved on every rank: trainer.log_dir broadcasts, so rank zero alone would wait for the others forever.
        dirpath = Path(self.dirpath or Path(trainer.log_dir or trainer.default_root_dir) / "export")
        if not trainer.is_global_zero:
            return
        network, shape, dtype = export_network_of(pl_module)
        self.metadata = export_policy(
            network,
            shape,
            dtype,
            self.batch_sizes,
            dirpath,
            self.backend,
            self.check_batches,
            self.tolerance,
            self.benchmark,
            self.benchmark_seconds,
            progress=lambda line: print(f"Policy export: {line}"),
        )
        eager = self.metadata["eager"]["file"]
        print(f"Policy export: {len(self.batch_sizes)} traced modules and {eager} in {dirpath}")


# --------------------------------------------------------------------------------------------------- command line
def find_config(checkpoint: Path, levels: int = 3) -> Path | None:
    """The ``config.yaml`` LightningCLI saved in the run folder: next to the checkpoint or up to ``levels - 1``
    folders above it (``runs/x/version_0/checkpoints/last.ckpt`` → ``runs/x/version_0/config.yaml``). No further,
    so that an unrelated config higher up is never picked."""
    for folder in list(checkpoint.resolve().parents)[:levels]:
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    return None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m callbacks.export --checkpoint PATH ...``: rebuild the model from its config, load the checkpoint's
    weights, export. Flags it does not know (``--data.init_args.env.init_args.size 12``) override the config."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m callbacks.export",
        description="Trace a trained policy from a checkpoint, check it against eager and benchmark it.",
        allow_abbrev=False,  # the unknown flags go to the model's config: never guess which of ours they abbreviate
    )
    parser.add_argument("--checkpoint", required=True, help="a Lightning checkpoint (e.g. .../checkpoints/last.ckpt)")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="the training config(s), composed in order; default the run's saved config.yaml near the checkpoint",
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[512, 1024, 2048], help="traced batch sizes")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="default auto: Neuron, else the fastest")
    parser.add_argument("--out", default=None, help="output folder; default <run folder>/export")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for the checks and benchmark")
    parser.add_argument("--check-batches", type=int, default=3, help="random batches compared with eager")
    parser.add_argument("--tolerance", type=float, default=1e-6, help="max |traced - eager| allowed")
    parser.add_argument("--benchmark-seconds", type=float, default=1.0, help="time per benchmark figure")
    parser.add_argument("--no-benchmark", action="store_true", help="skip the benchmark")
    args, overrides = parser.parse_known_args(argv)

    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_file():
        parser.error(f"--checkpoint {checkpoint}: no such file")
    try:
        sizes = check_options(
            args.batch_sizes,
            args.backend,
            args.check_batches,
            args.tolerance,
            args.benchmark_seconds,
            flag=lambda name: "--" + name.replace("_", "-"),
        )
    except ValueError as error:
        parser.error(str(error))
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    configs = args.config or [find_config(checkpoint)]
    if configs[0] is None:
        parser.error(f"--config: no config.yaml next to {checkpoint} or in the 2 folders above; pass the run's config")
    for config in configs:
        if not Path(config).is_file():
            parser.error(f"--config {config}: no such file")
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated file, not a checkpoint, pickled objects: one line each
        parser.error(f"--checkpoint {checkpoint} cannot be read: {str(error).splitlines()[0]}")
    if not isinstance(state, dict) or "state_dict" not in state:
        parser.error(f"--checkpoint {checkpoint} has no state_dict: not a Lightning checkpoint")

    from app.cli import build  # lazy: the CLI's import registers every agent and data module

    model, _ = build([str(config) for config in configs], overrides)
    try:
        model.load_state_dict(state["state_dict"])
    except RuntimeError as error:
        detail = " ".join(line.strip() for line in str(error).splitlines()[:2])  # the error and its first key list
        parser.error(f"--checkpoint {checkpoint} does not fit the model built from --config {configs}: {detail}")
    torch.set_num_threads(args.threads)  # after build, which sets the config's own `threads`
    network, shape, dtype = export_network_of(model)
    run_folder = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    out = Path(args.out) if args.out else run_folder / "export"
    print(
        f"Exporting {type(model).__name__}.export_network() from {checkpoint} (torch threads: {args.threads}) to {out}"
    )
    metadata = export_policy(
        network,
        shape,
        dtype,
        sizes,
        out,
        args.backend,
        args.check_batches,
        args.tolerance,
        not args.no_benchmark,
        args.benchmark_seconds,
        command=["python -m callbacks.export", *argv],
        progress=print,
    )
    report = f"; benchmark: {out / (BENCHMARK + '.md')}" if not args.no_benchmark else ""
    print(f"Wrote {out / METADATA}{report}")
    return metadata


if __name__ == "__main__":
    main()

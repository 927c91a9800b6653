"""Tracing a policy network for fixed-batch inference: compile it per batch size, check it against eager, save it.

The PIRL reference traced its 3,481-parameter MLP with AWS ``torch_neuronx.trace`` at batch sizes 512/1024/2048 and
compared CPU and Neuron throughput. :func:`export_policy` does the same for any agent's ``RLModule.export_network()``:
on Neuron when ``torch_neuronx`` imports (``pip install ".[neuron]"``), otherwise with a portable CPU backend,
TorchScript (``torch.jit.trace`` + ``freeze``) or AOTInductor (the network compiled to C++).

Files in the export folder:

- ``policy_b{N}.pt``: one traced module per batch size, since traced shapes are fixed (Neuron, TorchScript:
  ``torch.jit.load``; Neuron modules need ``import torch_neuronx`` first), or ``policy_b{N}.pt2``, an AOTInductor
  package (``torch._inductor.aoti_load_package``).
- ``eager.pt2``: the network as a ``torch.export`` program with a dynamic batch dim, which loads on any CPU without
  this code (``torch.export.load(path).module()``; same or compatible torch version, recorded in the metadata).
  A network ``torch.export`` cannot capture is saved as TorchScript instead, ``eager.pt``, and the metadata says why.
- ``export.json``: per artifact the backend, input and output spec, sha256 and max |traced - eager| on each input
  set; the input sets checked (``checks``: :mod:`export.inputs`) with the range of what each fed; the checkpoint
  exported; versions, machine.
- ``export_benchmark.json`` and ``.md`` (:mod:`export.report`): eager vs traced samples/s per batch size.

:class:`export.loader.TracedPolicy` loads the folder; ``python -m app export`` (app/export.py) runs this from a
checkpoint, and :class:`callbacks.export.PolicyExport` after ``fit``.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from compat.torch import aoti_compile_and_package
from export.inputs import CheckInputs, random_check_inputs, random_inputs
from export.loader import EAGER, METADATA, load_artifact, load_eager, log, neuron, quiet, sha256
from export.report import benchmark_row, format_rate, machine, samples_per_s, write_benchmark

Backend = Literal["auto", "neuron", "torchscript", "aot"]
BACKENDS = ("auto", "neuron", "torchscript", "aot")
# neuronx-cc (in some releases by default) casts fp32 matrix multiplies to bf16, whose 3 significant digits would fail
# the check against eager at fp32's 1e-6: keep every op in the model's own dtype.
NEURON_COMPILER_ARGS = ["--auto-cast", "none"]
# `auto` times each portable backend this long before keeping the faster: enough to rank them, cheap beside a compile.
SELECTION_SECONDS = 0.3
EAGER_CHECK_SIZES = (1, 3, 67)  # the eager fallback promises any batch size: checked at sizes unlike the traced ones


class ExportMismatchError(RuntimeError):
    """A traced module's outputs differ from the eager network's by more than the tolerance."""


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


def export_network_of(module: Any) -> tuple[nn.Module, tuple[int, ...], torch.dtype]:
    """A CPU, fp32, eval-mode copy of an ``RLModule``'s export network (training state untouched) and its input
    spec (one observation's shape and dtype)."""
    network = copy.deepcopy(module.export_network()).to("cpu", torch.float32).eval().requires_grad_(False)
    spec = module.observation_spec["observation"]
    return network, tuple(spec.shape), spec.dtype


def output_kind(module: Any) -> str:
    """What the export network's outputs are: ``scores`` (one per discrete action: Q-values or logits; the action is
    their argmax) or ``actions`` (a continuous action itself: SAC's and the behaviour clone's deterministic action)."""
    return "scores" if hasattr(module.action_spec.space, "n") else "actions"


def _artifact_path(dirpath: Path, backend: str, batch: int) -> Path:
    # AOTInductor insists on the .pt2 suffix of its packages.
    return dirpath / f"policy_b{batch}.{'pt2' if backend == 'aot' else 'pt'}"


def _compile(network: nn.Module, example: torch.Tensor, backend: str, path: Path) -> None:
    """Trace ``network`` at ``example``'s exact shape and dtype with ``backend``, and save the result at ``path``."""
    if backend == "neuron":
        traced = neuron().trace(network, example, compiler_args=NEURON_COMPILER_ARGS)
        torch.jit.save(traced, str(path))
    elif backend == "torchscript":
        # freeze inlines the weights as constants and folds them; optimize_for_inference is left out: on the reference's
        # MLP it was faster at some batch sizes and slower at others, within the run-to-run noise.
        with quiet(), torch.no_grad():
            traced = torch.jit.freeze(torch.jit.trace(network, example).eval())
            torch.jit.save(traced, str(path))
    elif backend == "aot":
        program = torch.export.export(network, (example,))
        aoti_compile_and_package(program, str(path))
    else:
        raise ValueError(f"unknown export backend {backend!r}")


def _check_seed(batch: int, index: int) -> int:
    # Environments seeded s use random streams s … s + batch - 1: seeds a million apart keep the check batches'
    # streams disjoint (batches below 500k), and never 0, the seed of the tracing example.
    return (index + 1) * 1_000_003 + batch


def _max_abs_diffs(
    traced: Callable, network: nn.Module, batch: int, input_sets: Sequence[CheckInputs], batches: int
) -> dict[str, float]:
    """Max |traced − eager| over ``batches`` fresh batches of each input set, by set name (inf on a shape change)."""
    worst: dict[str, float] = {}
    with torch.inference_mode():
        for inputs in input_sets:
            worst[inputs.name] = 0.0
            for index in range(batches):
                observation = inputs(batch, _check_seed(batch, index))
                expected, actual = network(observation).float(), traced(observation).float()
                difference = (actual - expected).abs().max().item() if actual.shape == expected.shape else math.inf
                worst[inputs.name] = max(worst[inputs.name], difference if math.isfinite(difference) else math.inf)
    return worst


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
    input_sets: Sequence[CheckInputs] = (),
    checkpoint: str | Path | None = None,
    outputs: str = "scores",
) -> dict[str, Any]:
    """Traces ``network`` at each batch size, checks each traced module against it, benchmarks both, writes the files.

    Args:
        network: ``observation [batch, *input_shape] -> [batch, num_actions]``, on CPU, eval mode, fp32.
        input_shape: one observation's shape (no batch dim).
        input_dtype: the observations' dtype (the traced modules accept exactly this one).
        batch_sizes: one traced module each.
        dirpath: output folder (created).
        backend: ``neuron``, ``torchscript``, ``aot``, or ``auto``: Neuron when ``torch_neuronx`` imports, else the
            faster portable backend at each batch size (both are compiled and timed; an AOT compile takes seconds,
            so ``auto`` costs one per batch size).
        check_batches: input batches of each set on which traced and eager outputs are compared.
        tolerance: largest allowed max |traced - eager|; beyond it :class:`ExportMismatchError` is raised.
        benchmark: time eager and traced inference and write ``export_benchmark.json`` / ``.md``.
        benchmark_seconds: time per figure (each the best of 3 runs).
        command: recorded in the benchmark report; default ``sys.argv``.
        progress: called with one line per batch size (``print`` in the command line).
        input_sets: checked besides the random inputs, e.g. the environment's own states
            (:func:`export.inputs.environment_check_inputs`).
        checkpoint: the checkpoint exported, recorded so that a damaged folder can say how to rebuild it.
        outputs: ``scores`` or ``actions`` (:func:`output_kind`), recorded for :meth:`TracedPolicy.act`.

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
    sets = [random_check_inputs(input_shape, input_dtype), *input_sets]
    network = network.eval()
    portable = ["torchscript", "aot"]
    candidates = [backend] if backend != "auto" else ["neuron"] if neuron() is not None else portable
    artifacts, rows, machine_before = [], [], machine()  # the load average before this process adds its own
    for batch in sizes:
        shape = (batch, *input_shape)
        example = random_inputs(shape, input_dtype, torch.Generator().manual_seed(0))
        artifact, loaded = _export_one(network, example, candidates, dirpath, sets, check_batches, tolerance)
        with torch.inference_mode():
            output = network(example)
        artifact.update(
            input={"shape": list(shape), "dtype": str(input_dtype).removeprefix("torch.")},
            output={"shape": list(output.shape), "dtype": str(output.dtype).removeprefix("torch.")},
        )
        artifacts.append(artifact)
        line = (
            f"batch {batch}: traced ({artifact['backend']}, {artifact['compile_s']:.1f} s), checked (max |traced - "
            f"eager| {artifact['max_abs_diff']:.2g} on {check_batches} batches each of "
            f"{', '.join(s.name for s in sets)} inputs)"
        )
        if benchmark:
            eager_rate = samples_per_s(network, example, benchmark_seconds)
            traced_rate = samples_per_s(loaded, example, benchmark_seconds)
            rows.append(benchmark_row(batch, artifact, eager_rate, traced_rate))
            line += f", benchmarked (eager {format_rate(eager_rate)}, traced {format_rate(traced_rate)} samples/s)"
        if progress is not None:
            progress(line)

    eager = _save_eager(network, input_shape, input_dtype, dirpath, sets, tolerance)
    checked = [*artifacts, eager]
    metadata = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "machine": machine_before,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "backend_requested": backend,
        "parameters": sum(p.numel() for p in network.parameters()),
        "input": {"shape": list(input_shape), "dtype": str(input_dtype).removeprefix("torch.")},
        "output": {
            "shape": artifacts[0]["output"]["shape"][1:],
            "dtype": artifacts[0]["output"]["dtype"],
            "kind": outputs,  # TracedPolicy.act: argmax over scores, or the actions as they are
        },
        "check_batches": check_batches,
        "tolerance": tolerance,
        "checks": {
            s.name: {**s.summary(), "max_abs_diff": max(a["max_abs_diff_by_inputs"][s.name] for a in checked)}
            for s in sets
        },
        "artifacts": artifacts,
        "eager": eager,
    }
    (dirpath / METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
    if benchmark:
        command = list(sys.argv if command is None else command)
        metadata["benchmark"] = write_benchmark(dirpath, metadata, rows, benchmark_seconds, command)
    return metadata


def _export_one(
    network: nn.Module,
    example: torch.Tensor,
    candidates: list[str],
    dirpath: Path,
    input_sets: Sequence[CheckInputs],
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
        diffs = _max_abs_diffs(loaded, network, batch, input_sets, check_batches)
        if max(diffs.values()) > tolerance:
            failures[backend] = diffs
            path.unlink(missing_ok=True)
            continue
        passed[backend] = (path, loaded, compile_s, diffs)
    if not passed:
        if failures:
            worst = ", ".join(f"{name} {_worst(diffs)}" for name, diffs in failures.items())
            raise ExportMismatchError(
                f"at batch {batch} the traced network differs from the eager one ({worst}; tolerance {tolerance:g}): "
                "not exported. Raise the tolerance or try another backend"
            )
        raise RuntimeError(f"no export backend worked at batch {batch}: {errors}")

    choice: dict[str, Any] = {}
    if len(passed) > 1:
        rates = {name: samples_per_s(entry[1], example, SELECTION_SECONDS) for name, entry in passed.items()}
        chosen = max(rates, key=rates.get)
        for name, entry in passed.items():
            if name != chosen:
                entry[0].unlink(missing_ok=True)
        summary = ", ".join(f"{name} {format_rate(rate)}" for name, rate in rates.items())
        choice = {"samples_per_s": rates, "reason": f"fastest in a {SELECTION_SECONDS} s measurement ({summary})"}
    else:
        chosen = next(iter(passed))
        if len(candidates) > 1:
            choice = {"reason": "the only backend that compiled and passed the check"}
    if errors or failures:
        choice.update(errors=errors, over_tolerance={name: max(diffs.values()) for name, diffs in failures.items()})
    path, loaded, compile_s, diffs = passed[chosen]
    artifact = {
        "batch_size": batch,
        "backend": chosen,
        "file": path.name,
        "sha256": sha256(path),
        "max_abs_diff": max(diffs.values()),
        "max_abs_diff_by_inputs": diffs,
        "compile_s": round(compile_s, 3),
    }
    if choice:
        artifact["choice"] = choice
    return artifact, loaded


def _worst(diffs: dict[str, float]) -> str:
    """``by up to 0.001 on env_start inputs``: the largest difference and the input set it came from."""
    name = max(diffs, key=diffs.get)
    return f"by up to {diffs[name]:.3g} on {name} inputs"


def _save_eager(
    network: nn.Module,
    input_shape: tuple[int, ...],
    dtype: torch.dtype,
    dirpath: Path,
    input_sets: Sequence[CheckInputs],
    tolerance: float,
) -> dict[str, Any]:
    # Batch 2, not 1: torch.export specialises a dim it sees as 1, which would defeat the dynamic batch.
    example = random_inputs((2, *input_shape), dtype, torch.Generator().manual_seed(0))
    try:
        program = torch.export.export(network, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        path, entry = dirpath / EAGER, {"format": "torch.export", "dynamic_batch": True}
        torch.export.save(program, str(path))
        loaded = load_eager(path, entry["format"])
    except Exception as error:
        # A network torch.export cannot capture (data-dependent control flow, say): TorchScript traces it anyway.
        # The traced graph is still batch-generic for per-sample networks, which is what the loader assumes.
        log.warning("export: torch.export failed (%s); saving the eager fallback as TorchScript", error)
        path, entry = dirpath / "eager.pt", {"format": "torchscript", "dynamic_batch": True, "export_error": str(error)}
        with quiet(), torch.no_grad():
            torch.jit.save(torch.jit.trace(network, example), str(path))
        loaded = load_eager(path, entry["format"])
    diffs: dict[str, float] = {}
    for n in EAGER_CHECK_SIZES:
        for name, diff in _max_abs_diffs(loaded, network, n, input_sets, 1).items():
            diffs[name] = max(diffs.get(name, 0.0), diff)
    if max(diffs.values()) > tolerance:
        raise ExportMismatchError(f"the eager fallback {path.name} differs from the network {_worst(diffs)}")
    return {
        "file": path.name,
        **entry,
        "sha256": sha256(path),
        "max_abs_diff": max(diffs.values()),
        "max_abs_diff_by_inputs": diffs,
    }

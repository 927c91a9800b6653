"""Every GPU measurement in one command: one report, each item under a wall-clock cap, failures reported and skipped.

    python benchmarks/gpu_suite.py --out runs/gpu_suite              # on a CUDA machine: every item (~14 min)
    python benchmarks/gpu_suite.py --out runs/gpu_suite --only snake_env pirl_export
    python benchmarks/gpu_suite.py --quick --out runs/gpu_suite_quick  # every item on the CPU at toy size: a smoke test

Each item runs in a process of its own (``--item NAME``), so a crash, a CUDA error or an out-of-memory in one item
cannot take the others down, and a cap is a real wall-clock limit. While an item runs, ``nvidia-smi`` is sampled
four times a second for the GPU's utilisation and memory in use (all processes: collector workers included); the
item's own process also records PyTorch's peak allocation. After every item the report is written again, so a run
stopped from outside still leaves what it measured:

- ``gpu_suite.json``: per item its status (``ok``, ``failed`` with the error's last lines, ``timed out``), seconds,
  figures, targets with met / not met, GPU utilisation and memory;
- ``gpu_suite.md``: the same as tables, for docs/results/gpu.md.

The items, in the order they run (each figure's target is the reference reports' where they have one):

========================  ========================================================================================
``snake_env``             Snake alone at 4,096 and 65,536 boards, eager and with ``compile_step`` (env steps/s;
                          target >= 100M at 65,536; ATen operations, host reads and graphs per step of each)
``pirl_export``           the PIRL policy exported (TorchScript) and loaded on the GPU: samples/s eager, exported,
                          exported replayed as a CUDA graph, at 512 / 1,024 / 2,048 and 1M / 4M; exported = eager
                          checked on the GPU (targets >= 50M at 2,048, >= 1G at >= 1M)
``vehicle_racing_env``    the vehicle (PIRL) and the racing cars alone at 65,536, eager and with ``compile_step``
                          (steps/s)
``snake_ppo``             ``configs/snake_ppo.yaml`` + its GPU preset, end to end (frames/s; target >= 1M)
``dqn_update``            the Snake DQN update at the reference's setting (batch 128) on the GPU: bare eager
                          PyTorch against the agent's own update eager, compiled, and compiled with the whole
                          update captured as one CUDA graph (``compile: cudagraph``), alternating slices (ms per
                          update, ratios)
``sac``                   racing SAC (from scratch, environments on the GPU) end to end (updates/s, frames/s)
``metta``                 MettaGrid ultra-fast: agent steps/s of whole 262,144-step rollouts, 16 environment
                          workers against 16 collector workers (target >= 500k)
``mario``                 Mario Double DQN, 14 collector workers, the learner on the GPU (experiences/s and
                          updates/s against the reference's 1,800 and 10)
========================  ========================================================================================

``--quick`` runs the same code on the CPU at toy sizes, every item in the suite's own process (a process each would
spend more time importing than measuring; ``--isolate``: a process each, as on the GPU), so that the suite cannot
rot between GPU sessions (a test runs it). Its figures mean nothing. Items whose packages are missing (MettaGrid, the
NES emulator) fail with the import error and the suite goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

QUICK_CPU = ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true"]


# ---------------------------------------------------------------------------------------------------------- items


def snake_env(ctx: Context) -> dict:
    from env_speed import main as env_speed

    sizes = (64, 256) if ctx.quick else (4096, 65536)
    steps = "20" if ctx.quick else "100"
    rows, per_step, errors = {}, {}, {}
    for size in sizes:
        common = ["--env", "snake", "--num-envs", str(size), "--steps", steps, "--device", ctx.device]
        count = ["--count-ops", "3"] if size == sizes[0] else []  # ATen operations and host reads per step
        # The C++ CPU kernel would be compiled first on a fresh CPU machine; --quick checks the code path, not speed.
        report = env_speed([*common, *(["--backend", "torch"] if ctx.quick else []), *count])
        rows[str(size)] = steps_per_s(report)
        per_step = per_step or ({"num_envs": size, "eager": report["per_step"]} if count else {})
        # The step and reset compiled into one graph each (compile_step): no host read, fused kernels. A compilation
        # per size (dynamic=False). --quick leaves them out (a cold compilation takes half a minute):
        # tests/envs/test_compiled_step.py compiles the step, checks it against the eager one and counts what it runs.
        if ctx.quick:
            continue
        compiled = compiled_speed(env_speed, [*common, "--compile-step", *count], errors, f"snake {size}")
        rows[str(size)].update(steps_per_s(compiled, "compiled_"))
        if count and compiled:
            per_step["compiled"] = compiled["per_step"]
    best = max(rows[str(sizes[-1])].values())
    return {
        "figures": {"steps_per_s": rows, "per_step": per_step, "errors": errors},
        "targets": [target(f"env steps/s at {sizes[-1]:,} boards", best, 100e6)],
    }


def vehicle_racing_env(ctx: Context) -> dict:
    from env_speed import main as env_speed

    size, steps = (256, "10") if ctx.quick else (65536, "50")
    rows, errors = {}, {}
    for env in ("vehicle", "racing"):
        common = ["--env", env, "--num-envs", str(size), "--steps", steps, "--device", ctx.device]
        report = env_speed(common)
        rows[env] = steps_per_s(report)
        # The compiled step and reset (a graph each), left out by --quick as Snake's are: the code path is Snake's, and
        # tests/envs/test_compiled_step.py checks these compiled steps against the eager ones.
        if not ctx.quick:
            compiled = compiled_speed(env_speed, [*common, "--compile-step"], errors, env)
            rows[env].update(steps_per_s(compiled, "compiled_"))
    return {"figures": {"num_envs": size, "steps_per_s": rows, "errors": errors}, "targets": []}


def steps_per_s(report: dict, prefix: str = "") -> dict[str, float]:
    """An ``env_speed`` report's steps/s per way of stepping (none for an empty report)."""
    return {f"{prefix}{name}": r["steps_per_s"] for name, r in report.get("results", {}).items()}


def compiled_speed(env_speed: Callable[[list[str]], dict], args: list[str], errors: dict, name: str) -> dict:
    """``env_speed(args)`` with the compiled step; a compilation that fails is recorded in ``errors`` (its last line)
    and leaves the eager figures measured beside it (2026-11-30: torch 2.11's Inductor failed on the H200)."""
    try:
        return env_speed(args)
    except Exception as error:
        errors[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:300] if str(error) else ''}"
        return {}


def pirl_export(ctx: Context) -> dict:
    """Exports the PIRL network on the CPU as the export command does (TorchScript), loads the files on the device
    with the project's loader, checks them against eager there, and times eager / exported / exported in a graph."""
    import torch

    from app.cli import build
    from export.loader import TracedPolicy
    from export.tracing import export_network_of, export_policy

    model, _ = build([str(ROOT / "configs/pirl_vehicle.yaml")], QUICK_CPU if ctx.quick else [])
    network, input_shape, dtype = export_network_of(model)
    small = (512, 1024, 2048)
    big = (4096, 16384) if ctx.quick else (1 << 20, 1 << 22)
    folder = ctx.scratch / "pirl_export"
    export_policy(network, input_shape, dtype, small, folder, backend="torchscript", benchmark=False)
    device = torch.device(ctx.device)
    # The exported files as a user loads them (sha256 checked); a traced MLP serves any batch, so the largest traced
    # module runs the batches beyond it whole (the loader itself would cut them into chunks of 2,048).
    # TorchScript keeps a traced function's constants on the device it was traced on: load them onto this one.
    TracedPolicy.load(folder)  # verifies every file's sha256, as a user's load does
    artifacts = json.loads((folder / "export.json").read_text())["artifacts"]
    modules = {a["batch_size"]: torch.jit.load(folder / a["file"], map_location=device) for a in artifacts}
    eager = network.to(device).eval()
    seconds = 0.2 if ctx.quick else 0.5
    rows, worst = {}, 0.0
    for batch in (*small, *big):
        x = torch.randn(batch, *input_shape, device=device, dtype=dtype)
        exported = modules[min((b for b in small if b >= batch), default=small[-1])]
        with torch.inference_mode():
            worst = max(worst, (exported(x) - eager(x)).abs().max().item())
        row = {
            "eager": rate(lambda x=x: eager(x), batch, seconds, ctx),
            "exported": rate(lambda x=x, m=exported: m(x), batch, seconds, ctx),
        }
        if ctx.cuda:
            row["exported_cuda_graph"] = rate(graphed(exported, x), batch, seconds, ctx)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                row["eager_bf16"] = rate(lambda x=x: eager(x), batch, seconds, ctx)
        rows[str(batch)] = row
    best = {b: max(v for k, v in rows[str(b)].items() if k.startswith("exported")) for b in (*small, *big)}
    return {
        "figures": {"samples_per_s": rows, "max_abs_exported_minus_eager": worst},
        "targets": [
            target("exported = eager on the device (max |diff|)", worst, 1e-5, above=False),
            target("samples/s at 2,048 through the exported policy", best[2048], 50e6),
            target(f"samples/s at {big[-1]:,} through the exported policy", max(best[b] for b in big), 1e9),
        ],
    }


def snake_ppo(ctx: Context) -> dict:
    flags = ["--trainer.max_steps", "16" if ctx.quick else "100000", "--trainer.max_time", ctx.fit_time]
    if ctx.quick:
        flags += [*QUICK_CPU, "--model.init_args.compile", "false", "--data.init_args.num_envs", "64"]
        flags += ["--data.init_args.collect_steps", "8", "--data.init_args.minibatch_size", "128"]
    report = fit(ctx, "snake_ppo", ["configs/snake_ppo.yaml", "configs/bench/gpu_snake_ppo.yaml"], flags)
    rates_ = steady(report)
    return {
        "figures": {"frames_per_s": rates_["frames_per_s"], "updates_per_s": rates_["updates_per_s"], "report": report},
        "targets": [target("frames/s end to end", rates_["frames_per_s"], 1e6)],
    }


def dqn_update(ctx: Context) -> dict:
    """The Snake DQN update at the reference's setting, on the device: the bare eager loop against the agent's own
    update (loss, backward, fused Adam, soft target update) eager, compiled and compiled with CUDA graphs, in
    alternating slices so that every ratio compares neighbours in time."""
    import torch

    from app.cli import build
    from callbacks.bare_updates import bare_update, framework_free_update

    configs = [str(ROOT / p) for p in ("configs/snake_dqn.yaml", "configs/bench/dqn_reference_ratio.yaml")]
    # reduce-overhead (torch.compile's CUDA graphs) failed inside TorchRL's DQNLoss on the first GPU run (an output
    # of one replay read after the next); cudagraph is the model's own whole-update graph.
    modes = ["false", "cudagraph"] if ctx.quick else ["false", "true", "cudagraph"]
    device = torch.device(ctx.device)
    steps: dict[str, Callable] = {}
    errors: dict[str, str] = {}
    for mode in modes:
        try:
            model, data = build(configs, ["--model.init_args.compile", mode, "--data.init_args.device", ctx.device])
            model.to(device)
            data.device = device  # what setup resolves from the trainer
            if not steps:
                steps["bare"] = bare_update(model, data)
            update = captured_update(model, data) if mode == "cudagraph" else framework_free_update(model, data)
            steps[f"compile={mode}"] = update
            for i in range(30):  # compilation and CUDA-graph recording happen here, untimed
                update(i)
        except Exception as error:  # one mode failing leaves the others' figures
            errors[f"compile={mode}"] = f"{type(error).__name__}: {error}"
            steps.pop(f"compile={mode}", None)
    if "bare" not in steps:
        raise RuntimeError(f"no bare update: {errors}")
    for i in range(30):
        steps["bare"](i)
    seconds, rounds = (0.1, 2) if ctx.quick else (1.0, 5)
    times: dict[str, list[float]] = {name: [] for name in steps}
    ctx.sync()
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(1e3 * per_call(step, seconds, ctx))
    ms = {name: statistics.median(values) for name, values in times.items()}
    return {
        "figures": {
            "ms_per_update": ms,
            "ratio_to_bare": {name: value / ms["bare"] for name, value in ms.items() if name != "bare"},
            "slices_ms": times,
            "batch_size": int(data.batch_size),
            "errors": errors,
        },
        "targets": [],
    }


def captured_update(model: Any, data: Any) -> Callable[[int], Any]:
    """The model's own ``compile: cudagraph`` update (:meth:`modules.base.RLModule._captured_update` in tensordict's
    ``CudaGraphModule``, as ``on_fit_start`` builds it) plus its soft target update, on the bare loop's batches. On
    a CPU the graph module passes through: the compiled update, eagerly."""
    from tensordict.nn import CudaGraphModule

    from callbacks.bare_updates import as_replay_sample, batch_pool, make_optimizer
    from modules.optim import FusedAdamStep

    optimizer = make_optimizer(model.trainable_parameters(), model)
    model._optimizer_step = FusedAdamStep(optimizer, model.optim.max_grad_norm)
    _ = model.loss_module.in_keys
    model._compiled_loss = model.compiled_loss()
    graphed = CudaGraphModule(model._captured_update, warmup=3, in_keys=[], out_keys=[])
    batches = [as_replay_sample(batch) for batch in batch_pool(data, data.batch_size)]

    def step(i: int) -> Any:
        losses = graphed(batches[i % len(batches)])
        model.soft_update()
        return losses["loss"]

    return step


def sac(ctx: Context) -> dict:
    configs = ["configs/racing_sac.yaml", "configs/bench/gpu_racing_sac.yaml", "configs/bench/sac_scratch.yaml"]
    flags = ["--trainer.max_steps", "8" if ctx.quick else "20000", "--trainer.max_time", ctx.fit_time]
    if ctx.quick:
        flags += [*QUICK_CPU, "--model.init_args.compile", "false", "--data.init_args.num_envs", "4"]
        flags += ["--data.init_args.batch_size", "32", "--data.init_args.warmup_frames", "64"]
        flags += ["--data.init_args.frames_per_update", "4"]
    report = fit(ctx, "racing_sac", configs, flags)
    rates_ = steady(report)
    return {"figures": {k: rates_[k] for k in ("frames_per_s", "updates_per_s")} | {"report": report}, "targets": []}


def metta(ctx: Context) -> dict:
    """Agent steps/s of the ultra-fast config's whole rollouts through its data module's collector, in each worker
    kind, with the (untrained) recurrent policy on the device."""
    from metta_throughput import collection

    configs = tuple(str(ROOT / p) for p in ("configs/metta_ultra_fast.yaml", "configs/bench/gpu_metta.yaml"))
    workers = 2 if ctx.quick else 16
    flags = ["--data.init_args.device", ctx.device]
    if ctx.quick:
        flags += [*QUICK_CPU, "--data.init_args.num_envs", "4", "--data.init_args.collect_steps", "8"]
        flags += ["--data.init_args.bptt", "8", "--data.init_args.minibatch_size", "64"]
        flags += ["--model.init_args.compile", "false"]
    batches = 1 if ctx.quick else 3
    rows = {}
    for kind in ("env_workers", "collector_workers"):
        rate_ = collection(kind, workers, batches, configs, tuple(flags))
        rows[kind] = {"agent_steps_per_s": rate_}
    best = max(rows, key=lambda k: rows[k]["agent_steps_per_s"])
    return {
        "figures": {"workers": workers, "rollouts_timed": batches, "by_worker_kind": rows, "faster": best},
        "targets": [target(f"agent steps/s ({best}, {workers} workers)", rows[best]["agent_steps_per_s"], 500e3)],
    }


def mario(ctx: Context) -> dict:
    import envs.mario.nes_compat  # noqa: F401  (fails here, with the import error, when the emulator is missing)

    flags = ["--trainer.max_steps", "1" if ctx.quick else "100000", "--trainer.max_time", ctx.fit_time]
    if ctx.quick:
        flags += [*QUICK_CPU, "--model.init_args.compile", "false", "--data.init_args.collection.workers", "1"]
        flags += ["--data.init_args.num_envs", "2", "--data.init_args.batch_size", "8"]
        flags += ["--data.init_args.buffer_size", "512", "--data.init_args.warmup_frames", "64"]
        flags += ["--model.init_args.optimizer.accumulate_grad_batches", "1"]
    # One learner update under torch.profiler, before the report's steady state begins (its rates stay unprofiled):
    # which kernels and host work it is made of, beside the phases the report times. One, not four: on the H200
    # (2026-11-28) four made a 32-MB compressed trace whose operator table took minutes.
    from profile_window import ProfileWindow

    window = ProfileWindow(ctx.profiles / "mario_update", start=0 if ctx.quick else 60, updates=1)
    if not ctx.quick:  # the first updates compile; by the 100th the rate is steady (2026-11-26: ~1.8 updates/s)
        flags += ["--trainer.callbacks.init_args.skip_first_steps", "100"]
    report = fit(ctx, "mario", ["configs/mario_ddqn.yaml", "configs/bench/gpu_mario.yaml"], flags, [window])
    rates_ = steady(report)
    return {
        "figures": {
            "experiences_per_s": rates_["frames_per_s"],
            "updates_per_s": rates_["updates_per_s"],
            "profile": window.summary,
            "report": report,
        },
        "targets": [
            target("experiences/s (reference: 1,800)", rates_["frames_per_s"], 1800),
            target("updates/s (reference: 10 batches/s)", rates_["updates_per_s"], 10),
        ],
    }


#: name -> (item, cap in seconds on the GPU). Sized on fresh H200s, whose compile caches are cold (2026-11-28: the DQN
#: item took 74 s, SAC 75, PIRL's export more than 50; 2026-11-30: the Snake and the vehicle/racing items, two
#: compilations of each step, passed 75 s cold and took 35 and 43 s warm; SAC passed 90 s cold). Together about 18
#: minutes: two commands of under 10 minutes each (``--only``; docs/results/gpu.md, "GPU suite").
ITEMS: dict[str, tuple[Callable[[Context], dict], int]] = {
    "snake_env": (snake_env, 120),  # two compilations of the step beside the eager runs
    "pirl_export": (pirl_export, 80),
    "vehicle_racing_env": (vehicle_racing_env, 110),
    "snake_ppo": (snake_ppo, 200),  # compiles and captures its update first (11-30, fresh machine: 196 s in all)
    "dqn_update": (dqn_update, 90),
    "sac": (sac, 120),  # its fit runs to two thirds of the cap; the bare-update yardstick compiles after it
    "metta": (metta, 100),
    "mario": (mario, 240),  # 14 worker processes start one after the other; emulators drawn for the yardstick
}
# Seconds per item with --quick: each takes a few, but a loaded machine (a parallel test run) slows them many times.
QUICK_CAP = 240


# -------------------------------------------------------------------------------------------------------- helpers


class Context:
    """What an item runs with: the device, whether it is the quick run, a scratch folder, the fits' time, where
    profiles go."""

    def __init__(self, quick: bool, scratch: Path, cap: int, profiles: Path) -> None:
        import torch

        self.quick = quick
        self.profiles = profiles  # profiler traces and tables, beside the report
        self.cuda = torch.cuda.is_available() and not quick
        self.device = "cuda" if self.cuda else "cpu"
        self.scratch = scratch
        # A fit stops itself well inside the item's cap, leaving time for start-up and for what follows its last
        # update (the workers' shutdown, the report's bare-update yardstick): a third of the cap, at least 25 s.
        seconds = 20 if quick else max(15, cap - max(25, cap // 3))
        self.fit_time = f"00:00:{seconds // 60:02d}:{seconds % 60:02d}"

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def target(what: str, value: float, goal: float, above: bool = True) -> dict:
    return {"what": what, "value": value, "target": goal, "met": bool(value >= goal if above else value <= goal)}


def per_call(function: Callable, seconds: float, ctx: Context) -> float:
    """Seconds per call of ``function`` (given the call index) over about ``seconds``, device work included."""
    ctx.sync()
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < seconds:
        function(calls)
        calls += 1
    ctx.sync()
    return (time.perf_counter() - start) / calls


def rate(function: Callable[[], Any], batch: int, seconds: float, ctx: Context) -> float:
    """Samples per second of ``function`` on a batch of ``batch``: the best of 3 runs after a warm-up."""
    import torch

    with torch.inference_mode():
        for _ in range(3):
            function()
        return batch / min(per_call(lambda _: function(), seconds / 3, ctx) for _ in range(3))


def graphed(module: Callable, x: Any) -> Callable[[], Any]:
    """``module(x)`` recorded once as a CUDA graph and replayed: no launch cost per kernel (static input). Not
    tensordict's ``CudaGraphModule`` (which the update uses): it copies the input and synchronises before every
    replay, which at these batch sizes would time the synchronisation rather than the policy."""
    import torch

    with torch.inference_mode():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                module(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            module(x)
    return graph.replay


def fit(ctx: Context, name: str, configs: list[str], flags: list[str], callbacks: Sequence[Any] = ()) -> dict:
    """``python -m app fit`` of ``configs`` + the throughput preset (+ ``callbacks``) in this process; returns its
    throughput report."""
    from app.cli import main

    runs = ctx.scratch / "runs"
    args = ["fit", *(a for c in (*configs, "configs/bench/throughput.yaml") for a in ("--config", str(ROOT / c)))]
    args += ["--trainer.logger.init_args.save_dir", str(runs), "--trainer.logger.init_args.name", name]
    # Rates in metrics.csv every 50 updates: an item stopped at its cap still leaves them.
    args += ["--trainer.enable_progress_bar", "false", "--trainer.callbacks.init_args.log_every_n_steps", "50", *flags]
    if ctx.quick:  # the report's bare-update yardstick draws its own batches: seconds that check nothing new here
        args += ["--trainer.callbacks.init_args.bare_update_seconds", "0"]
    main(args, extra_callbacks=callbacks)
    reports = sorted((runs / name).glob("version_*/throughput.json"), key=lambda p: p.stat().st_mtime)
    if not reports:
        raise RuntimeError(f"the {name} fit wrote no throughput report under {runs / name}")
    return json.loads(reports[-1].read_text())


def steady(report: dict) -> dict:
    """The report's steady-state rates, or this process's where the fit was too short to have a steady state."""
    return report.get("steady_state") or report["this_process"]


class GpuSampler:
    """``nvidia-smi`` read four times a second in the background: utilisation (%) and memory in use (MiB)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.process = None
        if shutil.which("nvidia-smi"):
            query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
            self.process = subprocess.Popen([*query, "-lms", "250"], stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                utilisation, memory = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((utilisation, memory))

    def stop(self) -> dict | None:
        if self.process is None:
            return None
        self.process.terminate()
        self.process.wait()
        if not self.samples:
            return None
        utilisation = [u for u, _ in self.samples]
        return {
            "utilisation_mean_pct": statistics.mean(utilisation),
            "utilisation_max_pct": max(utilisation),
            "memory_used_max_mib": max(m for _, m in self.samples),
            "samples": len(self.samples),
        }


def run_item(name: str, quick: bool, out: Path, cap: int) -> None:
    """The child process: runs one item and writes ``<out>/items/<name>.json``."""
    import torch

    torch.set_num_threads(1 if quick else min(8, os.cpu_count() or 1))
    scratch = out / "scratch" / name
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = Context(quick, scratch, cap, profiles=out / "profiles")
    os.chdir(ROOT)  # the configs name files relative to the checkout
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    result = ITEMS[name][0](ctx)
    if ctx.cuda:
        result["torch_peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    result["device"] = torch.cuda.get_device_name() if ctx.cuda else platform.processor() or "cpu"
    path = out / "items" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")


def run_here(name: str, out: Path, cap: int, log: Path) -> int:
    """``--quick``: one item in this process, its output and any traceback in ``log``; 0 if it finished."""
    folder = Path.cwd()
    with log.open("w") as stream, contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
        try:
            run_item(name, True, out, cap)
            return 0
        except Exception:
            traceback.print_exc()
            return 1
        finally:
            os.chdir(folder)  # run_item works from the checkout


def run_suite(names: list[str], quick: bool, out: Path, caps: dict[str, int], isolate: bool = True) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    suite = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/gpu_suite.py", *sys.argv[1:]],
        "quick": quick,
        "machine": machine(),
        "items": {},
    }
    for name in names:
        cap = caps[name]
        print(f"[gpu_suite] {name} (cap {cap} s) ...", flush=True)
        (out / "items" / f"{name}.json").unlink(missing_ok=True)
        sampler, start = GpuSampler(), time.perf_counter()
        log = out / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        if not isolate:  # toy sizes take seconds: a process per item would spend more on its imports than on the item
            code = run_here(name, out, cap, log)
        else:
            command = [sys.executable, str(Path(__file__).resolve()), "--item", name, "--out", str(out)]
            command += [*(["--quick"] if quick else []), "--cap", f"{name}={cap}"]
            with log.open("w") as stream:
                try:
                    code = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, timeout=cap).returncode
                except subprocess.TimeoutExpired:
                    code = None
        entry: dict[str, Any] = {"seconds": round(time.perf_counter() - start, 1), "gpu": sampler.stop()}
        result_path = out / "items" / f"{name}.json"
        if code == 0 and result_path.exists():
            entry |= {"status": "ok", **json.loads(result_path.read_text())}
        else:
            entry["status"] = "timed out" if code is None else "failed"
            entry["error"] = [readable(line) for line in log.read_text(errors="replace").strip().splitlines()[-15:]]
        suite["items"][name] = entry
        print(f"[gpu_suite] {name}: {entry['status']} in {entry['seconds']} s", flush=True)
        (out / "gpu_suite.json").write_text(json.dumps(suite, indent=2, default=str) + "\n")
        (out / "gpu_suite.md").write_text(markdown(suite))
    return suite


def readable(line: str) -> str:
    """A traceback line with the checkout's and the interpreter's folders cut: the report names no machine's paths."""
    line = line.replace(f"{ROOT}/", "")
    return re.sub(r"/\S*?/(site-packages|dist-packages|python3\.\d+)/", r"\1/", line)


def machine() -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1)}
    return info


def markdown(suite: dict) -> str:
    m = suite["machine"]
    lines = [
        f"# GPU suite — {suite['date']}" + (" (quick: CPU, toy sizes; figures mean nothing)" if suite["quick"] else ""),
        "",
        f"Machine: {m.get('gpu', 'no GPU')}, {m['cpu_count']} CPU cores, Python {m['python']}, torch {m['torch']}.",
        f"Command: `{' '.join(suite['command'])}`",
        "",
        "| item | status | s | GPU util. mean / max % | GPU memory max MiB | torch peak GiB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, item in suite["items"].items():
        gpu = item.get("gpu") or {}
        util = f"{gpu['utilisation_mean_pct']:.0f} / {gpu['utilisation_max_pct']:.0f}" if gpu else "n/a"
        memory = f"{gpu['memory_used_max_mib']:,.0f}" if gpu else "n/a"
        peak = f"{item['torch_peak_memory_gib']:.2f}" if "torch_peak_memory_gib" in item else "n/a"
        lines.append(f"| {name} | {item['status']} | {item['seconds']} | {util} | {memory} | {peak} |")
    lines += ["", "## Targets", "", "| item | what | measured | target | met |", "|---|---|---:|---:|---|"]
    for name, item in suite["items"].items():
        for t in item.get("targets", []):
            lines.append(
                f"| {name} | {t['what']} | {t['value']:.4g} | {t['target']:.4g} | {'yes' if t['met'] else 'no'} |"
            )
    lines += ["", "## Figures", ""]
    for name, item in suite["items"].items():
        if item["status"] == "ok":
            figures = {k: v for k, v in item["figures"].items() if k != "report"}
            lines += [f"### {name}", "", "```", json.dumps(figures, indent=1, default=str), "```", ""]
        else:
            lines += [f"### {name}: {item['status']}", "", "```", *item["error"], "```", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_suite.json, gpu_suite.md and logs")
    parser.add_argument("--quick", action="store_true", help="every item on the CPU at toy size (checks the code)")
    parser.add_argument("--only", nargs="+", choices=sorted(ITEMS), help="these items only, in the suite's order")
    parser.add_argument(
        "--cap", nargs="+", default=[], metavar="ITEM=SECONDS", help="another wall-clock cap for these items"
    )
    parser.add_argument(
        "--isolate", action="store_true", help="with --quick: each item in its own process, as on the GPU"
    )
    parser.add_argument("--item", choices=sorted(ITEMS), help=argparse.SUPPRESS)  # the child process's one item
    args = parser.parse_args(argv)
    out = args.out.resolve()
    caps = {name: QUICK_CAP if args.quick else cap for name, (_, cap) in ITEMS.items()}
    for given in args.cap:
        name, _, seconds = given.partition("=")
        if name not in ITEMS or not seconds.isdigit() or int(seconds) < 1:
            parser.error(f"--cap {given}: expected ITEM=SECONDS with ITEM one of {', '.join(ITEMS)}")
        caps[name] = int(seconds)
    if args.item:
        # An item about to be killed at its cap first prints every thread's stack into its log: where the time went.
        faulthandler.dump_traceback_later(max(1, caps[args.item] - 5))
        try:
            run_item(args.item, args.quick, out, caps[args.item])
        except Exception:
            traceback.print_exc()
            raise SystemExit(1) from None
        return None
    import torch

    if not args.quick and not torch.cuda.is_available():
        parser.error("no CUDA device on this machine: run with --quick to check the suite on the CPU")
    names = [name for name in ITEMS if not args.only or name in args.only]
    suite = run_suite(names, args.quick, out, caps, isolate=args.isolate or not args.quick)
    failed = [name for name, item in suite["items"].items() if item["status"] != "ok"]
    print(f"[gpu_suite] {len(names) - len(failed)} of {len(names)} items ok -> {out / 'gpu_suite.md'}")
    return suite


if __name__ == "__main__":
    main()

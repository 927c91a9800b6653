"""Environment speed alone: random actions through TorchRL's ``step_and_maybe_reset`` (what collectors call).

    python benchmarks/env_speed.py --env snake --num-envs 4096 --steps 2000 --threads 1
    python benchmarks/env_speed.py --env snake --num-envs 4096 --steps 2000 --threads 1 --backend torch
    python benchmarks/env_speed.py --env snake --num-envs 65536 --device cuda --json runs/bench/snake_env_gpu.json
    python benchmarks/env_speed.py --env vehicle --num-envs 4096 --steps 1000 --threads 1
    python benchmarks/env_speed.py --env racing --num-envs 4096 --steps 1000 --threads 1
    python benchmarks/env_speed.py --env snake --num-envs 4096 --steps 300 --threads 1 --backend torch --count-ops 10
    python benchmarks/env_speed.py --env snake --num-envs 4096 --steps 300 --threads 1 --compile-step --count-ops 10

Reports env steps per second (boards × steps / seconds) for two paths: ``torchrl`` (``env.step_and_maybe_reset``,
auto-reset included) and ``core`` (the environment's own ``_step`` + ``maybe_reset``, without TorchRL's per-step
spec checks and bookkeeping). Actions are drawn before timing, so the figure is the environment's alone.

``--count-ops N`` also runs ``N`` steps of the ``torchrl`` path under ``torch.profiler`` and reports per step the
ATen operations it ran and the host reads among them (``aten::_local_scalar_dense``: a tensor's value read by Python,
a ``bool(mask.any())`` or an ``.item()``; on a GPU, a synchronisation each). ``--compile-step`` builds the environment
with its ``compile_step`` option: its step and reset arithmetic compiled into one graph each, with no host read.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import Categorical

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.racing.env import RacingEnv  # noqa: E402
from envs.safety.toy import ToyEnv  # noqa: E402
from envs.safety.vehicle import VehicleEnv  # noqa: E402
from envs.snake.env import SnakeEnv  # noqa: E402

ENVS = {"snake": SnakeEnv, "vehicle": VehicleEnv, "toy": ToyEnv, "racing": RacingEnv}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loop(step, actions: torch.Tensor, device: torch.device, repeats: int) -> float:
    """Best of ``repeats`` timings of one pass over ``actions`` (the least disturbed by other work)."""
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for action in actions:
            step(action)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def count_operations(step, actions: torch.Tensor) -> dict[str, float]:
    """ATen operations, host reads and compiled graphs per step over ``actions``, counted by ``torch.profiler``
    (every ``aten::`` event, nested ones included: what the dispatcher runs, each a kernel launch or more on a GPU; a
    compiled graph's generated kernels are not ATen operations, so a compiled step's work shows as its graph calls)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for action in actions:
            step(action)
    names = [event.name for event in profiler.events()]
    steps = len(actions)
    return {
        "aten_ops": sum(name.startswith("aten::") for name in names) / steps,
        "host_reads": names.count("aten::_local_scalar_dense") / steps,
        "compiled_graphs": sum(name.startswith("## Call CompiledFxGraph") for name in names) / steps,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=sorted(ENVS), default="snake")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=1000, help="steps per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; the best is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", choices=["auto", "torch", "cpp"], default="auto", help="SnakeEnv backend")
    parser.add_argument("--count-ops", type=int, default=0, help="profile this many steps: ATen ops and host reads")
    parser.add_argument("--compile-step", action="store_true", help="the environment's compile_step option")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if not 0 <= args.count_ops <= args.steps:
        parser.error(f"--count-ops must be between 0 and --steps ({args.steps}), got {args.count_ops}")
    if args.num_envs < 1 or args.steps < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--num-envs, --steps, --repeats and --threads must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device on this machine")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    options = {"backend": args.backend} if args.env == "snake" else {}
    if args.compile_step:
        if "compile_step" not in inspect.signature(ENVS[args.env].__init__).parameters:
            parser.error(f"--compile-step: the {args.env} environment has no compile_step option")
        options["compile_step"] = True
    env = ENVS[args.env](num_envs=args.num_envs, device=device, **options)
    spec = env.action_spec
    if isinstance(spec, Categorical):
        actions = torch.randint(0, spec.space.n, (args.steps, args.num_envs), device=device)
    else:  # a box: uniform inside it
        low, high = spec.space.low, spec.space.high
        actions = low + (high - low) * torch.rand(args.steps, *low.shape, device=device)
    td = env.reset()

    def torchrl_step(action: torch.Tensor) -> None:
        nonlocal td
        td["action"] = action
        _, td = env.step_and_maybe_reset(td)

    def core_step(action: torch.Tensor) -> None:
        nonlocal td
        out = env._step(TensorDict({"action": action}, batch_size=env.batch_size))
        td = env.maybe_reset(out)

    results = {}
    for name, step in (("torchrl", torchrl_step), ("core", core_step)):
        time_loop(step, actions[: min(50, args.steps)], device, 1)  # warm-up
        seconds = time_loop(step, actions, device, args.repeats)
        results[name] = {"seconds": seconds, "steps_per_s": args.num_envs * args.steps / seconds}
    operations = count_operations(torchrl_step, actions[: args.count_ops]) if args.count_ops else None
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "env": args.env,
        "num_envs": args.num_envs,
        "steps": args.steps,
        "threads": args.threads,
        "backend": args.backend if args.env == "snake" else None,
        "compile_step": args.compile_step,
        "per_step": operations,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "results": results,
    }
    for name, result in results.items():
        print(
            f"{args.env} {name:8s} {args.num_envs} envs, {args.threads} thread(s), {args.device}"
            f"{', backend ' + args.backend if args.env == 'snake' and not args.compile_step else ''}"
            f"{', compiled step' if args.compile_step else ''}: "
            f"{result['steps_per_s'] / 1e6:.2f}M steps/s ({result['seconds'] / args.steps * 1e3:.3f} ms per step)"
        )
    if operations:
        print(
            f"{args.env} torchrl per step ({args.count_ops} profiled): {operations['aten_ops']:.1f} ATen operations, "
            f"{operations['host_reads']:.1f} host reads, {operations['compiled_graphs']:.1f} compiled graphs"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()

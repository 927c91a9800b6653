"""One PIRL training step, timed part by part on the 3,481-parameter vehicle network (the reference's "gradient
computation 1.455 ms; forward 0.096 ms").

    python benchmarks/pirl_step.py --threads 1
    python benchmarks/pirl_step.py --threads 1 --gradient func --json runs/bench/pirl_step.json

A replay batch of real vehicle transitions (random actions) is collected first; then, each the best of
``--repeats`` passes of ``--iterations`` calls:

- ``forward``: Q-values of the batch (256 × 16 → 25);
- ``dqn_loss_backward``: TorchRL's ``DQNLoss`` on the batch, backward;
- ``pirl_loss_backward``: the whole PIRL loss — DQN + PDE residual at 32 collocation points (∇ₓV with its graph)
  + boundary terms at 32 + 32 points — and its backward: the reference's "gradient computation";
- ``pirl_update``: the same plus the fused Adam step and the zeroing of gradients: one full update, minus Lightning.

The Lightning loop around the update (hooks, logging, target sync) is measured by ``fit`` with the throughput
callback instead (``configs/bench/throughput.yaml``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.safety.vehicle import VehicleEnv  # noqa: E402
from modules.pirl import PhysicsInformedDQN, PhysicsLossOptions  # noqa: E402


def replay_batch(env: VehicleEnv, size: int) -> TensorDict:
    """``size`` transitions of random driving, shaped like a replay sample."""
    td = env.reset()
    rows = []
    while sum(row.numel() for row in rows) < size:
        td["action"] = torch.randint(25, env.batch_size)
        out, td = env.step_and_maybe_reset(td)
        rows.append(out.clone())
    return torch.cat(rows)[:size]


def best_time(function, iterations: int, repeats: int) -> float:
    """Best of ``repeats`` mean times per call of ``function`` over ``iterations`` calls (seconds)."""
    for _ in range(max(iterations // 10, 5)):
        function()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            function()
        best = min(best, (time.perf_counter() - start) / iterations)
    return best


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=256, help="DQN batch (the reference: 256)")
    parser.add_argument("--collocation-points", type=int, default=32, help="interior points (the reference: 32)")
    parser.add_argument("--gradient", choices=["autograd", "func"], default="autograd", help="how ∇ₓV is taken")
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if min(args.batch_size, args.collocation_points, args.iterations, args.repeats, args.threads) < 1:
        parser.error("--batch-size, --collocation-points, --iterations, --repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    env = VehicleEnv(num_envs=64, seed=0)
    model = PhysicsInformedDQN(
        env.observation_spec[0],
        env.action_spec[0],
        physics_loss=PhysicsLossOptions(collocation_points=args.collocation_points, gradient=args.gradient),
    )
    model.physics = env.physics
    batch = replay_batch(env, args.batch_size)
    optimizer = torch.optim.Adam(model.loss_module.parameters(), lr=5e-4, fused=True)
    observation = batch["observation"]

    def forward() -> None:
        with torch.no_grad():
            model.q_network(observation)

    def dqn_loss_backward() -> None:
        model.loss_module(batch)["loss"].backward()

    def pirl_loss_backward() -> None:
        sum(value for key, value in model.loss(batch).items() if key.startswith("loss")).backward()

    def pirl_update() -> None:
        pirl_loss_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    results = {}
    for name, function in (
        ("forward", forward),
        ("dqn_loss_backward", dqn_loss_backward),
        ("pirl_loss_backward", pirl_loss_backward),
        ("pirl_update", pirl_update),
    ):
        seconds = best_time(function, args.iterations, args.repeats)
        optimizer.zero_grad(set_to_none=True)
        results[name] = {"ms": seconds * 1e3}
        print(f"{name:20s} {seconds * 1e3:8.3f} ms")
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "batch_size": args.batch_size,
        "collocation_points": args.collocation_points,
        "gradient": args.gradient,
        "threads": args.threads,
        "machine": f"{platform.platform()}, {torch.get_num_threads()} torch threads, {platform.processor() or 'cpu'}",
        "torch": torch.__version__,
        "seed_ms": {"gradient_computation": 1.455, "forward": 0.096},
        "results": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()

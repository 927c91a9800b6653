"""Racing on circuits a policy never trained on (issue 31): a report per circuit for the expert and trained policies.

    python benchmarks/racing_generalisation.py --config configs/racing_bc_circuits.yaml
    python benchmarks/racing_generalisation.py --checkpoints runs/racing_bc_circuits/version_0/checkpoints/last.ckpt \\
        --json runs/bench/generalisation.json --markdown runs/bench/generalisation.md \\
        --picture docs/results/reports/racing_lines.png

The circuits: the held-out set of the training distribution (``tracks: {split: held_out}`` of the config's or the
checkpoint's environment, a seed stream training never draws), each driven both ways, and the reference circuit
both ways. ``--starts`` cars per circuit and direction, each one episode of ``--seconds`` from its own start.

Per circuit and policy: the first lap's time (s, mean over the cars that completed it), the share of cars that
completed their first lap, the laps completed per episode, and the share of driven steps spent off the track
(|lateral error| > half the width). ``--picture`` draws the lines driven by the expert and each checkpoint's policy
from the same start on the first held-out circuit. Each checkpoint's model is built from its run's ``config.yaml``
and drives its deterministic action.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.racing_expert import checkpoint_policy  # noqa: E402
from envs.racing.env import RacingEnv, drive_episodes  # noqa: E402
from envs.racing.expert import TimeOptimalExpert  # noqa: E402
from envs.racing.track import DEFAULT_CIRCUIT  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def layouts(options: dict[str, Any], starts: int, seconds: float) -> dict[str, RacingEnv]:
    """The evaluation's environments, by name, from an environment's ``options`` (its observation, car and reward):
    the held-out circuits both ways (``starts`` cars each) and the reference circuit both ways."""
    options = {**options, "max_steps": int(round(seconds / options.get("dt", 0.02)))}
    tracks = dict(options.pop("tracks", None) or {})
    options.pop("control_points", None)
    held_out = {**tracks, "split": "held_out", "per": "env", "directions": "both"}
    held_out.pop("pool", None)
    count = 2 * held_out.get("held_out", 8)
    envs = {"held_out": RacingEnv(num_envs=count * starts, seed=0, tracks=held_out, **options)}
    for name, points in (("reference", DEFAULT_CIRCUIT), ("reference reversed", DEFAULT_CIRCUIT[::-1])):
        envs[name] = RacingEnv(num_envs=starts, seed=0, control_points=points, **options)
    return envs


def circuit_rows(name: str, env: RacingEnv, result: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """One row per circuit of ``env``: its cars' first laps, laps and time off the track."""
    rows = []
    for circuit in range(len(env.circuits)):
        cars = env.circuit == circuit
        completed = result["lap_time"][cars] > 0
        label = name if len(env.circuits) == 1 else f"held-out {circuit // 2}" + (" reversed" if circuit % 2 else "")
        rows.append(
            {
                "circuit": label,
                "length_m": env.circuits.tracks[circuit].length,
                "first_lap_time_s": result["lap_time"][cars][completed].mean().item() if completed.any() else None,
                "first_lap_completed": completed.float().mean().item(),
                "laps_mean": result["laps"][cars].mean().item(),
                "off_track_share": (result["off_track"][cars].sum() / result["steps"][cars].sum()).item(),
            }
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the held-out circuits only: the share of first laps completed, the mean first-lap time, time off."""
    held = [row for row in rows if row["circuit"].startswith("held-out")]
    times = [row["first_lap_time_s"] for row in held if row["first_lap_time_s"] is not None]
    return {
        "held_out_first_lap_completed": sum(row["first_lap_completed"] for row in held) / len(held),
        "held_out_first_lap_time_s": sum(times) / len(times) if times else None,
        "held_out_off_track_share": sum(row["off_track_share"] for row in held) / len(held),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Racing generalisation ({report['date']}, {report['starts']} starts per circuit, {report['seconds']} s)",
        "",
    ]
    for policy, entry in report["policies"].items():
        lines += [
            f"### {policy}",
            "",
            "| circuit | length (m) | first lap (s) | first laps completed | laps | off track |",
        ]
        lines.append("|---|---:|---:|---:|---:|---:|")
        for row in entry["circuits"]:
            time_s = "—" if row["first_lap_time_s"] is None else f"{row['first_lap_time_s']:.2f}"
            lines.append(
                f"| {row['circuit']} | {row['length_m']:.0f} | {time_s} | {100 * row['first_lap_completed']:.0f} % | "
                f"{row['laps_mean']:.2f} | {100 * row['off_track_share']:.1f} % |"
            )
        s = entry["summary"]
        time_s = "—" if s["held_out_first_lap_time_s"] is None else f"{s['held_out_first_lap_time_s']:.2f} s"
        lines += [
            "",
            f"Held-out circuits: {100 * s['held_out_first_lap_completed']:.0f} % of first laps completed, mean first "
            f"lap {time_s}, {100 * s['held_out_off_track_share']:.1f} % of the time off the track.",
            "",
        ]
    return "\n".join(lines)


def picture(path: Path, env: RacingEnv, traces: dict[str, torch.Tensor]) -> None:
    """The first held-out circuit (its edges) and each policy's line from the same start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    track = env.circuits.tracks[0]
    centre, heading = track.xy.double(), track.heading.double()
    normal = torch.stack((-torch.sin(heading), torch.cos(heading)), 1)
    figure, axes = plt.subplots(figsize=(8, 8))
    for side in (1, -1):
        edge = centre + side * env.width / 2 * normal
        axes.plot(edge[:, 0], edge[:, 1], color="0.3", linewidth=0.8)
    for (name, xy), colour in zip(traces.items(), ("tab:blue", "tab:red", "tab:green", "tab:orange"), strict=False):
        axes.plot(xy[:, 0], xy[:, 1], color=colour, linewidth=1.0, label=name)
    axes.plot(*traces[next(iter(traces))][0].tolist(), "ko", label="start")
    axes.set_aspect("equal")
    axes.set_title("Held-out circuit 0: lines driven from the same start")
    axes.legend(loc="best", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def evaluate(name: str, options: dict[str, Any], policy_for, args: argparse.Namespace) -> tuple[dict, torch.Tensor]:
    """Drive one policy (``policy_for(env)``) on every layout; its rows, summary and the first held-out car's line."""
    rows, line = [], None
    for layout, env in layouts(options, args.starts, args.seconds).items():
        with torch.no_grad():  # a trained policy's actions would otherwise carry autograd graphs into the traces
            result = drive_episodes(env, policy_for(env), trace=layout == "held_out")
        rows += circuit_rows(layout, env, result)
        if layout == "held_out":
            first = int((env.circuit == 0).nonzero()[0])
            ended = int(result["steps"][first])
            line = result["xy"][:ended, first]
    entry = {"circuits": rows, "summary": summary(rows)}
    s = entry["summary"]
    lap = s["held_out_first_lap_time_s"]
    print(
        f"{name}: held-out first laps completed {100 * s['held_out_first_lap_completed']:.0f} %, mean first lap "
        f"{'—' if lap is None else f'{lap:.2f} s'}, off track {100 * s['held_out_off_track_share']:.1f} %"
    )
    return entry, line


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config",
        type=Path,
        default=ROOT / "configs" / "racing_bc_circuits.yaml",
        help="a racing config whose environment (circuit distribution) the expert is evaluated on, "
        "when no checkpoint gives one",
    )
    parser.add_argument("--checkpoints", nargs="*", type=Path, default=[], help="BC or SAC checkpoints to drive")
    parser.add_argument("--starts", type=int, default=2, help="cars per circuit and direction")
    parser.add_argument("--seconds", type=float, default=60.0, help="episode length (s)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--picture", type=Path)
    args = parser.parse_args(argv)
    if args.starts < 1 or args.threads < 1 or not args.seconds > 0:
        parser.error("--starts and --threads must be >= 1 and --seconds > 0")
    for checkpoint in args.checkpoints:
        if not checkpoint.is_file():
            parser.error(f"--checkpoints {checkpoint}: no such file")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    policies: dict[str, Any] = {}
    checkpoints = []
    for checkpoint in args.checkpoints:
        env, policy = checkpoint_policy(checkpoint, 1, 0)
        checkpoints.append((str(checkpoint), env.init_kwargs(), policy))
    if checkpoints:
        expert_options = checkpoints[0][1]
    else:
        config = yaml.safe_load(args.config.read_text())
        expert_options = config["data"]["init_args"]["env"].get("init_args", {})
    traces = {}
    policies["expert"], traces["expert"] = evaluate("expert", expert_options, TimeOptimalExpert, args)
    for name, options, policy in checkpoints:
        policies[name], traces[Path(name).parents[2].name + "/" + Path(name).name] = evaluate(
            name, options, lambda env, policy=policy: policy, args
        )
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/racing_generalisation.py", *(argv if argv is not None else sys.argv[1:])],
        "machine": {"platform": platform.platform(), "threads": args.threads},
        "starts": args.starts,
        "seconds": args.seconds,
        "wall_s": time.perf_counter() - start,
        "policies": policies,
    }
    for path, text in ((args.json, json.dumps(report, indent=2, default=_plain)), (args.markdown, None)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text if text is not None else markdown(report))
    if args.picture is not None:
        picture(args.picture, layouts(expert_options, 1, args.seconds)["held_out"], traces)
    return report


def _plain(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else str(value)


if __name__ == "__main__":
    main()

"""Racing on circuits a policy never trained on: a report per circuit for the expert and trained policies.

    python benchmarks/racing_generalisation.py --config configs/racing_bc_circuits.yaml
    python benchmarks/racing_generalisation.py --checkpoints runs/racing_bc_circuits/version_0/checkpoints/last.ckpt \\
        --json runs/bench/generalisation.json --markdown runs/bench/generalisation.md \\
        --picture docs/results/reports/racing_lines.png
    python benchmarks/racing_generalisation.py --seeds-folder runs/racing_sac_circuits_seeds   # each seed's clone
        # and the SAC run from it, after `lightrl seeds --config configs/racing_sac_circuits.yaml --seeds 3`

The circuits, in three sets, each driven both ways: ``held_out``, the held-out split of the training distribution
(``tracks: {split: held_out}`` of the config's or the checkpoint's environment, a seed stream training never
draws); ``stress``, the hand-drawn circuits of ``envs/racing/stress_circuits.py`` (hairpins, chicanes, a tightening
bend, esses: what the generator rarely makes); and ``reference``, the reference circuit. ``--starts`` cars per
circuit and direction, each one episode of ``--seconds`` from its own start.

Per circuit and policy: the first lap's time (s, mean over the cars that completed it), the share of cars that
completed their first lap, the laps completed per episode, and the share of driven steps spent off the track
(|lateral error| > half the width); per set, the same over its circuits. ``--pairs`` reads the checkpoints two by
two as (baseline, candidate) of one seed (the clone, then the SAC run started from it) and judges each candidate
against its baseline (``--seeds-folder``: the pairs of a ``seeds`` command's runs, each seed's BC stage
``last.ckpt`` and its SAC run's ``--sac-checkpoint``, found as the runs found them; run it from the same folder): on
every circuit where the baseline completes at least ``--completion`` of its first laps, does the candidate too, and
how much faster is its mean first lap (over the circuits where both completed one)? Then the mean and a 95 %
interval of that speed-up over the pairs. ``--ceiling`` also drives the expert's steering with the throttle floored
(``FlooredThrottle``) and judges it against the expert: on a car with a speed limiter, which then does all the
braking, the fastest lap the limiter allows on the expert's line. ``--picture`` draws the lines driven by the expert
and each checkpoint's policy from the same start on the first held-out circuit. Each checkpoint's model is built
from its run's ``config.yaml`` and drives its deterministic action.
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
from datamodules.evaluation import episode_statistics  # noqa: E402
from envs.racing.env import RacingEnv, drive_episodes  # noqa: E402
from envs.racing.expert import FlooredThrottle, TimeOptimalExpert  # noqa: E402
from envs.racing.stress_circuits import STRESS_CIRCUITS  # noqa: E402
from envs.racing.track import DEFAULT_CIRCUIT  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETS = ("held_out", "stress", "reference")


def layouts(options: dict[str, Any], starts: int, seconds: float) -> dict[str, RacingEnv]:
    """The evaluation's environments, by name, from an environment's ``options`` (its observation, car and reward):
    the held-out circuits both ways (``starts`` cars each), each stress circuit both ways and the reference circuit
    both ways."""
    options = {**options, "max_steps": int(round(seconds / options.get("dt", 0.02)))}
    tracks = dict(options.pop("tracks", None) or {})
    options.pop("control_points", None)
    held_out = {**tracks, "split": "held_out", "per": "env", "directions": "both"}
    held_out.pop("pool", None)
    count = 2 * held_out.get("held_out", 8)
    envs = {"held_out": RacingEnv(num_envs=count * starts, seed=0, tracks=held_out, **options)}
    stress = {"split": "stress", "per": "env", "directions": "both"}
    envs["stress"] = RacingEnv(num_envs=2 * len(STRESS_CIRCUITS) * starts, seed=0, tracks=stress, **options)
    for name, points in (("reference", DEFAULT_CIRCUIT), ("reference reversed", DEFAULT_CIRCUIT[::-1])):
        envs[name] = RacingEnv(num_envs=starts, seed=0, control_points=points, **options)
    return envs


def set_of(circuit: str) -> str:
    """Which set a row's circuit belongs to: ``held_out``, ``stress`` or ``reference``."""
    return "held_out" if circuit.startswith("held-out") else circuit.split()[0]


def circuit_rows(name: str, env: RacingEnv, result: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """One row per circuit of ``env``: its cars' first laps, laps and time off the track."""
    rows = []
    for circuit in range(len(env.circuits)):
        cars = env.circuit == circuit
        completed = result["lap_time"][cars] > 0
        label = name
        if name in SETS[:2]:  # circuits both ways, each then its reverse
            base = f"held-out {circuit // 2}" if name == "held_out" else f"stress {list(STRESS_CIRCUITS)[circuit // 2]}"
            label = base + (" reversed" if circuit % 2 else "")
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


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per set of circuits (held-out, stress): the share of first laps completed, the mean first-lap time over the
    circuits where a car completed one, and the share of the time off the track."""
    sets = {}
    for name in SETS[:2]:
        chosen = [row for row in rows if set_of(row["circuit"]) == name]
        times = [row["first_lap_time_s"] for row in chosen if row["first_lap_time_s"] is not None]
        sets[name] = {
            "first_lap_completed": sum(row["first_lap_completed"] for row in chosen) / len(chosen),
            "first_lap_time_s": sum(times) / len(times) if times else None,
            "off_track_share": sum(row["off_track_share"] for row in chosen) / len(chosen),
        }
    return sets


def judge(baseline: list[dict[str, Any]], candidate: list[dict[str, Any]], completion: float) -> dict[str, Any]:
    """The candidate's circuits against the baseline's (the same circuits, in the same order): where the baseline
    completes at least ``completion`` of its first laps, those the candidate does not (``missed``), and the
    candidate's mean first-lap time over the baseline's on the circuits of each set where both completed one."""
    missed, ratios = [], {name: [] for name in SETS[:2]}
    for base, cand in zip(baseline, candidate, strict=True):
        if set_of(base["circuit"]) not in ratios:
            continue
        if base["first_lap_completed"] >= completion and cand["first_lap_completed"] < completion:
            missed.append(base["circuit"])
        if base["first_lap_time_s"] is not None and cand["first_lap_time_s"] is not None:
            ratios[set_of(base["circuit"])].append(cand["first_lap_time_s"] / base["first_lap_time_s"])
    faster = {name: 1 - sum(r) / len(r) if r else None for name, r in ratios.items()}
    return {"missed": missed, "faster": faster, "passes": not missed}


def set_line(name: str, s: dict[str, Any]) -> str:
    time_s = "—" if s["first_lap_time_s"] is None else f"{s['first_lap_time_s']:.2f} s"
    return (
        f"{name}: {100 * s['first_lap_completed']:.0f} % of first laps completed, mean first lap {time_s}, "
        f"{100 * s['off_track_share']:.1f} % of the time off the track"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Racing generalisation ({report['date']}, {report['starts']} starts per circuit, {report['seconds']} s)",
        "",
        f"Command: `{' '.join(report['command'])}`",
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
        lines.append("")
        lines += [f"- {set_line(name.replace('_', '-') + ' circuits', s)}." for name, s in entry["summary"].items()]
        lines.append("")
    if report.get("pairs"):
        pairs = report["pairs"]
        lines += [
            f"### Pairs: each candidate against its baseline (first laps ≥ {100 * pairs['completion']:.0f} %)",
            "",
            "| baseline | candidate | circuits missed | faster, held-out | faster, stress |",
            "|---|---|---|---:|---:|",
        ]
        for pair in pairs["pairs"]:
            faster = {k: "—" if v is None else f"{100 * v:+.1f} %" for k, v in pair["faster"].items()}
            missed = ", ".join(pair["missed"]) or "none"
            lines.append(
                f"| {pair['baseline']} | {pair['candidate']} | {missed} | {faster['held_out']} | {faster['stress']} |"
            )
        lines.append("")
        for name, stats in pairs["faster"].items():
            if stats is not None:
                lines.append(
                    f"- Faster on the {name.replace('_', '-')} circuits, over {len(pairs['pairs'])} pairs: mean "
                    f"{100 * stats['faster_mean']:+.1f} % (95 % interval {100 * stats['faster_ci_low']:+.1f} to "
                    f"{100 * stats['faster_ci_high']:+.1f} %)."
                )
        lines.append(f"- Every candidate keeps every circuit its baseline completes: {pairs['passes']}.")
        lines.append("")
    if report.get("ceiling"):
        (pair,) = report["ceiling"]["pairs"]
        faster = {k: "—" if v is None else f"{100 * v:+.1f} %" for k, v in pair["faster"].items()}
        lines += [
            "### Ceiling: the expert's steering with the throttle floored, against the expert",
            "",
            f"Faster: held-out {faster['held_out']}, stress {faster['stress']}; circuits the expert drives that it "
            f"misses: {', '.join(pair['missed']) or 'none'}. "
            + (
                "The car has a speed limiter: this is the fastest lap it allows on the expert's line."
                if report["ceiling"]["speed_limiter"]
                else "The car has no speed limiter: this is what arriving at corners unbraked costs."
            ),
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
    print(f"{name}: " + "; ".join(set_line(set_name, s) for set_name, s in entry["summary"].items()), flush=True)
    return entry, line


def seed_pairs(folder: Path, checkpoint: str) -> list[Path]:
    """(BC stage ``last.ckpt``, SAC ``checkpoint``) of each seed's run in a ``seeds`` command's ``folder``: the stage
    the run started its actor from (``model.init_args.actor_init`` of its ``config.yaml``, at its seed)."""
    from app.stages import stage_folder

    pairs = []
    for run in sorted(folder.glob("seed_*/version_*")):
        config = yaml.safe_load((run / "config.yaml").read_text())
        bc_config = config["model"]["init_args"].get("actor_init")
        if not bc_config or Path(bc_config).suffix not in (".yaml", ".yml"):
            raise ValueError(f"{run}: its SAC run did not start from a BC stage config (model.init_args.actor_init)")
        stage = stage_folder(Path(bc_config), "--seeds-folder", seed=int(config["seed_everything"]))
        pairs += [stage / "checkpoints" / "last.ckpt", run / "checkpoints" / checkpoint]
    if not pairs:
        raise ValueError(f"no seed_*/version_* runs in {folder}")
    return pairs


def judge_pairs(policies: dict[str, Any], names: list[str], completion: float) -> dict[str, Any]:
    """:func:`judge` for each (baseline, candidate) pair of ``names``, and the speed-up's statistics over pairs."""
    pairs = []
    for baseline, candidate in zip(names[::2], names[1::2], strict=True):
        verdict = judge(policies[baseline]["circuits"], policies[candidate]["circuits"], completion)
        pairs.append({"baseline": baseline, "candidate": candidate, **verdict})
    faster = {}
    for name in SETS[:2]:
        values = [pair["faster"][name] for pair in pairs if pair["faster"][name] is not None]
        faster[name] = episode_statistics(torch.tensor(values), prefix="faster") if values else None
    return {"completion": completion, "pairs": pairs, "faster": faster, "passes": all(p["passes"] for p in pairs)}


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
    parser.add_argument(
        "--pairs",
        action="store_true",
        help="read --checkpoints two by two as (baseline, candidate) and judge each candidate against its baseline",
    )
    parser.add_argument(
        "--seeds-folder", type=Path, help="with it, --pairs of every seed of a `seeds` command's folder (see above)"
    )
    parser.add_argument("--sac-checkpoint", default="best.ckpt", help="with --seeds-folder: the SAC run's checkpoint")
    parser.add_argument(
        "--completion", type=float, default=0.95, help="with --pairs: the share of first laps that counts as driven"
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also drive the expert's steering with the throttle floored and judge it against the expert: with a "
        "speed limiter in the car, the fastest lap the limiter allows on the expert's line",
    )
    parser.add_argument("--starts", type=int, default=16, help="cars per circuit and direction")
    parser.add_argument("--seconds", type=float, default=60.0, help="episode length (s)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--picture", type=Path)
    args = parser.parse_args(argv)
    if args.starts < 1 or args.threads < 1 or not args.seconds > 0:
        parser.error("--starts and --threads must be >= 1 and --seconds > 0")
    if args.seeds_folder is not None:
        try:
            args.checkpoints, args.pairs = seed_pairs(args.seeds_folder, args.sac_checkpoint), True
        except (OSError, ValueError, KeyError) as error:
            parser.error(f"--seeds-folder {args.seeds_folder}: {error}")
    if args.pairs and (len(args.checkpoints) < 2 or len(args.checkpoints) % 2):
        count = len(args.checkpoints)
        parser.error(f"--pairs needs an even number of --checkpoints (baseline, candidate, …), got {count}")
    if not 0 < args.completion <= 1:
        parser.error(f"--completion must be in (0, 1], got {args.completion}")
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
    if args.ceiling:
        policies["floored"], _ = evaluate("floored", expert_options, FlooredThrottle, args)
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
        "pairs": judge_pairs(policies, [name for name, _, _ in checkpoints], args.completion) if args.pairs else None,
        "ceiling": {
            **judge_pairs(policies, ["expert", "floored"], args.completion),
            "speed_limiter": expert_options.get("speed_limiter"),
        }
        if args.ceiling
        else None,
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

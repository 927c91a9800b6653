"""SAC from the behaviour-cloning actor against SAC from scratch, at equal frames, on one plot.

    python -m app fit --config configs/racing_sac.yaml                                        # from BC
    python -m app fit --config configs/racing_sac.yaml --config configs/bench/sac_scratch.yaml   # from scratch
    python benchmarks/racing_curves.py --runs runs/racing_sac/version_0 runs/racing_sac_scratch/version_0 \
        --out docs/results/reports/racing_sac_learning_curves.png

Reads each run's ``metrics.csv`` (the ``PeriodicEvaluation`` rows: deterministic return from 16 fixed starts
against frames) and draws them together with the uniformly random policy's return (measured by the same callback,
same starts) and, when a run started from a clone, the clone's return at frame 0 and the expert's from the BC run's
closed-loop evaluation. Prints each curve as a table too.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def evaluations(run: Path) -> tuple[list[tuple[int, float]], float | None]:
    """The run's ``(frames, eval/return_mean)`` points and the random policy's return."""
    points, random = [], None
    with (run / "metrics.csv").open() as file:
        for row in csv.DictReader(file):
            if row.get("eval/return_mean"):
                points.append((int(float(row["eval/frames"])), float(row["eval/return_mean"])))
            if row.get("eval/random_return_mean"):
                random = float(row["eval/random_return_mean"])
    if not points:
        raise SystemExit(f"{run / 'metrics.csv'}: no evaluation rows (was PeriodicEvaluation in the run's config?)")
    return sorted(points), random


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", type=Path, required=True, help="run folders (with metrics.csv)")
    parser.add_argument("--labels", nargs="+", help="one label per run (default: the run folders' names)")
    parser.add_argument("--expert", type=float, help="the expert's return from the same starts, drawn as a line")
    parser.add_argument("--out", type=Path, default=Path("docs/results/reports/racing_sac_learning_curves.png"))
    args = parser.parse_args()
    labels = args.labels or [f"{run.parent.name}/{run.name}" for run in args.runs]
    if len(labels) != len(args.runs):
        parser.error("--labels needs one label per run")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    fig, ax = plt.subplots(figsize=(9, 5))
    random = None
    for index, (run, label) in enumerate(zip(args.runs, labels, strict=True)):
        points, run_random = evaluations(run)
        random = random if random is not None else run_random
        ax.plot([f for f, _ in points], [r for _, r in points], "o-", color=f"C{index}", markersize=3, label=label)
        print(f"{label} ({run}):")
        for frames, value in points:
            print(f"  {frames:>9,} frames  return {value:9.1f}")
    if random is not None:
        ax.axhline(random, color="0.4", linestyle="--", label=f"random policy (uniform actions): {random:.0f}")
    if args.expert is not None:
        ax.axhline(args.expert, color="k", linestyle=":", label=f"expert: {args.expert:.0f}")
    ax.set_xlabel("environment frames")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_ylabel("return per 100 s episode (deterministic actor, 16 starts)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()

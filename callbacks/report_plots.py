"""The throughput report's figures: where the wall time went, and the learning curve against a random policy.

Kept apart from :mod:`callbacks.throughput` because they are drawing code (matplotlib, imported only when a report
is drawn), not accounting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

# (history key, axis label, what the line is) of the curves drawn when every evaluation has them; the baseline is
# the same key with `random_` after `eval/`, when the evaluation callback measured a random policy.
CURVES = (
    ("eval/return_mean", "return per episode", "greedy policy"),
    ("eval/food_mean", "food per game", "greedy policy"),
    ("eval/x_pos_mean", "x reached (Mario starts at 40)", "greedy policy"),
    ("eval/safety_mae", "mean |V − Monte Carlo|", "learned safety probability V"),
)
RANDOM_LABEL = "random policy (uniform actions)"


def run_name(trainer: pl.Trainer, folder: Path) -> str:
    """The run as its logger names it (``snake_dqn/version_0``), else the folder it writes to."""
    logger = trainer.logger
    if logger is not None and logger.name:
        version = logger.version
        return f"{logger.name}/{version if isinstance(version, str) else f'version_{version}'}"
    return str(folder)


def _pyplot() -> Any:
    import matplotlib  # lazy: only runs that draw pay for the import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_phases(path: Path, rows: Sequence[tuple[str, dict[str, Any]]], phases: Sequence[str]) -> None:
    """One horizontal bar per row (``this process``, ``steady state``...), split into seconds per phase."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(rows)))
    first = rows[0][1]
    for y, (_, summary) in enumerate(rows):
        left = 0.0
        for index, phase in enumerate(phases):
            label = f"{phase} ({100 * first['fraction'][phase]:.1f} %)" if y == 0 else None
            ax.barh(y, summary["seconds"][phase], left=left, color=f"C{index}", label=label)
            left += summary["seconds"][phase]
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()  # the first row on top, as listed
    ax.set_xlabel("wall time (s)")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5), title=f"share of {rows[0][0]}")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def plot_learning_curve(path: Path, history: list[dict[str, Any]], random: dict[str, float], title: str) -> None:
    """Each evaluated metric against frames (left) and wall time (right), with the random policy as a baseline and, for
    the return, the band of its 95 % interval over the evaluation's episodes.

    Args:
        path: the PNG to write.
        history: :attr:`PeriodicEvaluation.history` rows (``frames``, ``time_s``, ``eval/...``).
        random: the random policy's ``eval/random_...`` metrics (may be empty).
        title: the run's name.
    """
    plt = _pyplot()
    from matplotlib.ticker import EngFormatter

    curves = [curve for curve in CURVES if all(curve[0] in row for row in history)]
    frames = [row["frames"] for row in history]
    minutes = [row["time_s"] / 60 for row in history]
    rows = len(curves)
    fig, axes = plt.subplots(rows, 2, figsize=(10, 0.6 + 2.6 * rows), sharex="col", sharey="row", squeeze=False)
    for (key, label, line), (by_frames, by_time) in zip(curves, axes, strict=True):
        baseline = random.get(key.replace("eval/", "eval/random_", 1))
        for ax, x in ((by_frames, frames), (by_time, minutes)):
            ax.plot(x, [row[key] for row in history], "o-", color="C0", markersize=4, label=line)
            low, high = key.replace("_mean", "_ci_low"), key.replace("_mean", "_ci_high")
            if low != key and all(low in row and high in row for row in history):  # the episodes' 95 % interval
                ax.fill_between(x, [row[low] for row in history], [row[high] for row in history], color="C0", alpha=0.2)
            if baseline is not None:
                ax.axhline(baseline, color="0.4", linestyle="--", label=f"{RANDOM_LABEL}: {baseline:.3g}")
            ax.grid(alpha=0.3)
        by_frames.set_ylabel(label)
        by_frames.legend(fontsize="small", loc="best")
    axes[-1, 0].set_xlabel("environment frames")
    axes[-1, 0].xaxis.set_major_formatter(EngFormatter(sep=""))
    axes[-1, 1].set_xlabel("wall time (minutes)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""The learner's ingest limit: the collected frames per second one learner can take, fed batches made beforehand.

    python benchmarks/learner_ingest.py --config configs/metta_ppo.yaml --threads 1
    python benchmarks/learner_ingest.py --config configs/mario_ddqn.yaml --config configs/bench/mario_cpu.yaml

Two fits of the config, one after the other in this process, each with its throughput report
(:mod:`callbacks.throughput`):

1. ``premade``: the config's collection replaced by :class:`PremadeBatches`, which collects ``--batches`` batches with
   the config's own environments and policy in this process when the fit starts and then hands them to the learner
   over and over, each as a fresh copy. Collecting then costs a copy, so the report's steady-state frames/s is what the
   learner takes when it never waits for data: its updates, advantages, buffer writes and draws, logging and
   checkpoints. That rate is the ingest limit; divided by the frames of one batch, batches/s.
2. ``collected``: the config as it ships, for the same number of updates: frames/s end to end, and the share of the
   wall time its collection took.

A short fit before both (``--warmup-updates``, not measured) pays what only a process's first fit pays (compiling the
update). The figures are the reports' steady state, after their first 10 training steps (a step of PPO is a whole
rollout's updates), so ``--updates`` must hold well more than 10 steps.

The ratio of the two fits' updates/s says how far collection is from the learner's limit on this machine. It is taken
in updates, not frames, because a replay config's asynchronous collection delivers what it can per update (a few
frames), while the premade fit hands a whole batch to every update: their frames/s differ by design, their updates/s
are the learner's pace in both. (For on-policy configs the frames per update are fixed, a rollout's share, so the
two ratios are equal.) With the frames/s one collector machine delivers, the ingest limit bounds how many such
machines one learner can use (``docs/guide/scaling-out.md``).
The policy acting on the premade batches' frames never changes (they were collected once): the learner's arithmetic
per frame is the same, what it learns is not the point.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tensordict import TensorDictBase

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from app.cli import main as app_main  # noqa: E402
from datamodules.collection import CollectionHost, InProcess  # noqa: E402

#: Training steps the reports leave out of their steady state (the preset's 200 would be most of a short fit's; a step
#: may hold several updates, PPO's a whole rollout's).
SKIP_STEPS = 10


class PremadeBatches(InProcess):
    """Collects ``batches`` batches in this process at the start, then returns copies of them in turn."""

    def __init__(self, batches: int = 4) -> None:
        super().__init__()
        if batches < 1:
            raise ValueError(f"batches must be >= 1, got {batches}")
        self.batches = batches
        self._made: list[TensorDictBase] = []
        self._handed = 0

    def build(self, data: CollectionHost) -> None:
        super().build(data)
        self._made = [super(PremadeBatches, self).collect().clone() for _ in range(self.batches)]

    def collect(self, steps: int = 0) -> TensorDictBase:
        batch = self._made[self._handed % len(self._made)]  # whatever ``steps`` asks: the premade batches are it
        self._handed += 1
        return batch.clone()


def fit(configs: list[str], updates: int, out: Path, name: str, flags: list[str]) -> dict[str, Any]:
    """One fit of ``configs`` (composed in order) for ``updates`` updates with its throughput report; the report's
    figures, and the frames of one collected batch."""
    args = ["fit", *(f"--config={config}" for config in configs)]
    args += ["--config", str(ROOT / "configs" / "bench" / "throughput.yaml")]
    args += ["--trainer.max_steps", str(updates), "--trainer.logger.init_args.save_dir", str(out)]
    args += ["--trainer.logger.init_args.name", name, "--trainer.enable_progress_bar", "false", *flags]
    args += ["--trainer.callbacks.init_args.skip_first_steps", str(SKIP_STEPS)]  # the preset's one callback
    cli = app_main(args)
    report = json.loads((Path(cli.trainer.log_dir) / "throughput.json").read_text())
    if name != "warmup" and report["steady_state"] is None:
        raise SystemExit(f"learner_ingest.py: error: --updates {updates}: the {name} fit ended before its steady state")
    return {**report, "frames_per_batch": cli.datamodule.frames_per_batch}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", action="append", required=True, help="a shipped config (configs/<name>.yaml); several compose"
    )
    parser.add_argument(
        "--updates", type=int, default=400, help="updates of each fit (the steady state starts after 10 steps)"
    )
    parser.add_argument("--batches", type=int, default=4, help="batches the premade fit collects and cycles")
    parser.add_argument("--warmup-updates", type=int, default=8, help="updates of the unmeasured first fit")
    parser.add_argument("--out", type=Path, help="where the runs and ingest.json go (default: a temporary folder)")
    args, flags = parser.parse_known_args(argv)
    if min(args.updates, args.batches, args.warmup_updates) < 1:
        parser.error("--updates, --batches and --warmup-updates must be >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="learner_ingest_"))
    premade = ["--data.init_args.collection", f"{PremadeBatches.__module__}.PremadeBatches"]
    premade += ["--data.init_args.collection.batches", str(args.batches)]
    # A first short fit pays what only the first fit of a process pays (compilation, imports on first use), so that
    # neither measured fit does.
    fit(args.config, args.warmup_updates, out, "warmup", [*flags, *premade])
    reports = {
        "premade": fit(args.config, args.updates, out, "premade", [*flags, *premade]),
        "collected": fit(args.config, args.updates, out, "collected", flags),
    }
    steady = {kind: report["steady_state"] for kind, report in reports.items()}
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/learner_ingest.py", *(argv if argv is not None else sys.argv[1:])],
        # The fits' own thread count (``--threads`` applies inside each fit), not this process's.
        "torch_threads": reports["premade"]["machine"]["torch_threads"],
        "ingest_frames_per_s": steady["premade"]["frames_per_s"],
        "collected_frames_per_s": steady["collected"]["frames_per_s"],
        "premade_updates_per_s": steady["premade"]["updates_per_s"],
        "collected_updates_per_s": steady["collected"]["updates_per_s"],
        "collected_collect_frac": steady["collected"]["fraction"].get("collect", 0.0),
        "premade_collect_frac": steady["premade"]["fraction"].get("collect", 0.0),
        "frames_per_batch": reports["premade"]["frames_per_batch"],
    }
    result["ingest_batches_per_s"] = result["ingest_frames_per_s"] / result["frames_per_batch"]
    result["ratio"] = result["premade_updates_per_s"] / result["collected_updates_per_s"]
    (out / "ingest.json").write_text(json.dumps(result, indent=2))
    r = result
    print(
        f"learner ingest limit {r['ingest_frames_per_s']:,.0f} frames/s, {r['ingest_batches_per_s']:.2f} batches of "
        f"{r['frames_per_batch']:,} frames/s, {r['premade_updates_per_s']:.2f} updates/s (collection a copy: "
        f"{r['premade_collect_frac']:.1%} of wall); the config as it ships "
        f"{r['collected_frames_per_s']:,.0f} frames/s, {r['collected_updates_per_s']:.2f} updates/s "
        f"(collection {r['collected_collect_frac']:.1%}): "
        f"{r['ratio']:.2f}x in updates/s. Report: {out}/ingest.json"
    )
    return result


if __name__ == "__main__":
    main()

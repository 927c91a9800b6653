"""The racing expert over many starts: its return, lap time and completed laps per episode (reference: §4 of
docs/reference_systems.md).

    python benchmarks/racing_expert.py --starts 256 --threads 1
    python benchmarks/racing_expert.py --starts 256 --json runs/bench/racing_expert.json
    python benchmarks/racing_expert.py --starts 64 --seed 7 --checkpoints runs/racing_sac/version_0/checkpoints/*.ckpt

Every car drives one whole episode (``max_steps`` = 5,000 steps of 0.02 s, 100 s) from its own start, all cars at
once. Reported: the mean return, the mean number of laps completed per episode, the first lap's time (s) over the
cars that completed one, the share of cars that completed their first lap, the share that never left the track
(|lateral error| ≤ half the width at every step), and the cars' steps per second including the expert's control.

``--checkpoints`` drives trained policies from the same starts beside the expert: each checkpoint's model is built
from its run's ``config.yaml`` (BC or SAC) and drives its deterministic action (``export_network``). Each is compared
start by start with the expert, and every checkpoint after the first with the first (put the clone first).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.racing.env import RacingEnv, drive_episodes, episode_summary  # noqa: E402
from envs.racing.expert import TimeOptimalExpert  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=256, help="cars, each from its own start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--checkpoints", nargs="*", type=Path, default=[], help="BC or SAC checkpoints to drive too")
    args = parser.parse_args(argv)
    if args.starts < 1 or args.threads < 1:
        parser.error("--starts and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    env = RacingEnv(num_envs=args.starts, seed=args.seed)
    expert = TimeOptimalExpert(env)
    start = time.perf_counter()
    expert_result = drive_episodes(env, expert)
    summary = episode_summary(expert_result, env.width)
    seconds = time.perf_counter() - start
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/racing_expert.py", *(argv if argv is not None else sys.argv[1:])],
        "machine": {"platform": platform.platform(), "threads": args.threads},
        "starts": args.starts,
        "track_length_m": env.track.length,
        **summary,
        "returns": expert_result["reward"].tolist(),
        "steps_per_s": args.starts * env.max_steps / seconds,
    }
    print(
        f"racing expert over {args.starts} starts: return {report['return_mean']:.1f}, "
        f"{report['laps_mean']:.2f} laps per 100 s episode, first lap {report['lap_time_mean']:.2f} s "
        f"({100 * report['lap_completed']:.1f} % completed it), {100 * report['never_off_track']:.1f} % never "
        f"off the track; {report['steps_per_s'] / 1e3:.0f}k car-steps/s ({args.threads} thread(s))"
    )
    report["policies"] = {}
    for checkpoint in args.checkpoints:
        policy_env, policy = checkpoint_policy(checkpoint, args.starts, args.seed)
        driven = drive_episodes(policy_env, policy)
        result = episode_summary(driven, policy_env.width)
        # Paired by start: the same cars, the same starts.
        result["starts_above_expert"] = int((driven["reward"] > expert_result["reward"]).sum())
        result["returns"] = driven["reward"].tolist()
        if report["policies"]:  # and against the first checkpoint (e.g. SAC against the clone it started from)
            first = torch.tensor(next(iter(report["policies"].values()))["returns"])
            result["starts_above_first_checkpoint"] = int((driven["reward"] > first).sum())
            result["mean_difference_to_first_checkpoint"] = (driven["reward"] - first).mean().item()
        report["policies"][str(checkpoint)] = result
        print(
            f"  {checkpoint}: return {result['return_mean']:.1f} ({result['return_mean'] / report['return_mean']:.3f} "
            f"of the expert's), {result['laps_mean']:.2f} laps, first lap {result['lap_time_mean']:.2f} s "
            f"({100 * result['lap_completed']:.1f} % completed it), {100 * result['never_off_track']:.1f} % never off; "
            f"above the expert's return from {result['starts_above_expert']} of {args.starts} starts"
            + (
                f", above the first checkpoint's from {result['starts_above_first_checkpoint']} (by "
                f"{result['mean_difference_to_first_checkpoint']:+.1f} on average)"
                if "starts_above_first_checkpoint" in result
                else ""
            )
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


def checkpoint_policy(checkpoint: Path, cars: int, seed: int):
    """The environment of ``checkpoint``'s run (``cars`` cars seeded ``seed``) and its model's deterministic policy."""
    from tensordict.nn import TensorDictModule

    from app.cli import build

    model, data = build([str(checkpoint.parents[1] / "config.yaml")])
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"])
    network = model.export_network().eval()
    return data.make_env(cars, seed), TensorDictModule(network, in_keys=["observation"], out_keys=["action"])


if __name__ == "__main__":
    main()

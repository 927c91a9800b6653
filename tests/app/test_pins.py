"""The shipped configs' first evaluations, pinned: a change to the code that moves a shipped config's training
trajectory fails here until its pin moves with it, so no published learning curve goes stale without a word.

Each config runs as README runs it (its CSV logger on, its own callbacks, its seed), cut short: ``max_steps`` a few
updates, and where an episode would last minutes, the episode's length (``SHORT``). Its first evaluations (at frame 0
and at the end of the short run: every ``eval/*`` figure they log) and the last logged training loss are compared with
``tests/app/pins.json``. When a change moves them on purpose, rewrite the pins and re-measure the published curves
of the configs that moved (BENCHMARKS.md names each curve's command)::

    LIGHTRL_UPDATE_PINS=1 python -m pytest tests/app/test_pins.py -n logical

and say in the commit what moved them. The comparison allows a relative 1e-4, far below what any change of the
trajectory moves (a different draw, an update one step earlier), so that a processor with other vector units does not
fail it.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, fit

PINS = Path(__file__).with_name("pins.json")
UPDATE = os.environ.get("LIGHTRL_UPDATE_PINS") == "1"

#: Per config: updates of the short run, and what else keeps it to seconds (an episode of minutes cut shorter).
SHORT: dict[str, tuple[int, tuple[str, ...]]] = {
    "snake_dqn": (20, ()),
    "snake_ppo": (8, ()),
    "pirl_toy": (20, ("--trainer.callbacks.init_args.episodes", "64")),
    "racing_ppo": (4, ("--data.init_args.env.init_args.max_steps", "200")),
    "metta_ppo": (4, ("--data.init_args.env.init_args.max_steps", "100")),
    "gym/cartpole_dqn": (20, ()),
    "gym/cartpole_ppo": (8, ()),
    "gym/pendulum_sac": (20, ("--data.init_args.env.init_args.env_kwargs", "{max_episode_steps: 50}")),
    "gym/lunarlander_ppo": (4, ("--data.init_args.collect_steps", "64", "--data.init_args.minibatch_size", "256")),
}

#: Shipped configs left out, each with why.
NOT_PINNED = {
    "mario_ddqn": "asynchronous collector workers deliver in an order no run repeats (README, Mario)",
}

#: What each config needs installed beyond the base install.
NEEDS = {"metta_ppo": "mettagrid", "gym/lunarlander_ppo": "Box2D"}


def evaluations(run_dir: Path) -> dict[str, dict[str, float]]:
    """``{step: {eval/*: value}}`` of every logged evaluation, and ``{"last": {"train/loss": ...}}``."""
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    found: dict[str, dict[str, float]] = {}
    for row in rows:
        figures = {
            key: float(value)
            for key, value in row.items()
            if key.startswith("eval/") and value and not key.endswith("time_s")
        }
        if figures:
            found.setdefault(row["step"], {}).update(figures)
    losses = [row for row in rows if row.get("train/loss")]
    if losses:
        found["last"] = {"step": float(losses[-1]["step"]), "train/loss": float(losses[-1]["train/loss"])}
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHORT))
def test_a_shipped_configs_first_evaluations_are_its_pin(name, tmp_path, monkeypatch):
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"{NEEDS[name]} is not installed (an extra)")
    monkeypatch.chdir(tmp_path)  # as a user runs it: from another folder, relative outputs there
    updates, extra = SHORT[name]
    runs = tmp_path / "runs"
    cli = fit(
        ROOT / "configs" / f"{name}.yaml",
        *("--trainer.max_steps", str(updates), "--trainer.logger.init_args.save_dir", str(runs)),
        *("--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1"),
        *extra,
    )
    assert cli.trainer.global_step == updates
    found = evaluations(Path(cli.trainer.log_dir))
    assert "0" in found and str(updates) in found, f"{name}: no evaluation at the start and the end: {sorted(found)}"
    pins = json.loads(PINS.read_text()) if PINS.is_file() else {}
    if UPDATE:
        pins[name] = found
        PINS.write_text(json.dumps(dict(sorted(pins.items())), indent=1) + "\n")
        return
    assert name in pins, f"{name} has no pin: write it with LIGHTRL_UPDATE_PINS=1 (module docstring)"
    pinned = pins[name]
    assert found.keys() == pinned.keys(), f"{name}: evaluated at {sorted(found)}, pinned at {sorted(pinned)}"
    moved = [
        f"{step} {key}: {value} (pinned {pinned[step].get(key)})"
        for step, figures in found.items()
        for key, value in figures.items()
        if key not in pinned[step] or not math.isclose(value, pinned[step][key], rel_tol=1e-4, abs_tol=1e-6)
    ]
    assert not moved, (
        f"configs/{name}.yaml trains differently than its pin: {'; '.join(moved)}. If that is meant, rewrite the pins "
        "(LIGHTRL_UPDATE_PINS=1), re-measure its published curve and say what moved it"
    )


def test_every_shipped_agent_config_is_pinned_or_says_why_not():
    shipped = {
        str(path.relative_to(ROOT / "configs").with_suffix(""))
        for path in [*(ROOT / "configs").glob("*.yaml"), *(ROOT / "configs" / "gym").glob("*.yaml")]
    }
    assert set(SHORT) | set(NOT_PINNED) <= shipped
    assert set(SHORT).isdisjoint(NOT_PINNED)

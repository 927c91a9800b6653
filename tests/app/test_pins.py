"""The shipped configs' first evaluations, pinned: a change to the code that moves a shipped config's training
trajectory fails here until its pin moves with it, so no published learning curve goes stale without a word.

Each config runs as the docs run it (its CSV logger on, its own callbacks, its seed, from a folder that is not the
checkout), cut short: ``max_steps`` a few updates and, where one collection or one evaluation episode would take
minutes, a shorter rollout or episode (``SHORT``). Its first evaluations (frame 0 and the end of the short run: every
``eval/*`` figure they log) and the last logged training loss are compared with ``tests/app/pins.json``. Shipped fits
that other tests run anyway pin theirs with :func:`assert_pinned` (MettaGrid's resume test), so the pins cost no
extra fit there.

When a change moves a trajectory on purpose, rewrite the pins, re-measure the published curves of the configs that
moved (the docs/results/ pages name each curve's command) and say in the commit what moved them::

    LIGHTRL_UPDATE_PINS=1 python -m pytest -n logical tests/app/test_pins.py tests/app/test_metta.py

The comparison allows a relative 1e-3: far below what any change of the trajectory moves (a different draw, an
update one step earlier), so that a processor with other vector units does not fail it (Pendulum CrossQ's evaluation
after eight updates lands 1.3e-4 apart on two x86 machines with the same packages, 2026-11-30).
"""

from __future__ import annotations

import csv
import fcntl
import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, fit

PINS = Path(__file__).with_name("pins.json")
UPDATE = os.environ.get("LIGHTRL_UPDATE_PINS") == "1"

#: Gymnasium configs: one collection or one evaluation game would take seconds to minutes as shipped.
_BREAKOUT = (*("--data.init_args.collect_steps", "32", "--data.init_args.minibatch_size", "64"),)
#: Per config: updates of the short run, and what else keeps it to seconds (the rollout's geometry stays valid).
SHORT: dict[str, tuple[int, tuple[str, ...]]] = {
    "snake_dqn": (20, ()),
    "snake_ppo": (8, ()),
    "racing_ppo": (4, ("--data.init_args.env.init_args.max_steps", "200")),
    "gym/cartpole_dqn": (8, ()),
    "gym/cartpole_qrdqn": (8, ()),
    "gym/cartpole_ppo": (8, ()),
    "gym/cartpole_a2c": (8, ()),
    "gym/cartpole_discrete_sac": (8, ()),
    "gym/pendulum_sac": (8, ()),
    "gym/pendulum_tqc": (8, ()),
    "gym/pendulum_crossq": (8, ()),
    "gym/pendulum_td3": (8, ("--data.init_args.warmup_frames", "256")),  # the Zoo's 10,000 uniform frames: seconds
    "gym/pendulum_ddpg": (8, ("--data.init_args.warmup_frames", "256")),
    "gym/lunarlander_dqn": (8, ()),
    "gym/lunarlander_ppo": (8, ("--data.init_args.collect_steps", "64")),
    # MuJoCo is chaotic (a 1e-12 change to one action moves the observations of 256 random steps by whole units) and
    # the C library's sin, exp, ... differ in their last bit between processors (glibc picks them by the CPU's
    # features): only a short trajectory is the same on every machine. 32 warm-up frames (64 PPO steps) and 50-step
    # evaluation games give the same figures with glibc's AVX2/FMA/AVX-512 functions and without (GLIBC_TUNABLES
    # glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F); 256 warm-up frames and whole games did not.
    "gym/halfcheetah_sac": (
        8,
        (
            *("--data.init_args.warmup_frames", "32", "--data.init_args.evaluation.env_options"),
            "{env_kwargs: {max_episode_steps: 50}}",
        ),
    ),
    "gym/halfcheetah_ppo": (
        8,
        (
            *("--data.init_args.collect_steps", "64", "--data.init_args.evaluation.env_options"),
            "{env_kwargs: {max_episode_steps: 50}}",
        ),
    ),
    # Whole games take minutes to evaluate: games of 200 emulator frames here, CNN updates of 64 images, and the
    # throughput report without its bare-update yardstick (tests/agents/test_bare.py measures that).
    "gym/breakout_ppo": (
        8,
        (
            *_BREAKOUT,
            *("--trainer.callbacks.init_args.bare_update_seconds", "0", "--data.init_args.evaluation.env_options"),
            "{episodic_life: false, "
            "env_kwargs: {frameskip: 1, repeat_action_probability: 0.0, max_episode_steps: 200}}",
        ),
    ),
    "gym/breakout_ppo_envpool": (
        8,
        (
            *_BREAKOUT,
            *("--trainer.callbacks.init_args.bare_update_seconds", "0", "--data.init_args.evaluation.env_options"),
            "{episodic_life: false, env_kwargs: {reward_clip: true, max_episode_steps: 50}}",
        ),
    ),
}

#: Shipped configs pinned by the test that fits them anyway, and where.
PINNED_ELSEWHERE = {
    "metta_ppo": "tests/app/test_metta.py (its resume test, the shipped collector workers, smaller maps)",
    "pirl_toy": "tests/agents/test_pirl.py (its short fit: 150 updates, a smaller safety evaluation, no export)",
    "pirl_vehicle": "tests/agents/test_pirl.py (as pirl_toy)",
}

#: Shipped configs left out, each with why.
NOT_PINNED = {
    "mario_ddqn": "asynchronous collector workers deliver in an order no run repeats (docs/systems/mario.md)",
    "metta_ultra_fast": "262,144 agent steps a rollout; its code path is metta_ppo's, which is pinned",
    "racing_bc": "a supervised stage: its epochs are deterministic and test_bc.py resumes them to identical weights",
    "racing_bc_circuits": "as racing_bc",
    "racing_sac": "needs its BC stage first (minutes); test_sac.py resumes the pipeline to identical weights",
    "racing_sac_circuits": "as racing_sac",
}

#: What a config needs installed beyond the base install (an extra).
NEEDS = {
    "LunarLander": "Box2D",
    "HalfCheetah": "mujoco",
    "ALE/": "ale_py",
    "envpool": "envpool",
    "mettagrid": "mettagrid",
}


def evaluations(run_dir: Path) -> dict[str, dict[str, float]]:
    """``{step: {eval/*: value}}`` of every logged evaluation, and ``{"last": {"step", "train/loss"}}``."""
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


def same(value: float, pinned: float) -> bool:
    """Equal within a relative 1e-3; NaN (a lap time with no lap completed) equals NaN."""
    return (math.isnan(value) and math.isnan(pinned)) or math.isclose(value, pinned, rel_tol=1e-3, abs_tol=1e-6)


def assert_pinned(name: str, run_dir: Path) -> None:
    """The evaluations and last loss of the run in ``run_dir`` are the pin ``name`` (or, with
    ``LIGHTRL_UPDATE_PINS=1``, become it)."""
    found = evaluations(run_dir)
    assert "last" in found and len(found) >= 2, f"{name}: no evaluation or no training loss: {sorted(found)}"
    if UPDATE:
        with open(PINS.with_suffix(".lock"), "w") as lock:  # parallel test processes write the one file in turn
            fcntl.flock(lock, fcntl.LOCK_EX)
            pins = json.loads(PINS.read_text()) if PINS.is_file() else {}
            pins[name] = found
            PINS.write_text(json.dumps(dict(sorted(pins.items())), indent=1) + "\n")
        return
    pins = json.loads(PINS.read_text())
    assert name in pins, f"{name} has no pin: write it with LIGHTRL_UPDATE_PINS=1 (tests/app/test_pins.py)"
    pinned = pins[name]
    assert found.keys() == pinned.keys(), f"{name}: evaluated at {sorted(found)}, pinned at {sorted(pinned)}"
    moved = [
        f"{step} {key}: {value} (pinned {pinned[step].get(key)})"
        for step, figures in found.items()
        for key, value in figures.items()
        if key not in pinned[step] or not same(value, pinned[step][key])
    ]
    assert not moved, (
        f"{name} trains differently than its pin: {'; '.join(moved[:6])}. If that is meant, rewrite the pins "
        "(LIGHTRL_UPDATE_PINS=1), re-measure its published curve and say what moved it (tests/app/test_pins.py)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHORT))
def test_a_shipped_configs_first_evaluations_are_its_pin(name, tmp_path, monkeypatch):
    config = ROOT / "configs" / f"{name}.yaml"
    for marker, module in NEEDS.items():
        if marker in config.read_text() and importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (an extra: pip install -e '.[gym,envpool,metta]')")
    monkeypatch.chdir(tmp_path)  # as a user runs it: from another folder, relative outputs there
    updates, extra = SHORT[name]
    cli = fit(
        config,
        *("--trainer.max_steps", str(updates), "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")),
        *("--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1"),
        *extra,
    )
    assert cli.trainer.global_step == updates and cli.datamodule.frames > 0
    run_dir = Path(cli.trainer.log_dir)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert {"0", str(updates)} <= set(evaluations(run_dir))  # the evaluations at the start and the end
    assert_pinned(name, run_dir)


def test_every_shipped_agent_config_is_pinned_or_says_why_not():
    shipped = {
        str(path.relative_to(ROOT / "configs").with_suffix(""))
        for path in [*(ROOT / "configs").glob("*.yaml"), *(ROOT / "configs" / "gym").glob("*.yaml")]
    }
    accounted = [*SHORT, *PINNED_ELSEWHERE, *NOT_PINNED]
    assert sorted(accounted) == sorted(shipped)  # each once
    pins = json.loads(PINS.read_text())
    assert set(SHORT) | set(PINNED_ELSEWHERE) == set(pins)


def test_a_pin_that_moves_fails_naming_the_config_and_the_figure(tmp_path, monkeypatch):
    # Without this, a comparison that could not fail would let every pin above pass.
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": "0", "eval/return_mean": "1.0", "train/loss": ""},
        {"step": "4", "eval/return_mean": "", "train/loss": "0.5"},
        {"step": "5", "eval/return_mean": "2.0", "train/loss": ""},
    ]
    with open(run / "metrics.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    pins = tmp_path / "pins.json"
    monkeypatch.setitem(globals(), "PINS", pins)
    monkeypatch.setitem(globals(), "UPDATE", False)
    pins.write_text(json.dumps({"x": evaluations(run)}))
    assert_pinned("x", run)  # equal: passes
    pins.write_text(json.dumps({"x": {**evaluations(run), "5": {"eval/return_mean": 2.5}}}))
    with pytest.raises(AssertionError, match=r"x trains differently than its pin: 5 eval/return_mean: 2.0"):
        assert_pinned("x", run)

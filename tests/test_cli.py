"""The command line: overrides, composed configs, --print_config, and one clear error for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import chain_config, fit, write_config

ROOT = Path(__file__).resolve().parents[1]


def run_app(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_print_config_resolves_composed_configs_and_overrides(tmp_path):
    base = write_config(chain_config("dqn", tmp_path / "out"), tmp_path / "base.yaml")
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"data": {"init_args": {"num_envs": 4}}, "trainer": {"max_steps": 7}}))
    result = run_app(
        "fit",
        "--config",
        str(base),
        "--config",
        str(preset),
        "--model.init_args.lr",
        "3e-4",
        "--data.init_args.env.init_args.length",
        "9",
        "--print_config",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["trainer"]["max_steps"] == 7  # from the preset composed on top
    assert config["data"]["init_args"]["num_envs"] == 4
    assert config["data"]["init_args"]["batch_size"] == 32  # from the base
    assert config["model"]["init_args"]["lr"] == 3e-4  # from the command line
    assert config["data"]["init_args"]["env"]["init_args"]["length"] == 9
    assert config["model"]["init_args"]["gamma"] == 0.99  # defaults are shown too
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data.init_args.batch_size", "-3"], "--data.init_args.batch_size must be > 0, got -3"),
        (["--data.init_args.frames_per_update", "0"], "--data.init_args.frames_per_update must be > 0, got 0"),
        (["--model.init_args.lr", "-1"], "--model.init_args.lr must be > 0, got -1"),
        (["--data.init_args.env.init_args.length", "1"], "length must be >= 2, got 1"),
        (["--data.init_args.device", "cuda"], "--data.init_args.device 'cuda' is not available"),
        (
            ["--trainer.accelerator", "gpu"],
            "--trainer.accelerator gpu --trainer.devices auto: No supported gpu backend",
        ),
        (["--data.init_args.num_envs", "many"], "num_envs"),
        (["--data.init_args.batch_sise", "8"], "batch_sise"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
    ],
)
def test_bad_input_exits_with_one_clear_message_before_any_output(tmp_path, args, message):
    config = write_config(chain_config("dqn", tmp_path / "out"), tmp_path / "c.yaml")
    result = run_app("fit", "--config", str(config), *args, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_missing_config_file_is_named(tmp_path):
    result = run_app("fit", "--config", "configs/nope.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "configs/nope.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_board_too_small_for_the_snake_is_rejected(tmp_path):
    result = run_app(
        "fit",
        "--config",
        str(ROOT / "configs/snake_dqn.yaml"),
        "--data.init_args.env.init_args.size",
        "4",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "size" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("ckpt_path", "message"),
    [
        ("last", "error: --ckpt_path last: no checkpoints/last.ckpt in {runs}/snake_ppo/version_* — nothing to resume"),
        ("{runs}/snake_ppo/version_3/checkpoints/last.ckpt", "error: --ckpt_path {ckpt_path}: no such checkpoint file"),
    ],
    ids=["last", "missing-file"],
)
def test_resume_with_nothing_to_resume_exits_naming_the_flag(tmp_path, ckpt_path, message):
    # A run that was never started: asking to resume it must not start a fresh one.
    runs = tmp_path / "runs"
    ckpt_path = ckpt_path.format(runs=runs)
    result = run_app(
        "fit",
        "--config",
        str(ROOT / "configs/snake_ppo.yaml"),
        "--trainer.logger.init_args.save_dir",
        str(runs),
        "--ckpt_path",
        ckpt_path,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [message.format(runs=runs, ckpt_path=ckpt_path)]
    assert "Traceback" not in result.stderr
    assert not runs.exists()


def test_with_the_logger_off_the_config_goes_to_the_checkpoint_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(chain_config("dqn", tmp_path / "out"), tmp_path / "c.yaml")
    fit(config, "--trainer.max_steps", "5")
    saved = yaml.safe_load((tmp_path / "out/checkpoints/config.yaml").read_text())
    assert saved["trainer"]["max_steps"] == 5 and saved["trainer"]["logger"] is False
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.yaml", "out"]  # nothing in the current folder
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["checkpoints"]

"""The command line: overrides, composed configs, --print_config, and one clear error for bad input."""

from __future__ import annotations

import ast
import os
import pydoc
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import yaml

from app.__main__ import dispatch
from app.cli import main
from app.run_folder import SaveRunConfig
from tests.app_process import run_app_process
from tests.helpers import ROOT, app_in_process, chain_config, evaluated_chain_config, fit, write_config


def run_app(*args: str, cwd: Path, pythonpath: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """``python -m app *args`` in a process of its own (``tests/app_process.py``) with a bare environment, but the
    test run's ``PATH``, home and compiled-extensions folder: the Snake kernel built once for the suite is then the one
    every process loads (another folder, or another ``ninja`` found on another ``PATH``, would compile it again: half
    a minute). ``pythonpath``: folders importable after the repository."""
    kept = {name: os.environ[name] for name in ("PATH", "HOME", "TORCH_EXTENSIONS_DIR") if name in os.environ}
    pythonpath = os.pathsep.join(map(str, (ROOT, *pythonpath)))
    return run_app_process(*args, cwd=cwd, env={"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin", **kept})


def test_print_config_resolves_composed_configs_and_overrides(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = write_config(chain_config("dqn", tmp_path / "out"), tmp_path / "base.yaml")
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"data": {"init_args": {"num_envs": 4}}, "trainer": {"max_steps": 7}}))
    result = app_in_process(
        capsys,
        "fit",
        "--config",
        str(base),
        "--config",
        str(preset),
        "--model.init_args.optimizer.lr",
        "3e-4",
        "--data.init_args.env.init_args.length",
        "9",
        "--print_config",
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["trainer"]["max_steps"] == 7  # from the preset composed on top
    assert config["data"]["init_args"]["num_envs"] == 4
    assert config["data"]["init_args"]["batch_size"] == 32  # from the base
    assert config["model"]["init_args"]["optimizer"]["lr"] == 3e-4  # from the command line
    assert config["data"]["init_args"]["env"]["init_args"]["length"] == 9
    assert config["model"]["init_args"]["gamma"] == 0.99  # defaults are shown too
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data.init_args.batch_size", "-3"], "--data.init_args.batch_size must be > 0, got -3"),
        (["--data.init_args.frames_per_update", "0"], "--data.init_args.frames_per_update must be > 0, got 0"),
        (["--model.init_args.optimizer.lr", "-1"], "--model.init_args.optimizer.lr must be > 0, got -1"),
        (
            ["--model.init_args.optimizer.lrr", "1"],
            "--model.init_args.optimizer.lrr is not an option; did you mean lr?",
        ),
        (
            ["--model.init_args.lr", "3e-4"],
            "--model.init_args.lr moved: give --model.init_args.optimizer.lr (optimizer: {lr: ...} in a config)",
        ),
        (
            ["--trainer.accumulate_grad_batches", "2", "--model.init_args.optimizer.accumulate_grad_batches", "3"],
            "--trainer.accumulate_grad_batches 2 and --model.init_args.optimizer.accumulate_grad_batches 3 disagree",
        ),
        (["--data.init_args.env.init_args.length", "1"], "--data.init_args.env.init_args.length must be >= 2, got 1"),
        (["--data.init_args.device", "cuda"], "--data.init_args.device 'cuda' is not available"),
        (
            ["--trainer.accelerator", "gpu"],
            "--trainer.accelerator gpu --trainer.devices auto: No supported gpu backend",
        ),
        (["--data.init_args.num_envs", "many"], "num_envs"),
        (["--data.init_args.batch_sise", "8"], "batch_sise"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (["--model.init_args.n_steps", "0"], "--model.init_args.n_steps must be >= 1, got 0"),
        (
            ["--data.init_args.collection.prefetch", "true", "--data.init_args.priority.alpha", "0.6"],
            "--data.init_args.collection.init_args.prefetch: not with prioritized replay (priority.alpha > 0)",
        ),
        (  # prefetch is no option of collector workers: the combination cannot be written
            ["--data.init_args.collection", "CollectorWorkers", "--data.init_args.collection.workers", "2"]
            + ["--data.init_args.collection.prefetch", "true"],
            "--data.init_args.collection.init_args.prefetch is not an option of "
            "datamodules.collection.CollectorWorkers",
        ),
        (
            ["--data.init_args.collection", "EnvWorkers", "--data.init_args.collection.workers", "3"],
            "--data.init_args.collection.init_args.workers (3) must divide --data.init_args.num_envs (8)",
        ),
        (
            ["--data.init_args.collection", "CollectorWorkers", "--data.init_args.collection.workers", "0"],
            "--data.init_args.collection.init_args.workers must be >= 1, got 0",
        ),
    ],
)
def test_bad_input_exits_with_one_clear_message_before_any_output(tmp_path, capsys, args, message):
    # In this process (the error path is the same code; the tests that run `python -m app` show it as a process).
    config = write_config(chain_config("dqn", tmp_path / "out"), tmp_path / "c.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(config), *args])
    assert exited.value.code not in (0, None)
    stderr = capsys.readouterr().err
    assert message in stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_tracking_backend_is_one_line_naming_the_flag_and_the_choices(tmp_path, capsys):
    result = app_in_process(capsys, *snake_dqn_args(tmp_path, "--trainer.logger", "tensorbord"))
    message = (
        "--trainer.logger tensorbord: unknown backend 'tensorbord'; choose csv, tensorboard, wandb, mlflow "
        "(comma-separated for several) or a Logger class path"
    )
    assert_one_error_line(result.returncode, result.stderr, message)
    assert not (tmp_path / "runs").exists()


def test_missing_config_file_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "fit", "--config", "configs/nope.yaml")
    assert result.returncode != 0
    assert "configs/nope.yaml" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------- errors from nested options
SNAKE_DQN = ROOT / "configs/snake_dqn.yaml"


def assert_one_error_line(returncode: int, stderr: str, message: str) -> None:
    """Exit status 2 and stderr of exactly one ``error:`` line (Lightning's "Seed set to" note is held back until the
    options have been checked)."""
    assert returncode == 2, stderr
    assert stderr.splitlines() == [f"error: {message}"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "trainer:\n  max_steps: 3\n  devices: [1, 2\nmodel: x\n",
            "line 4, column 6: expected ',' or ']', but got ':'",
        ),
        ("trainer:\n  max_steps: 3\n\tlimit_val_batches: 1\n", "line 3, column 1: found character '\\t' that cannot"),
        ("model:\n  init_args: {gamma: 0.9\n", "line 3, column 1: expected ',' or '}', but got '<stream end>'"),
    ],
)
def test_a_config_that_is_not_yaml_is_one_line_naming_the_file_and_line(tmp_path, capsys, text, where):
    """YAML's own message names "<unicode string>", not the file: the line names the file given, the line and column,
    and why, whichever position the file has among the configs and whichever command reads it."""
    broken = tmp_path / "broken.yaml"
    broken.write_text(text)
    result = app_in_process(capsys, *snake_dqn_args(tmp_path), "--config", str(broken))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: --config {broken}: not valid YAML at {where}")
    for command in ("seeds", "tune"):
        other = app_in_process(capsys, command, "--config", str(broken), "--space", "s.yaml", "--trials", "1")
        assert other.returncode == 2 and len(other.stderr.splitlines()) == 1, other.stderr
        assert other.stderr.startswith(f"python -m app {command}: error: --config {broken}: not valid YAML at {where}")


def snake_dqn_args(tmp_path: Path, *args: str, config: Path = SNAKE_DQN) -> list[str]:
    """The shipped Snake-DQN config as the docs run it (CSV logger on), writing under ``tmp_path/runs``."""
    save_dir = ("--trainer.logger.init_args.save_dir", str(tmp_path / "runs"))
    return ["fit", "--config", str(config), "--threads", "1", *save_dir, *args]


def with_evaluation_every(tmp_path: Path, every_n_frames: object) -> Path:
    """The shipped Snake-DQN config with its evaluation callback's ``every_n_frames`` changed in the YAML list."""
    config = yaml.safe_load(SNAKE_DQN.read_text())
    evaluation = config["trainer"]["callbacks"][1]
    assert evaluation["class_path"] == "callbacks.schedule.PeriodicEvaluation"
    evaluation["init_args"]["every_n_frames"] = every_n_frames
    return write_config(config, tmp_path / "snake.yaml")


@pytest.mark.slow
def test_a_stateful_callback_given_twice_is_one_line_before_anything_runs(tmp_path, capsys):
    # The shipped config has a ThroughputReport; a second from the command line would share its checkpoint state.
    result = app_in_process(
        capsys, *snake_dqn_args(tmp_path, "--trainer.callbacks+=callbacks.throughput.ThroughputReport")
    )
    message = (
        "trainer.callbacks[3] (callbacks.throughput.ThroughputReport) is trainer.callbacks[2] again, and both would "
        "save their state under one name in checkpoints: give it once (the config may already have it)"
    )
    assert_one_error_line(result.returncode, result.stderr, message)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (  # refused by the environment built inside the data module's constructor
            ["--data.init_args.env.init_args.size", "4", "--data.init_args.env.init_args.spawn_margin", "3"],
            "--data.init_args.env.init_args.spawn_margin 3 leaves no room for the 3-block snake on a 4x4 board "
            "(size must be >= 2 * spawn_margin + 3 = 9); at most 0 fits, or leave it unset",
        ),
    ],
)
def test_nested_option_errors_are_one_line_naming_the_full_flag(tmp_path, args, message):
    # In a process of its own, as users run it: nothing but the one line (the other kinds: in-process below).
    result = run_app(*snake_dqn_args(tmp_path, *args), cwd=tmp_path)
    assert_one_error_line(result.returncode, result.stderr, message)  # no traceback, no usage dump
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("ckpt_path", "message"),
    [
        ("last", "error: --ckpt_path last: no checkpoints/last.ckpt in {runs}/snake_ppo/version_* — nothing to resume"),
        ("{runs}/snake_ppo/version_3/checkpoints/last.ckpt", "error: --ckpt_path {ckpt_path}: no such checkpoint file"),
    ],
    ids=["last", "missing-file"],
)
def test_resume_with_nothing_to_resume_exits_naming_the_flag(tmp_path, capsys, monkeypatch, ckpt_path, message):
    # A run that was never started: asking to resume it must not start a fresh one.
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    ckpt_path = ckpt_path.format(runs=runs)
    config = ("--config", str(ROOT / "configs/snake_ppo.yaml"), "--trainer.logger.init_args.save_dir", str(runs))
    result = app_in_process(capsys, "fit", *config, "--ckpt_path", ckpt_path)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [message.format(runs=runs, ckpt_path=ckpt_path)]
    assert "Traceback" not in result.stderr
    assert not runs.exists()


@pytest.mark.slow
def test_with_the_logger_off_the_config_goes_to_the_checkpoint_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(chain_config("dqn", tmp_path / "out"), tmp_path / "c.yaml")
    fit(config, "--trainer.max_steps", "5")
    saved = yaml.safe_load((tmp_path / "out/checkpoints/config.yaml").read_text())
    assert saved["trainer"]["max_steps"] == 5 and saved["trainer"]["logger"] is False
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.yaml", "out"]  # nothing in the current folder
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["checkpoints"]


@pytest.mark.slow
def test_the_saved_config_and_the_checkpoints_hyperparameters_are_what_a_checked_dump_writes(tmp_path, monkeypatch):
    # The parser writes the configs its own parse_args checked without checking them again (app/errors.py): to the
    # byte what jsonargparse's checked dump writes, for the run folder's config.yaml and the model's hyperparameters.
    monkeypatch.chdir(tmp_path)
    cli = fit(ROOT / "configs/gym/cartpole_ppo.yaml", "--trainer.max_steps", "1")
    saver = next(callback for callback in cli.trainer.callbacks if isinstance(callback, SaveRunConfig))
    checked = saver.parser.dump(saver.config, skip_none=False, skip_validation=False)
    assert (tmp_path / "runs/gym_cartpole_ppo/version_0/config.yaml").read_text() == checked
    hyperparameters = cli.parser.dump(cli.config, skip_link_targets=False, skip_none=False, skip_validation=False)
    assert cli.config_dump == yaml.safe_load(hyperparameters)["fit"]
    assert cli.model.hparams["optimizer"] == cli.config_dump["model"]["init_args"]["optimizer"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed_everything", "-3"], "--seed_everything must be in [0, 4294967295] (NumPy's seeds), got -3"),
        (["--data.init_args.seed", "-3"], "--data.init_args.seed must be >= 0, got -3"),
    ],
)
def test_a_negative_seed_is_one_line_naming_its_flag(tmp_path, capsys, args, message):
    result = app_in_process(capsys, *snake_dqn_args(tmp_path, *args))
    assert_one_error_line(result.returncode, result.stderr, message)
    assert not (tmp_path / "runs").exists()


def test_a_trainer_option_lightning_refuses_is_one_line_naming_its_flag(tmp_path, capsys):
    result = app_in_process(capsys, *snake_dqn_args(tmp_path, "--trainer.max_steps", "-5"))
    message = (
        "--trainer.max_steps: `max_steps` must be a non-negative integer or -1 (infinite steps). You passed in -5."
    )
    assert_one_error_line(result.returncode, result.stderr, message)


def test_a_logger_folder_that_cannot_be_created_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "afile").write_text("")  # a file where the runs' folder would go
    save_dir = tmp_path / "afile" / "runs"
    args = ["fit", "--config", str(SNAKE_DQN), "--trainer.logger.init_args.save_dir", str(save_dir)]
    result = app_in_process(capsys, *args)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --trainer.logger.init_args.save_dir {save_dir}: cannot create it (Not a directory)"]
    assert "Traceback" not in result.stderr


def test_a_bad_callback_in_a_config_list_is_named_by_position_and_class(tmp_path, capsys):
    result = app_in_process(capsys, *snake_dqn_args(tmp_path, config=with_evaluation_every(tmp_path, 0)))
    message = "trainer.callbacks[1] (callbacks.schedule.PeriodicEvaluation) every_n_frames must be >= 1, got 0"
    assert_one_error_line(result.returncode, result.stderr, message)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--data.init_args.env.init_args.size", "2"],
            "--data.init_args.env.init_args.size must be >= 3 to fit the 3-block snake, got 2",
        ),
        (  # refused by the parser, three objects deep
            ["--data.init_args.env.init_args.size", "ten"],
            "--data.init_args.env.init_args.size must be an int, got 'ten'",
        ),
        (  # a callback added and configured on the command line, refused by its constructor
            [
                "--trainer.callbacks+=callbacks.schedule.PeriodicEvaluation",
                "--trainer.callbacks.init_args.every_n_frames",
                "0",
            ],
            "--trainer.callbacks.init_args.every_n_frames must be >= 1, got 0",
        ),
        (
            ["--data.init_args.env.init_args.backend", "gpu"],
            "--data.init_args.env.init_args.backend must be one of 'auto', 'torch', 'cpp', got 'gpu'",
        ),
        (
            ["--data.init_args.env.init_args.sise", "7"],
            "--data.init_args.env.init_args.sise is not an option of envs.snake.env.SnakeEnv; did you mean size?",
        ),
        (  # the flag sets the last callback of the list, here the throughput report
            ["--trainer.callbacks.init_args.log_every_n_steps", "0"],
            "--trainer.callbacks.init_args.log_every_n_steps must be >= 1, got 0",
        ),
        (
            ["--trainer.callbacks.init_args.every_n_frames", "0"],
            "--trainer.callbacks.init_args.every_n_frames is not an option of callbacks.throughput.ThroughputReport, "
            "the last of trainer.callbacks (the one this flag sets)",
        ),
    ],
)
def test_each_kind_of_nested_error_is_worded_for_its_flag(tmp_path, capsys, args, message):
    # In-process, so that the wording of every kind is checked without a process start each (the subprocess tests
    # above show that the same path prints nothing else).
    with pytest.raises(SystemExit) as exited:
        main(snake_dqn_args(tmp_path, *args))
    assert_one_error_line(exited.value.code, capsys.readouterr().err, message)
    assert not (tmp_path / "runs").exists()


def test_a_wrong_type_in_a_config_list_names_the_callback_by_class(tmp_path, capsys):
    # The parser reports before the list is built, so the position is not known yet; the class finds it.
    with pytest.raises(SystemExit) as exited:
        main(snake_dqn_args(tmp_path, config=with_evaluation_every(tmp_path, "ten")))
    message = "trainer.callbacks (callbacks.schedule.PeriodicEvaluation) every_n_frames must be an int, got 'ten'"
    assert_one_error_line(exited.value.code, capsys.readouterr().err, message)


@pytest.mark.slow
def test_a_7x7_board_fits_the_shipped_snake_config_without_a_margin_override(tmp_path):
    args = snake_dqn_args(
        tmp_path,
        "--data.init_args.env.init_args.size",
        "7",
        "--trainer.max_steps",
        "5",
        "--data.init_args.warmup_frames",
        "32",
        "--data.init_args.batch_size",
        "32",
        "--data.init_args.buffer_size",
        "1000",
        "--trainer.enable_progress_bar",
        "false",
    )
    main(args)
    run = tmp_path / "runs/snake_dqn/version_0"
    env = yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"]["env"]["init_args"]
    assert env["size"] == 7 and env["spawn_margin"] is None  # the margin adapted, not set by hand
    checkpoint = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 5
    assert checkpoint["state_dict"]["q_network.1.0.weight"].shape == (256, 3 * 7 * 7)  # sized by the 7x7 board
    assert checkpoint["ReplayDataModule"]["env"]["board"].shape[1] == 3 * 7 * 7 + 1


def test_prefetch_is_refused_for_an_update_that_draws_random_numbers(tmp_path, capsys, monkeypatch):
    # SAC's actor loss samples actions from the global generator (PIRL draws its points from a generator of its own).
    paths = [
        arg
        for name in ("racing_sac.yaml", "bench/sac_scratch.yaml")
        for arg in ("--config", str(ROOT / "configs" / name))
    ]
    monkeypatch.chdir(tmp_path)
    result = app_in_process(capsys, "fit", *paths, "--data.init_args.collection.prefetch", "true")
    assert_one_error_line(result.returncode, result.stderr, result.stderr.strip().splitlines()[-1][len("error: ") :])
    assert "--data.init_args.collection.init_args.prefetch:" in result.stderr
    assert "draws random numbers" in result.stderr
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------ classes that moved (issue 46)
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("datamodules.envs.testing.chain.ChainEnv", "envs.testing.chain.ChainEnv"),  # the layout before issue 46
        ("datamodules.envs.snake.SnakeEnv", "envs.snake.env.SnakeEnv"),  # the layout before issue 26
        ("datamodules.demonstrations.DemonstrationDataModule", "envs.racing.demonstrations.DemonstrationDataModule"),
        ("callbacks.closed_loop.ClosedLoopEvaluation", "envs.racing.closed_loop.ClosedLoopEvaluation"),
        ("datamodules.envs.mettagrid.tokens.ObservationLayout", "envs.tokens.ObservationLayout"),
        ("callbacks.schedule.AtomicCheckpointIO", "checkpoints.io.AtomicCheckpointIO"),
        ("datamodules.checkpoint_files.CheckpointMismatch", "checkpoints.files.CheckpointMismatch"),
        ("modules.bare.bare_update_ms", None),  # a function, not a class: nothing to find by class name
    ],
)
def test_an_old_class_path_of_the_project_finds_the_class_where_it_is_now(old, new):
    from app.errors import moved_class_path

    assert moved_class_path(old) == new
    assert new is None or pydoc.locate(new) is not None


@pytest.mark.parametrize(
    ("line", "spelled"),
    [
        ("model.gamma must be in [0, 1], got 2", "--model.init_args.gamma must be in [0, 1], got 2"),
        ("model.optimizer.lr must be > 0", "--model.init_args.optimizer.lr must be > 0"),  # an option group
        (
            "data.collection.workers (3) must divide data.num_envs (4)",
            "--data.init_args.collection.init_args.workers (3) must divide --data.init_args.num_envs (4)",
        ),
        ("data.env.size must be >= 3", "--data.init_args.env.init_args.size must be >= 3"),  # a class's option
        ("data.evaluation.env_options: bad", "--data.init_args.evaluation.env_options: bad"),
        # Not options: a file name, another object's keys, a flag already spelled, a path
        ("wrote model.pt and data.npz", "wrote model.pt and data.npz"),
        ("--model.init_args.gamma stays", "--model.init_args.gamma stays"),
        ("runs/model.gamma stays", "runs/model.gamma stays"),
        ("trainer.max_steps stays", "trainer.max_steps stays"),
    ],
)
def test_library_code_names_options_by_their_config_keys_and_the_error_line_spells_the_flag(line, spelled):
    from app.errors import spell_flags
    from datamodules.replay import ReplayDataModule
    from modules.dqn import DQN

    assert spell_flags(line, {"model": DQN, "data": ReplayDataModule}) == spelled
    assert spell_flags(line, {}) == line  # nothing configured (yet): nothing to spell against


def test_no_library_code_spells_a_flag_of_the_model_or_the_data_module():
    # The command line's spelling (--model.init_args.x) is made in one place, app/errors.py (spell_flags); library
    # code names the option (model.x). Docstrings may show a command line; code may not build one.
    spelled = re.compile(r"--(model|data)\.init_args")
    found = []
    for package in ("modules", "datamodules", "envs", "callbacks", "checkpoints", "export"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            # A string standing alone as a statement is documentation (a module's, a class's or an attribute's).
            documentation = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
            for node in ast.walk(tree):
                code = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documentation
                if code and spelled.search(node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize(
    "path",
    ["envs.testing.chain.ChainEnv", "users_envs.ChainEnv", "envs.testing.chain.NoSuchEnv", "datamodules.envs.Nope"],
)
def test_a_class_path_that_imports_or_is_not_the_projects_has_not_moved(path):
    from app.errors import moved_class_path

    assert moved_class_path(path) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("datamodules.envs.testing.chain.ChainEnv", "envs.testing.chain.ChainEnv", "flag"),
        ("datamodules.envs.testing.chain.ChainEnv", "envs.testing.chain.ChainEnv", "config"),
        ("datamodules.envs.snake.SnakeEnv", "envs.snake.env.SnakeEnv", "config"),
    ],
)
def test_an_old_environment_class_path_is_one_line_naming_the_new_one(tmp_path, capsys, old, new, where):
    config = chain_config("dqn", tmp_path / "out")
    args = ["--data.init_args.env", old]
    if where == "config":  # as a run folder's saved config.yaml from before the move has it
        config["data"]["init_args"]["env"] = {"class_path": old}
        args = []
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(write_config(config, tmp_path / "c.yaml")), *args])
    flag = "--data.init_args.env"
    message = f"{flag}: {old} moved to {new}; give {flag} {new} (or class_path: {new} in a config)"
    assert_one_error_line(exited.value.code, capsys.readouterr().err, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("old", ["callbacks.schedule.AtomicCheckpointIO", "checkpoints.files.AtomicCheckpointIO"])
def test_a_saved_configs_old_checkpoint_plugin_is_one_line_naming_the_new_one(tmp_path, capsys, old):
    # Every run's saved config.yaml names the checkpoint plugin (trainer.plugins), which moved into checkpoints/ and
    # then beside the files it writes, out of the module that worker processes import (which need no Lightning).
    config = chain_config("dqn", tmp_path / "out")
    new = "checkpoints.io.AtomicCheckpointIO"
    config["trainer"]["plugins"] = [{"class_path": old}]
    result = app_in_process(capsys, "fit", "--config", str(write_config(config, tmp_path / "c.yaml")))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert f"{old} moved to {new}" in result.stderr
    assert not (tmp_path / "out").exists()


def refused_resume(saved: Path, run: Path, capsys) -> str:
    """``saved`` (a run's config.yaml) resumed as the docs say, from the folder above the runs (the current one):
    refused with exit status 2, and nothing in the run folder touched. Its stderr."""

    def files() -> dict[str, bytes]:
        return {path.name: path.read_bytes() for path in run.rglob("*") if path.is_file()}

    before = files()
    assert Path.cwd().resolve() == run.parents[2].resolve()
    result = app_in_process(capsys, "fit", "--config", str(saved), "--ckpt_path", "last", "--trainer.max_steps", "40")
    assert result.returncode == 2, result.stderr
    assert files() == before
    return result.stderr


@pytest.mark.slow
def test_a_saved_config_from_before_the_move_is_one_line_and_its_run_resumes_after_the_edit(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    config = write_config(evaluated_chain_config("dqn", every_n_frames=10**9, max_steps=20), tmp_path / "c.yaml")
    fit(config)
    run = tmp_path / "runs/chain/version_0"
    saved = run / "config.yaml"
    new = "envs.testing.chain.ChainEnv"
    assert new in saved.read_text()
    old = f"datamodules.{new}"  # what a run folder written before the move holds
    saved.write_text(saved.read_text().replace(new, old))
    flag = "--data.init_args.env"
    message = f"{flag}: {old} moved to {new}; give {flag} {new} (or class_path: {new} in a config)"
    assert refused_resume(saved, run, capsys) == f"error: {message}\n"

    saved.write_text(saved.read_text().replace(old, new))  # the edit the line asks for
    cli = fit(saved, "--ckpt_path", "last", "--trainer.max_steps", "40")
    assert cli.trainer.global_step == 40 and Path(cli.trainer.log_dir).resolve() == run.resolve()
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 40
    assert [path.name for path in run.parent.iterdir()] == ["version_0"]


@pytest.mark.parametrize("agent", ["dqn", "ppo", "recurrent"])
@pytest.mark.parametrize(("old", "value"), [("lr", 3e-4), ("max_grad_norm", 0.5), ("accumulate_grad_batches", 2)])
@pytest.mark.parametrize("where", ["flag", "config"])
def test_an_old_optimizer_option_is_one_line_naming_the_new_flag(tmp_path, capsys, agent, old, value, where):
    config = chain_config(agent, tmp_path / "out")
    args = [f"--model.init_args.{old}", str(value)]
    if where == "config":  # a run folder's saved config.yaml from before the optimizer group
        config["model"]["init_args"][old] = value
        args = []
    written = write_config(config, tmp_path / "c.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(written), *args])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    if where == "flag":
        assert lines == [
            f"error: --model.init_args.{old} moved: give --model.init_args.optimizer.{old} "
            f"(optimizer: {{{old}: ...}} in a config)"
        ]
    else:  # the config's group, with the value that moves into it, to write in place of the old option
        group = {**config["model"]["init_args"].get("optimizer", {}), old: value}
        write = yaml.safe_dump({"optimizer": group}, default_flow_style=True, sort_keys=False).strip()[1:-1]
        assert lines == [
            f"error: {written}: options moved into option groups; under model.init_args write {write} in place of {old}"
        ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("agent", "old", "value", "new"),
    [
        ("dqn", "hidden_sizes", "[16]", "network.hidden_sizes"),
        ("dqn", "target_update", "soft", "target.update"),
        ("dqn", "target_update_interval", "5", "target.interval"),
        ("dqn", "tau", "0.1", "target.tau"),
        ("dqn", "eps_frames", "10", "exploration.eps_frames"),
        ("ppo", "normalize_observations", "true", "normalize.observations"),
        ("ppo", "init_scale", "0.5", "gaussian.init_scale"),
        ("ppo", "clip_epsilon", "0.1", "loss.clip_epsilon"),
        ("recurrent", "lstm_hidden", "64", "network.lstm_hidden"),
        ("recurrent", "entropy_coef", "0.0", "loss.entropy_coef"),
    ],
)
def test_a_flat_option_that_moved_into_a_group_is_one_line_naming_its_new_flag(
    tmp_path, capsys, agent, old, value, new
):
    config = write_config(chain_config(agent, tmp_path / "out"), tmp_path / "c.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(config), f"--model.init_args.{old}", value])
    group, option = new.split(".")
    message = f"--model.init_args.{old} moved: give --model.init_args.{new} ({group}: {{{option}: ...}} in a config)"
    assert_one_error_line(exited.value.code, capsys.readouterr().err, message)
    assert not (tmp_path / "out").exists()


def test_a_scalar_where_a_group_now_sits_is_one_line_naming_the_groups_field(tmp_path, capsys):
    config = write_config(chain_config("dqn", tmp_path / "out"), tmp_path / "c.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", str(config), "--model.init_args.network", "mlp"])
    flag = "--model.init_args.network"
    message = f"{flag} is an option group: give {flag}.kind mlp (network: {{kind: mlp}} in a config)"
    assert_one_error_line(exited.value.code, capsys.readouterr().err, message)


@pytest.mark.parametrize(
    ("class_path", "old", "group", "field"),
    [
        ("modules.sac.SAC", "actor_hidden_sizes", "actor", "hidden_sizes"),
        ("modules.sac.SAC", "critic_hidden_sizes", "critics", "hidden_sizes"),
        ("modules.sac.SAC", "num_critics", "critics", "count"),
        ("modules.sac.SAC", "tau", "critics", "tau"),
        ("modules.sac.SAC", "bc_weight_end", "bc_term", "weight_end"),
        ("modules.pirl.PhysicsInformedDQN", "pde_weight", "physics_loss", "pde_weight"),
        ("modules.pirl.PhysicsInformedDQN", "tau", "target", "tau"),
        ("modules.ppo.PPO", "network", "network", "kind"),
        ("modules.ppo.PPO", "normalize_rewards", "normalize", "rewards"),
        ("datamodules.replay.ReplayDataModule", "priority_alpha", "priority", "alpha"),
        ("datamodules.replay.ReplayDataModule", "priority_beta_updates", "priority", "beta_updates"),
        ("datamodules.replay.ReplayDataModule", "eval_episodes", "evaluation", "episodes"),  # the base's, by **kwargs
        ("datamodules.rollout.RolloutDataModule", "eval_env_options", "evaluation", "env_options"),
    ],
)
def test_every_former_option_of_the_agents_finds_its_group(class_path, old, group, field):
    from app.errors import regrouped_options

    assert regrouped_options(class_path, {old: 7}) == {group: {field: 7}}
    assert regrouped_options(class_path, {"gamma": 0.9}) == {}  # still a flat option


def test_former_option_names_are_gone_by_the_version_they_are_removed_in():
    # The option groups' former names are a migration with an end: the hints for them go in FORMER_NAMES_REMOVED_IN.
    from importlib.metadata import version

    from packaging.version import Version

    from app.errors import FORMER_NAMES_REMOVED_IN

    distribution = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert Version(version(distribution)) < Version(FORMER_NAMES_REMOVED_IN), (
        "this version removes the option groups' former names: delete the fields' formerly metadata and its reader, "
        "and RecurrentPPO's reading of checkpoints whose loss held its trunk (recurrent_ppo.forget_trunk_in_loss)"
    )


@pytest.mark.slow
def test_a_saved_config_from_before_the_option_groups_is_one_line_and_its_run_resumes_after_the_edit(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    config = write_config(evaluated_chain_config("dqn", every_n_frames=10**9, max_steps=20), tmp_path / "c.yaml")
    fit(config)
    run = tmp_path / "runs/chain/version_0"
    saved = run / "config.yaml"
    # What the run folder held before the groups: the model's and the data module's options flat, under their
    # former names.
    written = yaml.safe_load(saved.read_text())
    model, data = written["model"]["init_args"], written["data"]["init_args"]
    network, target, exploration = (model.pop(name) for name in ("network", "target", "exploration"))
    assert network["activation"] == "relu" and not network["orthogonal_init"]  # new options, at the old behaviour
    evaluation, priority = data.pop("evaluation"), data.pop("priority")
    flat = {
        "model": {
            "network": network["kind"],
            "hidden_sizes": network["hidden_sizes"],
            "target_update": target["update"],
            "target_update_interval": target["interval"],
            "tau": target["tau"],
            **exploration,
        },
        "data": {
            "eval_episodes": evaluation["episodes"],
            "eval_env_options": evaluation["env_options"],
            **{f"priority_{name}": value for name, value in priority.items()},
        },
    }
    model.update(flat["model"])
    data.update(flat["data"])
    saved.write_text(yaml.safe_dump(written, sort_keys=False))
    stderr = refused_resume(saved, run, capsys)
    assert len(stderr.strip().splitlines()) == 1, stderr
    head, *parts = stderr.strip().removeprefix("error: ").split("; ")
    assert head == f"{saved}: options moved into option groups"

    # The edit the line asks for, for the model and the data module: the groups in, the options they replace out
    # (every moved option at once, in the file's order); the run resumes where it stopped.
    assert [part.split(".")[0] for part in parts] == ["under model", "under data"]
    for part, owner, init_args in zip(parts, ("model", "data"), (model, data), strict=True):
        groups, _, old = part.removeprefix(f"under {owner}.init_args write ").partition(" in place of ")
        assert old.split(", ") == list(flat[owner])
        for option in old.split(", "):
            init_args.pop(option)
        init_args.update(yaml.safe_load("{" + groups + "}"))
    assert model["network"] == {"kind": network["kind"], "hidden_sizes": network["hidden_sizes"]}  # new: defaults
    assert (model["target"], model["exploration"]) == (target, exploration)
    assert (data["evaluation"], data["priority"]) == (evaluation, priority)
    saved.write_text(yaml.safe_dump(written, sort_keys=False))
    cli = fit(saved, "--ckpt_path", "last", "--trainer.max_steps", "40")
    assert cli.trainer.global_step == 40 and Path(cli.trainer.log_dir).resolve() == run.resolve()
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 40
    assert [path.name for path in run.parent.iterdir()] == ["version_0"]


def test_a_composed_config_sets_single_optimizer_options_over_the_agents_defaults(tmp_path, capsys):
    config = chain_config("recurrent", tmp_path / "out")  # recurrent PPO's default clips the gradient norm at 0.5
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"model": {"init_args": {"optimizer": {"lr_end": 1e-4}}}}))
    base = write_config(config, tmp_path / "c.yaml")
    result = app_in_process(capsys, "fit", "--config", str(base), "--config", str(preset), "--print_config")
    assert result.returncode == 0, result.stderr
    optimizer = yaml.safe_load(result.stdout)["model"]["init_args"]["optimizer"]
    assert optimizer["lr"] == 0.003 and optimizer["lr_end"] == 1e-4  # the base config's, then the preset's
    assert optimizer["max_grad_norm"] == 0.5  # the agent's own default, kept


@pytest.mark.slow
def test_help_lists_every_command_and_only_the_subcommands_that_work_are_offered(tmp_path, capsys):
    from app.__main__ import COMMANDS

    help_text = run_app("--help", cwd=tmp_path).stdout
    assert help_text.startswith("usage: python -m app <command>")
    listed = [line.split()[0] for line in help_text.splitlines() if line.startswith("  ") and line.split()]
    assert listed[: len(COMMANDS)] == list(COMMANDS) == ["fit", "validate", "seeds", "tune", "watch", "export", "zoo"]
    assert app_in_process(capsys).stdout == help_text  # no command at all prints the same
    for removed in ("test", "predict"):
        result = app_in_process(capsys, removed, "--config", str(ROOT / "configs/snake_dqn.yaml"))
        assert result.returncode == 2
        assert result.stderr.strip().splitlines()[-1].startswith("error: argument subcommand: invalid choice")


@pytest.mark.parametrize(
    ("flags", "env_seed"), [([], 0), (["--seed_everything", "3"], 3), (["--data.init_args.seed", "5"], 5)]
)
def test_seed_everything_seeds_the_environments_unless_their_seed_is_set_apart(flags, env_seed):
    from app.cli import build

    model, data = build(
        [str(ROOT / "configs/snake_dqn.yaml")],
        ["--seed_everything", "3", *flags] if flags[:1] == ["--data.init_args.seed"] else flags,
    )
    assert data.seed == env_seed


def test_a_reader_that_stopped_reading_ends_the_overview_quietly(tmp_path):
    # `python -m app --help | head -1`: a pipe with no reader left is exit status 1 and nothing on stderr, not a
    # BrokenPipeError traceback. (The overview imports nothing heavy: a fresh interpreter is cheap here.)
    read, write = os.pipe()
    os.close(read)  # as `head` that has taken its line and gone
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app", "--help"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (1, "")


@pytest.mark.parametrize("prog", ["python -m app", "lightrl"])
def test_a_commands_help_names_the_command_as_it_was_run(prog, capsys):
    with pytest.raises(SystemExit) as exited:
        dispatch(["fit", "--help"], prog=prog)
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} [options] fit ")


@pytest.mark.slow
def test_the_installed_lightrl_command_lists_its_commands_and_trains_cartpole(tmp_path):
    """The console script pip installs (pyproject.toml's ``[project.scripts]``), as a user runs it: from a folder that
    is not the checkout, with the shipped config's logger and run folder."""
    from app.__main__ import COMMANDS

    script = Path(sys.executable).parent / "lightrl"
    assert script.is_file(), "no lightrl command beside this Python: pip install -e ."
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # the installed package
    overview = subprocess.run([script, "--help"], cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert overview.returncode == 0 and overview.stdout.startswith("usage: lightrl <command>")
    for name, (_, text) in COMMANDS.items():
        assert f"  {name}  " in overview.stdout and text in overview.stdout
    config = ROOT / "configs" / "gym" / "cartpole_ppo.yaml"
    fit_ = [script, "fit", "--config", config, "--trainer.max_steps", "40", "--trainer.enable_progress_bar", "false"]
    done = subprocess.run(fit_, cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "runs" / "gym_cartpole_ppo" / "version_0"
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 40 and (run / "config.yaml").is_file() and (run / "metrics.csv").is_file()


@pytest.mark.parametrize(("flags", "flushed"), [([], True), (["--flush_denormal", "false"], False)])
def test_subnormal_floats_are_flushed_to_zero_unless_the_flag_keeps_them(flags, flushed):
    """``--flush_denormal`` (default true) sets the CPU's flush-to-zero modes for the run: a float32 subnormal then
    reads as zero in arithmetic; with ``false`` it keeps its value."""
    from app.cli import build

    subnormal = torch.tensor([1e-39])
    try:
        build([str(ROOT / "configs/gym/pendulum_sac.yaml")], flags)
        assert ((subnormal * 1.0).item() == 0.0) == flushed
    finally:
        torch.set_flush_denormal(False)  # the test process's other tests run with IEEE subnormals

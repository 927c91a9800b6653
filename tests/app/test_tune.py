"""``python -m app tune``: an Optuna search over a config, pruned on its evaluations, resumable, its best a config."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest
import yaml

from app.cli import main
from app.tune import check_space, read_space
from tests.app.test_cli import run_app
from tests.helpers import ROOT, app_in_process, evaluated_chain_config, write_config

LR = "model.init_args.optimizer.lr"
EPOCHS = "data.init_args.update_epochs"
# 1e-12 leaves the policy where it started: the trial that draws it evaluates no better than at frame 0.
SPACE = {LR: {"type": "categorical", "choices": [0.003, 1.0e-12]}, EPOCHS: {"type": "categorical", "choices": [1, 2]}}
MEDIAN_AFTER_ONE = ["--startup-trials", "1"]


def tune_config(tmp_path, max_steps=60):
    config = evaluated_chain_config("ppo", every_n_frames=200, max_steps=max_steps)
    (tmp_path / "configs").mkdir(exist_ok=True)
    space = tmp_path / "configs" / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE, sort_keys=False))
    return write_config(config, tmp_path / "configs" / "chain.yaml"), space


def queue(out, *values):
    """Create the study the command will load, with these trials' values queued (Optuna runs queued ones first)."""
    out.mkdir(parents=True)
    study = optuna.create_study(storage=f"sqlite:///{out / 'study.db'}", study_name="chain", direction="maximize")
    for lr, epochs in values:
        study.enqueue_trial({LR: lr, EPOCHS: epochs})


def load(out):
    return optuna.load_study(study_name="chain", storage=f"sqlite:///{out / 'study.db'}")


@pytest.mark.slow
def test_search_prunes_a_poor_trial_its_best_config_runs_and_a_stopped_search_resumes(tmp_path, monkeypatch):
    # Trials of 400 updates (a few seconds each): the search reads a running trial's evaluations twice a second, so the
    # poor trial must still be training when its first ones are read (a trial of 60 updates ends within a second).
    config, space = tune_config(tmp_path, max_steps=400)
    work = tmp_path / "work"  # a folder that is neither the checkout nor the config's
    out = work / "runs" / "chain_tune"
    queue(out, (0.003, 2), (0.003, 1), (1.0e-12, 1))
    args = ("tune", "--config", str(config), "--space", str(space), "--parallel", "2", *MEDIAN_AFTER_ONE)
    result = run_app(*args, "--trials", "3", cwd=work)
    assert result.returncode == 0, result.stderr
    trials = load(out).trials
    states = optuna.trial.TrialState
    assert [trial.state for trial in trials] == [states.COMPLETE] * 2 + [states.PRUNED]
    assert trials[2].params[LR] == 1.0e-12 and "trial 2: pruned at" in result.stdout
    # Evaluations are the intermediate values, at their scheduled frame counts; the objective is the last one.
    assert set(trials[0].intermediate_values) >= {0, 200, 400} and trials[0].value == 1.0
    # The pruned trial stopped early: fewer evaluations than the completed ones, a checkpoint where it stopped.
    assert max(trials[2].intermediate_values) < max(trials[0].intermediate_values)
    assert (out / "trial_2" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    table = (out / "trials.md").read_text()
    assert "| 2 | pruned | 1e-12 | 1 |" in table and "| 0 | complete | 0.003 | 2 | 1 |" in table
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best == {"model": {"init_args": {"optimizer": {"lr": 0.003}}}, "data": {"init_args": {"update_epochs": 2}}}
    assert "python -m app fit --config" in (out / "best.yaml").read_text().splitlines()[1]
    monkeypatch.chdir(work)  # the best config's fit, in this process (the search's trials each had their own)
    main(["fit", "--config", str(config), "--config", str(out / "best.yaml"), "--trainer.max_steps", "4"])
    ran = yaml.safe_load((work / "runs" / "chain" / "version_0" / "config.yaml").read_text())
    assert ran["model"]["init_args"]["optimizer"]["lr"] == 0.003 and ran["data"]["init_args"]["update_epochs"] == 2
    assert ran["model"]["init_args"]["network"]["hidden_sizes"] == [32]  # the rest from the config

    # The same search killed while trial 3 ran: the trial is left RUNNING in the study, its process gone. The same
    # command, one trial more, runs it again and keeps the finished ones (the search above is the stopped one).
    logs = {number: (out / f"trial_{number}.log").stat().st_mtime_ns for number in range(3)}
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    study = load(out)
    study.enqueue_trial({LR: 0.003, EPOCHS: 2})  # trial 0's values: run again, it completes as trial 0 did
    trial = study.ask()
    trial.suggest_categorical(LR, [0.003, 1.0e-12])
    trial.suggest_categorical(EPOCHS, [1, 2])
    trial.set_user_attr("pid", gone.pid)
    again = run_app(*args, "--trials", "4", cwd=work)
    assert again.returncode == 0, again.stderr
    assert "trial 3: left running by a stopped search; it runs again" in again.stdout
    assert not any(f"trial {number}:" in again.stdout for number in range(3))  # finished trials are kept
    assert {number: (out / f"trial_{number}.log").stat().st_mtime_ns for number in range(3)} == logs
    trials = load(out).trials
    assert [t.state for t in trials[3:]] == [states.FAIL, states.COMPLETE]
    assert trials[4].params == trials[3].params and trials[4].user_attrs["rerun_of"] == 3  # the stopped one, again


@pytest.mark.parametrize(
    ("space", "args", "message"),
    [
        (
            {"model.init_args.gama": {"type": "float", "low": 0.9, "high": 0.99}},
            [],
            "--space space.yaml: model.init_args.gama is not an option of modules.ppo.PPO; did you mean gamma?",
        ),
        (
            {LR: {"type": "gaussian", "low": 0.1, "high": 0.2}},
            [],
            f"--space space.yaml: {LR}: unknown type 'gaussian'; choose float, int or categorical",
        ),
        (
            {LR: {"type": "float", "low": 0.1, "high": 0.01}},
            [],
            f"--space space.yaml: {LR}: low must be < high, got low 0.1 and high 0.01",
        ),
        (SPACE, ["--trials", "0"], "--trials must be >= 1, got 0"),
        (SPACE, ["--space", "missing.yaml"], "--space missing.yaml: no such file"),
    ],
)
def test_bad_tuning_input_is_one_line(tmp_path, capsys, monkeypatch, space, args, message):
    monkeypatch.chdir(tmp_path)
    config, _ = tune_config(tmp_path)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    command = ["tune", "--config", str(config), "--space", "space.yaml", "--trials", "2", *args]
    result = app_in_process(capsys, *command)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"python -m app tune: error: {message}"
    assert not (tmp_path / "runs").exists()


def test_missing_optuna_is_one_line_with_the_install_command(tmp_path, capsys, monkeypatch):
    config, space = tune_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError, as where it is not installed
    result = app_in_process(capsys, "tune", "--config", str(config), "--space", str(space), "--trials", "2")
    assert result.returncode == 2
    checkout = os.path.relpath(ROOT, tmp_path)  # the command installs this checkout's extra, from where it ran
    assert result.stderr.strip().splitlines()[-1] == (
        f'python -m app tune: error: the optuna package is not installed; pip install -e "{checkout}[tune]" (or pip '
        "install optuna)"
    )


def test_shipped_snake_space_fits_its_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dimensions = read_space(str(ROOT / "configs" / "tune" / "snake_ppo_space.yaml"))
    assert len(dimensions) >= 5
    check_space([str(ROOT / "configs" / "snake_ppo.yaml")], dimensions, [])  # both corners build

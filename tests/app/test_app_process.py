"""The tests' forked commands (``tests/app_process.py``) against ``python -m app`` in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.app_process import run_app_process
from tests.helpers import ROOT


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ("--help",),  # the overview, printed before anything is imported
        ("fit", "--config", "configs/gym/cartpole_ppo.yaml", "--trainer.max_steps", "-3"),  # one line, status 2
    ],
    ids=["overview", "a refused value"],
)
def test_a_forked_command_prints_and_exits_as_a_fresh_interpreter_does(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fresh = subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    forked = run_app_process(*args, cwd=ROOT, env=env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == (0 if args == ("--help",) else 2), fresh.stderr

"""README's "Adding an environment", run as written: its environment file and config are taken from the README,
put in a temporary folder, checked against the environment contract and fitted through ``python -m app fit``."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from tests.app.test_cli import run_app
from tests.envs import test_env_contract as contract
from tests.helpers import readme_code_blocks


def readme_example() -> dict[str, str]:
    """The section's code blocks by language: ``python`` (the environment file) and ``yaml`` (its config)."""
    blocks = readme_code_blocks("Adding an environment")
    assert {"python", "yaml"} <= blocks.keys()
    return blocks


@pytest.mark.slow
def test_the_readme_environment_follows_the_contract_and_fits(tmp_path, monkeypatch):
    example = readme_example()
    (tmp_path / "corridor.py").write_text(example["python"])
    (tmp_path / "corridor_dqn.yaml").write_text(example["yaml"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "corridor", raising=False)
    try:
        env_class = importlib.import_module("corridor").CorridorEnv
        contract.test_the_constructor_takes_the_batch_and_named_options(env_class)
        contract.test_specs_match_what_the_environment_returns(env_class)
        contract.test_the_same_seed_and_a_rebuild_from_init_kwargs_play_the_same_episodes(env_class)
        contract.test_state_dict_continues_exactly(env_class)
    finally:
        sys.modules.pop("corridor", None)

    # As the README runs it (PYTHONPATH=. in the example's folder), shortened to a few updates.
    result = run_app(
        "fit", "--config", "corridor_dqn.yaml", "--trainer.max_steps", "5", cwd=tmp_path, pythonpath=(tmp_path,)
    )
    assert result.returncode == 0, result.stderr
    (checkpoint,) = (tmp_path / "runs" / "corridor" / "checkpoints").glob("*.ckpt")
    assert torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"] == 5

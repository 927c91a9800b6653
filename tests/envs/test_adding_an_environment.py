"""The docs' "Adding an environment" (docs/extending/environment.md), run as written: its environment file and config
are taken from the page, put in a temporary folder, checked against the environment contract and fitted through
``python -m app fit``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from tests.app.test_cli import run_app
from tests.envs import test_env_contract as contract
from tests.helpers import doc_code_blocks


def docs_example() -> dict[str, str]:
    """The page's example by language: ``python`` (the environment file) and ``yaml`` (its config)."""
    blocks = doc_code_blocks("extending/environment.md", "A complete example")
    assert {"python", "yaml"} <= blocks.keys()
    return blocks


@pytest.mark.slow
def test_the_documented_environment_follows_the_contract_and_fits(tmp_path, monkeypatch):
    example = docs_example()
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

    fits_as_the_docs_run_it(tmp_path, "corridor_dqn.yaml")


def fits_as_the_docs_run_it(folder: Path, config: str, updates: int = 5) -> None:
    """``PYTHONPATH=. python -m app fit --config <config>`` in the example's folder, shortened to a few updates, then
    continued with ``--ckpt_path last``; the example's config writes its checkpoints under ``runs/corridor``."""
    for steps, resume in ((updates, ()), (2 * updates, ("--ckpt_path", "last"))):
        args = ("fit", "--config", config, "--trainer.max_steps", str(steps), *resume)
        result = run_app(*args, cwd=folder, pythonpath=(folder,))
        assert result.returncode == 0, result.stderr
        (checkpoint,) = (folder / "runs" / "corridor").glob("**/checkpoints/last.ckpt")
        assert torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"] == steps

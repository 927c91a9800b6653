"""README's "Adding an agent", run as written: its agent file and config are taken from the README, put in a
temporary folder and fitted through ``python -m app fit``, the agent named by its ``class_path``."""

from __future__ import annotations

import re

import pytest
import torch

from tests.app.test_cli import run_app
from tests.helpers import ROOT


def readme_example() -> dict[str, str]:
    """The section's code blocks by language: ``python`` (the agent file) and ``yaml`` (its config)."""
    section = (ROOT / "README.md").read_text().split("\n## Adding an agent\n", 1)[1].split("\n## ", 1)[0]
    blocks = dict(re.findall(r"^```(\w+)\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL))
    assert {"python", "yaml"} <= blocks.keys()
    return blocks


@pytest.mark.slow
def test_the_readme_agent_fits_through_its_class_path(tmp_path):
    example = readme_example()
    (tmp_path / "qlearning.py").write_text(example["python"])
    (tmp_path / "chain_qlearning.yaml").write_text(example["yaml"])
    # As the README runs it (PYTHONPATH=. in the example's folder), shortened to a few updates.
    result = run_app(
        "fit", "--config", "chain_qlearning.yaml", "--trainer.max_steps", "5", cwd=tmp_path, pythonpath=(tmp_path,)
    )
    assert result.returncode == 0, result.stderr
    checkpoint = (
        tmp_path / "runs" / "qlearning" / "checkpoints" / "last.ckpt"
    )  # README: runs/qlearning/checkpoints/last.ckpt
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert saved["global_step"] == 5
    assert saved["hyper_parameters"]["hidden"] == 32
    # It trained: the weights moved from the ones the same seed starts with.
    first = run_app(
        "fit",
        "--config",
        "chain_qlearning.yaml",
        "--trainer.max_steps",
        "1",
        "--trainer.default_root_dir",
        "one",
        cwd=tmp_path,
        pythonpath=(tmp_path,),
    )
    assert first.returncode == 0, first.stderr
    one = tmp_path / "one" / "checkpoints" / "last.ckpt"
    later = torch.load(one, map_location="cpu", weights_only=False)["state_dict"]
    assert any(not torch.equal(value, later[key]) for key, value in saved["state_dict"].items())

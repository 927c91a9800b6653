"""The docs' "Adding an agent" (docs/extending/agent.md), run as written: its agent file and config are taken from
the page, put in a temporary folder and fitted through ``python -m app fit``, the agent named by its ``class_path``."""

from __future__ import annotations

import pytest
import torch

from tests.app.test_cli import run_app
from tests.helpers import doc_code_blocks


def docs_example() -> dict[str, str]:
    """The page's example by language: ``python`` (the agent file) and ``yaml`` (its config)."""
    blocks = doc_code_blocks("extending/agent.md", "A complete example")
    assert {"python", "yaml"} <= blocks.keys()
    return blocks


@pytest.mark.slow
def test_the_documented_agent_fits_through_its_class_path(tmp_path):
    example = docs_example()
    (tmp_path / "qlearning.py").write_text(example["python"])
    (tmp_path / "chain_qlearning.yaml").write_text(example["yaml"])
    # As the docs run it (PYTHONPATH=. in the example's folder), shortened to a few updates.
    result = run_app(
        "fit", "--config", "chain_qlearning.yaml", "--trainer.max_steps", "5", cwd=tmp_path, pythonpath=(tmp_path,)
    )
    assert result.returncode == 0, result.stderr
    checkpoint = (
        tmp_path / "runs" / "qlearning" / "checkpoints" / "last.ckpt"
    )  # the docs: runs/qlearning/checkpoints/last.ckpt
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

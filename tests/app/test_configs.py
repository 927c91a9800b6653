"""Every YAML in configs/ parses and instantiates against the current code (a config that drifts fails CI)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
import yaml

from app.cli import build
from datamodules.base import RLDataModule
from modules.base import RLModule
from tests.helpers import ROOT

AGENT_CONFIGS = sorted([*(ROOT / "configs").glob("*.yaml"), *(ROOT / "configs" / "gym").glob("*.yaml")])
PRESETS = sorted((ROOT / "configs" / "bench").glob("*.yaml"))


@pytest.mark.parametrize("config", AGENT_CONFIGS, ids=lambda path: str(path.relative_to(ROOT / "configs")))
def test_agent_config_instantiates(config, tmp_path, monkeypatch):
    if "envs.mettagrid" in config.read_text():
        pytest.importorskip("mettagrid", reason='the metta extra: pip install -e ".[metta]"')
    if "LunarLander" in config.read_text():
        pytest.importorskip("Box2D", reason='the gym extra: pip install -e ".[gym]"')
    monkeypatch.chdir(tmp_path)  # relative output folders land here, if anything is written at all
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # configs name other configs from the repository's root
    model, data = build([str(config)])
    assert isinstance(model, pl.LightningModule) and isinstance(data, pl.LightningDataModule)
    # Agents train on an RL data module; supervised stages (behaviour cloning) on a dataset's.
    assert isinstance(model, RLModule) == isinstance(data, RLDataModule)
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("config", [*AGENT_CONFIGS, *PRESETS], ids=lambda path: str(path.relative_to(ROOT / "configs")))
def test_no_shipped_config_stops_on_wall_time_so_a_slower_day_trains_the_same_policy(config):
    # A run stopped by `max_time` ends wherever the day's speed took it (issue 48): every config stops on updates or
    # epochs, and a time-bounded run is a flag away (--trainer.max_time).
    trainer = yaml.safe_load(config.read_text()).get("trainer", {})
    assert trainer.get("max_time") is None, f"{config.name} stops on wall time"
    if config in AGENT_CONFIGS:
        assert trainer["max_steps"] > 0 or trainer.get("max_epochs", 0) > 0


@pytest.mark.parametrize("preset", PRESETS, ids=lambda path: path.name)
def test_bench_preset_composes_with_its_agent_config(preset, tmp_path, monkeypatch):
    if "accelerator: gpu" in preset.read_text() and not torch.cuda.is_available():
        pytest.skip("a GPU preset: its trainer needs a GPU (tests/app/test_presets.py builds it with a CPU trainer)")
    monkeypatch.chdir(tmp_path)
    # A preset names the agent config it is meant for in its first lines (`--config configs/<agent>.yaml`).
    header = preset.read_text().split("\n", 4)[:4]
    agents = [word for line in header for word in line.split() if word.startswith("configs/") and "bench" not in word]
    assert agents, f"{preset.name} does not say which agent config it composes with"
    model, data = build([str(ROOT / agents[0]), str(preset)])
    assert isinstance(model, RLModule) and isinstance(data, RLDataModule)

"""The GPU presets and every preset combination the documentation names build on the CPU, as the CLI builds them.

Each GPU preset (``configs/bench/gpu_<name>.yaml``) composes on one shipped config. Building the pair with the
trainer moved to the CPU (``--trainer.accelerator cpu``) runs everything ``python -m app fit`` does before training:
the config's parsing (an unknown key is refused), the data module's and model's constructors (their validation: a
rollout that a minibatch does not divide, Mario's data module refusing ``num_envs``), the model's check of its data
module and the trainer's construction (the preset's precision). The presets' ``device: auto`` resolves to the CPU
while no trainer is attached, so nothing here needs CUDA, and nothing is collected or trained: the sizes stay the
presets' own (a data module probes its specs with one environment, whatever ``num_envs`` says).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from app.cli import build
from datamodules.base import RLDataModule
from modules.base import RLModule
from tests.helpers import ROOT

BENCH = ROOT / "configs" / "bench"

#: each GPU preset and the shipped config it composes on
GPU_PRESETS = {
    "gpu_snake_dqn.yaml": "snake_dqn.yaml",
    "gpu_snake_ppo.yaml": "snake_ppo.yaml",
    "gpu_pirl.yaml": "pirl_vehicle.yaml",
    "gpu_racing_sac.yaml": "racing_sac.yaml",
    "gpu_metta.yaml": "metta_ultra_fast.yaml",
    "gpu_mario.yaml": "mario_ddqn.yaml",
}

#: what the documentation runs: README, BENCHMARKS, the docs' pages and the presets' own headers
DOCUMENTS = [
    *(path for path in (ROOT / "README.md", ROOT / "BENCHMARKS.md") if path.is_file()),
    *sorted((ROOT / "docs").glob("**/*.md")),
    *sorted(BENCH.glob("*.yaml")),
]

# `--config A --config B ...`, possibly wrapped over lines (and a YAML header's `#`) as the documents wrap them.
_COMBINATION = re.compile(r"(?:--config(?:\s|#)+configs/[\w/.-]+\.yaml(?:\s|#)*){2,}")
_CONFIG = re.compile(r"configs/[\w/.-]+\.yaml")

# Runs on a CPU, one thread; the presets' other settings (precision, sizes, devices: auto) stay as written.
ON_CPU = ("--threads", "1", "--trainer.accelerator", "cpu", "--trainer.devices", "1")


def documented_combinations() -> list[tuple[str, ...]]:
    """Every `--config configs/... --config configs/bench/...` combination the documents run, first mention first."""
    found: dict[tuple[str, ...], None] = {}
    for document in DOCUMENTS:
        for match in _COMBINATION.finditer(document.read_text()):
            configs = tuple(_CONFIG.findall(match.group(0)))
            if any(config.startswith("configs/bench/") for config in configs):
                found[configs] = None
    return list(found)


def combinations() -> list[tuple[str, ...]]:
    """The GPU presets on their configs, alone and with the throughput preset after them (how a GPU run is
    benchmarked), then every combination the documents name."""
    pairs: dict[tuple[str, ...], None] = {}
    for preset, config in GPU_PRESETS.items():
        pairs[(f"configs/{config}", f"configs/bench/{preset}")] = None
        pairs[(f"configs/{config}", f"configs/bench/{preset}", "configs/bench/throughput.yaml")] = None
    # SAC from scratch on the GPU (benchmarks/gpu_suite.py runs it: no BC stage before the timed run)
    pairs[("configs/racing_sac.yaml", "configs/bench/gpu_racing_sac.yaml", "configs/bench/sac_scratch.yaml")] = None
    pairs.update(dict.fromkeys(documented_combinations()))
    return list(pairs)


def skip_without_packages(configs: tuple[str, ...]) -> None:
    text = "".join((ROOT / config).read_text() for config in configs)
    if "envs.mettagrid" in text:
        pytest.importorskip("mettagrid", reason='the metta extra: pip install -e ".[metta]"')
    if "envs.mario" in text:
        pytest.importorskip("nes_py", reason='the mario extra: pip install -e ".[mario]"')


def build_on_cpu(configs: tuple[str, ...], tmp_path: Path, monkeypatch, *overrides: str):
    """``build`` of the composed configs with the trainer on the CPU; a refused option fails the test with the CLI's
    own error line (the parser exits with status 2 after printing it)."""
    monkeypatch.chdir(tmp_path)  # relative output folders land here, if anything is written at all
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # configs name other configs from the repository's root
    return build(list(configs), [*ON_CPU, *overrides])


def test_each_gpu_preset_is_tested_and_names_its_config():
    assert sorted(path.name for path in BENCH.glob("gpu*.yaml")) == sorted(GPU_PRESETS)
    for preset, config in GPU_PRESETS.items():
        header = (BENCH / preset).read_text().split("\n", 4)[:4]
        command = f"python -m app fit --config configs/{config} --config configs/bench/{preset}"
        assert any(command in line for line in header), f"{preset}'s first lines do not show `{command}`"


def test_the_documents_name_their_combinations():
    named = documented_combinations()
    # the ones the docs and the benchmark results run (a parser that found none would make the test below vacuous)
    for combination in [
        ("configs/snake_ppo.yaml", "configs/bench/throughput.yaml"),
        ("configs/racing_sac.yaml", "configs/bench/sac_scratch.yaml"),
        ("configs/mario_ddqn.yaml", "configs/bench/mario_cpu.yaml"),
        ("configs/snake_ppo.yaml", "configs/bench/throughput.yaml", "configs/bench/ppo_4096.yaml"),
    ]:
        assert combination in named
    for combination in named:
        for config in combination:
            assert (ROOT / config).is_file(), f"a document runs {config}, which does not exist"


@pytest.mark.parametrize("configs", combinations(), ids=lambda configs: "+".join(Path(c).stem for c in configs))
def test_preset_combination_builds_on_the_cpu(configs, tmp_path, monkeypatch, capsys):
    skip_without_packages(configs)
    try:
        model, data = build_on_cpu(configs, tmp_path, monkeypatch)
    except SystemExit as exit_:
        pytest.fail(f"{' + '.join(configs)} is refused (exit {exit_.code}): {capsys.readouterr().err.strip()}")
    assert isinstance(model, RLModule) and isinstance(data, RLDataModule)
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("preset", sorted(GPU_PRESETS))
def test_gpu_preset_targets_one_gpu_with_data_on_its_device(preset):
    settings = yaml.safe_load((BENCH / preset).read_text())
    assert settings["trainer"]["accelerator"] == "gpu" and settings["trainer"]["devices"] == 1
    assert settings["trainer"]["precision"] in ("bf16-mixed", "32-true")
    # the trainer's device, which is the CPU in the test above and the GPU in a GPU run
    assert settings["data"]["init_args"]["device"] == "auto"


@pytest.mark.parametrize("preset", sorted(GPU_PRESETS))
def test_gpu_preset_says_why_for_every_setting(preset):
    # House style: every value set carries a comment (a mapping's own key, `init_args:` or `trainer:`, needs none).
    for number, line in enumerate((BENCH / preset).read_text().splitlines(), 1):
        code = line.split("#", 1)[0].strip()
        if not code or code.endswith(":") or code.startswith("- class_path:"):
            continue
        assert "#" in line, f"{preset}:{number} sets {code!r} without saying why"


@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        (["--data.init_args.num_envs", "4096"], "num_envs"),  # what the old generic GPU preset set
        (["--model.init_args.compiled", "true"], "compiled"),  # a misspelt key
        (["--data.init_args.collection.workers", "0"], "workers must be >= 1"),  # a value the constructor rejects
    ],
)
def test_a_refused_setting_fails_the_build(setting, refusal, tmp_path, monkeypatch, capsys):
    configs = ("configs/mario_ddqn.yaml", "configs/bench/gpu_mario.yaml")
    skip_without_packages(configs)
    with pytest.raises(SystemExit):
        build_on_cpu(configs, tmp_path, monkeypatch, *setting)
    assert refusal in capsys.readouterr().err

"""PolicyExport: traced modules from a real fit, their metadata and benchmark, the loader and its fallbacks, the Neuron
path (with a stand-in ``torch_neuronx``), AOTInductor, and the export from a checkpoint alone."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import callbacks.export as export
from callbacks.export import ExportMismatchError, PolicyExport, export_policy
from callbacks.traced_policy import TracedPolicy
from modules.networks import observation_mlp
from tests.helpers import chain_config, fit, write_config

FIT_SIZES = [8, 32]
SEED_SIZES = [512, 1024, 2048]
CHAIN_SHAPE = (6,)  # the chain env's one-hot observation (length 6 in chain_config), uint8


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def seed_mlp() -> nn.Sequential:
    """The PIRL seed's policy network: 16 → 32 → 32 → 32 → 25, Tanh hidden layers, Sigmoid output."""
    torch.manual_seed(0)
    widths = [16, 32, 32, 32]
    layers: list[nn.Module] = []
    for n_in, n_out in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(n_in, n_out), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(32, 25), nn.Sigmoid()).eval()


def assert_close_to_eager(policy, network: nn.Module, observation: torch.Tensor) -> None:
    # Not bit-equal: a padded batch runs other matrix-multiply kernels than the eager one (about 3e-8 apart).
    with torch.inference_mode():
        expected = network(observation)
    actual = policy(observation)
    assert actual.shape == expected.shape
    assert (actual - expected).abs().max().item() <= 1e-6


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 50-update DQN fit on the chain with PolicyExport at batch sizes 8 and 32: (cli, export folder)."""
    root = tmp_path_factory.mktemp("fit")
    config = chain_config("dqn", root / "run")
    config["trainer"]["max_steps"] = 50
    config["trainer"]["callbacks"].append(
        {
            "class_path": "callbacks.export.PolicyExport",
            "init_args": {"batch_sizes": FIT_SIZES, "backend": "torchscript", "benchmark_seconds": 0.05},
        }
    )
    cli = fit(write_config(config, root / "chain_dqn.yaml"))
    return cli, root / "run" / "export"


@pytest.fixture(scope="module")
def seed_export(tmp_path_factory):
    """The seed's MLP exported with TorchScript at its three batch sizes: (network, folder, metadata)."""
    network = seed_mlp()
    folder = tmp_path_factory.mktemp("seed")
    metadata = export_policy(
        network, (16,), torch.float32, SEED_SIZES, folder, backend="torchscript", benchmark_seconds=0.05
    )
    return network, folder, metadata


# ------------------------------------------------------------------------------------------- after a real fit
def test_fit_writes_checked_artifacts_with_matching_metadata(trained):
    cli, folder = trained
    callback = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PolicyExport))
    metadata = json.loads((folder / "export.json").read_text())
    assert callback.metadata["artifacts"] == metadata["artifacts"]
    assert [a["batch_size"] for a in metadata["artifacts"]] == FIT_SIZES
    for artifact, batch in zip(metadata["artifacts"], FIT_SIZES, strict=True):
        path = folder / f"policy_b{batch}.pt"
        assert artifact["file"] == path.name and artifact["backend"] == "torchscript"
        assert artifact["sha256"] == file_sha256(path)
        assert artifact["input"] == {"shape": [batch, *CHAIN_SHAPE], "dtype": "uint8"}
        assert artifact["output"] == {"shape": [batch, 2], "dtype": "float32"}
        assert 0 <= artifact["max_abs_diff"] <= 1e-6
    assert metadata["eager"]["format"] == "torch.export" and metadata["eager"]["dynamic_batch"]
    assert metadata["eager"]["sha256"] == file_sha256(folder / "eager.pt2")
    assert metadata["torch"] == torch.__version__ and metadata["machine"]["torch_threads"] == 1
    assert metadata["parameters"] == sum(p.numel() for p in cli.model.q_network.parameters())

    # The files hold the trained weights, and load with plain torch: no lightrl code needed.
    q_network = cli.model.q_network.eval()
    observation = torch.randint(0, 2, (32, *CHAIN_SHAPE), dtype=torch.uint8)
    with torch.inference_mode():
        expected = q_network(observation)
        traced = torch.jit.load(str(folder / "policy_b32.pt"))(observation)
        eager = torch.export.load(str(folder / "eager.pt2")).module()(observation[:5])
    assert (traced - expected).abs().max().item() <= 1e-6
    assert (eager - expected[:5]).abs().max().item() <= 1e-6
    assert cli.model.device.type == "cpu" and q_network[1][0].weight.requires_grad  # the module itself is untouched


def test_fit_benchmark_report_has_a_row_per_batch_size(trained):
    _, folder = trained
    report = json.loads((folder / "export_benchmark.json").read_text())
    assert [row["batch_size"] for row in report["rows"]] == FIT_SIZES
    for row in report["rows"]:
        assert row["eager_samples_per_s"] > 0 and row["traced_samples_per_s"] > 0
        assert row["speedup"] == pytest.approx(row["traced_samples_per_s"] / row["eager_samples_per_s"])
        assert row["seed_cpu_samples_per_s"] is None  # the seed measured 512, 1024 and 2048 only
    assert report["machine"]["torch_threads"] == 1 and report["seconds_per_figure"] == 0.05
    markdown = (folder / "export_benchmark.md").read_text()
    assert "| batch | eager samples/s | traced samples/s | speedup | seed CPU (4 cores) | seed Neuron |" in markdown
    assert "torch threads: **1**" in markdown
    for row in report["rows"]:
        assert f"| {row['batch_size']} | {row['eager_samples_per_s'] / 1e6:.2f}M |" in markdown
        if row["speedup"] <= 1:
            assert f"At batch {row['batch_size']} the traced module (torchscript) is not faster" in markdown


# ------------------------------------------------------------------------------------------- the seed's network
def test_seed_mlp_matches_eager_at_its_batch_sizes_and_the_report_shows_the_seed(seed_export):
    network, folder, metadata = seed_export
    assert metadata["parameters"] == 3481
    assert [a["batch_size"] for a in metadata["artifacts"]] == SEED_SIZES
    assert all(a["backend"] == "torchscript" and a["max_abs_diff"] <= 1e-6 for a in metadata["artifacts"])
    assert [a["output"]["shape"] for a in metadata["artifacts"]] == [[n, 25] for n in SEED_SIZES]
    rows = metadata["benchmark"]["rows"]
    assert [(r["seed_cpu_samples_per_s"], r["seed_neuron_samples_per_s"], r["seed_speedup"]) for r in rows] == [
        (2.3e6, 3.2e6, 1.37),
        (3.6e6, 6.1e6, 1.71),
        (5.8e6, 10.8e6, 1.87),
    ]
    markdown = (folder / "export_benchmark.md").read_text()
    assert "| 2.30M | 3.20M | 1.37x |" in markdown and "| 5.80M | 10.80M | 1.87x |" in markdown
    assert "this network is that size" in markdown


def test_loader_pads_and_splits_any_batch_size(seed_export, caplog):
    network, folder, _ = seed_export
    with caplog.at_level(logging.INFO, logger="lightrl.export"):
        policy = TracedPolicy.load(folder)
    assert policy.backend_in_use == "torchscript" and policy.batch_sizes == tuple(SEED_SIZES)
    calls: list[int] = []
    for size, module in list(policy.modules.items()):
        policy.modules[size] = lambda x, module=module, size=size: calls.append(size) or module(x)
    routes = {1: [512], 511: [512], 512: [512], 700: [1024], 5000: [2048, 2048, 1024]}
    generator = torch.Generator().manual_seed(1)
    for n, expected_route in routes.items():
        calls.clear()
        observation = torch.rand(n, 16, generator=generator) * 2 - 1
        assert_close_to_eager(policy, network, observation)
        assert calls == expected_route, n
    assert policy.act(observation).equal(network(observation).argmax(-1))
    assert policy(observation[0]).shape == (25,)  # one observation, no batch dim
    records = [r for r in caplog.records if r.name == "lightrl.export"]
    assert len(records) == 1 and "running torchscript modules for batch sizes [512, 1024, 2048]" in records[0].message
    with pytest.raises(TypeError, match="dtype torch.float64"):
        policy(observation.double())


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_loader_falls_back_to_eager_when_an_artifact_is_missing_or_corrupt(trained, tmp_path, caplog, damage):
    cli, source = trained
    folder = shutil.copytree(source, tmp_path / "export")
    if damage == "missing":
        (folder / "policy_b32.pt").unlink()
    else:
        data = bytearray((folder / "policy_b32.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (folder / "policy_b32.pt").write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="lightrl.export"):
        policy = TracedPolicy.load(folder)
        for n in (1, 8, 100):
            assert_close_to_eager(policy, cli.model.q_network.eval(), torch.randint(0, 2, (n, 6), dtype=torch.uint8))
    assert policy.backend_in_use == "eager" and policy.batch_sizes == ()
    records = [r for r in caplog.records if r.name == "lightrl.export"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING  # logged once, not per call
    assert "running the eager fallback eager.pt2 on CPU" in records[0].message
    assert ("is missing" if damage == "missing" else "does not match its sha256") in records[0].message


def test_loader_says_so_when_neither_path_loads(trained, tmp_path):
    folder = shutil.copytree(trained[1], tmp_path / "export")
    (folder / "policy_b8.pt").unlink()
    (folder / "eager.pt2").write_bytes(b"truncated")
    with pytest.raises(RuntimeError, match=r"neither the traced modules \(.*policy_b8.pt is missing\) nor the eager"):
        TracedPolicy.load(folder)


def test_eager_fallback_is_torchscript_when_torch_export_fails(tmp_path, monkeypatch):
    network = observation_mlp(CHAIN_SHAPE, [16], 3).eval()

    def refuse(*args, **kwargs):
        raise RuntimeError("data-dependent control flow")

    monkeypatch.setattr(torch.export, "export", refuse)
    for stale in ("policy_b999.pt", "eager.pt2"):  # an earlier export into the same folder
        (tmp_path / stale).write_bytes(b"old")
    metadata = export_policy(network, CHAIN_SHAPE, torch.uint8, [4], tmp_path, "torchscript", benchmark=False)
    assert metadata["eager"]["format"] == "torchscript" and metadata["eager"]["file"] == "eager.pt"
    assert sorted(p.name for p in tmp_path.glob("*.pt*")) == ["eager.pt", "policy_b4.pt"]
    assert "data-dependent control flow" in metadata["eager"]["export_error"]
    (tmp_path / "policy_b4.pt").unlink()
    policy = TracedPolicy.load(tmp_path)
    assert policy.backend_in_use == "eager"
    assert_close_to_eager(policy, network, torch.randint(0, 2, (9, 6), dtype=torch.uint8))


# ------------------------------------------------------------------------------------------- Neuron, stand-in
def fake_neuronx(offset: float = 0.0) -> tuple[types.ModuleType, list[dict]]:
    """A ``torch_neuronx`` whose ``trace`` records its calls and returns a TorchScript trace (plus ``offset``)."""
    calls: list[dict] = []

    def trace(func, example_inputs, **kwargs):
        calls.append({"shape": tuple(example_inputs.shape), "dtype": example_inputs.dtype, **kwargs})
        target = func if offset == 0 else nn.Sequential(func, Shift(offset))
        return torch.jit.trace(target, example_inputs)

    module = types.ModuleType("torch_neuronx")
    module.trace = trace
    return module, calls


class Shift(nn.Module):
    def __init__(self, offset: float) -> None:
        super().__init__()
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset


def test_neuron_path_traces_each_batch_size_at_its_exact_shape(tmp_path, monkeypatch, caplog):
    fake, calls = fake_neuronx()
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    network = observation_mlp(CHAIN_SHAPE, [16], 3).eval()
    metadata = export_policy(network, CHAIN_SHAPE, torch.uint8, [16, 4], tmp_path, benchmark=False)  # auto
    assert [(c["shape"], c["dtype"]) for c in calls] == [((4, 6), torch.uint8), ((16, 6), torch.uint8)]
    assert all(c["compiler_args"] == ["--auto-cast", "none"] for c in calls)  # fp32 on the device, not bf16
    assert [a["backend"] for a in metadata["artifacts"]] == ["neuron", "neuron"]
    assert all(a["max_abs_diff"] <= 1e-6 for a in metadata["artifacts"])

    assert TracedPolicy.load(tmp_path).backend_in_use == "neuron"
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # `import torch_neuronx` now fails
    with caplog.at_level(logging.WARNING, logger="lightrl.export"):
        policy = TracedPolicy.load(tmp_path)
    assert policy.backend_in_use == "eager"
    assert "torch_neuronx does not import" in caplog.text
    assert_close_to_eager(policy, network, torch.randint(0, 2, (7, 6), dtype=torch.uint8))


def test_neuron_output_off_by_more_than_the_tolerance_is_refused(tmp_path, monkeypatch):
    fake, calls = fake_neuronx(offset=1e-3)  # what bf16 auto-casting would do to the outputs
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    network = observation_mlp(CHAIN_SHAPE, [16], 3).eval()
    with pytest.raises(ExportMismatchError, match=r"at batch 8 .*neuron by up to 0\.001.*tolerance 1e-06"):
        export_policy(network, CHAIN_SHAPE, torch.uint8, [8], tmp_path, "neuron", benchmark=False)
    assert len(calls) == 1 and not (tmp_path / "export.json").exists()


# ------------------------------------------------------------------------------------------- portable backends
@pytest.mark.skipif(
    not any(shutil.which(compiler) for compiler in ("g++", "c++", "clang++")), reason="AOTInductor needs a C++ compiler"
)
def test_aot_backend_compiles_checks_and_loads_and_auto_keeps_the_faster(tmp_path):
    network = observation_mlp(CHAIN_SHAPE, [16], 3).eval()
    metadata = export_policy(network, CHAIN_SHAPE, torch.uint8, [16], tmp_path, "aot", benchmark=False)
    (artifact,) = metadata["artifacts"]
    assert artifact["backend"] == "aot" and artifact["file"] == "policy_b16.pt2"
    assert artifact["sha256"] == file_sha256(tmp_path / "policy_b16.pt2") and artifact["max_abs_diff"] <= 1e-6
    policy = TracedPolicy.load(tmp_path)
    assert policy.backend_in_use == "aot"
    for n in (5, 16, 40):
        assert_close_to_eager(policy, network, torch.randint(0, 2, (n, 6), dtype=torch.uint8))

    # `auto` compiles and times both portable backends (at the same shape, so AOT now hits the compile cache).
    metadata = export_policy(network, CHAIN_SHAPE, torch.uint8, [16], tmp_path / "auto", "auto", benchmark_seconds=0.05)
    (artifact,) = metadata["artifacts"]
    rates = artifact["choice"]["samples_per_s"]
    assert set(rates) == {"torchscript", "aot"} and min(rates.values()) > 0
    assert artifact["backend"] == max(rates, key=rates.get)
    markdown = (tmp_path / "auto" / "export_benchmark.md").read_text()
    assert f"- Batch 16: `auto` kept {artifact['backend']}, fastest in a 0.3 s measurement (torchscript" in markdown
    assert sorted(p.name for p in (tmp_path / "auto").glob("policy_b16.*")) == [artifact["file"]]  # loser removed
    assert TracedPolicy.load(tmp_path / "auto").backend_in_use == artifact["backend"]


def test_auto_without_a_compiler_keeps_torchscript_and_says_why(tmp_path, monkeypatch):
    compile_ = export._compile

    def no_compiler(network, example, backend, path):
        if backend == "aot":
            raise RuntimeError("Invalid cxx_compiler: g++ not found")
        compile_(network, example, backend, path)

    monkeypatch.setattr(export, "_compile", no_compiler)
    network = observation_mlp(CHAIN_SHAPE, [16], 3).eval()
    metadata = export_policy(network, CHAIN_SHAPE, torch.uint8, [4], tmp_path, "auto", benchmark=False)
    (artifact,) = metadata["artifacts"]
    assert artifact["backend"] == "torchscript"
    assert artifact["choice"]["reason"] == "the only backend that compiled and passed the check"
    assert artifact["choice"]["errors"] == {"aot": "RuntimeError: Invalid cxx_compiler: g++ not found"}


# ------------------------------------------------------------------------------------------- options and CLI
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_sizes": [0, 8]}, "--trainer.callbacks.init_args.batch_sizes must be positive integers, got [0, 8]"),
        ({"batch_sizes": []}, "--trainer.callbacks.init_args.batch_sizes must be positive integers, got []"),
        ({"backend": "tensorrt"}, "--trainer.callbacks.init_args.backend must be one of auto, neuron, torchscript"),
        ({"backend": "neuron"}, "--trainer.callbacks.init_args.backend is neuron but torch_neuronx does not import"),
        ({"check_batches": 0}, "--trainer.callbacks.init_args.check_batches must be >= 1, got 0"),
        ({"tolerance": -1.0}, "--trainer.callbacks.init_args.tolerance must be a finite number >= 0, got -1.0"),
        ({"benchmark_seconds": 0}, "--trainer.callbacks.init_args.benchmark_seconds must be > 0, got 0"),
    ],
)
def test_callback_options_are_validated_naming_the_flag(kwargs, message, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)
    with pytest.raises(ValueError) as error:
        PolicyExport(**kwargs)
    assert str(error.value).startswith(message)


def test_export_from_a_checkpoint_alone(trained, tmp_path, capsys):
    cli, _ = trained
    run = tmp_path / "runs" / "chain" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    # The run folder as LightningCLI leaves it: config.yaml beside checkpoints/, found from the checkpoint alone.
    # (With the logger off, as in this fixture, the CLI saves config.yaml into the checkpoint folder.)
    shutil.copy(Path(cli.trainer.default_root_dir) / "checkpoints" / "config.yaml", run / "config.yaml")
    shutil.copy(Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt", run / "checkpoints" / "last.ckpt")
    argv = ["--checkpoint", str(run / "checkpoints" / "last.ckpt"), "--batch-sizes", "4", "16"]
    argv += ["--backend", "torchscript", "--benchmark-seconds", "0.05", "--data.init_args.num_envs", "4"]
    metadata = export.main(argv)

    out = capsys.readouterr().out
    assert "batch 4: traced (torchscript" in out and "batch 16: traced (torchscript" in out
    assert "benchmarked (eager" in out
    assert [a["batch_size"] for a in metadata["artifacts"]] == [4, 16]
    assert metadata["machine"]["torch_threads"] == 1  # --threads default
    folder = run / "export"
    assert json.loads((folder / "export.json").read_text())["artifacts"] == metadata["artifacts"]
    report = json.loads((folder / "export_benchmark.json").read_text())
    assert report["command"] == ["python -m callbacks.export", *argv]
    policy = TracedPolicy.load(folder)
    assert_close_to_eager(policy, cli.model.q_network.eval(), torch.randint(0, 2, (21, 6), dtype=torch.uint8))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "{tmp}/nope.ckpt"], "--checkpoint {tmp}/nope.ckpt: no such file"),
        (["--checkpoint", "{ckpt}", "--batch-sizes", "0", "8"], "--batch-sizes must be positive integers, got [0, 8]"),
        (["--checkpoint", "{ckpt}", "--threads", "0"], "--threads must be >= 1, got 0"),
        (["--checkpoint", "{ckpt}"], "--config: no config.yaml next to {ckpt} or in the 2 folders above"),
        (["--checkpoint", "{ckpt}", "--config", "{tmp}/none.yaml"], "--config {tmp}/none.yaml: no such file"),
        (
            ["--checkpoint", "{tmp}/junk.ckpt", "--config", "{tmp}/c.yaml"],
            "--checkpoint {tmp}/junk.ckpt cannot be read",
        ),
    ],
)
def test_cli_bad_input_is_one_line_naming_the_flag(trained, tmp_path, capsys, args, message):
    cli, _ = trained
    ckpt = tmp_path / "alone" / "last.ckpt"  # a checkpoint with no config.yaml near it
    ckpt.parent.mkdir()
    shutil.copy(Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt", ckpt)
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    (tmp_path / "c.yaml").write_text("{}\n")
    with pytest.raises(SystemExit) as exit_:
        export.main([arg.format(tmp=tmp_path, ckpt=ckpt) for arg in args])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("python -m callbacks.export: error: " + message.format(tmp=tmp_path, ckpt=ckpt))

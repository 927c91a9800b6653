"""PolicyExport and the export package: traced modules from real fits (the chain, and the shipped pirl_toy config),
their metadata and benchmark, the equality check on the environment's own states (the vehicle's start states and
collocation box), the Neuron path (with a stand-in ``torch_neuronx``), AOTInductor, and ``python -m app export`` from
a checkpoint alone. The loader's own tests are in test_export_loader.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import export.tracing as tracing
from app.cli import build
from app.export import main as export_main
from callbacks.export import PolicyExport
from envs.safety.physics import TAU
from export.inputs import ENV_COPIES, environment_check_inputs
from export.loader import TracedPolicy
from export.report import format_rate
from export.tracing import ExportMismatchError, export_network_of, export_policy
from modules.networks import observation_mlp
from tests.app_process import run_app_process
from tests.export_helpers import (
    CHAIN_SHAPE,
    Shift,
    assert_close_to_eager,
    assert_each_damaged_file_is_refused,
    fake_neuronx,
    file_sha256,
    seed_mlp,
)
from tests.helpers import ROOT, app_in_process, chain_config, fit, write_config

FIT_SIZES = [8, 32]
REFERENCE_SIZES = [512, 1024, 2048]


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
    """The reference's MLP exported with TorchScript at its three batch sizes: (network, folder, metadata)."""
    network = seed_mlp()
    folder = tmp_path_factory.mktemp("seed")
    metadata = export_policy(
        network, (16,), torch.float32, REFERENCE_SIZES, folder, backend="torchscript", benchmark_seconds=0.05
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
    assert metadata["checkpoint"] == str(Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt")
    # Checked on the chain's own start states too (it has no physics, so no collocation set): every chain starts in
    # cell 0, so the recorded range is exactly that one-hot row, unlike the random 0/1 rows.
    checks = metadata["checks"]
    assert list(checks) == ["random", "env_start"]
    assert checks["env_start"]["min"] == checks["env_start"]["max"] == [1, 0, 0, 0, 0, 0]
    assert checks["random"]["min"] == [0] * 6 and checks["random"]["max"] == [1] * 6
    rows = 3 * sum(FIT_SIZES) + 1 + 3 + 67  # 3 batches per traced size, and the eager fallback at 1, 3 and 67
    assert checks["env_start"]["rows"] == checks["random"]["rows"] == rows
    for artifact in [*metadata["artifacts"], metadata["eager"]]:
        assert set(artifact["max_abs_diff_by_inputs"]) == {"random", "env_start"}
        assert artifact["max_abs_diff"] == max(artifact["max_abs_diff_by_inputs"].values())

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
        assert row["reference_cpu_samples_per_s"] is None  # the reference measured 512, 1024 and 2048 only
    assert report["machine"]["torch_threads"] == 1 and report["seconds_per_figure"] == 0.05
    markdown = (folder / "export_benchmark.md").read_text()
    header = "| batch | eager samples/s | traced samples/s | speedup | reference CPU (4 cores) | reference Neuron |"
    assert header in markdown
    assert "torch threads: **1**" in markdown
    for row in report["rows"]:
        assert f"| {row['batch_size']} | {format_rate(row['eager_samples_per_s'])} |" in markdown
        if row["speedup"] <= 1:
            assert f"At batch {row['batch_size']} the traced module (torchscript) is not faster" in markdown


# ------------------------------------------------------------------------------------------- the reference's network
def test_seed_mlp_matches_eager_at_its_batch_sizes_and_the_report_shows_the_seed(seed_export):
    network, folder, metadata = seed_export
    assert metadata["parameters"] == 3481
    assert [a["batch_size"] for a in metadata["artifacts"]] == REFERENCE_SIZES
    assert all(a["backend"] == "torchscript" and a["max_abs_diff"] <= 1e-6 for a in metadata["artifacts"])
    assert [a["output"]["shape"] for a in metadata["artifacts"]] == [[n, 25] for n in REFERENCE_SIZES]
    rows = metadata["benchmark"]["rows"]
    keys = ("reference_cpu_samples_per_s", "reference_neuron_samples_per_s", "reference_speedup")
    assert [tuple(r[key] for key in keys) for r in rows] == [
        (2.3e6, 3.2e6, 1.37),
        (3.6e6, 6.1e6, 1.71),
        (5.8e6, 10.8e6, 1.87),
    ]
    markdown = (folder / "export_benchmark.md").read_text()
    assert "| 2.30M | 3.20M | 1.37x |" in markdown and "| 5.80M | 10.80M | 1.87x |" in markdown
    assert "this network is that size" in markdown


# ------------------------------------------------------------------------------------------- the environment's states
@pytest.fixture(scope="module")
def vehicle():
    """The model and data module of the shipped PIRL vehicle config, as ``python -m app export`` builds them."""
    return build([str(ROOT / "configs" / "pirl_vehicle.yaml")])


def test_vehicle_export_is_checked_on_its_start_states_and_collocation_box(vehicle, tmp_path):
    model, datamodule = vehicle
    network, shape, dtype = export_network_of(model)
    sets = environment_check_inputs(datamodule)
    metadata = export_policy(network, shape, dtype, [64], tmp_path, "torchscript", 2, benchmark=False, input_sets=sets)
    checks = metadata["checks"]
    assert json.loads((tmp_path / "export.json").read_text())["checks"] == checks
    assert list(checks) == ["random", "env_start", "collocation"]
    assert all(check["rows"] == 2 * 64 + 1 + 3 + 67 and check["max_abs_diff"] <= 1e-6 for check in checks.values())
    assert set(metadata["artifacts"][0]["max_abs_diff_by_inputs"]) == set(checks)
    # What each set fed, feature by feature: (vx, β, ω, e, ψ, waypoints…, τ).
    random_low, random_high = torch.tensor(checks["random"]["min"]), torch.tensor(checks["random"]["max"])
    assert random_low.min() >= -1 and random_high.max() <= 1
    bounds = torch.tensor([20.0, 10.0, 30.0, 0.95, 30.0])
    for name in ("env_start", "collocation"):
        low, high = torch.tensor(checks[name]["min"]), torch.tensor(checks[name]["max"])
        assert low.shape == (16,), name
        assert low[0] >= 5 and high[0] <= 20 and high[0] - low[0] > 10, name  # real speeds, spread over the box
        assert (low[1:5] >= -bounds[1:]).all() and (high[1:5] <= bounds[1:]).all(), name
        assert high[2] > 20 and low[2] < -20, name  # yaw rates up to ±30 °/s, far outside [-1, 1]
        assert low[TAU] >= 0 and high[TAU] <= 5 and high[TAU] > 4, name
        assert high[5] > 1.5, name  # waypoints ahead of the car, metres away: taken from the environment


@pytest.mark.parametrize(
    ("rate", "shown"),
    [(2_345_678.0, "2.35M"), (1_000_000.0, "1.00M"), (45_612.0, "45.6k"), (1_234.0, "1.2k"), (321.4, "321")],
)
def test_rates_are_shown_in_a_unit_that_keeps_their_digits(rate, shown):
    assert format_rate(rate) == shown


def test_start_states_build_a_bounded_number_of_environment_copies(vehicle, monkeypatch):
    # An engine per copy (Atari's emulators) makes an environment of the traced batch sizes cost minutes: the states
    # come from ENV_COPIES copies at most, each copy's start state repeated, the same as the first rows of a batch.
    _, datamodule = vehicle
    built = []
    make_env = datamodule.make_env
    monkeypatch.setattr(datamodule, "make_env", lambda n, seed: built.append(n) or make_env(n, seed))
    start_states = environment_check_inputs(datamodule)[0]
    few, many = start_states(5, 7), start_states(3 * ENV_COPIES + 5, 7)
    assert built == [5, ENV_COPIES]
    assert many.shape[0] == 3 * ENV_COPIES + 5 and torch.equal(many[:5], few)
    assert torch.equal(many[ENV_COPIES : 2 * ENV_COPIES], many[:ENV_COPIES])
    assert len(torch.unique(many, dim=0)) == ENV_COPIES  # distinct start states, from distinct seeds


def test_a_difference_only_on_real_vehicle_states_fails_the_export(vehicle, tmp_path, monkeypatch):
    model, datamodule = vehicle
    network, shape, dtype = export_network_of(model)
    # A device that errs only at large inputs (vx > 2 m/s): uniform [-1, 1] inputs never see it.
    fake, _ = fake_neuronx(lambda traced: Shift(traced, 1e-3, beyond=2.0))
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    blind = export_policy(network, shape, dtype, [32], tmp_path / "random", "neuron", benchmark=False)
    assert blind["artifacts"][0]["max_abs_diff"] <= 1e-6  # what the check alone used to pass
    sets = environment_check_inputs(datamodule)
    with pytest.raises(
        ExportMismatchError, match=r"at batch 32 .*neuron by up to 0\.001 on (env_start|collocation) inp"
    ):
        export_policy(network, shape, dtype, [32], tmp_path / "real", "neuron", benchmark=False, input_sets=sets)
    assert not (tmp_path / "real" / "export.json").exists()


@pytest.mark.slow
def test_pirl_toy_config_exports_after_fit_checked_on_its_own_states(tmp_path):
    """The shipped config as the docs run it (CSV logger on), shortened by flags; PolicyExport is its last callback."""
    short = ["--trainer.max_steps", "50", "--trainer.logger.init_args.save_dir", str(tmp_path)]
    short += ["--trainer.enable_progress_bar", "false", "--trainer.callbacks.init_args.backend", "torchscript"]
    short += ["--trainer.callbacks.init_args.batch_sizes", "[64, 128]"]
    cli = fit(ROOT / "configs" / "pirl_toy.yaml", *short, "--trainer.callbacks.init_args.benchmark_seconds", "0.05")
    run = tmp_path / "pirl_toy" / "version_0"
    metadata = json.loads((run / "export" / "export.json").read_text())
    assert [a["batch_size"] for a in metadata["artifacts"]] == [64, 128]
    assert metadata["checkpoint"] == str(run / "checkpoints" / "last.ckpt")
    start, box = metadata["checks"]["env_start"], metadata["checks"]["collocation"]
    # The toy starts at |x₁| <= 1.5, |x₂| <= 0.9; its collocation box is |x₁| <= 2, |x₂| <= 1; τ in [0, 1] for both.
    assert max(-start["min"][0], start["max"][0]) <= 1.5 and max(-start["min"][1], start["max"][1]) <= 0.9
    assert max(-box["min"][0], box["max"][0]) > 1.5 and max(-box["min"][0], box["max"][0]) <= 2
    assert min(start["min"][2], box["min"][2]) >= 0 and max(start["max"][2], box["max"][2]) <= 1
    policy = TracedPolicy.load(run / "export")
    assert policy.backend_in_use == "torchscript"
    assert_close_to_eager(policy, cli.model.export_network().eval(), torch.rand(100, 3) * 2 - 1)
    assert_each_damaged_file_is_refused(run / "export", tmp_path / "damaged", str(run / "checkpoints" / "last.ckpt"))


# ------------------------------------------------------------------------------------------- Neuron, stand-in
def test_neuron_output_off_by_more_than_the_tolerance_is_refused(tmp_path, monkeypatch):
    fake, calls = fake_neuronx(lambda network: Shift(network, 1e-3))  # what bf16 auto-casting would do to the outputs
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    network = observation_mlp(CHAIN_SHAPE, [16], 3).eval()
    with pytest.raises(ExportMismatchError, match=r"at batch 8 .*neuron by up to 0\.001.*tolerance 1e-06"):
        export_policy(network, CHAIN_SHAPE, torch.uint8, [8], tmp_path, "neuron", benchmark=False)
    assert len(calls) == 1 and not (tmp_path / "export.json").exists()


# ------------------------------------------------------------------------------------------- portable backends
@pytest.mark.skipif(
    not any(shutil.which(compiler) for compiler in ("g++", "c++", "clang++")), reason="AOTInductor needs a C++ compiler"
)
@pytest.mark.slow
def test_aot_backend_compiles_checks_and_loads_and_auto_keeps_the_faster(tmp_path):
    network = observation_mlp(CHAIN_SHAPE, [16], 3).eval()
    metadata = export_policy(
        network, CHAIN_SHAPE, torch.uint8, [16], tmp_path, "aot", benchmark=False, checkpoint="a.ckpt"
    )
    (artifact,) = metadata["artifacts"]
    assert artifact["backend"] == "aot" and artifact["file"] == "policy_b16.pt2"
    assert artifact["sha256"] == file_sha256(tmp_path / "policy_b16.pt2") and artifact["max_abs_diff"] <= 1e-6
    policy = TracedPolicy.load(tmp_path)
    assert policy.backend_in_use == "aot"
    for n in (5, 16, 40):
        assert_close_to_eager(policy, network, torch.randint(0, 2, (n, 6), dtype=torch.uint8))
    damaged = assert_each_damaged_file_is_refused(tmp_path, tmp_path.parent / "aot-damaged", "a.ckpt")
    assert damaged == ["policy_b16.pt2", "eager.pt2"]

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
    compile_ = tracing._compile

    def no_compiler(network, example, backend, path):
        if backend == "aot":
            raise RuntimeError("Invalid cxx_compiler: g++ not found")
        compile_(network, example, backend, path)

    monkeypatch.setattr(tracing, "_compile", no_compiler)
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
    argv = ["--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--batch-sizes", "4", "16"]
    argv += ["--backend", "torchscript", "--benchmark-seconds", "0.05", "--data.init_args.num_envs", "4"]
    metadata = export_main(argv)

    out = capsys.readouterr().out
    assert "batch 4: traced (torchscript" in out and "batch 16: traced (torchscript" in out
    assert "benchmarked (eager" in out
    assert [a["batch_size"] for a in metadata["artifacts"]] == [4, 16]
    assert metadata["machine"]["torch_threads"] == 1  # --threads default
    folder = run / "export"
    assert json.loads((folder / "export.json").read_text())["artifacts"] == metadata["artifacts"]
    report = json.loads((folder / "export_benchmark.json").read_text())
    assert report["command"] == ["lightrl export", *argv]
    policy = TracedPolicy.load(folder)
    assert_close_to_eager(policy, cli.model.q_network.eval(), torch.randint(0, 2, (21, 6), dtype=torch.uint8))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ckpt_path", "{tmp}/nope.ckpt"], "--ckpt_path {tmp}/nope.ckpt: no such file"),
        (["--checkpoint", "{tmp}/nope.ckpt"], "--ckpt_path {tmp}/nope.ckpt: no such file"),  # the former name
        (["--ckpt_path", "{ckpt}", "--batch-sizes", "0", "8"], "--batch-sizes must be positive integers, got [0, 8]"),
        (["--ckpt_path", "{ckpt}", "--threads", "0"], "--threads must be >= 1, got 0"),
        (["--ckpt_path", "{ckpt}"], "--config: no config.yaml next to {ckpt} or in the 2 folders above"),
        (["--ckpt_path", "{ckpt}", "--config", "{tmp}/none.yaml"], "--config {tmp}/none.yaml: no such file"),
        (
            ["--ckpt_path", "{tmp}/junk.ckpt", "--config", "{tmp}/c.yaml"],
            "--ckpt_path {tmp}/junk.ckpt cannot be read",
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
        export_main([arg.format(tmp=tmp_path, ckpt=ckpt) for arg in args])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("lightrl export: error: " + message.format(tmp=tmp_path, ckpt=ckpt))


@pytest.mark.slow
def test_the_export_command_runs_and_its_old_names_say_where_it_went(trained, tmp_path, capsys):
    """``python -m app export`` in a process of its own; its old names, ``python -m export`` and
    ``python -m callbacks.export``, only print the new command, in one line, with exit status 2. (A missing
    checkpoint's line, in this process.)"""
    cli, _ = trained
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(Path(cli.trainer.default_root_dir) / "checkpoints" / "config.yaml", run / "config.yaml")  # logger off
    shutil.copy(Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt", run / "checkpoints" / "last.ckpt")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}

    def command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=environment, capture_output=True, text=True)

    missing = app_in_process(capsys, "export", "--ckpt_path", str(tmp_path / "nope.ckpt"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert (
        missing.stderr.strip().splitlines()[-1]
        == f"python -m app export: error: --ckpt_path {tmp_path}/nope.ckpt: no such file"
    )
    args = ["--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--batch-sizes", "4", "--backend", "torchscript"]
    args += ["--no-benchmark"]
    done = run_app_process("export", *args, cwd=ROOT, env=environment)
    assert done.returncode == 0, done.stderr
    assert f"Wrote {run / 'export' / 'export.json'}" in done.stdout
    assert TracedPolicy.load(run / "export").batch_sizes == (4,)
    report = json.loads((run / "export" / "export.json").read_text())
    for old in ("export", "callbacks.export"):
        renamed = command(old, *args)
        assert renamed.returncode == 2 and renamed.stdout == ""
        assert renamed.stderr.splitlines() == [
            f"python -m {old}: error: the export tool is now python -m app export (same flags): "
            f"python -m app export {' '.join(args)}"
        ]
    assert json.loads((run / "export" / "export.json").read_text()) == report  # the old names wrote nothing

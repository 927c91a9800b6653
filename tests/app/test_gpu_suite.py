"""The GPU suite's code runs on the CPU (--quick), so that it cannot rot between sessions that have a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT

SUITE = ROOT / "benchmarks" / "gpu_suite.py"


def run_suite(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SUITE), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def suite_module():
    """``benchmarks/gpu_suite.py`` imported (benchmarks/ is not a package)."""
    sys.path.insert(0, str(SUITE.parent))
    try:
        import gpu_suite
    finally:
        sys.path.remove(str(SUITE.parent))
    return gpu_suite


@pytest.mark.slow
def test_quick_mode_runs_every_item_from_any_folder_and_writes_both_reports(tmp_path):
    out = tmp_path / "suite"
    done = run_suite("--quick", "--out", str(out), cwd=tmp_path)  # not the checkout: the suite finds its configs
    assert done.returncode == 0, done.stdout + done.stderr
    ITEMS = suite_module().ITEMS
    report = json.loads((out / "gpu_suite.json").read_text())
    assert report["quick"] is True
    assert list(report["items"]) == list(ITEMS)  # every item, in the suite's order
    for name, item in report["items"].items():
        assert item["status"] == "ok", (name, item.get("error"))
        assert item["figures"], name
        for target in item["targets"]:
            assert isinstance(target["met"], bool) and target["value"] == target["value"], (name, target)
    figures = {name: item["figures"] for name, item in report["items"].items()}
    # Eager steps only: --quick compiles no environment step (a cold compilation each; tests/envs/test_compiled_step.py
    # compiles them, and counts the compiled Snake step's operations and host reads).
    rates = [*figures["snake_env"]["steps_per_s"].values(), *figures["vehicle_racing_env"]["steps_per_s"].values()]
    assert len(rates) == 4 and all(rate["torchrl"] > 0 for rate in rates)
    assert not any(name.startswith("compiled_") for rate in rates for name in rate)
    # benchmarks/env_speed.py --count-ops, as the results page runs it: the eager Snake step reads its masks back to
    # skip idle work (the counter's own test is in tests/app/test_throughput.py).
    snake_step = figures["snake_env"]["per_step"]
    assert snake_step["eager"]["host_reads"] > 0 and snake_step["eager"]["compiled_graphs"] == 0
    assert "compiled" not in snake_step
    assert figures["pirl_export"]["max_abs_exported_minus_eager"] == 0.0  # the exported files compute the network
    assert set(figures["pirl_export"]["samples_per_s"]) == {"512", "1024", "2048", "4096", "16384"}
    assert figures["snake_ppo"]["frames_per_s"] > 0 and figures["sac"]["updates_per_s"] > 0
    assert set(figures["metta"]["by_worker_kind"]) == {"env_workers", "collector_workers"}
    assert figures["mario"]["experiences_per_s"] > 0
    assert figures["mario"]["profile"]["updates"] == 1  # one learner update under the profiler, trace and table kept
    assert "aten::" in (out / "profiles" / "mario_update.txt").read_text()
    assert (out / "profiles" / "mario_update.trace.json.gz").stat().st_size > 0
    assert "compile=false" in figures["dqn_update"]["ratio_to_bare"] and not figures["dqn_update"]["errors"]
    markdown = (out / "gpu_suite.md").read_text()
    assert all(f"| {name} | ok |" in markdown for name in ITEMS)
    assert (out / "logs" / "pirl_export.log").exists()  # each item's output in its log


@pytest.mark.slow
def test_an_item_in_its_own_process_reports_what_it_measured(tmp_path):
    # As on the GPU: the item in a child process (`--item`), its figures handed back through its file. The quickest
    # item (eager steps of two environments): what a child process changes is the hand-back, the same for every item.
    out = tmp_path / "suite"
    done = run_suite("--quick", "--isolate", "--only", "vehicle_racing_env", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (item,) = json.loads((out / "gpu_suite.json").read_text())["items"].values()
    assert item["status"] == "ok" and item["figures"]["num_envs"] == 256 and not item["figures"]["errors"]
    rates = item["figures"]["steps_per_s"]
    assert set(rates) == {"vehicle", "racing"} and all(rate["torchrl"] > 0 for rate in rates.values())
    assert (out / "logs" / "vehicle_racing_env.log").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_full_suite_without_cuda_is_one_error_line(tmp_path, capsys):
    gpu_suite = suite_module()
    with pytest.raises(SystemExit) as stopped:
        gpu_suite.main(["--out", str(tmp_path / "suite")])
    assert stopped.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("no CUDA device on this machine: run with --quick to check the suite on the CPU")
    )
    assert not (tmp_path / "suite" / "gpu_suite.json").exists()

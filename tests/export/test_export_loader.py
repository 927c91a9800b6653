"""TracedPolicy: any batch size on the traced modules; every file verified against export.json, a damaged one refused
(each file in turn, every backend); the eager fallback only for intact modules this machine cannot run (Neuron
without torch_neuronx, with a stand-in ``torch_neuronx``)."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

from export.loader import TracedPolicy
from export.tracing import export_policy
from modules.networks import observation_mlp
from tests.export_helpers import (
    CHAIN_SHAPE,
    assert_close_to_eager,
    assert_each_damaged_file_is_refused,
    fake_neuronx,
    file_sha256,
    seed_mlp,
)

SIZES = [8, 16, 32]
CHECKPOINT = "runs/chain/version_3/checkpoints/last.ckpt"  # recorded in export.json, quoted by the refusal


def chain_network() -> torch.nn.Module:
    torch.manual_seed(0)
    return observation_mlp(CHAIN_SHAPE, [16], 3).eval()


def chain_observation(n: int) -> torch.Tensor:
    return torch.randint(0, 2, (n, *CHAIN_SHAPE), dtype=torch.uint8)


@pytest.fixture(scope="module")
def torchscript_export(tmp_path_factory):
    """The chain network exported with TorchScript at batch 4 and 16 (no benchmark): (network, folder)."""
    network, folder = chain_network(), tmp_path_factory.mktemp("torchscript")
    export_policy(
        network, CHAIN_SHAPE, torch.uint8, [4, 16], folder, "torchscript", benchmark=False, checkpoint=CHECKPOINT
    )
    return network, folder


# ------------------------------------------------------------------------------------------- serving
def test_loader_pads_and_splits_any_batch_size(tmp_path, caplog):
    network = seed_mlp()
    export_policy(network, (16,), torch.float32, SIZES, tmp_path, "torchscript", benchmark=False)
    with caplog.at_level(logging.INFO, logger="lightrl.export"):
        policy = TracedPolicy.load(tmp_path)
    assert policy.backend_in_use == "torchscript" and policy.batch_sizes == tuple(SIZES)
    calls: list[int] = []
    for size, module in list(policy.modules.items()):
        policy.modules[size] = lambda x, module=module, size=size: calls.append(size) or module(x)
    routes = {1: [8], 7: [8], 8: [8], 11: [16], 78: [32, 32, 16]}  # the last chunk on the smallest size holding it
    generator = torch.Generator().manual_seed(1)
    for n, expected_route in routes.items():
        calls.clear()
        observation = torch.rand(n, 16, generator=generator) * 2 - 1
        assert_close_to_eager(policy, network, observation)
        assert calls == expected_route, n
    assert policy.act(observation).equal(network(observation).argmax(-1))
    assert policy(observation[0]).shape == (25,)  # one observation, no batch dim
    records = [r for r in caplog.records if r.name == "lightrl.export"]
    assert len(records) == 1 and "running torchscript modules for batch sizes [8, 16, 32]" in records[0].message
    with pytest.raises(TypeError, match="dtype torch.float64"):
        policy(observation.double())


# ------------------------------------------------------------------------------------------- integrity
def test_a_flipped_byte_in_any_torchscript_export_file_is_refused(torchscript_export, tmp_path):
    _, source = torchscript_export
    files = assert_each_damaged_file_is_refused(source, tmp_path, CHECKPOINT)
    assert files == ["policy_b4.pt", "policy_b16.pt", "eager.pt2"]
    assert TracedPolicy.load(source).backend_in_use == "torchscript"  # the undamaged original still loads


def test_a_missing_export_file_is_refused_naming_it(torchscript_export, tmp_path):
    _, source = torchscript_export
    assert assert_each_damaged_file_is_refused(source, tmp_path, CHECKPOINT, damage="missing") == [
        "policy_b4.pt",
        "policy_b16.pt",
        "eager.pt2",
    ]


def test_a_folder_without_export_json_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"export\.json: no such file \(lightrl export --ckpt_path"):
        TracedPolicy.load(tmp_path)


def test_a_replaced_eager_fallback_that_verifies_but_does_not_load_is_an_error(tmp_path, monkeypatch):
    """Neuron modules here cannot run, and the fallback (rewritten with a matching sha256) cannot load: one error."""
    fake, _ = fake_neuronx()
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    export_policy(chain_network(), CHAIN_SHAPE, torch.uint8, [4], tmp_path, benchmark=False)
    (tmp_path / "eager.pt2").write_bytes(b"truncated")
    metadata = json.loads((tmp_path / "export.json").read_text())
    metadata["eager"]["sha256"] = file_sha256(tmp_path / "eager.pt2")
    (tmp_path / "export.json").write_text(json.dumps(metadata))
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)
    with pytest.raises(
        RuntimeError, match=r"neither the traced modules \(torch_neuronx does not import.*nor the eager"
    ):
        TracedPolicy.load(tmp_path)


# ------------------------------------------------------------------------------------------- Neuron, stand-in
@pytest.fixture
def neuron_export(tmp_path, monkeypatch):
    """The chain network exported by the stand-in torch_neuronx at batch 4 and 16: (network, folder, trace calls)."""
    fake, calls = fake_neuronx()
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    network, folder = chain_network(), tmp_path / "neuron"
    export_policy(network, CHAIN_SHAPE, torch.uint8, [16, 4], folder, benchmark=False, checkpoint=CHECKPOINT)  # auto
    return network, folder, calls


def test_neuron_path_traces_each_batch_size_at_its_exact_shape(neuron_export):
    network, folder, calls = neuron_export
    assert [(c["shape"], c["dtype"]) for c in calls] == [((4, 6), torch.uint8), ((16, 6), torch.uint8)]
    assert all(c["compiler_args"] == ["--auto-cast", "none"] for c in calls)  # fp32 on the device, not bf16
    metadata = json.loads((folder / "export.json").read_text())
    assert [a["backend"] for a in metadata["artifacts"]] == ["neuron", "neuron"]
    assert all(a["max_abs_diff"] <= 1e-6 for a in metadata["artifacts"])
    policy = TracedPolicy.load(folder)
    assert policy.backend_in_use == "neuron"
    assert_close_to_eager(policy, network, chain_observation(11))


def test_neuron_files_without_torch_neuronx_fall_back_to_the_verified_eager_file(neuron_export, monkeypatch, caplog):
    network, folder, _ = neuron_export
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # `import torch_neuronx` now fails
    with caplog.at_level(logging.WARNING, logger="lightrl.export"):
        policy = TracedPolicy.load(folder)
    assert policy.backend_in_use == "eager" and policy.batch_sizes == ()
    records = [r for r in caplog.records if r.name == "lightrl.export"]
    assert len(records) == 1  # logged once, not per call
    assert "cannot load here (ModuleNotFoundError: torch_neuronx does not import" in records[0].message
    assert "running the eager fallback eager.pt2 on CPU" in records[0].message
    for n in (1, 4, 37):
        assert_close_to_eager(policy, network, chain_observation(n))


def test_a_flipped_byte_in_any_neuron_export_file_is_refused_with_or_without_torch_neuronx(
    neuron_export, tmp_path, monkeypatch
):
    _, source, _ = neuron_export
    assert assert_each_damaged_file_is_refused(source, tmp_path / "with", CHECKPOINT) == [
        "policy_b4.pt",
        "policy_b16.pt",
        "eager.pt2",
    ]
    # Without torch_neuronx the fallback runs, but only from intact files: a damaged module or fallback is refused.
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)
    assert_each_damaged_file_is_refused(source, tmp_path / "without", CHECKPOINT)


def test_torchscript_eager_fallback_when_torch_export_fails(tmp_path, monkeypatch):
    fake, _ = fake_neuronx()
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)

    def refuse(*args, **kwargs):
        raise RuntimeError("data-dependent control flow")

    monkeypatch.setattr(torch.export, "export", refuse)
    folder = tmp_path / "export"
    folder.mkdir()
    for stale in ("policy_b999.pt", "eager.pt2"):  # an earlier export into the same folder
        (folder / stale).write_bytes(b"old")
    network = chain_network()
    metadata = export_policy(network, CHAIN_SHAPE, torch.uint8, [4], folder, benchmark=False, checkpoint=CHECKPOINT)
    assert metadata["eager"]["format"] == "torchscript" and metadata["eager"]["file"] == "eager.pt"
    assert sorted(p.name for p in folder.glob("*.pt*")) == ["eager.pt", "policy_b4.pt"]
    assert "data-dependent control flow" in metadata["eager"]["export_error"]
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)
    policy = TracedPolicy.load(folder)
    assert policy.backend_in_use == "eager"
    assert_close_to_eager(policy, network, chain_observation(9))
    assert assert_each_damaged_file_is_refused(folder, tmp_path / "damaged", CHECKPOINT) == ["policy_b4.pt", "eager.pt"]

"""Shared by the export tests: the reference's network, closeness to eager, and a stand-in ``torch_neuronx``.

``torch_neuronx`` cannot be installed here; its stand-in records each ``trace`` call and returns a TorchScript trace,
optionally of a network altered by ``alter`` (what a miscompiling device would serve).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from export.loader import ExportIntegrityError, TracedPolicy

CHAIN_SHAPE = (6,)  # the chain env's one-hot observation (length 6 in chain_config), uint8


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def seed_mlp() -> nn.Sequential:
    """The PIRL reference's policy network: 16 → 32 → 32 → 32 → 25, Tanh hidden layers, Sigmoid output."""
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


class Shift(nn.Module):
    """``network(x) + offset``, everywhere or only where the first feature exceeds ``beyond``."""

    def __init__(self, network: nn.Module, offset: float, beyond: float | None = None) -> None:
        super().__init__()
        self.network, self.offset, self.beyond = network, offset, beyond

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.network(x)
        if self.beyond is None:
            return out + self.offset
        return out + self.offset * (x[:, :1] > self.beyond).to(out.dtype)


def fake_neuronx(alter: Callable[[nn.Module], nn.Module] | None = None) -> tuple[types.ModuleType, list[dict]]:
    """A ``torch_neuronx`` whose ``trace`` records its calls and returns a TorchScript trace of ``alter(network)``."""
    calls: list[dict] = []

    def trace(func, example_inputs, **kwargs):
        calls.append({"shape": tuple(example_inputs.shape), "dtype": example_inputs.dtype, **kwargs})
        return torch.jit.trace(func if alter is None else alter(func), example_inputs)

    module = types.ModuleType("torch_neuronx")
    module.trace = trace
    return module, calls


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def exported_files(folder: Path) -> list[str]:
    """The files export.json lists, checked to be every module file in the folder (so "each file" means each)."""
    metadata = json.loads((folder / "export.json").read_text())
    listed = [artifact["file"] for artifact in metadata["artifacts"]] + [metadata["eager"]["file"]]
    assert sorted(listed) == sorted(p.name for p in folder.glob("*.pt*"))
    return listed


def assert_each_damaged_file_is_refused(
    source: Path, tmp_path: Path, checkpoint: str, damage: str = "flip"
) -> list[str]:
    """Damages each exported file of ``source`` in turn (one flipped byte, or deleted), each in a fresh copy under
    ``tmp_path``, and checks that loading is refused naming that file and how to re-export from ``checkpoint``.
    Returns the files, in export.json's order."""
    files = exported_files(source)
    for name in files:
        folder = shutil.copytree(source, tmp_path / f"{damage}-{name}")
        if damage == "flip":
            flip_one_byte(folder / name)
            expected = f"{folder / name}: sha256 does not match export.json (corrupt or replaced)"
        else:
            (folder / name).unlink()
            expected = f"{folder / name}: missing, though export.json lists it"
        with pytest.raises(ExportIntegrityError) as error:
            TracedPolicy.load(folder)
        assert str(error.value).startswith(expected), name
        assert str(error.value).endswith(f"re-export with lightrl export --ckpt_path {checkpoint}")
    return files

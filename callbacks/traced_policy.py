"""TracedPolicy: an exported policy network served at any batch size, with the eager fallback of the seed's hybrid
execution. The deployment side of :mod:`callbacks.export`, which writes the folder this reads.

Usage::

    from callbacks.traced_policy import TracedPolicy

    policy = TracedPolicy.load("runs/pirl_vehicle/version_0/export")
    q_values = policy(observations)         # any batch size: padded to or split over the traced sizes
    actions = policy.act(observations)      # argmax over the outputs
    print(policy.backend_in_use)            # neuron, torchscript, aot, or eager (the fallback)
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger("lightrl.export")

METADATA, EAGER = "export.json", "eager.pt2"


def neuron() -> ModuleType | None:
    """``torch_neuronx`` when it imports, else None. Looked up on each call (tests swap it in ``sys.modules``)."""
    try:
        return importlib.import_module("torch_neuronx")
    except Exception:  # an install that fails to import for any reason (no runtime, say) means "no Neuron"
        return None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def quiet() -> Iterator[None]:
    # torch 2.13 deprecates TorchScript in favour of torch.export, on every call; it is still the fastest CPU
    # backend measured here for small MLPs (export_benchmark.md), and `auto` moves on by itself once it is gone.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        yield


def load_artifact(backend: str, path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    if backend == "aot":
        return torch._inductor.aoti_load_package(str(path))
    if backend == "neuron":
        if neuron() is None:  # the Neuron ops register on import; torch.jit.load fails obscurely without them
            raise ModuleNotFoundError("torch_neuronx does not import, and Neuron artifacts need it")
        return torch.jit.load(str(path))
    with quiet():
        return torch.jit.load(str(path), map_location="cpu")


class TracedPolicy:
    """An exported policy for any batch size: the traced modules when they load, else the eager fallback on CPU.

    A batch of ``n`` runs on the smallest traced batch size ``>= n``, zero-padded, and the padding rows are sliced
    off the output (rows are independent in an eval-mode network); a batch above the largest traced size runs in
    chunks of it, the last chunk on the smallest size that holds it.

    Usage::

        policy = TracedPolicy.load("runs/snake_dqn/version_0/export")
        actions = policy.act(observations)  # argmax over the network's outputs

    Attributes:
        backend_in_use: ``neuron``, ``torchscript``, ``aot`` or ``eager``; the names joined by ``+`` when ``auto``
            chose different backends at different batch sizes.
        batch_sizes: the traced batch sizes (empty on the eager fallback).
    """

    def __init__(
        self,
        modules: dict[int, Callable[[torch.Tensor], torch.Tensor]],
        backend_in_use: str,
        input_shape: Sequence[int],
        input_dtype: torch.dtype,
        eager: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        if not modules and eager is None:
            raise ValueError("TracedPolicy needs traced modules or an eager network")
        self.modules, self.eager = modules, eager
        self.batch_sizes = tuple(sorted(modules))
        self.backend_in_use = backend_in_use
        self.input_shape, self.input_dtype = tuple(input_shape), input_dtype

    @classmethod
    def load(cls, dirpath: str | Path) -> TracedPolicy:
        """Loads the export in ``dirpath`` (its ``export.json``), verifying each file's sha256 first."""
        dirpath = Path(dirpath)
        metadata = json.loads((dirpath / METADATA).read_text())
        shape, dtype = metadata["input"]["shape"], getattr(torch, metadata["input"]["dtype"])
        try:
            modules, backends = {}, []
            for artifact in metadata["artifacts"]:
                path = verified(dirpath / artifact["file"], artifact["sha256"])
                modules[artifact["batch_size"]] = load_artifact(artifact["backend"], path)
                backends += [artifact["backend"]] if artifact["backend"] not in backends else []
        except Exception as error:  # whatever stops the traced path, the eager one may still run
            eager = metadata["eager"]
            try:
                path = verified(dirpath / eager["file"], eager["sha256"])
                torchscript = eager["format"] == "torchscript"
                module = load_artifact("torchscript", path) if torchscript else torch.export.load(str(path)).module()
            except Exception as eager_error:
                raise RuntimeError(
                    f"{dirpath}: neither the traced modules ({error}) nor the eager fallback ({eager_error}) load"
                ) from eager_error
            log.warning(
                "TracedPolicy: the traced modules in %s do not load (%s: %s); running the eager fallback %s on CPU",
                dirpath,
                type(error).__name__,
                error,
                eager["file"],
            )
            return cls({}, "eager", shape, dtype, eager=module)
        backend = "+".join(backends)
        log.info("TracedPolicy: running %s modules for batch sizes %s from %s", backend, sorted(modules), dirpath)
        return cls(modules, backend, shape, dtype)

    def __call__(self, observation: torch.Tensor) -> torch.Tensor:
        """The network's outputs for ``observation [n, *input_shape]`` (or one observation without the batch dim)."""
        single = tuple(observation.shape) == self.input_shape
        if single:
            observation = observation.unsqueeze(0)
        if tuple(observation.shape[1:]) != self.input_shape:
            raise ValueError(
                f"observation shape {tuple(observation.shape)} does not fit the export's [batch, *{self.input_shape}]"
            )
        if observation.dtype != self.input_dtype:
            raise TypeError(f"observation dtype {observation.dtype} is not the exported {self.input_dtype}")
        device, observation = observation.device, observation.cpu()
        with torch.inference_mode():
            if not self.modules:
                output = self.eager(observation)
            else:
                output = torch.cat([self._run(chunk) for chunk in observation.split(self.batch_sizes[-1])])
        output = output.to(device)
        return output[0] if single else output

    def _run(self, chunk: torch.Tensor) -> torch.Tensor:
        n = chunk.shape[0]
        size = next(size for size in self.batch_sizes if size >= n)
        if size > n:
            chunk = torch.cat([chunk, chunk.new_zeros(size - n, *chunk.shape[1:])])
        return self.modules[size](chunk)[:n]

    def act(self, observation: torch.Tensor) -> torch.Tensor:
        """The greedy action: argmax over the outputs (Q-values or action scores)."""
        return self(observation).argmax(-1)


def verified(path: Path, expected: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    if sha256(path) != expected:
        raise ValueError(f"{path} does not match its sha256 in {METADATA} (corrupt or replaced)")
    return path

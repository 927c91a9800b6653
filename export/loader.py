"""TracedPolicy: an exported policy network served at any batch size, with the eager fallback of the reference's hybrid
execution. The deployment side of :mod:`export.tracing`, which writes the folder this reads; it needs only torch.

Usage::

    from export.loader import TracedPolicy

    policy = TracedPolicy.load("runs/pirl_vehicle/version_0/export")
    q_values = policy(observations)         # any batch size: padded to or split over the traced sizes
    actions = policy.act(observations)      # argmax over the outputs
    print(policy.backend_in_use)            # neuron, torchscript, aot, or eager (the fallback)

Every file ``export.json`` lists is checked against its sha256 before anything loads: a missing, corrupt or replaced
file is refused with :class:`ExportIntegrityError`, never served. The eager fallback (``eager.pt2``) runs only when
intact traced modules cannot load on this machine (Neuron modules without ``torch_neuronx``, say).
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
from typing import Any

import torch

from compat.torch import aoti_load_package

log = logging.getLogger("lightrl.export")

METADATA, EAGER = "export.json", "eager.pt2"


class ExportIntegrityError(RuntimeError):
    """A file of an export folder is missing, or its sha256 differs from the one ``export.json`` records."""


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
    """Loads one traced module (``neuron``, ``torchscript`` or ``aot``) without checking it: see :func:`verify`."""
    if backend == "aot":
        return aoti_load_package(str(path))
    if backend == "neuron":
        if neuron() is None:  # the Neuron ops register on import; torch.jit.load fails obscurely without them
            raise ModuleNotFoundError("torch_neuronx does not import, and Neuron artifacts need it")
        return torch.jit.load(str(path))
    with quiet():
        return torch.jit.load(str(path), map_location="cpu")


def load_eager(path: Path, file_format: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Loads the eager fallback: a ``torch.export`` program (``eager.pt2``) or, when export failed, TorchScript."""
    return load_artifact("torchscript", path) if file_format == "torchscript" else torch.export.load(str(path)).module()


def verify(path: Path, expected: str, remedy: str) -> Path:
    """``path`` when it exists and its sha256 is ``expected``; else :class:`ExportIntegrityError` naming it."""
    if not path.is_file():
        raise ExportIntegrityError(f"{path}: missing, though {METADATA} lists it; {remedy}")
    if sha256(path) != expected:
        raise ExportIntegrityError(f"{path}: sha256 does not match {METADATA} (corrupt or replaced); {remedy}")
    return path


def reexport_command(metadata: dict[str, Any]) -> str:
    """How to rebuild the folder: from the checkpoint the export recorded, else the run's usual one."""
    checkpoint = metadata.get("checkpoint") or "<run folder>/checkpoints/last.ckpt"
    return f"re-export with lightrl export --ckpt_path {checkpoint}"


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
        output_kind: ``scores`` (Q-values or logits: :meth:`act` takes their argmax) or ``actions`` (a continuous
            policy's action itself), from the export's ``export.json``.
    """

    def __init__(
        self,
        modules: dict[int, Callable[[torch.Tensor], torch.Tensor]],
        backend_in_use: str,
        input_shape: Sequence[int],
        input_dtype: torch.dtype,
        eager: Callable[[torch.Tensor], torch.Tensor] | None = None,
        output_kind: str = "scores",
    ) -> None:
        if not modules and eager is None:
            raise ValueError("TracedPolicy needs traced modules or an eager network")
        self.modules, self.eager = modules, eager
        self.batch_sizes = tuple(sorted(modules))
        self.backend_in_use = backend_in_use
        self.input_shape, self.input_dtype = tuple(input_shape), input_dtype
        self.output_kind = output_kind

    @classmethod
    def load(cls, dirpath: str | Path) -> TracedPolicy:
        """Loads the export in ``dirpath`` (its ``export.json``).

        Raises:
            ExportIntegrityError: a listed file (traced module or eager fallback) is missing or fails its sha256;
                the whole folder is refused, since whoever changed one file may have changed the others.
        """
        dirpath = Path(dirpath)
        if not (dirpath / METADATA).is_file():
            raise FileNotFoundError(f"{dirpath / METADATA}: no such file (lightrl export --ckpt_path writes one)")
        metadata = json.loads((dirpath / METADATA).read_text())
        shape, dtype = metadata["input"]["shape"], getattr(torch, metadata["input"]["dtype"])
        kind = metadata["output"].get("kind", "scores")  # exports before the field held discrete agents' scores
        remedy = reexport_command(metadata)
        # Every file first, the fallback included: a tampered file is an error, not a reason to serve another one.
        paths = {
            entry["file"]: verify(dirpath / entry["file"], entry["sha256"], remedy)
            for entry in [*metadata["artifacts"], metadata["eager"]]
        }
        try:
            modules, backends = {}, []
            for artifact in metadata["artifacts"]:
                modules[artifact["batch_size"]] = load_artifact(artifact["backend"], paths[artifact["file"]])
                backends += [artifact["backend"]] if artifact["backend"] not in backends else []
        except Exception as error:
            # The files verified above, so what fails here is this machine, not them: Neuron modules without
            # torch_neuronx, an AOT package built for another CPU or torch. The verified eager program may still run.
            eager = metadata["eager"]
            try:
                module = load_eager(paths[eager["file"]], eager["format"])
            except Exception as eager_error:
                raise RuntimeError(
                    f"{dirpath}: neither the traced modules ({error}) nor the eager fallback ({eager_error}) load"
                ) from eager_error
            log.warning(
                "TracedPolicy: the traced modules in %s cannot load here (%s: %s); running the eager fallback %s on "
                "CPU",
                dirpath,
                type(error).__name__,
                error,
                eager["file"],
            )
            return cls({}, "eager", shape, dtype, eager=module, output_kind=kind)
        backend = "+".join(backends)
        log.info("TracedPolicy: running %s modules for batch sizes %s from %s", backend, sorted(modules), dirpath)
        return cls(modules, backend, shape, dtype, output_kind=kind)

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
        """The greedy action: argmax over the outputs when they are scores (Q-values, logits), else the outputs, which
        are then the action itself (a continuous policy's deterministic action)."""
        outputs = self(observation)
        return outputs if self.output_kind == "actions" else outputs.argmax(-1)

"""What a run's stores will take, estimated from the config before anything is allocated, and checked against what
the machine has: a config that cannot fit is refused at start with the numbers, rather than killed by the kernel's
out-of-memory killer an hour later (issue 30).

Each data module says what it will allocate (:meth:`datamodules.base.RLDataModule.memory_needs`: the replay buffer,
the frame ring, the rollout, the collector's batches, the worker processes: :class:`WorkerMemory`), the command line
adds the model and its optimizer, and :func:`check_memory` compares the sum per device with the memory available there:
``MemAvailable`` of ``/proc/meminfo`` or, if lower, what the cgroup's limit leaves (``/sys/fs/cgroup/memory.max``); on
a GPU, ``torch.cuda.mem_get_info``. Refused: one line naming the flag of the largest need. Above
:data:`WARN_FRACTION` of it: one warning line. ``--memory_check false`` skips the check
(docs/guide/collection.md, "Memory and worker failures").

The stores' estimates count the tensors' bytes only (not the allocator's slack or Python objects), so they are a
floor: what fits here may still be tight, which is what the warning is for. The worker processes' is measured instead
(:class:`WorkerMemory`): a worker is an interpreter with torch imported, whose size no spec gives.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torchrl.data import Composite, TensorSpec

if TYPE_CHECKING:
    from torchrl.envs import EnvBase

#: Above this share of the available memory a run is started with a warning.
WARN_FRACTION = 0.8
#: The flag that skips the check.
SKIP_FLAG = "--memory_check false"
#: How the worker processes' need starts (:meth:`WorkerMemory.need`).
WORKER_POOL = "the pool"
#: Bytes of the entries a stored transition has besides its observations and action: reward (float32), and the
#: done, terminated and truncated flags of the step (bool).
STEP_ENTRIES_BYTES = 4 + 3


@dataclass(frozen=True)
class MemoryNeed:
    """One store a run allocates: what it is, the flag (with its value) that sizes it, its bytes and its device."""

    what: str
    flag: str
    nbytes: int
    device: torch.device


def spec_bytes(spec: TensorSpec) -> int:
    """Bytes of one value of ``spec`` (every leaf of a Composite)."""
    if isinstance(spec, Composite):
        return sum(spec_bytes(leaf) for leaf in spec.values(True, True))
    return int(torch.Size(spec.shape).numel()) * torch.empty((), dtype=spec.dtype).element_size()


def transition_bytes(observation_spec: Composite, action_spec: TensorSpec, observations: int = 2) -> int:
    """Bytes of one stored transition: ``observations`` observations (the observation and the next one), the action,
    the reward and the step's flags."""
    return observations * spec_bytes(observation_spec) + spec_bytes(action_spec) + STEP_ENTRIES_BYTES


def parameters_need(module: torch.nn.Module, device: torch.device) -> MemoryNeed | None:
    """The model's weights, their gradients and Adam's two moments (4 × the parameters), and its buffers, once on
    ``device`` (the trainer's)."""
    parameters = list(module.parameters())
    if not parameters:
        return None
    weights = sum(p.numel() * p.element_size() for p in parameters)
    buffers = sum(b.numel() * b.element_size() for b in module.buffers())
    return MemoryNeed("the model and its optimizer", "--model", 4 * weights + buffers, device)


def private_resident_bytes() -> int:
    """This process's resident memory that is its own: ``/proc/self/statm``'s resident pages less its shared ones (the
    pages of the files it maps, shared libraries above all, which every process that maps them shares, and shared
    memory)."""
    _, resident, shared, *_ = Path("/proc/self/statm").read_text().split()
    return (int(resident) - int(shared)) * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class WorkerMemory:
    """What one worker process holds besides the stores, measured in this process when the data module is built.

    ``process``: this process's own resident memory (:func:`private_resident_bytes`) at that moment: after the
    imports, the model's classes and a throw-away environment, before any store. A worker is spawned: it starts a new
    interpreter, which imports the same stack (torch, TorchRL, Lightning through the policy's classes it unpickles,
    the environment's module), so it starts about where this process stands; not a figure written down here, which
    would go stale with every release of those libraries. (The pages of the shared libraries are counted once, in
    this process's use of the machine, not per worker.) ``per_env``: what one more environment adds, built and reset
    beside the throw-away one (so its module's first-use costs are in ``process``); an engine's own memory (an
    emulator's) is in it, which the environment's tensors would not show.

    Where a worker imports less (environment workers get no policy, so no Lightning), or where it is measured in a
    process that holds more than a training run's does before its stores (a test runner after other tests), it
    overestimates: it errs on the side of the warning.
    """

    process: int
    per_env: int

    @classmethod
    def measure(cls, make_env: Callable[[], EnvBase]) -> WorkerMemory:
        """Measure both; ``make_env`` builds one environment (of one element)."""
        process = private_resident_bytes()
        env = make_env()
        try:
            env.reset()
            per_env = max(private_resident_bytes() - process, 0)
        finally:
            env.close()
        return cls(process, per_env)

    def need(self, workers: int, envs_per_worker: int, flag: str) -> MemoryNeed:
        """``workers`` processes of ``envs_per_worker`` environments each, in the host's memory whatever the
        learner's device; ``flag`` sizes it."""
        each = self.process + envs_per_worker * self.per_env
        what = f"{WORKER_POOL} of {workers} worker processes ({gigabytes(each)} each)"
        return MemoryNeed(what, flag, workers * each, torch.device("cpu"))


def available_bytes(device: torch.device) -> tuple[int, str]:
    """The memory available on ``device`` and where that figure comes from."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {device}"
    available, source = _meminfo("MemAvailable"), "MemAvailable"
    limit = _cgroup_room()
    if limit is not None and limit < available:
        available, source = limit, "the cgroup's memory limit less its use"
    return available, source


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0]) * 1024
    raise RuntimeError(f"/proc/meminfo has no {key}")


def _cgroup_room() -> int | None:
    """What this process's cgroup may still allocate (v2, then v1), or None without a limit."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v1 writes its "no limit" as a huge number
            return None
        return max(int(limit) - usage, 0)
    return None


def gigabytes(nbytes: int) -> str:
    if nbytes >= 1e8:
        return f"{nbytes / 1e9:.1f} GB"
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} kB"


def check_memory(
    needs: Iterable[MemoryNeed | None], available: dict[torch.device, tuple[int, str]] | None = None
) -> list[str]:
    """Refuse (``ValueError``, one line) what cannot fit on its device; return the warning lines of what nearly fills
    it. ``available`` replaces the machine's figures (``{device: (bytes, source)}``, for tests)."""
    by_device: dict[torch.device, list[MemoryNeed]] = {}
    for need in needs:
        if need is not None and need.nbytes > 0:
            device = need.device
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            by_device.setdefault(device, []).append(need)
    warnings = []
    for device, listed in by_device.items():
        total = sum(need.nbytes for need in listed)
        free, source = (available or {}).get(device) or available_bytes(device)
        largest = max(listed, key=lambda need: need.nbytes)
        where = "this machine has" if device.type == "cpu" else f"{device} has"
        parts = _summary(listed)
        if total > free:
            raise ValueError(
                f"{largest.flag}: {largest.what} needs {gigabytes(largest.nbytes)}, {where} {gigabytes(free)} "
                f"available ({source}; the run needs {gigabytes(total)} in all: {parts}); make it smaller, or skip "
                f"this check with {SKIP_FLAG}"
            )
        if total > WARN_FRACTION * free:
            warnings.append(
                f"the run needs {gigabytes(total)} of the {gigabytes(free)} available on {device} ({source}; {parts}); "
                f"{largest.flag} sizes the largest part"
            )
    return warnings


def _summary(needs: Sequence[MemoryNeed]) -> str:
    return ", ".join(f"{need.what} {gigabytes(need.nbytes)}" for need in sorted(needs, key=lambda n: -n.nbytes))

"""Collector worker processes: TorchRL's multi-process collectors, each worker with its own environments and its own
copy of the acting policy, as every data module that collects in workers builds them.

What is shared here:

- :func:`worker_env_factories`: one picklable factory per worker. It runs in the worker process: it copies the
  worker's stderr to ``<log_dir>/worker<i>.log`` (so that the learner can name the exception a dead worker printed),
  seeds the worker's torch generator (a spawned process starts from torch's fixed default seed, so without it every
  worker would draw the same exploration noise), and builds the worker's environments with the seeds one batch of
  all of them would use.
- :func:`multi_process_collector`: TorchRL's ``MultiSyncCollector`` or ``MultiAsyncCollector`` with the options every
  caller needs, weights through shared memory without waiting for acknowledgements (TorchRL's default waits without a
  timeout, so one dead worker would hang the learner before the death is seen).
- :class:`ResumableCollector`: the collector each worker runs, whose ``state_dict`` holds what continues its
  collection exactly (its environments' state, the observations and recurrent states it carries between batches, and
  its process's generator). TorchRL's own holds only the transforms' state and counters.
- :func:`worker_death_error`: one error naming the dead worker and its last exception.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import torch
from tensordict import TensorDict
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import EnvBase, TransformedEnv
from torchrl.weight_update import SharedMemWeightSyncScheme

from compat.torchrl import collector_carrier, collector_counters, install_dead_worker_check, set_collector_counters

# How TorchRL's ParallelEnv and multi-process collectors name a worker process that died.
DEAD_WORKER = re.compile(r"worker (\d+) \(exit code -?\d+\)")
install_dead_worker_check()  # a dead worker found reliably, whatever the load (compat/torchrl.py)


def workers_log_dir(trainer: Any) -> Path:
    """Where the workers' logs go: ``<run>/collector_workers``, or a new temporary folder when there is no run folder
    (a data module driven without a logger or trainer), never the current folder."""
    if trainer is not None and trainer.log_dir:
        return Path(trainer.log_dir) / "collector_workers"
    return Path(tempfile.mkdtemp(prefix="collector_workers-"))


def worker_env_factories(
    log_dir: Path,
    env_class: type,
    env_options: dict[str, Any],
    transform: Any,
    num_workers: int,
    envs_per_worker: int,
    seed: int,
    device: torch.device,
) -> list[Callable[[], EnvBase]]:
    """One factory per worker: worker ``w`` runs environments ``w * envs_per_worker ...`` of the batch, seeded as one
    in-process batch of ``num_workers * envs_per_worker`` environments seeded ``seed`` would be."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return [
        partial(
            _worker_env,
            log_dir / f"worker{w}.log",
            env_class,
            transform,
            num_envs=envs_per_worker,
            seed=seed + w * envs_per_worker,
            device=device,
            **env_options,
        )
        for w in range(num_workers)
    ]


def multi_process_collector(
    kind: type[MultiSyncCollector] | type[MultiAsyncCollector],
    make_envs: list[Callable[[], EnvBase]],
    policy: Any,
    frames_per_batch: int,
    device: torch.device,
    **options: Any,
) -> MultiSyncCollector | MultiAsyncCollector:
    """``kind`` over ``make_envs`` with ``policy``, one thread per worker, weights through shared memory."""
    return kind(
        make_envs,
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=-1,
        device=device,
        num_threads=torch.get_num_threads(),  # the collector would otherwise change this process's threads
        num_sub_threads=1,
        trust_policy=True,
        auto_register_policy_transforms=False,
        # The workers' policies hold the shared-memory weights themselves, so a push is visible to them at once;
        # not waiting for acknowledgements keeps a dead worker from hanging the push.
        weight_sync_schemes={"policy": SharedMemWeightSyncScheme(sync=False)},
        **options,
    )


class ResumableCollector(Collector):
    """The collector a worker process runs (``collector_class``), with a ``state_dict`` that continues it exactly.

    Plain tensors only (TorchRL sends it through a pipe as a TensorDict, and checkpoints load with
    ``weights_only=True``). The policy's weights are not in it: they are the learner's, pushed before each batch.
    """

    def state_dict(self) -> dict[str, Any]:
        frames, iterations = collector_counters(self)
        return {
            "env": dict(stateful_env(self.env).state_dict()),
            "carrier": collector_carrier(self).exclude("collector").to_dict(),
            "rng": torch.get_rng_state(),
            "frames": frames,
            "iter": iterations,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        env = stateful_env(self.env)
        env.load_state_dict(state["env"])
        carrier = collector_carrier(self)
        if getattr(env, "exact_state", True):
            carrier.update(TensorDict.from_dict(state["carrier"], batch_dims=1, device=carrier.device))
        else:  # its episodes ended on loading (BatchedEnv.exact_state): carry its reset's observations
            carrier.update(self.env.reset())
        torch.set_rng_state(state["rng"])
        set_collector_counters(self, int(state["frames"]), int(state["iter"]))


def worker_death_error(error: BaseException, log_dir: Path | None, frames: int) -> RuntimeError | None:
    """One error naming the dead worker and the exception it printed, when ``error`` (or what it was raised from) is
    TorchRL's report of a worker that died; None otherwise."""
    found, chained = None, error
    while chained is not None and found is None:
        found = DEAD_WORKER.search(str(chained))
        chained = chained.__cause__ or chained.__context__
    if found is None:
        return None
    cause = _last_exception_line(log_dir / f"worker{found.group(1)}.log") if log_dir is not None else ""
    return RuntimeError(
        f"collector {found.group(0)} died{': ' + cause if cause else ''}, at {frames:,} frames; training stopped "
        "without saving, so the last checkpoint is intact: continue from it with --ckpt_path last (the workers' "
        f"logs: {log_dir})"
    )


def _worker_env(log: Path, env_class: type, transform: Any, **options: Any) -> EnvBase:
    """Builds a worker's environments in the worker process (see the module docstring)."""
    sys.stderr = _Tee(sys.stderr, open(log, "a", buffering=1))  # noqa: SIM115 - open for the process's life
    torch.manual_seed(options["seed"])  # the worker's own exploration noise (the seed of its first environment)
    env = env_class(**options)
    return env if transform is None else TransformedEnv(env, transform.clone())


def stateful_env(env: EnvBase) -> EnvBase:
    """The environment whose ``state_dict`` is the environments' state: a TransformedEnv's holds only its
    transforms', and the models' env transforms keep none of their own (an observation normaliser's statistics are
    the model's, in its checkpoint with the weights), so its base env's."""
    return env.base_env if isinstance(env, TransformedEnv) else env


class _Tee:
    """A text stream writing to two others."""

    def __init__(self, first: TextIO, second: TextIO) -> None:
        self.first, self.second = first, second

    def write(self, text: str) -> int:
        self.second.write(text)
        return self.first.write(text)

    def flush(self) -> None:
        self.first.flush()
        self.second.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.first, name)


def _last_exception_line(path: Path) -> str:
    """The last ``Type: message`` line of a worker's log (its uncaught exception, printed as it died)."""
    time.sleep(0.2)  # the dying process's last write
    if not path.exists():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    exceptions = [line for line in lines if ":" in line and not line.startswith(("File ", "Traceback", "^", "~"))]
    return exceptions[-1] if exceptions else ""

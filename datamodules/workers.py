"""Collector worker processes: TorchRL's multi-process collectors, each worker with its own environments and its own
copy of the acting policy, as every data module that collects in workers builds them.

What is shared here:

- :func:`worker_env_factories`: one picklable factory per worker. It runs in the worker process: it copies the
  worker's stderr to ``<log_dir>/worker<i>.log`` (so that the learner can name the exception a dead worker printed),
  ignores SIGTERM (the learner stops the workers: :mod:`datamodules.ignore_sigterm`), seeds the worker's torch
  generator (a spawned process starts from torch's fixed default seed, so without it every worker would draw the same
  exploration noise), and builds the worker's environments with the seeds one batch of
  all of them would use.
- :func:`multi_process_collector`: TorchRL's ``MultiSyncCollector`` or ``MultiAsyncCollector`` with the options every
  caller needs, weights through shared memory without waiting for acknowledgements (TorchRL's default waits without a
  timeout, so one dead worker would hang the learner before the death is seen).
- :class:`ResumableCollector`: the collector each worker runs, whose ``state_dict`` holds what continues its
  collection exactly (its environments' state, the observations and recurrent states it carries between batches, and
  its process's generator). TorchRL's own holds only the transforms' state and counters.
- :class:`WorkerWatch`: a thread that notices a worker process that died (the out-of-memory killer's SIGKILL too)
  within a fraction of a second, remembers which and how, and kills the other workers, so that whatever the learner
  waits on in TorchRL (a pipe, a queue, a worker that waits for the dead one) returns at once.
- :func:`worker_death_error`: one error naming the dead worker, how it died, and its last exception.
- :func:`use_forkserver`: workers forked from a server that imported torch, tensordict and TorchRL once, not spawned
  anew.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import torch
from tensordict import TensorDict
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import EnvBase, TransformedEnv

from checkpoints.files import CheckpointMismatch
from compat.torchrl import (
    SharedWeights,
    collector_carrier,
    collector_counters,
    install_dead_worker_check,
    set_collector_counters,
    transformed,
)

# How TorchRL's ParallelEnv and multi-process collectors name a worker process that died.
DEAD_WORKER = re.compile(r"worker (\d+) \(exit code (-?\d+)\)")
#: How a worker's log shows it refused a resumed checkpoint's state (the exception it died of, as Python prints it).
_REFUSED_STATE = f"{CheckpointMismatch.__module__}.{CheckpointMismatch.__qualname__}: "
install_dead_worker_check()  # a dead worker found reliably, whatever the load (compat/torchrl.py)
#: What the learner was told when the worker it waited for died, or was killed because another one did.
STOPPED_BY_DEATH = "the worker processes stopped because one died"


TEMPORARY_LOGS = "collector_workers-"  # the name of a temporary log folder starts with this


def workers_log_dir(trainer: Any) -> Path:
    """Where the workers' logs go: ``<run>/collector_workers``, or a new temporary folder when there is no run folder
    (a data module driven without a logger or trainer), never the current folder."""
    if trainer is not None and trainer.log_dir:
        return Path(trainer.log_dir) / "collector_workers"
    return Path(tempfile.mkdtemp(prefix=TEMPORARY_LOGS))


def remove_temporary_logs(log_dir: Path | None) -> None:
    """Delete ``log_dir`` if it is a temporary folder of :func:`workers_log_dir`'s (a run folder's logs stay)."""
    temporary = log_dir is not None and log_dir.parent == Path(tempfile.gettempdir())
    if temporary and log_dir.name.startswith(TEMPORARY_LOGS):
        shutil.rmtree(log_dir, ignore_errors=True)


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
        weight_sync_schemes={"policy": SharedWeights(sync=False)},
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

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """``strict`` is TorchRL's (a Ray collector passes it); the state is this class's own, always loaded whole."""
        env = stateful_env(self.env)
        env.load_state_dict(state["env"])
        carrier = collector_carrier(self)
        if getattr(env, "exact_state", True):
            carrier.update(TensorDict.from_dict(state["carrier"], batch_dims=1, device=carrier.device))
        else:  # its episodes ended on loading (BatchedEnv.exact_state): carry its reset's observations
            carrier.update(self.env.reset())
        torch.set_rng_state(state["rng"])
        set_collector_counters(self, int(state["frames"]), int(state["iter"]))


class WorkerDied(RuntimeError):
    """A worker process died and the run stopped: the command line prints its message as one line (exit status 1)."""


class CannotCollect(RuntimeError):
    """The collection cannot start as configured, which shows only when it starts (a Ray cluster without room for
    the actors): the command line prints the message as one line (exit status 1), each option it names by its config
    keys (``data.collection.workers``) spelled as the flag of ``owner``'s (the data module's class) config."""

    def __init__(self, message: str, owner: type) -> None:
        super().__init__(message)
        self.owner = owner


def worker_death_error(
    error: BaseException | None,
    log_dir: Path | None,
    frames: int,
    watch: WorkerWatch | None = None,
    kind: str = "collector",
    processes: list[Any] = (),
    checkpointed: bool = True,
) -> WorkerDied | CheckpointMismatch | None:
    """One error naming the dead worker, how it died and the exception it printed, when ``watch`` saw a worker die or
    ``error`` (or what it was raised from) is TorchRL's report of one; None otherwise. ``processes`` (the workers'
    ``multiprocessing`` process objects, by index) give the exit code when neither has it; ``checkpointed``: whether
    the run has a checkpoint to continue from. A worker that died refusing a resumed checkpoint's state is that
    refusal, a :class:`CheckpointMismatch` (``in_workers``)."""
    found = next((match for cause in error_chain(error) if (match := DEAD_WORKER.search(str(cause)))), None)
    reported = (int(found.group(1)), int(found.group(2))) if found else None
    death = watch.death if watch is not None and watch.death is not None else reported
    if death is None and error is not None:  # a worker that died before the watch's first look at it
        death = first_ended(processes)
    if death is None:
        return None
    # The watch's code is unknown where TorchRL collected the worker first, or the forkserver started it. TorchRL's
    # report has the code; it names the dead worker where TorchRL saw the death first (the others then ended with it),
    # but may name one the watch killed where the watch saw it first.
    if death[1] is None and reported is not None and (reported[0] == death[0] or watch.ended_together):
        death = reported
    index, code = death
    if code is None and watch is not None and watch.ended_together and watch.death == death:
        # Forkserver workers' codes are not known to the watch: of those that ended together, the one whose code
        # says most (a signal or an error's exit code, before a SIGTERM TorchRL sent, before a clean exit).
        codes = {ended: _exit_code_of(processes, ended) for ended in watch.ended}
        index = min(codes, key=lambda ended: (*_telling_first(codes[ended]), ended))
    code = code if code is not None else _exit_code_of(processes, index)
    cause = _last_exception_line(log_dir / f"worker{index}.log") if log_dir is not None else ""
    if cause.startswith(_REFUSED_STATE):
        return CheckpointMismatch(cause.removeprefix(_REFUSED_STATE), in_workers=True)
    logs = f" (the workers' logs: {log_dir})" if log_dir is not None else ""
    what_now = (
        "training stopped without saving, so the last checkpoint is intact: continue from it with --ckpt_path last"
        if checkpointed
        else "training stopped before its first checkpoint, so there is nothing to continue: start it again"
    )
    return WorkerDied(
        f"{kind} worker {index} {exit_description(code)}{': ' + cause if cause else ''}, at {frames:,} frames; "
        + what_now
        + logs
    )


#: How long the error waits for a dead worker's exit code to reach its process object.
EXIT_CODE_WAIT_S = 2.0


def _exit_code_of(processes: list[Any], index: int) -> int | None:
    """Worker ``index``'s exit code from its ``multiprocessing`` process object; None where there is none to read.
    A worker the watch saw end (its /proc entry gone) may not have been reaped yet, a forkserver's child least of all
    (the server reports its status a moment later): its code is waited for, at most ``EXIT_CODE_WAIT_S``."""
    if index >= len(processes):
        return None
    # ValueError: a process object TorchRL closed; AssertionError: one this process did not start (it cannot join).
    with contextlib.suppress(ValueError, AssertionError):
        process = processes[index]
        if process.exitcode is None:
            process.join(EXIT_CODE_WAIT_S)
        return process.exitcode
    return None


def _telling_first(code: int | None) -> tuple[bool, bool]:
    """Sort key of an ended worker's exit code: the one that says most first (a signal or an error's exit code, then a
    SIGTERM TorchRL sent the others, then a clean exit or an unknown code)."""
    return code in (0, None), code == -signal.SIGTERM


def first_ended(processes: Sequence[Any]) -> tuple[int, int] | None:
    """(index, exit code) of a worker whose ``multiprocessing`` process object has ended, the one whose code says most
    (:func:`_telling_first`); None when none has. Read in the learner's thread only: the watch's reads of these objects
    would race TorchRL's."""
    ended = []
    for index, process in enumerate(processes):
        with contextlib.suppress(ValueError, AssertionError):  # closed by TorchRL; not this process's
            if process.exitcode is not None:
                ended.append((index, process.exitcode))
    return min(ended, key=lambda death: (*_telling_first(death[1]), death[0]), default=None)


def error_chain(error: BaseException | None) -> list[BaseException]:
    """``error`` and what it was raised from or during, in order."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def exit_description(code: int | None) -> str:
    """How a process ended, from its exit code as multiprocessing gives it (``-N``: killed by signal N)."""
    if code is None:
        return "died"
    if code >= 0:
        return f"died (exit code {code})"
    number = -code
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number != signal.SIGKILL:
        return f"died: killed by {name} (signal {number})"
    oom = _kernel_oom_line()
    if oom:
        return f"died: killed by SIGKILL (signal 9: out of memory: the kernel said '{oom}')"
    return "died: killed by SIGKILL (signal 9), as the out-of-memory killer does"


def _kernel_oom_line() -> str:
    """The kernel's last out-of-memory kill message, when the kernel log is readable by this user; else ''."""
    try:
        import subprocess

        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=2, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    kills = [line.split("]", 1)[-1].strip() for line in log.splitlines() if "Killed process" in line]
    return kills[-1] if kills else ""


class WorkerWatch(threading.Thread):
    """Watches the worker processes this process starts while it runs, and acts when one dies.

    TorchRL checks its workers' liveness in most of its waits, not all: a worker killed while the collector is being
    built, or while another worker waits on it, left the learner blocked on a pipe for good (and the interpreter, at
    exit, waiting to join the workers still alive). So this thread looks, every ``poll_s``, at the worker processes
    started by ``multiprocessing`` (:func:`worker_pids`: numbered in the order they appear, which is the order TorchRL
    starts its workers). When one has ended, it records which and how, then kills the others: every wait of the
    learner on them then ends (a closed pipe, TorchRL's own liveness checks), and the error says which worker died
    first, and how (:func:`worker_death_error`).

    A worker this process started itself (``spawn``) is looked at with ``waitid`` and ``WNOWAIT``, which gives its exit
    code and leaves it for ``multiprocessing`` to collect. A worker the forkserver started is the server's child: its
    end is seen in ``/proc``, and its exit code is read later, in the learner's thread, from its ``multiprocessing``
    process object (reading it here would race TorchRL's own reads of the same pipe).

    Once the workers have started, :meth:`number` gives their pids by index from their process objects; from then on
    those are the processes watched, whatever a look at the server's children shows: a worker that is ending has no
    command line left before it becomes a zombie, and a look in that moment lost it (the error then named the worker
    that TorchRL stopped after it).

    Call :meth:`stop` before shutting the workers down normally (their exits are not deaths).
    """

    def __init__(self, poll_s: float = 0.2) -> None:
        super().__init__(name="worker-watch", daemon=True)
        self.poll_s = poll_s
        self.workers: list[int] = []  # worker pids, by index
        #: (index, exit code as multiprocessing gives it, -N: signal N; None when not known here)
        self.death: tuple[int, int | None] | None = None
        self.ended: list[int] = []  # the indices of the workers that had ended when the death was seen
        self._known = set(worker_pids())  # started before this watch (other strategies'): not watched
        self._candidates: set[int] = set()  # looking like workers at the last look, not yet watched
        self._numbered = False  # whether the workers are known by their process objects (:meth:`number`)
        self._lock = threading.Lock()  # a look and a numbering are not interleaved
        self._stopping = threading.Event()

    def number(self, pids: Sequence[int]) -> None:
        """Watch the worker processes ``pids`` (by index, from their process objects) and no others from now on: a
        process the server starts later is not a worker, and a worker a look does not find is still one. Nothing
        changes while a pid is not known (a worker not started yet)."""
        if pids and None not in pids:
            with self._lock:
                self.workers, self._numbered = list(pids), True

    def run(self) -> None:
        while not self._stopping.wait(self.poll_s):
            with self._lock:
                if not self._numbered:
                    self._find_workers()
                ended = [(index, *_exit_code(pid)) for index, pid in enumerate(self.workers)]
            ended = [(index, code) for index, done, code in ended if done]
            if ended and not self._stopping.is_set():
                # TorchRL may have seen the death first: it collected that worker (its code unknown here) and
                # terminated the others (SIGTERM), which are not the one that died. So a known code comes first,
                # then an unknown one (TorchRL's report names it), and a SIGTERM only when nothing else ended.
                ended.sort(key=lambda death: (death[1] == -signal.SIGTERM, death[1] is None))
                self.death, self.ended = ended[0], [index for index, _ in ended]
                self._kill_others(self.workers[self.death[0]])
                return

    def _find_workers(self) -> None:
        """Before :meth:`number`: the workers as they appear among the server's children, numbered in that order."""
        # A watched process running another program was not a worker (a process that is ending, its command line
        # gone, still is one).
        self.workers = [pid for pid in self.workers if not _runs_another_program(pid)]
        self.workers += self._confirmed_workers(set(worker_pids()))

    @property
    def ended_together(self) -> bool:
        """Whether several workers had ended when the death was seen (TorchRL stopped the others)."""
        return len(self.ended) > 1

    def _kill_others(self, dead: int) -> None:
        for pid in self.workers:
            if pid != dead:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def settle(self, timeout_s: float = 2.0, ending: bool = False, processes: Sequence[Any] = ()) -> None:
        """Wait (at most ``timeout_s``) for the watch to record a worker that has ended and not been looked at yet:
        an error in the learner can come from the death (a closed pipe) a moment before the watch's next look.
        ``ending``: the learner saw a worker's pipe close, so a worker is ending (printing its exception, its
        interpreter exiting: seconds on a busy machine); wait for its end even if no worker has ended yet.
        ``processes``: the workers' process objects; one of them ended is an end the watch may never see (a worker
        that died before the watch's first look at it), so the wait is over (:func:`first_ended`)."""
        deadline = time.monotonic() + timeout_s
        while self.death is None and self.is_alive() and time.monotonic() < deadline:
            if not ending and not any(_exit_code(pid)[0] for pid in [*self.workers, *self._new_workers()]):
                return
            if first_ended(processes) is not None:
                return
            time.sleep(self.poll_s / 4)

    def _new_workers(self, alive: set[int] | None = None) -> list[int]:
        return sorted((set(worker_pids()) if alive is None else alive) - self._known - set(self.workers))

    def _confirmed_workers(self, alive: set[int]) -> list[int]:
        """The new workers among ``alive`` seen at the last look too: a process the server starts for another purpose
        (a module it imports running a program) keeps the server's command line from its fork to its ``exec``, a
        moment a busy machine lengthens, and a look inside that moment took it for worker 0 and its end for a death
        (one still running after its ``exec`` is let go in :meth:`run`). A worker that dies before its second look is
        named from its process object (:meth:`settle`, :func:`first_ended`)."""
        new = set(self._new_workers(alive))
        confirmed, self._candidates = sorted(new & self._candidates), new - self._candidates
        return confirmed

    def stop(self) -> None:
        """Stop watching (before the workers are shut down on purpose)."""
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5 * self.poll_s)


def worker_pids(pid: int | None = None) -> list[int]:
    """The worker processes ``multiprocessing`` started for process ``pid`` (this one by default): its children
    started with ``spawn`` and the forks of its forkserver (:func:`use_forkserver`).

    A fork keeps the server's command line; any other child of the server is not a worker: a process that a module
    imported in the server starts (MuJoCo, which TorchRL imports, imports glfw, which runs a Python process to read its
    library's version) was taken for worker 0, and its end for the worker's death. A child that has ended has no
    command line left, so only those alive are found (the watch follows a worker it has seen to its end)."""
    found = []
    for child in _children(os.getpid() if pid is None else pid):
        command = _command_line(child)
        if _SPAWNED in command:
            found.append(child)
        elif _FORKSERVER in command:
            found += [fork for fork in _children(child) if _command_line(fork) == command]
    return found


#: What the command line of a spawned worker, and of the forkserver (and its forks until they run another program),
#: holds.
_SPAWNED, _FORKSERVER = b"spawn_main", b"multiprocessing.forkserver"


def _runs_another_program(pid: int) -> bool:
    """Whether process ``pid`` runs and its command line is not a worker's (nor the forkserver's, which its forks keep
    until they run another program). One that has ended, or is ending, has none."""
    command = _command_line(pid)
    return bool(command) and _SPAWNED not in command and _FORKSERVER not in command


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            children += [int(child) for child in task.read_text().split()]
    return children


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _exit_code(pid: int) -> tuple[bool, int | None]:
    """``(ended, exit code)`` of worker ``pid``: the code as ``multiprocessing`` gives it (``-N``: killed by signal
    N), None when unknown here (a forkserver's worker; or a child already collected by ``multiprocessing``, whose
    TorchRL report then has it). A child stays waitable (``WNOWAIT``), so ``multiprocessing`` still reads its code."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # collected already, or not this process's child (the forkserver's)
        return not _running(pid), None
    if info is None:
        return False, None
    return True, (-info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


#: What the forkserver imports once, before it forks the workers: torch, tensordict, the module by which the server and
#: its workers ignore SIGTERM (:mod:`datamodules.ignore_sigterm`) and this one, whose worker functions a worker runs
#: (TorchRL's collectors and environments with it): each worker then starts without importing them anew. A worker
#: that dies at once (refusing a resumed checkpoint's state) can then end before the watch's first look; its process
#: object still names it (:func:`first_ended`).
WORKER_IMPORTS = ("torch", "tensordict", "datamodules.ignore_sigterm", "datamodules.workers")


def use_forkserver() -> None:
    """Start worker processes from a forkserver that has imported :data:`WORKER_IMPORTS`, so that a worker does not
    import torch, tensordict and TorchRL anew (seconds, and a core's worth of them per worker). TorchRL takes the
    start method set here. Importing TorchRL sets ``spawn`` when no method was chosen yet, so ``spawn`` is read as that
    default and replaced; a program's other choice (``fork``), a server chosen by an earlier call, and platforms other
    than Linux are left alone."""
    if sys.platform != "linux" or multiprocessing.get_start_method(allow_none=True) not in (None, "spawn"):
        return
    multiprocessing.set_forkserver_preload(list(WORKER_IMPORTS))
    multiprocessing.set_start_method("forkserver", force=True)


def logged_env(log: Path, env_class: type, learner: int, **options: Any) -> EnvBase:
    """Builds an environment worker's environments (``EnvWorkers``), its standard error also written to ``log``: a
    worker that dies names its exception there, which the death's error line quotes. TorchRL's ``ParallelEnv`` calls
    the first worker's factory in the learner too (process ``learner``), for the environments' specs: there it only
    builds them."""
    if os.getpid() != learner:
        _become_worker(log)
    return env_class(**options)


def _become_worker(log: Path) -> None:
    """What a worker's factory does first in its worker process: ignore SIGTERM (the learner stops the workers, after
    the checkpoint that asks them for their state: :mod:`datamodules.ignore_sigterm`) and copy stderr to ``log``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stderr = _Tee(sys.stderr, open(log, "a", buffering=1))  # noqa: SIM115 - open for the process's life


def _worker_env(log: Path, env_class: type, transform: Any, **options: Any) -> EnvBase:
    """Builds a worker's environments in the worker process (see the module docstring)."""
    _become_worker(log)
    torch.manual_seed(options["seed"])  # the worker's own exploration noise (the seed of its first environment)
    env = env_class(**options)
    return env if transform is None else transformed(env, transform.clone())


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

"""The fits a command starts by the dozen (``seeds``' and ``tune``'s): ``python -m app fit ...`` in a process of its
own, forked from a server that imported the app once.

A fresh interpreter spends seconds importing torch, Lightning and TorchRL before a command starts: for a search of
fifty short trials, minutes of a small machine. (A pipeline stage, one per run, starts a fresh interpreter:
a server would cost the same imports and then sit beside the run.) :func:`start` forks each command from one server per
process (a ``multiprocessing`` forkserver of its own, apart from the one a run starts its workers from), which imports
the app when the first command starts. The command then runs as ``python -m app`` does from where that interpreter's
imports end: in its own process, with its own pid, working folder, environment, standard output and error (the
file descriptors given), ``sys.argv`` and ``sys.path`` (the working folder first, then ``PYTHONPATH``'s); it ends as the
interpreter ends (its non-daemon threads joined, its ``atexit`` functions run, an uncaught exception printed, the exit
status of ``SystemExit`` or a signal). It reads nothing from standard input (``/dev/null``), stays in the caller's
process group (Ctrl-C reaches it as it reaches the caller) and outlives the caller as a ``subprocess`` child would:
nothing joins or kills it at the caller's exit.

What a fork does not repeat: the imports under the command's own environment variables (the server imported under
the caller's, which is the command's unless ``env`` is given) and the interpreter's final garbage collection. A
process list names a started command by its server's command line.
"""

from __future__ import annotations

import atexit
import io
import os
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import forkserver, popen_forkserver, process, reduction, spawn, util
from multiprocessing.context import set_spawning_popen
from pathlib import Path

#: What the server imports before it forks a command: every command's module (``app/__main__.py`` runs as the
#: command's ``__main__``, as ``python -m app`` runs it).
PRELOADED = ["app.cli", "app.seeds", "app.tune", "app.watch", "app.export", "app.zoo"]

_server = forkserver.ForkServer()
_server.set_forkserver_preload(PRELOADED)


class _Popen(popen_forkserver.Popen):
    """CPython's forkserver ``Popen`` (3.11's ``_launch``), asking this module's server, handing the child the
    command's standard output and error, and leaving out of what the child takes from the caller its ``__main__`` (the
    command runs ``app`` as its ``__main__``) and its ``multiprocessing`` start method (the command's is the server's,
    as a fresh interpreter's is after the same imports: a run chooses its workers' server from it)."""

    def _launch(self, process_obj):
        prep_data = spawn.get_preparation_data(process_obj._name)
        for key in ("init_main_from_name", "init_main_from_path", "start_method"):
            prep_data.pop(key, None)
        self._fds.extend(process_obj.streams)  # the child finds them first among the descriptors it inherits
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = _server.connect_to_new_process(self._fds)
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


def _start_server() -> None:
    """Start this process's server unless it runs. It starts with SIGTERM blocked, for good: a SIGTERM to the caller's
    whole process group (a scheduler's, a service manager's) would otherwise end it while the commands it forked save
    their checkpoints, and the caller, told that they ended (multiprocessing reads a lost server as status 255), would
    exit before them. (Blocked in this thread alone while it starts the server, which inherits the mask; the caller's
    other threads take a SIGTERM meanwhile.)"""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        _server.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class _Forked(process.BaseProcess):
    _start_method = None  # the child keeps the server's start method (a named one would be forced on it)

    def __init__(self, streams: tuple[int, int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.streams = streams

    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


def _exit_status(code: object) -> int:
    """The status an interpreter exits with for ``SystemExit(code)`` (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run(
    args: Sequence[str],
    cwd: str,
    env: dict[str, str],
    new_session: bool,
    preexec: Callable[[], None] | None,
) -> None:
    """In the forked child: become ``python -m app *args`` started in ``cwd`` with ``env``, and exit as it would."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked in the server (_start_server), not here
    if new_session:
        os.setsid()
    if preexec is not None:
        preexec()
    for target, fd in zip((1, 2), forkserver.get_inherited_fds(), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # ``python -m`` puts the working folder first, then PYTHONPATH's folders.
    sys.path[:0] = [cwd, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    sys.argv = ["app", *args]
    status = 0
    try:
        runpy.run_module("app", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
        traceback.print_exc()
        status = 1
    threading._shutdown()  # noqa: SLF001 - what the interpreter does first at exit: join non-daemon threads
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


class Command:
    """A started command, as much of ``subprocess.Popen`` as a caller needs: ``args``, ``pid``, ``returncode``,
    ``poll``, ``wait`` and ``send_signal``."""

    def __init__(
        self,
        args: Sequence[str],
        streams: tuple[int, int],
        cwd: Path | str,
        env: dict[str, str],
        new_session: bool,
        preexec: Callable[[], None] | None,
    ) -> None:
        self.args = [sys.executable, "-m", "app", *args]
        _start_server()
        self._process = _Forked(streams=streams, target=_run, args=(list(args), str(cwd), env, new_session, preexec))
        self._process.start()
        # Not one of this process's multiprocessing children: nothing joins or kills it when the caller exits.
        process._children.discard(self._process)  # noqa: SLF001
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once it has ended (minus the signal's number if a signal ended it), else None."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, signal_number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal_number)


def start(
    args: Sequence[str],
    *,
    stdout: int,
    stderr: int,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    preexec: Callable[[], None] | None = None,
) -> Command:
    """``python -m app *args`` started in ``cwd`` (this process's working folder by default) with environment ``env``
    (this process's by default), writing to the file descriptors ``stdout`` and ``stderr``, in a session of its own
    if ``new_session`` (as ``subprocess.Popen(start_new_session=True)``), after ``preexec`` (a module-level function:
    it is pickled by name) as ``subprocess.Popen(preexec_fn=...)``."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # what this process printed comes first
    cwd, env = os.getcwd() if cwd is None else cwd, dict(os.environ if env is None else env)
    return Command(args, (stdout, stderr), cwd, env, new_session, preexec)

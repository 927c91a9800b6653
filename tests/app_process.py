"""``python -m app`` in a process of its own, forked from a server that imported the app once.

A fresh interpreter spends about six CPU-seconds importing torch, Lightning and TorchRL before a command starts, and the
tests that need a process of their own (signals, process groups, a worker's death, a limit on memory, an exit status, a
user's module on the path) start dozens. :func:`start_app` forks each from one server per test process that imported
``app`` once (a ``multiprocessing`` forkserver of its own, apart from the one the app starts its workers from). The
command then runs as ``python -m app`` does from where that interpreter's imports end: in its own process, with its own
pid, session if asked, working folder, environment, standard streams, ``sys.argv`` and ``sys.path``; it ends as the
interpreter ends (its non-daemon threads joined, its ``atexit`` functions run, an uncaught exception printed, the exit
status of ``SystemExit`` or a signal).

What it does not repeat, and the tests that start a fresh interpreter show instead: the imports under the command's own
environment variables and the interpreter's final garbage collection (``tests/app/test_cli.py`` runs the installed
``lightrl`` command, Lightning's DDP relaunches ``python -m app`` for its second rank, and
``tests/data/test_parallel.py`` ends a learner in a fresh interpreter).
"""

from __future__ import annotations

import atexit
import io
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import connection, forkserver, popen_forkserver, process, reduction, spawn, util
from multiprocessing.context import set_spawning_popen
from pathlib import Path

#: What the server imports before it forks a command: every command's module (``app/__main__.py`` runs as the
#: command's ``__main__``, as ``python -m app`` runs it).
PRELOADED = ["app.cli", "app.seeds", "app.tune", "app.watch", "app.export", "app.zoo"]

_server = forkserver.ForkServer()
_server.set_forkserver_preload(PRELOADED)


class _Popen(popen_forkserver.Popen):
    """CPython's forkserver ``Popen`` (3.11's ``_launch``), asking this module's server, and leaving out of what the
    child takes from the test process its ``__main__`` (the command runs ``app`` as its ``__main__``) and its
    ``multiprocessing`` start method (the command's is the server's, as a fresh interpreter's is after the same imports:
    the app chooses its workers' server from it)."""

    def _launch(self, process_obj):
        prep_data = spawn.get_preparation_data(process_obj._name)
        for key in ("init_main_from_name", "init_main_from_path", "start_method"):
            prep_data.pop(key, None)
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


class _Command(process.BaseProcess):
    _start_method = None  # the child keeps the server's start method (a named one would be forced on it)

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
    out: str,
    err: str,
    new_session: bool,
    preexec: Callable[[], None] | None,
) -> None:
    """In the forked child: become ``python -m app *args`` started in ``cwd`` with ``env``, and exit as it would."""
    if new_session:
        os.setsid()
    if preexec is not None:
        preexec()
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
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


class AppProcess:
    """A started command, as much of ``subprocess.Popen`` as the tests use: ``pid``, ``poll``, ``wait``,
    ``send_signal``, ``communicate`` and ``stderr`` (its output so far), its output kept in files until it ends."""

    def __init__(
        self,
        args: Sequence[str],
        cwd: Path,
        env: dict[str, str],
        new_session: bool,
        preexec: Callable[[], None] | None,
    ) -> None:
        self.args = [sys.executable, "-m", "app", *args]
        self._folder = tempfile.TemporaryDirectory(prefix="app-process-")
        self._out, self._err = (str(Path(self._folder.name) / name) for name in ("stdout", "stderr"))
        for path in (self._out, self._err):
            Path(path).touch()
        self._command = _Command(
            target=_run, args=(list(args), str(cwd), env, self._out, self._err, new_session, preexec)
        )
        self._command.start()
        self.pid = self._command.pid
        self.stderr = open(self._err)  # noqa: SIM115 - closed by communicate

    @property
    def returncode(self) -> int | None:
        return self._command.exitcode

    def poll(self) -> int | None:
        return self._command.exitcode

    def wait(self, timeout: float | None = None) -> int:
        if not connection.wait([self._command.sentinel], timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        self._command.join()
        return self._command.exitcode

    def send_signal(self, signal_number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal_number)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        output, errors = Path(self._out).read_text(), Path(self._err).read_text()
        self.stderr.close()
        self._folder.cleanup()
        return output, errors


def start_app(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    preexec: Callable[[], None] | None = None,
) -> AppProcess:
    """``python -m app *args`` started in ``cwd`` with environment ``env`` (this process's by default), in a
    session of its own if ``new_session`` (as ``subprocess.Popen(start_new_session=True)``), after ``preexec`` (a
    module-level function: it is pickled by name) as ``subprocess.Popen(preexec_fn=...)``."""
    return AppProcess(args, cwd, dict(os.environ if env is None else env), new_session, preexec)


def run_app_process(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    preexec: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess:
    """``python -m app *args`` run to its end as :func:`start_app` starts it: a ``subprocess.run`` result with its
    exit status, stdout and stderr as text."""
    command = start_app(*args, cwd=cwd, env=env, preexec=preexec)
    try:
        output, errors = command.communicate(timeout)
    except subprocess.TimeoutExpired:
        command.send_signal(signal.SIGKILL)
        command.wait()
        raise
    return subprocess.CompletedProcess(command.args, command.returncode, output, errors)

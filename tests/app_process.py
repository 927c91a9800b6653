"""``python -m app`` in a process of its own, forked from a server that imported the app once (:mod:`app.launch`,
the way ``seeds`` and ``tune`` start their fits), its output kept in files until it ends.

A fresh interpreter spends seconds importing torch, Lightning and TorchRL before a command starts, and the tests that
need a process of their own (signals, process groups, a worker's death, a limit on memory, an exit status, a user's
module on the path) start dozens. What a fork does not repeat, and the tests that start a fresh interpreter show
instead: the imports under the command's own environment variables and the interpreter's final garbage collection
(``tests/app/test_cli.py`` runs the installed ``lightrl`` command, Lightning's DDP relaunches ``python -m app`` for its
second rank, ``tests/app/test_app_process.py`` compares the two, and ``tests/data/test_parallel.py`` ends a learner in
a fresh interpreter).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from app import launch


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
        self._folder = tempfile.TemporaryDirectory(prefix="app-process-")
        self._out, self._err = (str(Path(self._folder.name) / name) for name in ("stdout", "stderr"))
        streams = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for path in (self._out, self._err)]
        try:
            self._command = launch.start(
                args, stdout=streams[0], stderr=streams[1], cwd=cwd, env=env, new_session=new_session, preexec=preexec
            )
        finally:
            for fd in streams:
                os.close(fd)
        self.args, self.pid = self._command.args, self._command.pid
        self.stderr = open(self._err)  # noqa: SIM115 - closed by communicate

    @property
    def returncode(self) -> int | None:
        return self._command.returncode

    def poll(self) -> int | None:
        return self._command.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._command.wait(timeout)

    def send_signal(self, signal_number: int) -> None:
        self._command.send_signal(signal_number)

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

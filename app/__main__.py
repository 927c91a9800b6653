"""The command line: ``lightrl <command>`` once installed, or ``python -m app <command>`` from a checkout.

``fit`` and ``validate`` are Lightning's CLI (app/cli.py); the other commands have modules of their own, each
importing the training stack only once its flags are checked. ``lightrl --help`` lists them all.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

#: Every command: the module that runs it (app.cli: Lightning's CLI) and what it does, in one line.
COMMANDS = {
    "fit": ("app.cli", "train a config's agent; --ckpt_path last continues its run where it stopped"),
    "validate": ("app.cli", "evaluate a config's agent, or a checkpoint's (--ckpt_path), on greedy episodes"),
    "seeds": ("app.seeds", "train a config over several seeds and aggregate their evaluations with intervals"),
    "tune": ("app.tune", "search a config's options with Optuna, trials judged by their evaluations"),
    "watch": ("app.watch", "play a checkpoint's policy (--ckpt_path) into an MP4 video"),
    "export": ("app.export", "trace a checkpoint's policy (--ckpt_path) for deployment, check it, benchmark it"),
    "zoo": ("app.zoo", "write the RL Zoo's tuned hyperparameters for an algorithm and task as a config"),
}


def usage(prog: str) -> str:
    """What ``<prog> --help`` prints: every command with its line, and where each one's options are listed."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: {prog} <command> [options]", "", "Train reinforcement-learning agents from YAML configs.", ""]
    lines += ["commands:", *(f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()), ""]
    lines += [
        f"'{prog} <command> --help' lists a command's options; for example:",
        f"  {prog} fit --config configs/gym/cartpole_ppo.yaml --trainer.max_steps 200",
        f"  {prog} fit --config configs/gym/cartpole_ppo.yaml --ckpt_path last",
    ]
    return "\n".join(lines)


def version() -> str:
    from importlib.metadata import PackageNotFoundError, packages_distributions
    from importlib.metadata import version as installed_version

    for distribution in packages_distributions().get("app", []):
        try:
            return f"{distribution} {installed_version(distribution)}"
        except PackageNotFoundError:
            continue
    return "lightrl (not installed: run from a checkout)"


def dispatch(argv: Sequence[str] | None = None, prog: str = "python -m app") -> None:
    """Run ``<prog> *argv`` (default: the command line): an overview for no command or ``--help``, else the
    command's own module."""
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or words[0] in ("-h", "--help"):
        print(usage(prog))
        return
    if words[0] == "--version":
        print(version())
        return
    module, _ = COMMANDS.get(words[0], ("app.cli", ""))
    if module == "app.cli":  # fit, validate, or anything else: Lightning's parser names what it does not know
        from app.cli import main

        main(None if argv is None else words, prog=prog)  # None: Lightning reads the command line (given, it warns)
    else:
        importlib.import_module(module).main(words[1:], prog=f"{prog} {words[0]}")


def run(prog: str) -> None:
    """``dispatch`` with the error handling of a command line: a dead worker or memory that ran out is one line
    (app/errors.py) and exit status 1; a reader that stopped early (``| head``) ends it quietly, with status 1; any
    other error keeps its traceback."""
    try:
        try:
            dispatch(prog=prog)
        finally:
            sys.stdout.flush()  # the closed pipe is met here, not in the interpreter's flush at exit
    except BrokenPipeError:
        # What Python's documentation advises (signal module, "Note on SIGPIPE"): nothing more to that reader.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except Exception as error:
        from app.errors import exit_on_fatal_error

        exit_on_fatal_error(error)  # returns for any other error
        raise


def main() -> None:
    """The ``lightrl`` console script (pyproject.toml's ``[project.scripts]``)."""
    run("lightrl")


if __name__ == "__main__":
    run("python -m app")

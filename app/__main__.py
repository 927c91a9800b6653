"""``python -m app fit --config configs/snake_dqn.yaml`` — see app/cli.py. The other commands have modules of their
own: ``python -m app export`` (app/export.py), ``python -m app seeds`` (app/seeds.py), ``python -m app watch``
(app/watch.py), ``python -m app tune`` (app/tune.py)."""

import importlib
import sys

#: Commands outside Lightning's CLI, and their modules; each imports the training stack only once its flags are checked.
COMMANDS = {"export": "app.export", "seeds": "app.seeds", "watch": "app.watch", "tune": "app.tune"}


def dispatch(argv: list[str] | None = None) -> None:
    """Run ``python -m app *argv`` (default: the command line): a command of :data:`COMMANDS`, or Lightning's
    (``fit``, ``validate``)."""
    words = sys.argv[1:] if argv is None else argv
    if words and words[0] in COMMANDS:
        importlib.import_module(COMMANDS[words[0]]).main(words[1:])
    else:
        from app.cli import main

        main(argv)  # None: Lightning reads the command line itself (given a list, it warns of a second one)


if __name__ == "__main__":
    try:
        dispatch()
    except Exception as error:  # a dead worker or memory that ran out: one line (app/errors.py), exit status 1
        from app.errors import exit_on_fatal_error

        exit_on_fatal_error(error)  # returns for any other error: its traceback
        raise

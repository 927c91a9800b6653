"""``python -m app fit --config configs/snake_dqn.yaml`` — see app/cli.py. The other commands have modules of their
own: ``python -m app export`` (app/export.py), ``python -m app seeds`` (app/seeds.py), ``python -m app watch``
(app/watch.py), ``python -m app tune`` (app/tune.py)."""

import importlib
import sys

#: Commands outside Lightning's CLI, and their modules; each imports the training stack only once its flags are checked.
COMMANDS = {"export": "app.export", "seeds": "app.seeds", "watch": "app.watch", "tune": "app.tune"}

if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command in COMMANDS:
        importlib.import_module(COMMANDS[command]).main(sys.argv[2:])
    else:
        from app.cli import main
        from app.errors import exit_on_fatal_error

        try:
            main()
        except Exception as error:  # a dead worker or memory that ran out: one line (app/errors.py), exit status 1
            exit_on_fatal_error(error)  # returns for any other error: its traceback
            raise

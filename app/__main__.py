"""``python -m app fit --config configs/snake_dqn.yaml`` — see app/cli.py; ``python -m app export --checkpoint ...``
— see app/export.py."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["export"]:
        from app.export import main  # imports the training stack only once its own flags are checked

        main(sys.argv[2:])
    else:
        from app.cli import main

        main()

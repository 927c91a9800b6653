"""``python -m app fit --config configs/snake_dqn.yaml`` — see app/cli.py; ``python -m app export --checkpoint ...``
— see app/export.py; ``python -m app watch --ckpt_path ...`` — see app/watch.py."""

import sys

if __name__ == "__main__":
    # These commands import the training stack only once their own flags are checked.
    if sys.argv[1:2] == ["export"]:
        from app.export import main

        main(sys.argv[2:])
    elif sys.argv[1:2] == ["watch"]:
        from app.watch import main

        main(sys.argv[2:])
    else:
        from app.cli import main

        main()

"""``python -m app fit --config configs/snake_dqn.yaml`` — see app/cli.py."""

from app.cli import main

if __name__ == "__main__":
    main()

"""``python -m export --checkpoint ...``: see :mod:`export.cli`."""

from export.cli import main

if __name__ == "__main__":
    main()

"""``python -m export`` was the export tool's name; it is ``python -m app export`` now (app/export.py). This name only
says so, in one line, with exit status 2."""

import shlex
import sys

if __name__ == "__main__":
    command = shlex.join(["python", "-m", "app", "export", *sys.argv[1:]])
    print(
        f"python -m export: error: the export tool is now python -m app export (same flags): {command}", file=sys.stderr
    )
    raise SystemExit(2)

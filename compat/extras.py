"""The command that installs one of this project's optional extras (pyproject.toml's optional dependencies), for
the error that names a missing package: the one place that spells the distribution's name.

From a checkout (an editable install, or the source tree on ``sys.path``) the command installs the checkout's extra;
from an installed distribution it installs the published one.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The distribution's name on the package index ("lightrl" there is an unrelated project).
DISTRIBUTION = "lightrl-train"

_CHECKOUT = Path(__file__).resolve().parents[1]


def install_command(extra: str) -> str:
    """``pip install -e "<checkout>[extra]"`` (``.`` when the current folder is the checkout) from a checkout, else
    ``pip install "lightrl-train[extra]"``."""
    if (_CHECKOUT / "pyproject.toml").is_file():
        try:
            where = os.path.relpath(_CHECKOUT)
        except ValueError:  # another drive (Windows): the relative path does not exist
            where = str(_CHECKOUT)
        return f'pip install -e "{where}[{extra}]"'
    return f'pip install "{DISTRIBUTION}[{extra}]"'

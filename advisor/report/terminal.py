"""Terminal conventions shared by every verb: a wide console when piped, and short paths for people."""

from __future__ import annotations

import sys

from rich.console import Console

from advisor.findings import display_path

PIPED_WIDTH = 140  # rich falls back to 80 columns when stdout is not a terminal; tables then wrap badly


def stdout_console() -> Console:
    return Console(file=sys.stdout, highlight=False, emoji=False,
                   width=None if sys.stdout.isatty() else PIPED_WIDTH)


def short_path(path: str) -> str:
    """Relative to the current directory, or from the package root for installed code
    (`transformers/models/llama/modeling_llama.py`), else absolute."""
    shown = display_path(path)
    marker = "site-packages/"
    return shown.split(marker, 1)[1] if marker in shown else shown

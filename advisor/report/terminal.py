"""Terminal conventions shared by every verb: a wide console when piped, short paths for people, user text shown
as text (never as rich markup or raw terminal control sequences), and a reader that leaves early (`| head`)."""

from __future__ import annotations

import os
import re
import sys
from typing import Callable

from rich.console import Console
from rich.markup import escape

from advisor.errors import visible
from advisor.contracts.finding import display_path

PIPED_WIDTH = 140  # rich falls back to 80 columns when stdout is not a terminal; tables then wrap badly


def stdout_console() -> Console:
    return Console(file=sys.stdout, highlight=False, emoji=False,
                   width=None if sys.stdout.isatty() else PIPED_WIDTH)


# C0/C1 controls (terminal escapes) and the bidirectional overrides that make a diff read differently from what
# it does ("Trojan Source", CVE-2021-42574).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """The text with control and bidi-override characters shown as `\\xNN`/`\\uNNNN`: a terminal escape in a file
    or op name must not recolor the terminal, and a reviewer must see the code as it runs. Newlines, tabs stay."""
    return _CONTROL.sub(_escaped, str(value))


def shown(text: object) -> str:
    """User-controlled text (paths, function names, reasons quoting code) for a rich markup string: `[` is escaped
    and control characters are written as `\\xNN`, so a name can neither crash the renderer nor drive the terminal."""
    return escape(visible(text))


def short_path(path: str) -> str:
    """Relative to the current directory, or from the package root for installed code
    (`transformers/models/llama/modeling_llama.py`), else absolute; escaped for rich markup."""
    shown_path = display_path(path)
    marker = "site-packages/"
    return shown(shown_path.split(marker, 1)[1] if marker in shown_path else shown_path)


def write_report(render: Callable[[], None], exit_code: int) -> int:
    """Print the report and return the verb's exit code, also when the reader left early (`scan | head` keeps exit
    1 when findings exist). Stdout is then pointed at /dev/null so the interpreter's final flush stays quiet."""
    try:
        render()
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()
    return exit_code


def quiet_stdout() -> None:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

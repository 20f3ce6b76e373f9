"""The y/n/q question that `fix --interactive` and `optimize --interactive` ask for each patch."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.prompt import Prompt

from advisor.report.findings_console import print_diff

APPLY, SKIP, QUIT = "y", "n", "q"


def ask_to_apply(console: Console, diff: str | None) -> str:
    """Show the diff, then ask. Input that ends (a closed pipe, Ctrl-D) or is not there at all (a closed standard
    input, `<&-`, where Python has no `sys.stdin`: promise round 32) answers q, so a script never hangs or raises;
    the default is n, so a stray Enter applies nothing."""
    print_diff(console, diff)
    if sys.stdin is None or sys.stdin.closed:
        return QUIT
    try:
        return Prompt.ask("apply this patch?", choices=[APPLY, SKIP, QUIT], default=SKIP, console=console)
    except (EOFError, OSError):
        return QUIT

"""The y/n/q question that `fix --interactive` and `optimize --interactive` ask for each patch."""

from __future__ import annotations

from rich.console import Console
from rich.prompt import Prompt

from advisor.report.findings_console import print_diff

APPLY, SKIP, QUIT = "y", "n", "q"


def ask_to_apply(console: Console, diff: str | None) -> str:
    """Show the diff, then ask. Input that ends (a closed pipe, Ctrl-D) answers q, so a script never hangs or
    raises EOFError; the default is n, so a stray Enter applies nothing."""
    print_diff(console, diff)
    try:
        return Prompt.ask("apply this patch?", choices=[APPLY, SKIP, QUIT], default=SKIP, console=console)
    except EOFError:
        return QUIT

"""Errors a user can act on: the CLI prints them as one line and exits 2 (traceback only with --debug)."""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 but tab, DEL, C1: ESC starts sequences, \n breaks lines


class AdvisorError(Exception):
    """Bad input or a failed target: message is shown to the user as is."""


def visible(text: object) -> str:
    """User-controlled text for a terminal: control characters written as `\\xNN`, so a file name cannot drive it."""
    return CONTROL.sub(lambda hit: f"\\x{ord(hit.group()):02x}", str(text))

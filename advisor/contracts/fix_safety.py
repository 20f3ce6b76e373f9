"""How far a fix may be trusted, as Ruff's `Applicability`. A str enum: JSON and reports print its value."""

from __future__ import annotations

from enum import StrEnum


class FixSafety(StrEnum):
    SAFE = "safe"  # applied by `fix --apply`: every fact it relies on is proved
    UNSAFE = "unsafe"  # applied only with --unsafe-fixes: the finding names what is not proved
    DISPLAY_ONLY = "display-only"  # shown for a person to apply, never applied by advisor

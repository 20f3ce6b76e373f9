"""Examples of the copy/cast rules: an expression returned by a one-line function."""

from __future__ import annotations

from advisor.registry import negative, positive

HEADER = "import torch\nimport torch.nn.functional as F\n\n\ndef f(x):\n    return {}\n"


def returned(expression: str, fixed: str | None = None, **kwargs):
    return positive(HEADER.format(expression), fixed=HEADER.format(fixed) if fixed else None, **kwargs)


def not_returned(expression: str, reason: str | None = None):
    return negative(HEADER.format(expression), reason=reason)

"""Examples of the copy/cast rules: an expression returned by a one-line function (static), or the body of a small
module's forward, profiled (workload)."""

from __future__ import annotations

from advisor.contracts.rule import negative, positive, workload_module

HEADER = "import torch\nimport torch.nn.functional as F\n\n\ndef f(x):\n    return {}\n"
BUFFER = 'self.register_buffer("table", torch.randn(32, 32, dtype=torch.float64))'


def returned(expression: str, fixed: str | None = None, **kwargs):
    return positive(HEADER.format(expression), fixed=HEADER.format(fixed) if fixed else None, **kwargs)


def not_returned(expression: str, reason: str | None = None):
    return negative(HEADER.format(expression), reason=reason)


def _module(body: str) -> str:
    return workload_module(body, (2, 16, 32), init=BUFFER)


def profiled(body: str, fixed: str | None = None, **kwargs):
    """A positive workload example: forward's body (with `x` of shape (2, 16, 32) and a float64 buffer
    `self.table` of (32, 32)), and the body `fix --profile` makes of it."""
    return positive(_module(body), fixed=_module(fixed) if fixed else None, workload=True, **kwargs)


def not_profiled(body: str, reason: str | None = None):
    return negative(_module(body), reason=reason, workload=True)

"""One triangle reader serves the matcher's causal proof and the flash backend's bottom-right check: every
spelling either of them accepted reads as the same triangle, and nothing else does."""

from __future__ import annotations

import libcst as cst
import pytest

from advisor.patterns.attention.causal import triangle
from advisor.static.module_index import ParsedModule


def _read(expression: str) -> str | None:
    parsed = ParsedModule(f"import torch\nmask = {expression}\n", "model.py")
    statement = parsed.module.body[1].body[0]
    assert isinstance(statement, cst.Assign)
    return triangle(parsed, statement.value)


@pytest.mark.parametrize(("expression", "expected"), [
    ("torch.tril(torch.ones(n, n))", "lower"),
    ("torch.tril(torch.ones((n, n)), diagonal=0)", "lower"),
    ("torch.tril(torch.ones([n, n]), 0)", "lower"),
    ("torch.ones(n, n).tril()", "lower"),
    ("torch.ones(n, n).tril_()", "lower"),
    ("torch.tril(torch.ones(n, n)).view(1, 1, n, n)", "lower"),
    ("torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None, :, :]", "lower"),
    ("torch.ones(n, n).tril().long().unsqueeze(0).expand(b, n, n)", "lower"),
    ("torch.tril(torch.ones(n, n)).to(torch.uint8).half()", "lower"),
    ("torch.triu(torch.ones(n, n), diagonal=1)", "upper"),
    ("torch.ones(n, n).triu(1).bool()", "upper"),
    ("torch.ones(n, n).triu_(diagonal=1)", "upper"),
    ("torch.tril(torch.ones(n, m))", None),  # not square
    ("torch.tril(torch.ones(n, n), diagonal=1)", None),  # keeps the next key too
    ("torch.triu(torch.ones(n, n))", None),  # masks the diagonal
    ("torch.tril(torch.rand(n, n))", None),  # not ones
    ("torch.tril(torch.ones(n, n)).cumsum(0)", None),  # changes the values
    ("torch.tril(torch.ones(n, n))[1:, :]", None),  # drops a row
    ("mask.tril()", None),  # not built here
])
def test_triangle_of_ones(expression, expected):
    """'lower' keeps keys up to the query's position, 'upper' masks the keys after it; None is no triangle."""
    assert _read(expression) == expected

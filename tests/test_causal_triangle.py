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


@pytest.mark.parametrize("expression", [
    "torch.tril(torch.ones(n, n))",
    "torch.tril(torch.ones((n, n)), diagonal=0)",
    "torch.tril(torch.ones([n, n]), 0)",
    "torch.ones(n, n).tril()",
    "torch.ones(n, n).tril_()",
    "torch.tril(torch.ones(n, n)).view(1, 1, n, n)",
    "torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None, :, :]",
    "torch.ones(n, n).tril().long().unsqueeze(0).expand(b, n, n)",
    "torch.tril(torch.ones(n, n)).to(torch.uint8).half()",
])
def test_lower_triangles_of_ones(expression):
    assert _read(expression) == "lower"


@pytest.mark.parametrize("expression", [
    "torch.triu(torch.ones(n, n), diagonal=1)",
    "torch.ones(n, n).triu(1).bool()",
    "torch.ones(n, n).triu_(diagonal=1)",
])
def test_strict_upper_triangles_of_ones(expression):
    assert _read(expression) == "upper"


@pytest.mark.parametrize("expression", [
    "torch.tril(torch.ones(n, m))",  # not square
    "torch.tril(torch.ones(n, n), diagonal=1)",  # keeps the next key too
    "torch.triu(torch.ones(n, n))",  # masks the diagonal
    "torch.tril(torch.rand(n, n))",  # not ones
    "torch.tril(torch.ones(n, n)).cumsum(0)",  # changes the values
    "torch.tril(torch.ones(n, n))[1:, :]",  # drops a row
    "mask.tril()",  # not built here
])
def test_anything_else_is_no_triangle(expression):
    assert _read(expression) is None

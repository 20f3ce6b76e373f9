"""Which calls may run code the analysis does not see (patterns/foreign_calls.py): the attention rewrite refuses
where one runs between the scores and the value product (breaker rounds 22 and 23), and another file's in-place
shape change counts for the length proof only where the block calls one."""

from __future__ import annotations

import pytest
import libcst as cst

from advisor.patterns.foreign_calls import foreign_call
from advisor.static.module_index import ParsedModule

HEAD = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
import helpers


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.maps = []

    def inverse(self, m, n_iter=2):
        for _ in range(n_iter):
            m = torch.matmul(m, m)
        return m

    def forward(self, x, cb):
{body}
"""

KNOWN = {
    "torch and tensor methods": "        return F.softmax(x.transpose(-1, -2) @ x, dim=-1).float()",
    "builtins and exceptions": "        if len(x) != 2:\n            raise ValueError(f'{x.size()}')\n"
                               "        return [i for i in range(3)]",
    "a torch.nn layer built here": "        return self.proj(x)",
    "a method of this class, followed": "        return self.inverse(x)",
    "a list the class builds": "        self.maps.append(x)\n        return x",
}
FOREIGN = {
    "a callback": ("        cb()\n        return x", "cb"),
    "another module's function": ("        return helpers.shrink(x)", "helpers.shrink"),
    "a method of an object": ("        return x.cache.update(x)", "x.cache.update"),
    "a builtin the file rebinds": ("        range = cb\n        return range(3)", "range"),
}


def _first_foreign(body: str) -> str | None:
    parsed = ParsedModule(HEAD.format(body=body), "m.py")
    forward = next(f for f, owner, _ in parsed.functions if f.name.value == "forward")
    owner = next(owner for f, owner, _ in parsed.functions if f is forward)
    call = foreign_call(parsed, owner, forward.body)
    return parsed.code(call.func) if isinstance(call, cst.Call) else None


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_calls_whose_code_is_seen(name):
    assert _first_foreign(KNOWN[name]) is None


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_calls_that_may_run_unseen_code(name):
    body, callee = FOREIGN[name]
    assert _first_foreign(body) == callee


CYCLE = """
import torch
import torch.nn as nn


class Attn(nn.Module):
    def a(self, x, n):
        if n:
            x = self.b(x, n - 1)
        return hook(x)

    def b(self, x, n):
        return self.a(x, n)

    def first(self, x):
        return self.a(x, 2)

    def second(self, x):
        return self.b(x, 2)
"""


def test_a_method_in_a_cycle_keeps_what_its_cycle_calls():
    """Followed first from `a`, `b` meets `a` half searched: its own answer is not remembered, so `b` asked
    afterwards still finds `hook`, which `a` calls."""
    parsed = ParsedModule(CYCLE, "m.py")
    methods = {f.name.value: (f, owner) for f, owner, _ in parsed.functions}
    for name, callee in (("first", "self.a"), ("second", "self.b")):
        function, owner = methods[name]
        call = foreign_call(parsed, owner, function)
        assert call is not None and parsed.code(call.func) == callee, name  # the call through which `hook` runs

"""Whether a call whose result is used writes the tensors it is given (patterns/argument_writes.py): breaker round 27's
`s = stat(q)` wrote q unchecked; checking such calls as if made for their effect refused every helper returning what
it is given (timm's `resolve_self_attn_mask`), so a helper's body is read for writes, not for escapes."""

from __future__ import annotations

import libcst as cst
import pytest

from advisor.patterns.argument_writes import argument_call, writes_arguments
from advisor.static.module_index import ParsedModule

HEAD = """
import torch
import torch.nn as nn


{helper}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, q, k):
        out = {call}
        return out
"""

WRITES = {
    "in-place method": ("def f(t):\n    t.mul_(2)\n    return t.sum()", "f(q)"),
    "augmented": ("def f(t):\n    t += 1\n    return t", "f(q)"),
    "store through a view": ("def f(t):\n    row = t.view(-1)\n    row[0] = 1\n    return row", "f(q)"),
    "in-place on an index": ("def f(t):\n    t[0].zero_()\n    return t", "f(q)"),
    "out=": ("def f(t):\n    return torch.add(t, 1, out=t)", "f(q)"),
    "keyword argument": ("def f(a, t=None):\n    t.fill_(0)\n    return a", "f(k, t=q)"),
    "handed to a writer": ("def g(x):\n    x.zero_()\n\n\ndef f(t):\n    g(t)\n    return t", "f(q)"),
    "a builtin running a lambda": ("", "list(map(lambda t: t.mul_(2), (q, k)))"),
    "a torch in-place function": ("", "torch.relu_(q)"),
    "an inplace layer": ("", "self.act(q)"),
    "a method of another object": ("", "k.cache.update(q)"),
}
READS = {
    "returns it": ("def f(t):\n    return t", "f(q)"),
    "returns a fresh tensor written after": ("def f(t):\n    b = t.new_full((2, 2), 0.0).triu_(1)\n    return b",
                                             "f(q)"),
    "reads metadata": ("def f(t, mask):\n    b = torch.zeros_like(mask, dtype=t.dtype)\n    b.masked_fill_(~mask, 1)"
                       "\n    return b", "f(q, k > 0)"),
    "writes another parameter's copy": ("def f(t):\n    c = t.clone()\n    c.mul_(2)\n    return c", "f(q)"),
    "a torch function": ("", "torch.matmul(q, k)"),
    "a tensor method of another tensor": ("", "k.view_as(q)"),
    "a torch.nn layer": ("", "self.proj(q)"),
    "a builtin reading it": ("", "len(q)"),
}


def _verdict(helper: str, call: str) -> bool:
    parsed = ParsedModule(HEAD.format(helper=helper, call=call), "m.py")
    forward, owner = next((f, o) for f, o, _ in parsed.functions if f.name.value == "forward")
    q = next(node for node in parsed.nodes_of(cst.Name) if node.value == "q" and parsed.within(node, forward.body))
    found = argument_call(parsed, q)
    assert found is not None
    return writes_arguments(parsed, found, q, owner, layers_trusted=True)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_call_that_may_write_its_argument(name):
    assert _verdict(*WRITES[name])


@pytest.mark.parametrize("name", sorted(READS))
def test_a_call_that_only_reads_or_returns_its_argument(name):
    assert not _verdict(*READS[name])


def test_a_layer_of_a_tree_with_hooks_may_write():
    """Untrusted layers (a hook registered, a torch class replaced) may run any code on what they are given."""
    parsed = ParsedModule(HEAD.format(helper="", call="self.proj(q)"), "m.py")
    forward, owner = next((f, o) for f, o, _ in parsed.functions if f.name.value == "forward")
    q = next(node for node in parsed.nodes_of(cst.Name) if node.value == "q" and parsed.within(node, forward.body))
    assert writes_arguments(parsed, argument_call(parsed, q), q, owner, layers_trusted=False)


@pytest.mark.parametrize("expression, passed", [("f(q)", True), ("f(q[0])", True), ("f(q.T)", True),
                                                ("f([q, k])", True), ("f(bias[:q])", False), ("f(q * 2)", False),
                                                ("f(q.shape)", False), ("f(q.size(-1))", False)])
def test_which_reads_hand_the_tensor_to_a_call(expression, passed):
    parsed = ParsedModule(f"out = {expression}\n", "m.py")
    q = next(node for node in parsed.nodes_of(cst.Name) if node.value == "q")
    found = argument_call(parsed, q)
    assert (found is not None) is passed


METHODS = """
import torch.nn as nn


class Block(nn.Module):
{method}

    def forward(self, q, k):
        out = self.rel(q, k)
        return out


class Sub(Block):
{override}
"""


@pytest.mark.parametrize("method, override, writes", [
    ("    def rel(self, t, k):\n        return t.reshape(-1) @ k.reshape(-1)", "    pass", False),
    ("    def rel(self, t, k):\n        t.mul_(2)\n        return t", "    pass", True),
    ("    def rel(self, t, k):\n        return t", "    def rel(self, t, k):\n        t.zero_()\n        return t", True),
    ("    @staticmethod\n    def rel(a, t=None):\n        a.mul_(2)\n        return t", "    pass", True),
], ids=["reads", "writes", "a subclass writes", "staticmethod"])
def test_a_method_of_the_class_is_read_with_every_override(method, override, writes):
    """SAM's `self.get_decomposed_rel_pos(query, ...)`: the method's body (and every one of that name in the file)
    says whether q is written; a decorator binds otherwise."""
    parsed = ParsedModule(METHODS.format(method=method, override=override), "m.py")
    forward, owner = next((f, o) for f, o, _ in parsed.functions if f.name.value == "forward")
    q = next(node for node in parsed.nodes_of(cst.Name) if node.value == "q" and parsed.within(node, forward.body))
    assert writes_arguments(parsed, argument_call(parsed, q), q, owner, layers_trusted=True) is writes

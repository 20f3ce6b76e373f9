"""A causal buffer written through what holds it is no longer causal: `d = {"b": m.mask}; d["b"][...] = 1`,
`lst.append(m.mask)`, `.numpy()`, `b = self.mask; b[...] = 1` in a method of the class itself, `getattr(self, "mask")`,
`exec("...")` (breaker round 11, bugs 08-10: 2.87 in fp32). Every read of the buffer's attribute is followed until it
only computes a new tensor or reads metadata (static/tensor_reads.attribute_escape); one that may write it or hand it
on leaves the buffer's value unproved. Each program runs original against patch, fp64, values and gradients."""

from __future__ import annotations

import pytest
import torch

from attention_sources import attention_finding_and_fix
from fixture_models import load_module_from_source

MODEL = '''import math
import operator
import types
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(4)
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        return (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)

    def widen(self):
        {inside}


def build():
    m = Attn()
    m.widen()
    {outside}
    return m
'''

OUTSIDE = {
    "dict": 'd = {"b": m.mask}\n    d["b"][0, 0, 0, 1] = 1',
    "list-append": "lst = []\n    lst.append(m.mask)\n    lst[0][0, 0, 0, 1] = 1",
    "list-display": "[m.mask][0][0, 0, 0, 1] = 1",
    "namespace": "ns = types.SimpleNamespace(b=m.mask)\n    ns.b[0, 0, 0, 1] = 1",
    "zip-loop": "for t, in zip([m.mask]):\n        t[0, 0, 0, 1] = 1",
    "numpy": "m.mask.numpy()[0, 0, 0, 1] = 1",
    "buffers-table": 'held = [m._buffers["mask"]]\n    held[0][0, 0, 0, 1] = 1',
    "get-buffer": 'held = {"b": m.get_buffer("mask")}\n    held["b"][0, 0, 0, 1] = 1',
    "state-dict": 'held = [m.state_dict()["mask"]]\n    held[0][0, 0, 0, 1] = 1',
    "exec-literal": 'exec("m.mask[0, 0, 0, 1] = 1")',
    "exec-computed": 'exec("m.mask[0, 0, 0, 1] = " + "1")',
}
INSIDE = {
    "alias": "b = self.mask\n        b[0, 0, 0, 1] = 1",
    "diagonal": "self.mask.diagonal(1, -2, -1).fill_(1)",
    "narrow": "torch.narrow(self.mask, 3, 0, 2).fill_(1)",
    "detach": "self.mask.detach()[0, 0, 0, 1] = 1",
    "getattr": 'getattr(self, "mask")[0, 0, 0, 1] = 1',
    "clamp": "torch.clamp_(self.mask, min=1)",
    "operator": "operator.setitem(self.mask, (0, 0, 0, 1), 1)",
    "dunder": "self.mask.__setitem__((0, 0, 0, 1), 1)",
    "walrus": "(b := self.mask)[0, 0, 0, 1] = 1",
    "kept": "self.keep = [self.mask]\n        self.keep[0][0, 0, 0, 1] = 1",
    "own-table": 'held = [self._buffers["mask"]]\n        held[0][0, 0, 0, 1] = 1',
    "returned": "self.held()[0, 0, 0, 1] = 1\n\n    def held(self):\n        return self.mask",
}
CASES = [("pass", code) for code in OUTSIDE.values()] + [(code, "pass") for code in INSIDE.values()]


def _outputs_and_grads(model, x):
    inputs = x.clone().requires_grad_(True)
    out = model(inputs)
    (out * torch.cos(torch.arange(out.numel(), dtype=out.dtype).view(out.shape))).sum().backward()
    return [out, inputs.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("inside, outside", CASES, ids=[*OUTSIDE, *INSIDE])
def test_a_buffer_written_through_what_holds_it_is_not_causal(inside, outside):
    source = MODEL.format(inside=inside, outside=outside)
    finding, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert "is_causal=True" not in fixed, finding.extra.get("facts")
    torch.manual_seed(0)
    original = load_module_from_source(source, "escaped_buffer").build().double()
    patched = load_module_from_source(fixed, "escaped_buffer_fixed").build().double()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    for a, b in zip(_outputs_and_grads(original, x), _outputs_and_grads(patched, x)):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-10, equal_nan=True)


@pytest.mark.parametrize("inside", [
    "print(self.mask.shape, self.mask.dtype)",
    "self.count = int(self.mask.sum())",
    "self.any = bool((self.mask[0, 0] == 0).any())",
    "visible = self.mask[:, :, :4, :4]\n        self.seen = torch.where(visible == 0, 0.0, 1.0)",
    "self.total = self.count_open(self.mask)\n\n    def count_open(self, m):\n        return int((m == 0).sum())",
    "self.seen = self.visible()[0].sum()\n\n    def visible(self):\n        return self.mask[:, :, :4, :4]",
    "self.gathered = self.mask[0, 0, torch.arange(4)]\n        self.gathered[0] = 5",
], ids=["metadata", "sum", "compare", "alias-read", "method-reads", "method-returns", "gathered-copy"])
def test_reads_that_leave_the_buffer_alone_keep_it_causal(inside):
    finding, fixed = attention_finding_and_fix(MODEL.format(inside=inside, outside="pass"))
    assert finding.fix_safety == "safe" and "is_causal=True" in fixed, finding.extra.get("facts")


def test_a_linear_bias_zeroed_under_isinstance_keeps_a_buffer_of_that_name_causal():
    """nanoGPT's `_init_weights` zeroes `module.bias` of `nn.Linear` modules only; its attention's causal buffer is
    also named `bias`, and an nn.Module-only class is no Linear."""
    source = MODEL.replace('"mask"', '"bias"').replace("self.mask", "self.bias").format(
        inside="pass", outside="m.apply(init)") + '''

def init(module):
    if isinstance(module, nn.Linear):
        torch.nn.init.zeros_(module.bias)
'''
    finding, fixed = attention_finding_and_fix(source)
    assert "is_causal=True" in fixed, finding.extra.get("facts")


TABLE = '''import torch
from torch import nn
from timm.layers import trunc_normal_, resize_rel_pos_bias_table


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(9, 2))
        {init}

    def set_window_size(self, size):
        self.table = nn.Parameter(resize_rel_pos_bias_table(self.table, size),
                                  requires_grad=self.table.requires_grad)
'''


@pytest.mark.parametrize("init, finite", [
    ("trunc_normal_(self.table, std=.02)", True),  # timm's draw, by torch.nn.init's name: finite values
    ("nn.init.normal_(self.table, std=.02)", True),
    ("nn.init.constant_(self.table, -1e9)", False),  # a mask value, not a draw of moderate ones
    ("hand_on(self.table)", False),  # a function of another module may keep it
])
def test_a_learned_table_drawn_in_place_or_rebuilt_from_itself_stays_finite(init, finite):
    """timm's relative position tables: drawn by `trunc_normal_` and rebuilt by `set_window_size` as
    `self.table = nn.Parameter(resize(self.table, ...))`, whose call's effect on the old tensor the new binding
    replaces."""
    from advisor.static.module_index import ParsedModule

    parsed = ParsedModule(TABLE.format(init=init), "table.py")
    (owner,) = {id(o): o for _, o, _ in parsed.functions if o is not None}.values()
    assert (owner.rebound("table", finite_ok=True) is None) == finite

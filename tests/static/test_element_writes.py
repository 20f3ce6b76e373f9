"""Writes into a buffer's elements (`m.bias.data[..., :p] = 1`, `self.mask[0] = 0`, `m.bias.fill_(1)`) change its
values, never its rank or dtype: the rank proof may still read the class's own assignment, the value proofs
(causal structure) may not. Writes that rebind or reshape (`m.bias = t`, `m.bias.data = t`, `m.bias.unsqueeze_(0)`)
leave both unknown."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from advisor.static.module_index import ParsedModule
from fixture_models import load_module_from_source

BLOCK = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=16, n_head=2, block_size=8):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return y.transpose(1, 2).reshape(B, T, C)
{method}

def opened(model):
{write}
    return model
'''

ELEMENT_WRITES = {
    "`.data` slice store": "    model.bias.data[..., :3] = 1.0",
    "slice store": "    model.bias[..., :3] = 1.0",
    "augmented slice store": "    model.bias.data[..., :3] += 1.0",
    "in-place fill": "    model.bias.data.fill_(1.0)",
}
RESHAPING_WRITES = {
    "rebinding": "    model.bias = torch.ones(8)",
    "`.data` rebinding": "    model.bias.data = torch.ones(8)",
    "reshaping in place": "    model.bias.squeeze_(0)",
}
IN_CLASS_ELEMENT_WRITE = "\n    def open_prefix(self, p: int):\n        self.bias[..., :p] = 1.0\n"


def _owner(source: str):
    parsed = ParsedModule(source, "m.py")
    return next(owner for _, owner, _ in parsed.functions if owner is not None)


def _source(write: str, method: str = "") -> str:
    return BLOCK.format(write=write, method=method)


@pytest.mark.parametrize("write", ELEMENT_WRITES.values(), ids=ELEMENT_WRITES)
def test_an_element_write_keeps_the_rank_but_not_the_value(write):
    owner = _owner(_source(write))
    assert owner.only_value("bias") is None
    assert owner.shape_value("bias") is not None


@pytest.mark.parametrize("write", RESHAPING_WRITES.values(), ids=RESHAPING_WRITES)
def test_a_rebinding_or_reshaping_write_keeps_nothing(write):
    owner = _owner(_source(write))
    assert owner.only_value("bias") is None and owner.shape_value("bias") is None


def test_an_element_write_inside_the_class_keeps_the_rank():
    owner = _owner(_source("    pass", IN_CLASS_ELEMENT_WRITE))
    assert owner.class_value("bias") is None and owner.shape_value("bias") is not None


@pytest.mark.parametrize("method", ["", IN_CLASS_ELEMENT_WRITE], ids=["outside", "in the class"])
def test_a_buffer_opened_through_an_element_write_is_a_safe_mask_not_is_causal(method):
    source = _source(ELEMENT_WRITES["`.data` slice store"], method)
    result = analyze_source(source, "m.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.extra["facts"]
    assert "mask-rank" in {fact["name"] for fact in finding.extra["facts"]["proved"]}
    assert "is_causal" not in result.fixed and "attn_mask=" in result.fixed
    torch.manual_seed(0)
    module = load_module_from_source(source, "prefix")
    original = module.opened(module.CausalSelfAttention())
    patched = load_module_from_source(result.fixed, "prefix_fixed").CausalSelfAttention()
    patched.load_state_dict(original.state_dict())  # the opened prefix travels with the buffer
    x = torch.randn(2, 6, 16, requires_grad=True)
    torch.testing.assert_close(patched(x), original(x), atol=1e-5, rtol=1e-5)


def test_a_rebound_buffer_leaves_the_rank_unproved_so_it_is_checked():
    """`model.bias.data = torch.ones(8)`: the class's 4-D buffer says nothing of the rank; the patch checks the
    buffer's rank before the SDPA call, and the rebound 1-D buffer runs the original, which raises as before."""
    source = _source(RESHAPING_WRITES["`.data` rebinding"])
    result = analyze_source(source, "m.py")
    finding = next(f for f in result.findings if f.kind == "attention")
    assert "mask-rank" not in {fact["name"] for fact in finding.extra["facts"]["proved"]}
    assert "mask-rank" in {fact["name"] for fact in finding.extra["facts"]["guarded"]}
    assert "2 <= self.bias.dim() <= 4" in finding.patch
    module, patched = load_module_from_source(source, "rebound"), load_module_from_source(result.fixed, "fixed")
    x = torch.randn(2, 6, 16)
    for model in (module.opened(module.CausalSelfAttention()), module.opened(patched.CausalSelfAttention())):
        with pytest.raises(IndexError):
            model(x)

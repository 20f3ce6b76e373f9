"""A relative-position bias read from an `nn.Embedding` the class builds (MaxViT's `self.rel_pos_bias(indices)`,
rearranged by einops) is a learned table like an `nn.Parameter` one: "no row is swallowed" is accepted, the patch is
safe, and outputs and gradients (the embedding's included) match in fp32 and fp64. Where the embedding's call may
not run torch's code (a hook registered in the tree, `forward` assigned on some module), or its weight may hold a
mask value (filled in place, given as `_weight`, loaded by `from_pretrained`), the fact stays assumed."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

pytest.importorskip("einops")

MAXVIT = '''
import torch
from torch import nn, einsum
from einops import rearrange


class Attention(nn.Module):
    def __init__(self, dim=32, dim_head=8, window=3):
        super().__init__()
        self.heads = dim // dim_head
        self.scale = dim_head ** -0.5
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.rel_pos_bias = nn.Embedding((2 * window - 1) ** 2, self.heads)
        pos = torch.arange(window)
        grid = rearrange(torch.stack(torch.meshgrid(pos, pos, indexing="ij")), "c i j -> (i j) c")
        rel = rearrange(grid, "i ... -> i 1 ...") - rearrange(grid, "j ... -> 1 j ...") + window - 1
        self.register_buffer("rel_pos_indices", (rel * torch.tensor([2 * window - 1, 1])).sum(dim=-1),
                             persistent=False)
        {init}

    def forward(self, x):
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.heads), (q, k, v))
        q = q * self.scale
        sim = einsum("b h i d, b h j d -> b h i j", q, k)
        {bias}
        attn = sim.softmax(dim=-1)
        out = einsum("b h i j, b h j d -> b h i d", attn, v)
        return rearrange(out, "b h n d -> b n (h d)")
'''
CALL = 'sim = sim + rearrange(self.rel_pos_bias(self.rel_pos_indices), "i j h -> h i j")'
WEIGHT = 'sim = sim + self.rel_pos_bias.weight[self.rel_pos_indices].permute(2, 0, 1)'
READS = {"the module called": CALL, "its weight gathered": WEIGHT}


def _source(bias: str = CALL, init: str = "", extra: str = "") -> str:
    return MAXVIT.replace("{bias}", bias).replace("{init}", init) + extra


def _finding(source: str):
    (finding,) = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    return finding


def _facts(finding, status: str) -> dict[str, str]:
    return {fact["name"]: fact["why"] or "" for fact in finding.extra["facts"].get(status, [])}


@pytest.mark.parametrize("bias", list(READS.values()), ids=list(READS))
def test_an_embedding_table_bias_is_a_safe_float_mask(bias):
    finding = _finding(_source(bias))
    assert finding.fix_safety == "safe" and finding.fixable, finding.extra["facts"]
    assert "learned table `self.rel_pos_bias.weight`" in _facts(finding, "accepted")["fully-masked-rows"]
    assert "attn_mask=" in finding.patch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("bias", list(READS.values()), ids=list(READS))
def test_outputs_and_gradients_match_the_embedding_included(bias, dtype):
    source = _source(bias)
    fixed = analyze_source(source, "case.py").fixed
    torch.manual_seed(0)
    original = load_module_from_source(source, "case").Attention().to(dtype)
    patched = load_module_from_source(fixed, "case_fixed").Attention().to(dtype)
    patched.load_state_dict(original.state_dict())
    x = torch.randn(2, 9, 32, dtype=dtype, generator=torch.Generator().manual_seed(1))
    results = []
    for model in (original, patched):
        leaf = x.clone().requires_grad_()
        out = model(leaf)
        (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum().backward()
        results.append((out, leaf.grad, model.rel_pos_bias.weight.grad))
    assert results[0][2].abs().sum() > 0
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-12}
    torch.testing.assert_close(results[1], results[0], **tolerance)
    assert uses_sdpa(dispatched_ops(patched, (x,)))


HOOK = '''

def watch(model):
    model.rel_pos_bias.register_forward_hook(lambda m, i, o: o.fill_(float("-inf")))
'''
FORWARD = '''

def patch_all(model):
    for m in model.modules():
        m.forward = lambda idx: torch.full((idx.shape[0], idx.shape[1], 4), float("-inf"))
'''


@pytest.mark.parametrize("init, extra", [
    ("", HOOK),
    ("", FORWARD),
    ("self.rel_pos_bias.weight.data.fill_(float('-inf'))", ""),
    ("nn.init.constant_(self.rel_pos_bias.weight, -1e9)", ""),
    ("self.rel_pos_bias = nn.Embedding(25, self.heads, _weight=torch.full((25, self.heads), -1e9))", ""),
    ("self.rel_pos_bias = nn.Embedding.from_pretrained(torch.full((25, self.heads), -1e9))", ""),
    ("self.rel_pos_bias = nn.Linear(4, 4)", ""),
], ids=["a hook in the file", "forward assigned on every module", "filled with -inf", "initialised to -1e9",
        "given its weight", "loaded from a tensor", "rebound to another module"])
def test_an_embedding_that_may_hold_or_return_a_mask_value_is_no_learned_bias(init, extra):
    finding = _finding(_source(init=init, extra=extra))
    assert "fully-masked-rows" in _facts(finding, "assumed"), finding.extra["facts"]
    assert finding.fix_safety == "unsafe" or not finding.fixable

"""A relative-position bias read from an `nn.Embedding` the class builds (MaxViT's `self.rel_pos_bias(indices)`,
rearranged by einops) is not read as a learned table: breaker round 43 wrote -inf into its weight through
`m.named_parameters()` and through a helper of another file handed `m.rel_pos_bias.weight`, which the class's reads
do not show, and a safe patch that had accepted "no learned bias swallows a row" then zeroed a row the original
kept finite. `fully-masked-rows` stays assumed for it (fixtures/attention/breaker43 run the programs)."""

from __future__ import annotations

import pytest

from advisor.engine.static import analyze_source

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
READS = {"the module called": 'sim = sim + rearrange(self.rel_pos_bias(self.rel_pos_indices), "i j h -> h i j")',
         "its weight gathered": "sim = sim + self.rel_pos_bias.weight[self.rel_pos_indices].permute(2, 0, 1)"}


@pytest.mark.parametrize("bias", list(READS.values()), ids=list(READS))
def test_an_embedding_table_bias_is_no_learned_bias(bias):
    (finding,) = [f for f in analyze_source(MAXVIT.replace("{bias}", bias), "case.py").findings
                  if f.kind == "attention"]
    assumed = {fact["name"] for fact in finding.extra["facts"].get("assumed", [])}
    assert "fully-masked-rows" in assumed and finding.fix_safety == "unsafe", finding.extra["facts"]

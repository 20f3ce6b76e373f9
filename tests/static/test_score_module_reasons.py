"""Scores passed through something the walk does not read get a refusal that says what it is: a learned layer over
the scores (talking heads: `nn.Conv2d(heads, heads, 1)` mixes the heads), a submodule whose forward is not followed
(one that is not a bias added to the scores), and a helper called under an `if` that writes into the scores in place (MViTv2's
decomposed relative positions on a slice), instead of "not a recognised operation"."""

from __future__ import annotations

import pytest

from advisor.engine.static import analyze_source

TEMPLATE = '''
import torch
from torch import nn


class Temperature(nn.Module):
    def __init__(self, heads):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(heads, 1, 1))

    def forward(self, attn):
        return attn * self.gain


def add_rel_pos(attn, q, table):
    attn[:, :, 1:, 1:] = attn[:, :, 1:, 1:] + torch.einsum("bhqc,kc->bhqk", q[:, :, 1:], table)
    return attn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, n=5, spatial=True):
        super().__init__()
        self.heads, self.scale, self.spatial = heads, (dim // heads) ** -0.5, spatial
        self.qkv = nn.Linear(dim, dim * 3)
        self.mix = nn.Conv2d(heads, heads, kernel_size=1)
        self.project = nn.Linear(n, n)
        self.temperature = Temperature(heads)
        self.rel_table = nn.Parameter(torch.zeros(n - 1, dim // heads))

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        {use}
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(B, N, C)
'''
USES = {
    "talking heads (conv over the heads)": ("attn = self.mix(attn)", ["`self.mix`", "nn.Conv2d", "dim 1", "heads"]),
    "a linear layer over the keys": ("attn = self.project(attn)", ["`self.project`", "nn.Linear", "last dim"]),
    "a submodule": ("attn = self.temperature(attn)", ["`self.temperature`", "`Temperature`", "forward is not followed"]),
    "a helper under an if writing a slice": (
        "if N > 1:\n            attn = add_rel_pos(attn, q, self.rel_table)",
        ["`add_rel_pos", "under `if N > 1:`", "in place", "`attn[:, :, 1:, 1:] = "]),
}


@pytest.mark.parametrize("use,expected", list(USES.values()), ids=list(USES))
def test_the_refusal_names_what_the_scores_pass_through(use, expected):
    [finding] = [f for f in analyze_source(TEMPLATE.format(use=use), "m.py").findings if f.kind == "attention"]
    assert not finding.fixable
    assert "not a recognised operation" not in finding.reason
    for part in expected:
        assert part in finding.reason, (part, finding.reason)

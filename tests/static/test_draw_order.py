"""What may draw from torch's generator between the dropout and the value product, where SDPA draws its dropout
mask (breaker rounds 27, 32 and 33): torch's own callees are read by what they do, not trusted as a namespace."""

from __future__ import annotations

import pytest

from advisor.engine.static import analyze_source
from advisor.patterns.attention.weights import function_may_draw, layer_may_draw

BLOCK = '''import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Jitter:
    def add(self, x):
        return x + torch.rand_like(x)


JIT = Jitter()


class Attn(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.drop = nn.Dropout(0.1)
        self.extra = {layer}

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        w = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(C // self.heads), dim=-1)
        w = self.drop(w)
        {between}
        return (w @ v).transpose(1, 2).reshape(B, T, C)
'''


@pytest.mark.parametrize("layer, draws", [
    ("torch.nn.Linear", False), ("torch.nn.LayerNorm", False), ("torch.nn.ReLU", False), ("torch.nn.GELU", False),
    ("torch.nn.Dropout", True), ("torch.nn.AlphaDropout", True), ("torch.nn.RReLU", True),
    ("torch.nn.Sequential", True), ("torch.nn.ModuleList", True), ("torch.nn.TransformerEncoderLayer", True),
    ("torch.nn.GRU", True), ("torch.nn.MultiheadAttention", True), ("torch.nn.NoSuchLayer", True),
])
def test_a_torch_layer_draws_where_it_holds_or_takes_a_dropout(layer: str, draws: bool) -> None:
    assert layer_may_draw(layer) is draws


@pytest.mark.parametrize("layer, between, safe", [
    ("nn.LayerNorm(8)", "v = self.extra(v)", True),
    ("nn.Identity()", "n = torch.Size([1, 2])", True),
    ("nn.Linear(8, 8)", "n = torch.cat([v, v]).shape", True),
    ("nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2))", "v = self.extra(v)", False),
    ("nn.GRU(8, 8, dropout=0.1)", "v = self.extra(v)", False),
    ("nn.Identity()", "n = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)", False),
    ("nn.Identity()", "n = nn.Linear(4, 4)", False),
    ("nn.Identity()", "self.state = torch.get_rng_state()", False),
    ("nn.Identity()", "n = list(torch.utils.data.RandomSampler(range(4)))", False),
    ("nn.Identity()", "n = torch.ops.aten.rand.default([4])", False),  # breaker round 34: an aten overload
    ("nn.Identity()", "n = torch.default_generator.get_state()", False),
    ("nn.Identity()", "n = JIT.add(torch.zeros(4))", False),  # a class of the file, a tensor method's name
    ("nn.Identity()", "n = v.add(torch.zeros(1))", True),
])
def test_a_call_between_the_dropout_and_the_value_product_is_read_by_what_it_does(layer, between, safe) -> None:
    [finding] = [f for f in analyze_source(BLOCK.format(layer=layer, between=between), "attn.py").findings
                 if f.kind == "attention"]
    assert (finding.fix_safety == "safe") is safe, finding.reason
    if not safe:
        assert "between the dropout and the value product" in finding.reason


@pytest.mark.parametrize("function, draws", [
    ("torch.svd_lowrank", True),  # torch.randn two calls down (breaker round 35)
    ("torch.pca_lowrank", True),
    ("torch.nn.utils.spectral_norm", True),  # `normal_` in the method `SpectralNorm.apply` (round 36's helper)
    ("torch.nn.functional.gumbel_softmax", True),
    ("torch.split", False),  # written in Python, draws nothing
    ("torch.nn.functional.layer_norm", False),
    ("torch.nn.functional.interpolate", False),
    ("torch.matmul", False),  # built in: its signature is all there is
])
def test_a_torch_function_written_in_python_draws_where_its_code_does(function: str, draws: bool) -> None:
    assert function_may_draw(function) is draws

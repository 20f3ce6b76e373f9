"""A finite fill the scores are scaled after (`s.masked_fill(m == 0, -1e9)`, then `softmax(s / d ** 0.5)`: the
Annotated-Transformer-like tutorials that mask first): the original's masked scores are `fill * scale`, which still
mask where the fill times the least the scale can be stays at or below -1e3 (sizes below 2**31). Proved, the patch
runs against the original in float64 on padded inputs with a fully padded sample, values and gradients."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

SOURCE = '''import math
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, mask):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        d_k = q.size(-1)
        scores = torch.matmul(q, k.transpose(-2, -1))
        scores = scores.masked_fill(mask == 0, {fill})
        attn = torch.softmax(scores {scale}, dim=-1)
        return torch.matmul(attn, v).transpose(1, 2).reshape(b, n, c)


def run(model, x, ids):
    return model(x, (ids != 0)[:, None, None, :])
'''

PROVED = {
    "literal": ("-1e9", "/ 8 ** 0.5"),
    "embed size unpacked": ('float("-1e20")', "/ (c ** (1 / 2))"),
    "math.sqrt of a size": ("-1e9", "/ math.sqrt(d_k)"),
    "negative power of a size": ("-1e9", "* d_k ** -0.5"),
}
REFUSED = {
    "fill too small for a size": ("-1e4", "/ math.sqrt(d_k)"),  # -1e4 / sqrt(2**31) is above -1e3
    "a scale that shrinks it": ("-1e9", "* 1e-7"),
    "a number of no visible size": ("-1e9", "/ float(x.std())"),
    "an attribute from constructor sizes": ("-1e9", "* self.scale"),
}


def _finding(fill: str, scale: str):
    source = SOURCE.format(fill=fill, scale=scale)
    result = analyze_source(source, "scaled.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    return source, finding, result.fixed


@pytest.mark.parametrize("fill, scale", PROVED.values(), ids=PROVED)
def test_a_large_fill_scaled_after_is_safe_and_exact(fill, scale):
    source, finding, fixed = _finding(fill, scale)
    assert finding.fix_safety == "safe", finding.reason
    assert "scaled-fill" in {fact["name"] for fact in finding.extra["facts"]["proved"]}
    original, patched = load_module_from_source(source, "scaled"), load_module_from_source(fixed, "scaled_fixed")
    torch.manual_seed(0)
    model = original.Attention().double()
    twin = patched.Attention().double()
    twin.load_state_dict(model.state_dict())
    ids = torch.tensor([[3, 4, 5, 0, 0], [0, 0, 0, 0, 0]])  # the second sample fully padded: uniform rows
    results = []
    for module, m in ((model, original), (twin, patched)):
        x = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = m.run(module, x, ids)
        out.square().sum().backward()
        results.append([out, x.grad] + [p.grad for p in module.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("fill, scale", REFUSED.values(), ids=REFUSED)
def test_a_fill_the_scale_may_shrink_past_a_mask_is_refused(fill, scale):
    _, finding, _ = _finding(fill, scale)
    assert not finding.fixable and "scaled after a finite or additive mask" in finding.reason

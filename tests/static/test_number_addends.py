"""A Python number added to the scores is not a mask: softmax is shift-invariant, so a finite constant drops out
(exactly when it is 0; a nonzero one only rounds the scores, an assumption). A name that holds a number on one
path and a tensor on another (`bias = 0.0; if mask is not None: bias = ...`) is a mask only where it is a tensor.
"""

from __future__ import annotations

import pytest

from advisor.engine.static import analyze_source
from fixture_models import parity

SOURCE = '''import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x, pad=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
{body}
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)


def make(seed: int = 0, with_mask: bool = False):
    torch.manual_seed(seed)
    pad = torch.zeros(2, 6)
    pad[1, 4:] = 1.0
    return Attn(), (torch.randn(2, 6, 16), pad if with_mask else None)
'''


def _source(body: str) -> str:
    return SOURCE.format(body="\n".join("        " + line for line in body.strip().splitlines()))


def _attention(source: str, unsafe: bool = False):
    result = analyze_source(source, "m.py", unsafe_fixes=unsafe)
    (finding,) = [f for f in result.findings if f.rule.startswith("ADV1")]
    return finding, result.fixed


@pytest.mark.parametrize("body", ["s = s + 0.0", "s = 0 + s", "s += 0.0", "zero = 0.0\ns = s + zero",
                                  "s = s - 0"])
def test_an_added_zero_drops_out_exactly(body):
    source = _source(body)
    finding, fixed = _attention(source)
    assert finding.rule == "ADV101" and finding.fix_safety == "safe", finding.reason
    assert "attn_mask" not in fixed
    parity(source, fixed, name="added_zero")


@pytest.mark.parametrize("body", ["s = s + 3.0", "s = s - 2"])
def test_an_added_nonzero_constant_drops_out_as_an_assumption(body):
    source = _source(body)
    finding, _ = _attention(source)
    assert finding.fix_safety == "unsafe" and "shift-invariant" in finding.reason
    _, fixed = _attention(source, unsafe=True)
    assert "attn_mask" not in fixed
    parity(source, fixed, name="added_constant")


@pytest.mark.parametrize("body", ["s = s + float('inf')", "s = s + float('nan')"])
def test_a_non_finite_constant_is_not_dropped(body):
    finding, fixed = _attention(_source(body), unsafe=True)
    assert "attn_mask" in fixed or finding.rule == "ADV103"


BIAS = """
bias = 0.0
if pad is not None:
    bias = pad[:, None, None, :].to(x.dtype) * -1e9
s = s + bias
"""


def test_a_bias_that_is_a_number_on_the_default_path_is_a_mask_only_where_it_is_a_tensor():
    source = _source(BIAS)
    finding, fixed = _attention(source, unsafe=True)
    assert finding.fix_safety == "unsafe"  # the tensor's rank is not visible
    assert "isinstance(bias, torch.Tensor)" in fixed
    parity(source, fixed, name="bias_default")
    parity(source, fixed, name="bias_masked", with_mask=True)


def test_a_number_or_tensor_bias_among_other_masks_is_refused():
    source = _source(BIAS + "s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float('-inf'))")
    finding, fixed = _attention(source, unsafe=True)
    assert finding.rule == "ADV103" and "`bias`" in finding.reason

"""A finite fill that reads the scores' dtype after an additive mask (FSMT, fairseq: `s = s + attn_mask`, then
`s.masked_fill(pad, torch.finfo(s.dtype).min)`).

The sum has the scores' dtype unless the mask is a float wider than the query, which is the additive mask's own
`mask-dtype` fact (proved, guarded or assumed like any other). Under it the fill reads the query's dtype, so the
patch is offered instead of refused, and matches the original (values and gradients) for every mask dtype that
fact admits. Where both masks sit under their own `if m is not None:`, the safe patch is still the one that
passes the padding to SDPA where no bias is given (the rows are proved there), not one that needs both absent.
"""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from attention_sources import fact_names
from fixture_models import load_module_from_source

SOURCE = '''
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.heads = 2

    def forward(self, x, attn_mask, key_padding_mask):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, 8).permute(2, 0, 3, 1, 4)
        scores = (q * 8 ** -0.5) @ k.transpose(-2, -1)
        scores = scores + attn_mask
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        out = weights @ v
        return out.transpose(1, 2).reshape(b, n, 16)
'''


# the fill first: `where` whose fill operand reads the scores' dtype is still the fill, the scores its last operand
WHERE_FILL = SOURCE.replace("scores = scores.masked_fill(key_padding_mask[:, None, None, :], torch.finfo(scores.",
                            "scores = torch.where(key_padding_mask[:, None, None, :], torch.finfo(scores.").replace(
                                "torch.finfo(scores.dtype).min)\n", "torch.finfo(scores.dtype).min, scores)\n")
CONDITIONAL_BIAS = SOURCE.replace("        scores = scores + attn_mask\n",
                                  "        if attn_mask is not None:\n            scores = scores + attn_mask\n")


def test_the_fill_is_read_from_the_query_under_the_added_masks_dtype_fact():
    result = analyze_source(SOURCE, "case.py", unsafe_fixes=True)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.rule == "ADV101" and finding.patch is not None, finding.reason
    assert "torch.finfo(q.dtype).min" in result.fixed
    stated = [fact["statement"] for status in ("proved", "guarded", "assumed")
              for fact in finding.extra["facts"].get(status, []) if fact["name"] == "mask-dtype"]
    assert any("`attn_mask` is not a float wider than the query" in statement for statement in stated), stated
    assert "fully-masked-rows" in fact_names(finding, "assumed") | fact_names(finding, "guarded")
    # SDPA adds the bias under the fill, so a bias that cancels the fill at a padded key is a stated divergence
    (replaced,) = [fact for fact in finding.extra["facts"]["accepted"] if fact["name"] == "replaced-scores"]
    assert "masks added before it" in replaced["statement"] and "cancels the fill" in replaced["why"]


def _pair(source: str = SOURCE, unsafe_fixes: bool = True):
    fixed = analyze_source(source, "case.py", unsafe_fixes=unsafe_fixes).fixed
    assert "scaled_dot_product_attention" in fixed, "no patch"
    torch.manual_seed(0)
    name = f"fill_after_add_{len(source)}"
    original = load_module_from_source(source, name).Attention()
    patched = load_module_from_source(fixed, f"{name}_fixed").Attention()
    patched.load_state_dict(original.state_dict())
    return original, patched


@pytest.mark.parametrize("form", ["masked_fill", "where"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_dtype", ["query's", torch.float16, torch.bool])
@pytest.mark.parametrize("padded", [True, False])
def test_values_and_gradients_match_for_every_mask_dtype_the_fact_admits(form, dtype, mask_dtype, padded):
    original, patched = _pair(SOURCE if form == "masked_fill" else WHERE_FILL)
    original.to(dtype)
    patched.to(dtype)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 16, dtype=dtype, generator=generator, requires_grad=True)
    if mask_dtype is torch.bool:
        attn_mask = torch.rand(5, 5, generator=generator) > 0.5
    else:
        attn_mask = torch.randn(2, 1, 5, 5, generator=generator).to(dtype if mask_dtype == "query's" else mask_dtype)
    pad = None
    if padded:  # no query row fully masked: each sample keeps its first three keys
        pad = torch.zeros(2, 5, dtype=torch.bool)
        pad[0, 3:] = True
    expected = original(x, attn_mask, pad)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    got = patched(x, attn_mask, pad)
    (got_grad,) = torch.autograd.grad(got.sum(), x)
    tolerance = dict(atol=1e-12, rtol=1e-10) if dtype is torch.float64 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, expected, **tolerance)
    torch.testing.assert_close(got_grad, expected_grad, **tolerance)


def test_with_both_masks_optional_the_safe_patch_passes_the_padding_where_no_bias_is_given():
    """The path without the bias proves the rows (SDPA keeps fully padded rows uniform through its own fixup);
    the proof of the whole block would leave them assumed and run SDPA only where neither mask is passed."""
    result = analyze_source(CONDITIONAL_BIAS, "case.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and finding.patch is not None
    guard = next(line for line in result.fixed.splitlines() if "scaled_dot_product_attention" in line or
                 line.strip().startswith("if attn_mask is None"))
    assert guard.strip().startswith("if attn_mask is None and") and "key_padding_mask is None:" not in guard
    assert "fully-masked-rows" not in fact_names(finding, "assumed")
    original, patched = _pair(CONDITIONAL_BIAS, unsafe_fixes=False)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2), requires_grad=True)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1] = True  # every key of sample 1 padded: its rows are uniform in the original
    expected, got = original(x, None, pad), patched(x, None, pad)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(expected.sum(), x)[0])

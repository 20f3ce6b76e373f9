"""Weights zeroed after the softmax where the mask masks (ESPnet, WeNet, icefall: `softmax(s.masked_fill(m, -inf))
.masked_fill(m, 0.0)`): a fully masked row is 0 in the original and in SDPA, so the block is safe with padding, and
its values and gradients match on every row (attention.zeroed_rows). Any other mask for the zeroing, a second
mask, a mask rebound between the fills, keeps the refusal."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

BLOCK = '''import math
import torch
from torch import nn


class MultiHeadedAttention(nn.Module):
    def __init__(self, n_head=2, n_feat=16, dropout_rate=0.0):
        super().__init__()
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.dropout = nn.Dropout(p=dropout_rate)

    def forward(self, x, mask):
        n_batch = x.size(0)
        q = self.linear_q(x).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        k = self.linear_k(x).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        mask = mask.unsqueeze(1).eq(0)
        {between}
        scores = scores.masked_fill(mask, {fill})
        attn = {weights}
        p_attn = self.dropout(attn)
        x = torch.matmul(p_attn, v)
        return x.transpose(1, 2).reshape(n_batch, -1, self.h * self.d_k)


def run(dtype=torch.float32):
    torch.manual_seed(0)
    m = MultiHeadedAttention().to(dtype)
    x = torch.randn(3, 6, 16, dtype=dtype, requires_grad=True)
    lens = torch.tensor([6, 3, 0])  # the last sample is all padding: its rows are masked everywhere
    mask = (torch.arange(6)[None, :] < lens[:, None]).unsqueeze(1)
    out = m(x, mask)
    out.pow(2).sum().backward()
    return [out] + [p.grad for p in m.parameters()] + [x.grad]
'''
ZEROED = "torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)"


def _block(fill: str = "-float('inf')", weights: str = ZEROED, between: str = "pass") -> str:
    return BLOCK.format(fill=fill, weights=weights, between=between)


@pytest.mark.parametrize("fill", ["-float('inf')", "torch.finfo(scores.dtype).min", "-1e4",
                                  "float(torch.finfo(scores.dtype).min)"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_padded_block_whose_weights_are_zeroed_is_safe_and_exact_on_fully_masked_rows(fill, dtype):
    source = _block(fill)
    result = analyze_source(source, "attn.py")
    [finding] = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.reason
    rows = [fact for fact in finding.extra["facts"]["proved"] if fact["name"] == "fully-masked-rows"]
    assert rows and "0" in rows[0]["statement"]
    original = load_module_from_source(source, "zeroed_original").run(dtype)
    patched = load_module_from_source(result.fixed, "zeroed_patched").run(dtype)
    assert "scaled_dot_product_attention" in result.fixed and "masked_fill(mask, 0.0)" in result.fixed  # fallback
    for mine, theirs in zip(patched, original):
        torch.testing.assert_close(mine, theirs, equal_nan=False)


@pytest.mark.parametrize("weights, between", [
    ("torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)", "pass"),  # the other polarity
    ("torch.softmax(scores, dim=-1).masked_fill(mask[:, :, :1], 0.0)", "pass"),  # another mask
    (ZEROED.replace("(mask,", "(other,"), "other = mask.clone()"),  # another name
    (ZEROED, "scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), -1e9)"),  # a second mask
    ("torch.softmax(scores, dim=-1).masked_fill(mask, 0.5)", "pass"),  # not zeroed
])
def test_a_zeroing_that_is_not_the_one_mask_of_the_block_is_refused(weights, between):
    [finding] = [f for f in analyze_source(_block(weights=weights, between=between), "attn.py").findings
                 if f.kind == "attention"]
    assert finding.patch is None and "before the value product" in finding.reason, finding.reason


@pytest.mark.parametrize("fill, mask", [("-1e9", "mask"), ("-float('inf')", "torch.rand(3, 1, 1, 6) > 0.5")])
def test_a_fill_float16_cannot_hold_or_a_mask_drawn_twice_is_refused(fill, mask):
    """Breaker round 34: `masked_fill(m, -1e9)` raises on float16 scores where the patch's boolean mask runs; a mask
    expression with a call (`torch.rand(...) > 0.5` in both fills) is another tensor each time."""
    source = _block(fill=fill, weights=f"torch.softmax(scores, dim=-1).masked_fill({mask}, 0.0)")
    if "rand" in mask:
        source = source.replace("scores.masked_fill(mask, ", f"scores.masked_fill({mask}, ")
    [finding] = [f for f in analyze_source(source, "attn.py").findings if f.kind == "attention"]
    assert finding.patch is None, finding.reason


def test_a_zeroing_after_the_weights_are_transposed_is_refused():
    """Breaker round 34: `softmax(s).transpose(-2, -1).masked_fill(m, 0.0)` zeroes other positions."""
    source = _block(weights="torch.softmax(scores, dim=-1).transpose(-2, -1).masked_fill(mask, 0.0)")
    source = source.replace("torch.matmul(p_attn, v)", "torch.matmul(p_attn.transpose(-2, -1), v)")
    [finding] = [f for f in analyze_source(source, "attn.py").findings if f.kind == "attention"]
    assert finding.patch is None, finding.reason


def test_a_mask_rebound_between_the_fill_and_the_zeroing_is_refused():
    source = _block(weights="torch.softmax(scores, dim=-1)\n        mask = ~mask\n        attn = "
                            "attn.masked_fill(mask, 0.0)")
    [finding] = [f for f in analyze_source(source, "attn.py").findings if f.kind == "attention"]
    assert finding.fix_safety != "safe" or finding.patch is None, finding.reason


def test_a_commented_line_the_guard_reads_moves_above_it_with_its_comment_once():
    """The mask line the rank check reads runs above the check; its comment goes with it, and is not also carried
    to the statement after the guarded block (as `# attend to values` was, twice, in transformers' Chameleon)."""
    source = _block().replace("        mask = mask.unsqueeze(1).eq(0)\n",
                              "        # the padded keys\n        mask = mask.unsqueeze(1).eq(0)\n")
    fixed = analyze_source(source, "attn.py").fixed
    assert fixed.count("# the padded keys") == 1
    assert fixed.index("# the padded keys") < fixed.index("mask = mask.unsqueeze(1)") < fixed.index("if isinstance(")


BRANCHED = '''import math
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, n_head=2, n_feat=16):
        super().__init__()
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)

    def forward(self, x, mask):
        n_batch = x.size(0)
        q = self.linear_q(x).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        scores = torch.matmul(q, q.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            mask = mask.unsqueeze(1).eq(0)
            scores = scores.masked_fill(mask, float(torch.finfo(scores.dtype).min))
            attn = torch.softmax(scores, dim=-1).masked_fill({zeroed}, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        return torch.matmul(attn, v)


def run(dtype=torch.float32, masked=True):
    torch.manual_seed(0)
    m = Attention().to(dtype)
    x = torch.randn(3, 6, 16, dtype=dtype, requires_grad=True)
    lens = torch.tensor([6, 3, 0])
    mask = (torch.arange(6)[None, :] < lens[:, None]).unsqueeze(1) if masked else None
    out = m(x, mask)
    out.pow(2).sum().backward()
    return [out] + [p.grad for p in m.parameters()] + [x.grad]
'''


@pytest.mark.parametrize("masked", [True, False])
def test_espnet_s_branches_zeroing_under_the_mask_s_if_and_a_plain_softmax_else_are_one_block(masked):
    """ESPnet's form: the fill and the zeroing under `if mask is not None:`, a plain softmax in `else:` (one block,
    SDPA's mask None on the `else` path); `float(torch.finfo(...).min)` is the finite fill. The mask's rank after
    `unsqueeze` inside the `if` stays assumed (unsafe); the patch is exact where it holds."""
    source = BRANCHED.format(zeroed="mask")
    [finding] = [f for f in analyze_source(source, "attn.py").findings if f.kind == "attention"]
    assert finding.patch is not None and {f["name"] for f in finding.extra["facts"]["assumed"]} == {"mask-rank"}
    fixed = analyze_source(source, "attn.py", unsafe_fixes=True).fixed
    original = load_module_from_source(source, "branched_original").run(torch.float64, masked)
    patched = load_module_from_source(fixed, "branched_patched").run(torch.float64, masked)
    for mine, theirs in zip(patched, original):
        torch.testing.assert_close(mine, theirs)


def test_a_branch_zeroing_another_mask_is_no_twin_of_the_plain_softmax():
    source = BRANCHED.format(zeroed="mask[:, :, :1]")
    assert all(f.patch is None for f in analyze_source(source, "attn.py").findings if f.kind == "attention")

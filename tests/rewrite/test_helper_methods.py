"""Attention split across methods of its class: the scores from `self._scores(q, k)`, the value product from
`self._mix(w, v)` (`@`, matmul or einsum), the weights returned only under `if output_attentions:`. The facts a
whole block would prove or guard hold across the helpers too: their parameters are the call's arguments, and
their `self` is the caller's, so a guard reads `self.p` or `self.hd` where the block starts. Each patch is run
against the original: outputs and gradients in fp32 and fp64, dropout under one seed in training, the flag on and
off, and a dropout probability out of range (the original raises, so must the patch)."""

from __future__ import annotations

import textwrap

import pytest

from attention_sources import attention_finding_and_fix, fact_names
from dtype_parity import FP32, FP64, compare_run, load_pair
from fixture_models import dispatched_ops, uses_sdpa

SPLIT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, d=16, h=2, p=0.1):
        super().__init__()
        self.h, self.hd = h, d // h
        self.qkv = nn.Linear(d, 3 * d)
        self.p = p

    def forward(self, x, output_attentions=False):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
{body}

    def _scores(self, q, k):
        return {scores}

    def _mix(self, att, v):
        return {mix}


def build(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return Attn(p=dropout), (torch.randn(2, 5, 16),)
'''
MATMUL = ("(q @ k.transpose(-2, -1)) * self.hd ** -0.5", "att @ v")
EINSUM = ("torch.einsum('bhqd,bhkd->bhqk', q, k) * self.hd ** -0.5", "torch.einsum('bhqk,bhkd->bhqd', att, v)")
TORCH_MATMUL = ("torch.matmul(q, k.mT) * self.hd ** -0.5", "torch.matmul(att, v)")
DROPOUT = """
att = self._scores(q, k).softmax(dim=-1)
att = F.dropout(att, p=self.p, training=self.training)
return self._mix(att, v)
"""
ON_REQUEST = """
att = self._scores(q, k).softmax(dim=-1)
y = self._mix(att, v)
if output_attentions:
    return y, att
return y, None
"""


def _source(body: str, products: tuple[str, str]) -> str:
    return SPLIT.format(body=textwrap.indent(body.strip("\n"), " " * 8), scores=products[0], mix=products[1])


@pytest.mark.parametrize("products", [MATMUL, EINSUM, TORCH_MATMUL], ids=["at", "einsum", "matmul"])
def test_helper_products_with_dropout_get_a_safe_patch_with_parity(products) -> None:
    source = _source(DROPOUT, products)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe", finding.reasons
    assert {"dropout-range", "scale-is-number"} <= fact_names(finding, "guarded")
    assert "self._scores(q, k)" in fixed  # kept in the fallback the guard runs
    original, rewritten = load_pair(source, fixed, "helper_methods")
    for dtype, atol, rtol in (FP32, FP64):
        for seed in (0, 1):
            compare_run(original, rewritten, seed=seed, dtype=dtype, atol=atol, rtol=rtol)
            compare_run(original, rewritten, seed=seed, dtype=dtype, atol=atol, rtol=rtol, dropout=0.0, train=True)
    model, inputs = rewritten.build(0, 0.1)
    assert uses_sdpa(dispatched_ops(model, inputs))


def test_the_guard_runs_the_original_where_the_probability_is_out_of_range() -> None:
    """`self.p = 1.5`: F.dropout raises even in eval mode, and so does the patch, through its fallback."""
    source = _source(DROPOUT, EINSUM)
    _, fixed = attention_finding_and_fix(source)
    original, rewritten = load_pair(source, fixed, "helper_methods_range")
    for side in (original, rewritten):
        model, inputs = side.build(0, 1.5)
        with pytest.raises(ValueError, match="dropout probability"):
            model.eval()(*inputs)


@pytest.mark.parametrize("products", [MATMUL, EINSUM], ids=["matmul", "einsum"])
def test_weights_returned_on_request_from_helper_methods(products) -> None:
    source = _source(ON_REQUEST, products)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe", finding.reasons
    assert "flag-is-bool" in fact_names(finding, "guarded")
    original, rewritten = load_pair(source, fixed, "helper_methods_flag")
    for flag in (False, True):
        for dtype, atol, rtol in (FP32, FP64):
            compare_run(original, rewritten, dtype=dtype, atol=atol, rtol=rtol,
                        inputs_hook=lambda inputs, flag=flag: (*inputs, flag))
    model, inputs = rewritten.build(0, 0.0)
    assert uses_sdpa(dispatched_ops(model, (*inputs, False)))
    assert not uses_sdpa(dispatched_ops(model, (*inputs, True)))


def test_a_helper_reading_the_weights_twice_is_not_a_value_product() -> None:
    """`_mix` that also adds the weights back (`w @ v + w.sum(-1, keepdim=True)`) is no one-op helper: refused."""
    source = _source(DROPOUT, (MATMUL[0], "att @ v + att.sum(-1, keepdim=True)"))
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety != "safe" and fixed == source

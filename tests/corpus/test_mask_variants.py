"""Mask variants over three of the round-3 layouts (BERT-style 4-D matmul, einsum, fairseq-style heads folded into
the batch with the mask applied on a 4-D view): the mask's dtype (bool/float/int), rank (2/3/4), polarity,
how it is applied (masked_fill, where, added as a float bias), the fill, and whether a query row is fully masked
are drawn by hypothesis. A safe patch must match the original's outputs and gradients in fp32, an unsafe one must
run, a refusal must give a reason, and no variant may go unnoticed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from advisor.engine.static import analyze_source
from dtype_parity import FP32, compare_run, load_pair

LAYOUTS = {
    "bert4d": ("s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)", "", "",
               "o = torch.matmul(w, v)"),
    "einsum": ('s = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale', "", "",
               'o = torch.einsum("bhij,bhjd->bhid", w, v)'),
    "folded": ("q, k, v = (t.reshape(b * self.h, n, self.d) for t in (q, k, v))\n"
               "        s = torch.bmm(q, k.transpose(1, 2)) * self.scale",
               "s = s.view(b, self.h, n, n)", "s = s.view(b * self.h, n, n)",
               "o = torch.bmm(w, v)"),
}
EXPAND = {2: "mask[:, None, None, :]", 3: "mask.unsqueeze(1)", 4: "mask"}
FILLS = {"-inf": 'float("-inf")', "finfo.min": "torch.finfo(s.dtype).min", "-1e9": "-1e9", "-1e4": "-10000.0"}


@dataclass(frozen=True)
class MaskVariant:
    layout: str
    dtype: str  # bool, float, int
    rank: int
    keep_polarity: bool  # True: True/1 means attend
    apply: str  # masked_fill, where, additive
    fill: str
    fully_masked: bool

    def conditions(self) -> tuple[str, str]:
        """(dropped, kept) expressions over the expanded mask `m`."""
        if self.dtype == "bool":
            return ("~m", "m") if self.keep_polarity else ("m", "~m")
        return ("m == 0", "m != 0") if self.keep_polarity else ("m != 0", "m == 0")

    def apply_code(self) -> str:
        dropped, kept = self.conditions()
        fill = FILLS[self.fill]
        if self.apply == "masked_fill":
            return f"s = s.masked_fill({dropped}, {fill})"
        if self.apply == "where":
            return f"s = torch.where({kept}, s, {fill})"
        # a float bias built from the mask before the scores exist (BERT's extended mask; log() for -inf)
        kept_float = {(True, True): "m", (True, False): "(~m)", (False, True): "m", (False, False): "(1 - m)"}[
            (self.dtype == "bool", self.keep_polarity)] + ".to(x.dtype)"
        if self.fill == "-inf":
            return f"bias = {kept_float}.log()\n        s = s + bias"
        return f"bias = (1.0 - {kept_float}) * {fill.replace('s.dtype', 'x.dtype')}\n        s = s + bias"

    def source(self) -> str:
        product, to_4d, from_4d, value_product = LAYOUTS[self.layout]
        lines = [product, to_4d, f"m = {EXPAND[self.rank]}", self.apply_code(), from_4d,
                 "w = torch.softmax(s, dim=-1)", value_product]
        body = "\n        ".join(line for line in lines if line)
        out = "o.view(b, self.h, n, self.d)" if self.layout == "folded" else "o"
        return TEMPLATE.format(body=body, out=out, variant=repr(self), dtype=self.dtype, rank=self.rank,
                               keep=self.keep_polarity, fully=self.fully_masked)


TEMPLATE = '''"""{variant}"""
import math

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.h = heads
        self.d = dim // heads
        self.scale = self.d ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, mask):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        {body}
        o = {out}
        return self.out(o.transpose(1, 2).reshape(b, n, c))


def build(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    b, n = 2, 5
    shape = {{2: (b, n), 3: (b, n, n), 4: (b, 1, n, n)}}[{rank}]
    keep = torch.rand(shape) > 0.4
    keep[..., 0] = True
    if {fully}:
        keep[1] = False if {rank} == 2 else keep[1]
        if {rank} != 2:
            keep[1, ..., 2, :] = False
    mask = keep if {keep} else ~keep
    mask = mask.to({{"bool": torch.bool, "float": torch.float32, "int": torch.int64}}["{dtype}"])
    return Attention(), (torch.randn(b, n, 16), mask)
'''

variants = st.builds(MaskVariant, layout=st.sampled_from(sorted(LAYOUTS)),
                     dtype=st.sampled_from(["bool", "float", "int"]), rank=st.sampled_from([2, 3, 4]),
                     keep_polarity=st.booleans(), apply=st.sampled_from(["masked_fill", "where", "additive"]),
                     fill=st.sampled_from(sorted(FILLS)), fully_masked=st.booleans())


def _judge(variant: MaskVariant) -> None:
    source = variant.source()
    result = analyze_source(source, "mask_variant.py", unsafe_fixes=True)
    findings = [f for f in result.findings if f.kind == "attention"]
    assert findings, f"no attention finding for a plain masked attention: {variant}"
    for finding in findings:
        if not finding.fixable:
            assert finding.reason and len(finding.reason) > 20, finding.reason
            continue
        fixed = result.fixed_with([finding]).text
        original, rewritten = load_pair(source, fixed, "mask_variant")
        if finding.fix_safety == "unsafe":
            model, inputs = rewritten.build(0, 0.0)
            model.eval()(*inputs)
            continue
        accepted = {fact["name"] for fact in finding.extra["facts"].get("accepted", [])}
        for dtype, atol, rtol in (FP32,):
            compare_run(original, rewritten, dtype=dtype, atol=atol, rtol=rtol,
                        accept_nan="fully-masked-rows" in accepted)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=15, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mask_variants(layout, data):
    variant = data.draw(variants.filter(lambda v: v.layout == layout))
    _judge(variant)


@pytest.mark.parametrize("fill", ["finfo.min", "-1e9"])
def test_finite_additive_mask_with_fully_masked_row(fill):
    """A float bias built with a large finite constant masks as a finite fill does: a fully masked row gets other
    gradients from SDPA, so the patch assumes none (the einsum layout proves the bias's rank and dtype: before
    this round this patch was safe and its gradients wrong)."""
    variant = MaskVariant("einsum", "bool", 2, True, "additive", fill, True)
    _judge(variant)
    (finding,) = analyze_source(variant.source(), "mask_variant.py").findings
    assert finding.fix_safety == "unsafe"
    assert "fully-masked-rows" in {fact["name"] for fact in finding.extra["facts"]["assumed"]}

"""Causal additive masks read as the values of their squares' three parts (`attention.triangles`): every spelling
that is 0 on and below the diagonal proves no row fully masked, whatever builds it, and nothing else does. Each
mask is a module-level tensor the block adds to its scores (a mask of no such form built from constants is computed,
`evaluated_masks`); where the proof holds, the patch is run against the
original in float64, outputs and gradients, with a fully masked row impossible by construction."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from advisor.patterns.attention.triangles import Parts, _held
from fixture_models import load_module_from_source

TUTORIAL_HELPER = '''
def generate_square_subsequent_mask(sz):
    """The PyTorch tutorial's helper."""
    mask = (torch.triu(torch.ones(sz, sz)) == 1).transpose(0, 1)
    mask = mask.float().masked_fill(mask == 0, float('-inf')).masked_fill(mask == 1, float(0.0))
    return mask
'''
CLIP_HELPER = '''
def build_causal_mask(n):
    mask = torch.empty(n, n)
    mask.fill_(float("-inf"))
    mask.triu_(1)
    return mask
'''
ALIASED_HELPER = '''
def build_causal_mask(n):
    mask = torch.empty(n, n)
    keep = mask
    mask.fill_(float("-inf"))
    mask.triu_(1)
    return keep.tril()
'''

SOURCE = '''
import math
import numpy as np
import torch
import torch.nn.functional as F
{helper}
MASK = {mask}


def attend(q, k, v):
    s = q @ k.transpose(-1, -2) * 0.5
    return F.softmax(s + MASK, dim=-1) @ v
'''

KEEPS_KEY_ZERO = {
    "tutorial helper": ("generate_square_subsequent_mask(5)", TUTORIAL_HELPER),
    "CLIP's in-place helper": ("build_causal_mask(5)", CLIP_HELPER),
    "full, triu(1)": ("torch.full((5, 5), float('-inf')).triu(1)", ""),
    "stacked squares": ("torch.triu(torch.full((1, 1, 5, 5), -1e9), diagonal=1)", ""),
    "empty, fill_, triu_": ("torch.empty(5, 5).fill_(-np.inf).triu_(1)", ""),
    "zeros, masked_fill of tril == 0": ("torch.zeros(5, 5).masked_fill(torch.tril(torch.ones(5, 5)) == 0, -1e4)", ""),
    "where of a bool tril": ("torch.where(torch.tril(torch.ones(5, 5)).bool(), 0.0, float('-inf'))", ""),
    "one minus tril, times a fill": ("(1.0 - torch.tril(torch.ones(5, 5))) * -1e9", ""),
    "transposed triu": ("torch.where(torch.ones(5, 5).triu().T == 1, 0.0, -1e4)", ""),
    "finfo fill, viewed 4-D": ("torch.full((5, 5), torch.finfo(torch.float32).min).triu(1).view(1, 1, 5, 5)", ""),
    "not of an upper comparison": ("torch.where(~(torch.ones(5, 5).triu(1) == 1), 0.0, -1e9)", ""),
    # computed (evaluated_masks): every row keeps its diagonal key, read whole
    "transposed (anti-causal)": ("torch.full((5, 5), float('-inf')).triu(1).t()", ""),
}
MASKS_A_ROW = {
    "triu without the diagonal kept": ("torch.full((5, 5), float('-inf')).triu()", ""),  # row 0 fully masked
    "tutorial helper, polarity flipped": ("generate_square_subsequent_mask(5)",
                                          TUTORIAL_HELPER.replace("== 1).transpose", "== 0).transpose")),
    "in-place helper on an aliased tensor": ("build_causal_mask(5)", ALIASED_HELPER),
    "one plus tril, times a fill": ("(1.0 + torch.tril(torch.ones(5, 5))) * -1e9", ""),
    "half overflow then added back": ("torch.full((5, 5), -1e9).half().triu(1) + 1e9", ""),
    "not of an integer triangle": ("torch.where(~torch.ones(5, 5).triu(1).long() == 0, 0.0, -1e9)", ""),
    # float16 arithmetic: -6e4 * 2 is -inf there, and adding 1.2e5 back leaves -inf everywhere (0 in float32)
    "half doubled past its range": ("torch.full((5, 5), -6e4, dtype=torch.half) * 2 + 1.2e5", ""),
    "half filled past its range": ("torch.zeros(5, 5).half().masked_fill(torch.ones(5, 5) > 0, -1e5) + 1e5", ""),
    # an in-place call inside an assignment overwrites the whole square (breaker round 12, bug 19)
    "helper filled in place inside an assignment": ("build_causal_mask(5)", CLIP_HELPER.replace(
        "    mask.triu_(1)\n", "    mask.triu_(1)\n    z = mask.fill_(-1e9)\n")),
}


def _proved(mask: str, helper: str) -> tuple[bool, str, str]:
    source = SOURCE.format(mask=mask, helper=helper)
    result = analyze_source(source, "m.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    return "fully-masked-rows" in {fact["name"] for fact in finding.extra["facts"].get("proved", [])}, source, \
        result.fixed


@pytest.mark.parametrize("mask, helper", KEEPS_KEY_ZERO.values(), ids=KEEPS_KEY_ZERO)
def test_a_mask_zero_on_and_below_the_diagonal_keeps_every_row(mask, helper):
    proved, source, fixed = _proved(mask, helper)
    assert proved and fixed != source
    original, patched = load_module_from_source(source, "square"), load_module_from_source(fixed, "square_fixed")
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64, requires_grad=True,
                           generator=torch.Generator().manual_seed(i)) for i in range(3))
    expected, got = original.attend(q, k, v), patched.attend(q, k, v)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got.square().sum(), (q, k, v)),
                               torch.autograd.grad(expected.square().sum(), (q, k, v)))


@pytest.mark.parametrize("mask, helper", MASKS_A_ROW.values(), ids=MASKS_A_ROW)
def test_a_mask_that_may_mask_a_whole_row_proves_nothing(mask, helper):
    assert not _proved(mask, helper)[0]


def test_integer_values_outside_their_dtype_are_not_read():
    """uint8 holds `0 - 1` as 255 and int16 `-40000` as 25536: a value past an integer dtype's range is not the one
    the tensor holds (breaker round 11, bug 12)."""
    parts = Parts(below=0.0, diagonal=0.0, above=-100.0, ndim=2, side="5")
    assert _held(parts, "uint8") is None
    assert _held(parts, "int8").above == -100.0
    assert _held(Parts(below=0.0, diagonal=0.0, above=-40000.0, ndim=2, side="5"), "int16") is None
    assert _held(Parts(below=0.0, diagonal=0.0, above=-40000.0, ndim=2, side="5"), "int32").dtype == "int32"

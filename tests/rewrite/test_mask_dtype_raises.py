"""A boolean mask's dtype where the patch would not raise as the original does.

`masked_fill` takes only a bool mask, so a patch that passes that mask (or its complement) to SDPA raises wherever
the original does, except where it drops a `~`: `~m` raises on a float `m`, while SDPA would add a float `m` to the
scores. `torch.where` also takes a uint8 condition (read as bool), which SDPA rejects. Where the source does not
show the dtype, the patch checks it (`m.dtype == torch.bool`) and runs the original block otherwise, so every
dtype gives what the original gives: the same values, or the same exception. Where the callers in the tree show
it, it is proved from their call sites and nothing is checked.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from attention_sources import masked_module
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

FORMS = {  # how the mask is applied; `mask` is a (b, 1, 1, n) 0/1 mask of the dtype under test
    "masked_fill(~mask)": 'scores = scores.masked_fill(~mask, float("-inf"))',
    "masked_fill(~mask) finite": "scores = scores.masked_fill(~mask, -1e9)",
    "where(mask, s, fill)": 'scores = torch.where(mask, scores, float("-inf"))',
    "where(mask, s, fill) finite": "scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)",
    "where(~mask, fill, s)": 'scores = torch.where(~mask, float("-inf"), scores)',
    "masked_fill(mask) finite": "scores = scores.masked_fill(mask, -1e9)",  # 1 = masked here
    "under if": 'if mask is not None:\n    scores = scores.masked_fill(~mask[:, :, :, :], float("-inf"))',
}
DTYPES = [torch.bool, torch.uint8, torch.int64, torch.float32]


def _source(form: str) -> str:
    return masked_module(f"scores = (q @ k.transpose(-2, -1)) * 0.25\n{FORMS[form]}\nout = scores.softmax(dim=-1) @ v")


def _outcome(model, x, mask):
    """The output, or the exception's type: what a caller sees."""
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # where() warns that a uint8 condition is deprecated
            return model(x, mask)
    except (RuntimeError, TypeError) as error:
        return type(error)


def _pair(source: str, fixed: str, name: str):
    """The original and the patched module, with the same weights."""
    torch.manual_seed(0)
    original = load_module_from_source(source, name).Attention().eval()
    patched = load_module_from_source(fixed, f"{name}_fixed").Attention().eval()
    patched.load_state_dict(original.state_dict())
    return original, patched


def _assert_same_outcome(original, patched, x, mask, equal_nan: bool = False):
    """The same values, or the same exception type."""
    expected, got = _outcome(original, x, mask), _outcome(patched, x, mask)
    if isinstance(expected, type):
        assert got is expected, (mask.dtype, got)
    else:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, equal_nan=equal_nan)
    return got


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_mask_dtype_gives_what_the_original_gives(form):
    source = _source(form)
    [finding] = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.reason
    assert "mask-dtype" in {fact["name"] for fact in finding.extra["facts"]["guarded"]}
    assert "mask.dtype == torch.bool" in finding.patch
    original, patched = _pair(source, analyze_source(source, "case.py").fixed, "case")
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    for dtype in DTYPES:
        mask = torch.ones(2, 1, 1, 5, dtype=dtype)
        mask[0, ..., 3:] = 0
        got = _assert_same_outcome(original, patched, x, mask, equal_nan=True)
        assert uses_sdpa(dispatched_ops(patched, (x, mask.bool()))) and \
            (dtype is torch.bool or not uses_sdpa(dispatched_ops(patched, (x, mask)))
             if not isinstance(got, type) else True)


CALLER = '''
import torch
from torch import nn

from attn import Attention


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.attn = Attention()

    def forward(self, ids):
        return self.attn(self.embed(ids), {mask})
'''


@pytest.mark.parametrize(("mask", "proved"), [("(ids != 0)[:, None, None, :]", True),
                                              ("(ids != 0).float()[:, None, None, :]", False)])
def test_a_caller_that_passes_a_comparison_proves_the_dtype(tmp_path, mask, proved):
    (tmp_path / "attn.py").write_text(_source("masked_fill(~mask)"))
    (tmp_path / "model.py").write_text(CALLER.format(mask=mask))
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    from_sites = {fact["name"] for fact in finding.extra["facts"].get("from_call_sites", [])}
    guarded = {fact["name"] for fact in finding.extra["facts"].get("guarded", [])}
    assert finding.fix_safety == "safe"
    assert ("mask-dtype" in from_sites) == proved and ("mask-dtype" in guarded) == (not proved)


def test_a_mask_built_as_bool_in_the_block_needs_no_check():
    source = _source("masked_fill(~mask)").replace("    def forward(self, x, mask):\n",
                                                   "    def forward(self, x, ids):\n        mask = ids.ne(0)[:, None, None, :]\n")
    [finding] = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and "mask.dtype" not in finding.patch
    assert "mask-dtype" not in {fact["name"] for status in ("guarded", "assumed")
                                for fact in finding.extra["facts"].get(status, [])}


LUCIDRAINS = '''
import torch
import torch.nn.functional as F
from torch import nn, einsum
from einops import rearrange


def exists(v):
    return v is not None


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)

    def forward(self, x, mask=None):
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> b h n d', h=self.heads), (q, k, v))
        sim = einsum('b h i d, b h j d -> b h i j', q, k) * 0.25
        if exists(mask):
            mask = F.pad(mask, (1, 0), value=True)[:, 1:]  # imagen pads a null key's mask
            mask = rearrange(mask, 'b j -> b 1 1 j')
            sim = sim.masked_fill(~mask, float('-inf'))
        out = einsum('b h i j, b h j d -> b h i d', sim.softmax(dim=-1), v)
        return rearrange(out, 'b h n d -> b n (h d)')
'''
PADDED_CALLER = '''

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.attn = Attention()

    def forward(self, ids):
        return self.attn(self.embed(ids), mask=ids != 0)
'''


@pytest.mark.parametrize("caller", [False, True], ids=["no caller: guarded", "a caller passes ids != 0: proved"])
def test_a_mask_rebound_by_rearrange_is_read_as_the_parameter_it_views(tmp_path, caller):
    """`mask = F.pad(mask, ...)` and `mask = rearrange(mask, ...)` keep the parameter's dtype: the guard checks
    the parameter, and a caller that passes a comparison proves it."""
    source = LUCIDRAINS + (PADDED_CALLER if caller else "")
    (tmp_path / "attn.py").write_text(source)
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    facts = finding.extra["facts"]
    assert finding.fix_safety == "safe", finding.reason
    assert "mask-dtype" in {f["name"] for f in facts.get("from_call_sites" if caller else "guarded", [])}
    original, patched = _pair(source, _fixed(tmp_path), "luc")
    x = torch.randn(2, 5, 16)
    for dtype in [torch.bool] if caller else DTYPES:  # proved from call sites: for what the tree's callers pass
        mask = torch.ones(2, 5, dtype=dtype)
        mask[0, 3:] = 0
        _assert_same_outcome(original, patched, x, mask)
    assert uses_sdpa(dispatched_ops(patched, (x, torch.ones(2, 5, dtype=torch.bool))))


def _fixed(root) -> str:
    [result] = [f for f in scan_paths([str(root)], jobs=1, fixed=True).files]
    return result.fixed


MPT_CAUSAL = """
s = max(q.size(-2), k.size(-2))
causal_mask = q.new_ones(s, s, dtype=torch.float32)
causal_mask = causal_mask.tril()
causal_mask = causal_mask.to(torch.bool)
causal_mask = ~causal_mask
causal_mask = causal_mask[-q.size(-2):, -k.size(-2):]
scores = (q @ k.transpose(-2, -1)) * 0.25
scores = scores.masked_fill(causal_mask.view(1, 1, q.size(-2), k.size(-2)), torch.finfo(q.dtype).min)
out = scores.softmax(dim=-1) @ v"""


@pytest.mark.parametrize("written", [False, True], ids=["rebound by views and casts", "an alias written in place"])
def test_a_mask_rebound_from_itself_keeps_the_dtype_it_was_cast_to(written):
    """MPT's causal mask is rebound from itself four times (`m = m.tril()`, `m = m.to(torch.bool)`, `m = ~m`,
    `m = m[...]`): each rebinding is a read of the same local, so its bool dtype is read through the chain, while
    a write through an alias (`alias = m; alias.logical_not_()`) is a new value of the mask, whose dtype the
    patch checks (guarded) where it reads it."""
    body = MPT_CAUSAL.replace("scores = (q", "alias = causal_mask\nalias.logical_not_()\nscores = (q") \
        if written else MPT_CAUSAL
    source = masked_module(body)
    [finding] = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    facts = {status: {fact["name"] for fact in finding.extra["facts"].get(status, [])}
             for status in ("guarded", "assumed")}
    assert finding.fix_safety == "safe", finding.reason
    assert "mask-dtype" not in facts["assumed"] and ("mask-dtype" in facts["guarded"]) == written
    original, patched = _pair(source, analyze_source(source, "case.py").fixed, "mpt")
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    _assert_same_outcome(original, patched, x, mask)
    assert uses_sdpa(dispatched_ops(patched, (x, mask)))

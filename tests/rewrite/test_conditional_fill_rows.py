"""A finite fill applied under an `if` (lucidrains' `if exists(mask): sim = sim.masked_fill(~mask, -finfo.max)`,
`if mask is not None: s = s.masked_fill(mask == 0, -1e9)`): the patch binds the keep mask where the original fills,
to a name that starts as None, so a run that fills gets the uniform-rows fixup and one that does not gets q and no
mask. Both paths are run original vs patched (outputs and q/k/v gradients, float32/float64/bfloat16), with fully
masked rows (a sample all padding, a query row all masked) and masks of each rank and dtype the code admits; where
the row is not constant in the original the fact stays assumed, and flex refuses the form."""

from __future__ import annotations

import functools

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

FUNCTION = '''
import math
import torch
import torch.nn.functional as F


def exists(val):
    return val is not None


def attend(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if {test}:
        scores = {masking}
    weights = F.softmax(scores, dim=-1)
    return weights @ v
'''

# (the `if`'s test, the fill line, how `mask` is built from a keep mask (True = attend))
FORMS = {
    "exists_inverted_finfo_max": ("exists(mask)", "scores.masked_fill(~mask, -torch.finfo(scores.dtype).max)",
                                  lambda keep: keep),
    "not_none_eq0_1e9_float": ("mask is not None", "scores.masked_fill(mask == 0, -1e9)", lambda keep: keep.float()),
    "not_none_eq0_1e4_int": ("mask is not None", "scores.masked_fill(mask == 0, -10000.0)", lambda keep: keep.long()),
    "not_none_where_keep": ("mask is not None", "torch.where(mask, scores, torch.finfo(scores.dtype).min)",
                            lambda keep: keep),
}
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-10, torch.bfloat16: 3e-2}
B, H, L, S, E = 3, 2, 5, 6, 4


@functools.cache
def _source(form: str) -> str:
    test, masking, _ = FORMS[form]
    return FUNCTION.format(test=test, masking=masking)


def _attention_finding(source: str, **options):
    (finding,) = [f for f in analyze_source(source, "case.py", **options).findings if f.kind == "attention"]
    return finding


def _facts(finding, status: str) -> set[str]:
    return {fact["name"] for fact in finding.extra["facts"].get(status, [])}


def _keep_masks(generator: torch.Generator) -> dict[str, tuple[tuple[int, ...], torch.Tensor | None]]:
    padding = torch.ones(B, 1, 1, S, dtype=torch.bool)
    padding[0, ..., -2:] = False
    padding[2] = False  # a sample all padding
    rows = torch.rand(B, H, L, S, generator=generator) > 0.4
    rows[1, 0, 3] = False  # a query row all masked
    square = torch.rand(L, S, generator=generator) > 0.3
    square[2] = False
    folded = torch.rand(B * H, L, S, generator=generator) > 0.5
    folded[4] = False
    return {"none": ((B, H), None), "padding_rank4": ((B, H), padding), "rows_rank4": ((B, H), rows),
            "rank2": ((B, H), square), "folded_rank3": ((B * H,), folded)}


@pytest.mark.parametrize("form", FORMS)
def test_the_fill_under_if_is_safe_with_its_rows_fact_settled(form):
    finding = _attention_finding(_source(form))
    assert finding.fix_safety == "safe" and finding.patch, finding.reason
    assert "fully-masked-rows" in _facts(finding, "proved") | _facts(finding, "guarded")
    assert not _facts(finding, "assumed")


@pytest.mark.parametrize("form", FORMS)
def test_both_paths_of_the_if_match_the_original_with_gradients(form):
    source = _source(form)
    fixed = analyze_source(source, "case.py").fixed
    assert "attn_keep: torch.Tensor | None = None" in fixed and "scaled_dot_product_attention" in fixed
    original = load_module_from_source(source, f"cond_{form}").attend
    patched = load_module_from_source(fixed, f"cond_{form}_fixed").attend
    generator = torch.Generator().manual_seed(11)
    for case, (batch, keep) in _keep_masks(generator).items():
        for dtype, tolerance in TOLERANCE.items():
            q, k, v = (torch.randn(*batch, n, E, generator=generator).to(dtype) for n in (L, S, S))
            upstream = torch.randn(*batch, L, E, generator=generator).to(dtype)
            mask = None if keep is None else FORMS[form][2](keep)
            results = []
            for function in (original, patched):
                inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                out = function(*inputs, mask)
                out.backward(upstream)
                results.append((out.detach(), [t.grad for t in inputs]))
            (out_o, grads_o), (out_p, grads_p) = results
            where = f"{case}, {dtype}"
            torch.testing.assert_close(out_p, out_o, atol=tolerance, rtol=tolerance, msg=lambda m: f"{where}: {m}")
            for name, ours, theirs in zip("qkv", grads_p, grads_o):
                torch.testing.assert_close(ours, theirs, atol=tolerance * 10, rtol=tolerance * 10,
                                           msg=lambda m, name=name: f"{where}, gradient of {name}: {m}")


def test_a_fill_that_does_not_fit_float16_still_raises_on_the_path_that_fills():
    source = _source("not_none_eq0_1e9_float")
    fixed = analyze_source(source, "case.py").fixed
    original = load_module_from_source(source, "cond_fp16").attend
    patched = load_module_from_source(fixed, "cond_fp16_fixed").attend
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float16) for _ in range(3))
    keep = torch.ones(3, 3)
    for function in (original, patched):
        with pytest.raises(RuntimeError, match="overflow"):
            function(q, k, v, keep)
    torch.testing.assert_close(patched(q, k, v), original(q, k, v))  # no mask: no fill, no error


@pytest.mark.parametrize("masking, why", [
    ("scores.masked_fill(mask == 0, -1e9) + bias", "an additive term after the fill"),
    ("scores + mask", "an added mask, not a fill"),
])
def test_where_the_row_is_not_constant_under_if_no_uniform_fixup_is_emitted(masking, why):
    """The rows fact is not proved; what stays safe takes SDPA only where the mask is None (no fill runs)."""
    source = FUNCTION.replace("mask=None)", "mask=None, bias=None)").format(test="mask is not None", masking=masking)
    _assert_no_uniform_fixup(source, why)


def _two_fills(second_fill: str) -> str:
    return FUNCTION.replace("mask=None)", "mask=None, pad=None)").format(
        test="mask is not None", masking="scores.masked_fill(mask == 0, -1e9)\n"
        f"    if pad is not None:\n        scores = scores.masked_fill(pad, {second_fill})")


def test_two_fills_of_one_value_under_two_ifs_share_one_keep_mask():
    """MPT fills padding and the causal triangle with one value, each under its own `if`: a row masked by either is
    that value everywhere, so the keep mask is each fill's keep mask ANDed where it runs. Every path (neither, one,
    the other, both) against the original, with a sample all padding and a row the two masks cover only together."""
    source = _two_fills("-1e9")
    finding = _attention_finding(source)
    assert finding.fix_safety == "safe" and not _facts(finding, "assumed"), finding.reason
    fixed = analyze_source(source, "case.py").fixed
    assert "attn_keep: torch.Tensor | None = None" in fixed and "attn_keep is None else attn_keep &" in fixed
    original = load_module_from_source(source, "two_fills").attend
    patched = load_module_from_source(fixed, "two_fills_fixed").attend
    generator = torch.Generator().manual_seed(5)
    keep = torch.ones(B, 1, 1, S)
    keep[0, ..., :3] = 0  # with the causal pad below, sample 0's first rows keep no key
    keep[2] = 0  # a sample all padding
    pad = torch.ones(L, S, dtype=torch.bool).triu(1)
    for dtype, tolerance in TOLERANCE.items():
        q, k, v = (torch.randn(B, H, n, E, generator=generator).to(dtype) for n in (L, S, S))
        upstream = torch.randn(B, H, L, E, generator=generator).to(dtype)
        for masks in ((None, None), (keep, None), (None, pad), (keep, pad)):
            results = []
            for function in (original, patched):
                inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                out = function(*inputs, *masks)
                out.backward(upstream)
                results.append((out.detach(), [t.grad for t in inputs]))
            where = f"{dtype}, mask {masks[0] is not None}, pad {masks[1] is not None}"
            torch.testing.assert_close(results[1][0], results[0][0], atol=tolerance, rtol=tolerance,
                                       msg=lambda m: f"{where}: {m}")
            for ours, theirs in zip(results[1][1], results[0][1]):
                torch.testing.assert_close(ours, theirs, atol=tolerance * 10, rtol=tolerance * 10,
                                           msg=lambda m: f"{where}, gradients: {m}")


def test_two_fills_of_different_values_get_no_uniform_fixup():
    _assert_no_uniform_fixup(_two_fills("-1e4"), "two fills of two values")


def _assert_no_uniform_fixup(source: str, why: str) -> None:
    finding = _attention_finding(source)
    assert "fully-masked-rows" not in _facts(finding, "proved"), why
    assert "attn_keep" not in analyze_source(source, "case.py", unsafe_fixes=True).fixed, why
    if finding.fix_safety == "safe":
        assert "if mask is None" in analyze_source(source, "case.py").fixed, why


def test_torchscript_keeps_the_fill_under_if_unproved():
    """TorchScript types a name at its first assignment (None): the conditional keep mask is not emitted there."""
    source = _source("not_none_eq0_1e9_float").replace("def attend", "@torch.jit.script\ndef attend") \
        .replace("mask=None", "mask: Optional[torch.Tensor] = None").replace("import math", "import math\n"
                                                                           "from typing import Optional")
    assert "fully-masked-rows" in _facts(_attention_finding(source), "assumed")


def test_flex_refuses_a_fill_under_if():
    finding = _attention_finding(_source("exists_inverted_finfo_max"), backend="flex")
    emission = finding.extra["emission"]
    assert emission["emitted"] == "sdpa" and "finite fill applied under `if`" in emission["reason"]


LUCIDRAINS = '''
import torch
from torch import nn, einsum


def exists(val):
    return val is not None


class Attention(nn.Module):
    def __init__(self, dim, heads=2, dim_head=4):
        super().__init__()
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.to_qkv = nn.Linear(dim, heads * dim_head * 3, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim)

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        q = q * self.scale
        sim = einsum('b h i d, b h j d -> b h i j', q, k)
        max_neg_value = -torch.finfo(sim.dtype).max
        if exists(mask):
            mask = mask[:, None, None, :]
            sim = sim.masked_fill(~mask, max_neg_value)
        attn = sim.softmax(dim=-1)
        out = einsum('b h i j, b h j d -> b h i d', attn, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))
'''


def test_a_lucidrains_module_with_a_padding_mask_matches_on_both_paths():
    """The mask reshaped inside the `if` before the fill; a sample all padding; x and parameter gradients."""
    finding = _attention_finding(LUCIDRAINS)
    assert finding.fix_safety == "safe" and "fully-masked-rows" in _facts(finding, "proved"), finding.reason
    fixed = analyze_source(LUCIDRAINS, "case.py").fixed
    original = load_module_from_source(LUCIDRAINS, "cond_lucidrains").Attention(8)
    patched = load_module_from_source(fixed, "cond_lucidrains_fixed").Attention(8)
    patched.load_state_dict(original.state_dict())
    generator = torch.Generator().manual_seed(2)
    keep = torch.rand(3, 5, generator=generator) > 0.4
    keep[1] = False
    for dtype, tolerance in TOLERANCE.items():
        x = torch.randn(3, 5, 8, generator=generator).to(dtype)
        for mask in (None, keep):
            grads = []
            for model in (original, patched):
                model.to(dtype).zero_grad()
                inputs = x.clone().requires_grad_()
                out = model(inputs, mask)
                out.square().sum().backward()
                grads.append((out.detach(), inputs.grad, [p.grad for p in model.parameters()]))
            (out_o, grad_o, params_o), (out_p, grad_p, params_p) = grads
            torch.testing.assert_close(out_p, out_o, atol=tolerance, rtol=tolerance)
            torch.testing.assert_close(grad_p, grad_o, atol=tolerance * 10, rtol=tolerance * 10)
            for ours, theirs in zip(params_p, params_o):
                torch.testing.assert_close(ours, theirs, atol=tolerance * 10, rtol=tolerance * 10)


def test_a_mask_the_fill_rejects_raises_in_the_patch_too():
    """`~mask` on an int mask, then `masked_fill` with it, raise in the original; the patch must not run quietly."""
    fixed = analyze_source(LUCIDRAINS, "case.py").fixed
    original = load_module_from_source(LUCIDRAINS, "cond_lucidrains_raise").Attention(8)
    patched = load_module_from_source(fixed, "cond_lucidrains_raise_fixed").Attention(8)
    x, keep = torch.randn(2, 5, 8), torch.ones(2, 5)
    for mask in (keep.long(), keep):
        for model in (original, patched):
            with pytest.raises((RuntimeError, TypeError, NotImplementedError)):
                model(x, mask)

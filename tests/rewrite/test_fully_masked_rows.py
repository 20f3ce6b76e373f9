"""Fully masked rows under a finite fill: where every mask replaces the scores with one finite fill
(`masked_fill(m == 0, -1e9)`, `where(keep, s, finfo.min)`), a query row masked everywhere is constant, so the
original's weights there are exactly uniform (the mean of v). The patch passes SDPA the boolean keep mask with such
rows opened to every key and their query zeroed, so SDPA's weights are uniform there too. Each masking form, fill,
mask rank, polarity and mask dtype is run original vs patched on inputs with fully masked rows (a sample all
padding, a query row all masked) in float32, float64 and bfloat16, outputs and q/k/v gradients compared; double
backward under the math kernel; dropout in training; a fill that does not fit the dtype raises as before."""

from __future__ import annotations

import functools
import textwrap

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from advisor.engine.static import analyze_source
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

FUNCTION = '''
import math
import torch
import torch.nn.functional as F


def max_neg_value(t):
    return -torch.finfo(t.dtype).max


def attend(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = {masking}
    weights = F.softmax(scores, dim=-1)
    return weights @ v
'''

# the masking line, and how the function's `mask` argument is built from a keep mask (True = attend)
MASKINGS = {
    "fill_eq0_bool": ("scores.masked_fill(mask == 0, {fill})", lambda keep: keep),
    "fill_eq0_int": ("scores.masked_fill(mask == 0, {fill})", lambda keep: keep.long()),
    "fill_eq0_float": ("scores.masked_fill(mask == 0, {fill})", lambda keep: keep.float().requires_grad_()),
    "fill_inverted": ("scores.masked_fill(~mask, {fill})", lambda keep: keep),
    "fill_masked": ("scores.masked_fill(mask, {fill})", lambda keep: ~keep),
    "fill_logical_not_int": ("scores.masked_fill(mask.logical_not(), {fill})", lambda keep: keep.int()),
    "where_keep": ("torch.where(mask, scores, {fill})", lambda keep: keep),
    "where_masked": ("torch.where(mask == 0, {fill}, scores)", lambda keep: keep.float()),
}
FILLS = {"1e9": "-1e9", "1e4": "-10000.0", "finfo_scores": "torch.finfo(scores.dtype).min",
         "finfo_fp16": "torch.finfo(torch.float16).min", "finfo_helper": "max_neg_value(scores)"}
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-10, torch.bfloat16: 3e-2}
B, H, L, S, E = 3, 2, 5, 6, 4


def _keep_masks(generator: torch.Generator) -> dict[str, tuple[tuple[int, ...], torch.Tensor]]:
    """{case: (q/k/v batch dims, keep mask)}: each mask of a rank SDPA takes, with fully masked rows."""
    padding = torch.ones(B, 1, 1, S, dtype=torch.bool)
    padding[0, ..., -2:] = False
    padding[2] = False  # a sample all padding: every query row of it is fully masked
    rows = torch.rand(B, 1, L, S, generator=generator) > 0.4
    rows[1, 0, 3] = False  # a query row all masked
    heads = torch.rand(H, L, S, generator=generator) > 0.3
    heads[1, 0] = False  # one head's query row masked everywhere (broadcast over the batch)
    square = torch.rand(L, S, generator=generator) > 0.3
    square[2] = False
    folded = torch.rand(B * H, L, S, generator=generator) > 0.5
    folded[4] = False
    return {"padding_rank4": ((B, H), padding), "rows_rank4": ((B, H), rows), "heads_rank3": ((B, H), heads),
            "rank2": ((B, H), square), "folded_rank3": ((B * H,), folded), "folded_rank2": ((B * H,), square)}


@functools.cache
def _sources(masking: str, fill: str) -> tuple[str, str]:
    source = FUNCTION.format(masking=MASKINGS[masking][0].format(fill=FILLS[fill]))
    return source, analyze_source(source, "case.py").fixed


def _finding(source: str):
    (finding,) = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    return finding


def _facts(finding, status: str) -> set[str]:
    return {fact["name"] for fact in finding.extra["facts"].get(status, [])}


def _functions(masking: str, fill: str):
    source, fixed = _sources(masking, fill)
    assert "scaled_dot_product_attention" in fixed, "no safe patch"
    name = f"rows_{masking}_{fill}"
    return load_module_from_source(source, name).attend, load_module_from_source(fixed, f"{name}_fixed").attend


def _run(function, q, k, v, mask, upstream):
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = function(*inputs, mask)
    out.backward(upstream)
    return out.detach(), [t.grad for t in inputs]


@pytest.mark.parametrize("fill", FILLS)
def test_a_finite_fill_patch_is_safe_with_its_rows_fact_proved_or_guarded(fill):
    finding = _finding(_sources("fill_eq0_bool", fill)[0])
    assert finding.fix_safety == "safe" and finding.patch, finding.reason
    status = "guarded" if fill == "1e9" else "proved"  # -1e9 does not fit float16: masked_fill raises there
    assert "fully-masked-rows" in _facts(finding, status), finding.extra["facts"]
    assert "fully-masked-rows" not in _facts(finding, "assumed")
    # the kept rows' divergence (a masked key weighs exp(fill - row max) in the original) is named, not hidden
    assert "finite-fill" in _facts(finding, "accepted"), finding.extra["facts"]


def test_a_fill_float16_cannot_hold_names_autocast_where_the_guard_reads_q_s_dtype():
    """Under `torch.autocast` to float16, q stays float32 while Q·K^T is float16: the original's `masked_fill(-1e9)`
    raises and the guard (`q.dtype != torch.float16`) takes the SDPA path (breaker round 37). The divergence, a
    program that raised runs, is the accepted fact `autocast-fill`; a fill float16 holds raises nowhere and names
    none."""
    finding = _finding(_sources("fill_eq0_bool", "1e9")[0])
    assert "autocast-fill" in _facts(finding, "accepted"), finding.extra["facts"]
    assert "autocast-fill" not in _facts(_finding(_sources("fill_eq0_bool", "1e4")[0]), "accepted")
    original, patched = _functions("fill_eq0_bool", "1e9")
    q, k, v = (torch.randn(1, 2, L, E) for _ in range(3))
    keep = torch.rand(1, 1, L, L) > 0.3
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(RuntimeError):
            original(q, k, v, keep)
        assert patched(q, k, v, keep).shape == (1, 2, L, E)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # -1e9 fits bfloat16: both run
        torch.testing.assert_close(patched(q, k, v, keep).float(), original(q, k, v, keep).float(), atol=0.1,
                                   rtol=0.1)


# the matcher does not read `where(c, torch.finfo(scores.dtype).min, scores)` (the fill reads the scores it replaces)
PAIRS = [(masking, fill) for masking in MASKINGS for fill in FILLS if (masking, fill) != ("where_masked", "finfo_scores")]


@pytest.mark.parametrize("masking, fill", PAIRS)
def test_fully_masked_rows_and_gradients_match_the_original(masking, fill):
    original, patched = _functions(masking, fill)
    generator = torch.Generator().manual_seed(3)
    for case, (batch, keep) in _keep_masks(generator).items():
        for dtype in TOLERANCE if fill in ("1e4", "finfo_scores") else (torch.float32,):  # the time the suite has
            q, k, v = (torch.randn(*batch, n, E, generator=generator).to(dtype) for n in (L, S, S))
            upstream = torch.randn(*batch, L, E, generator=generator).to(dtype)
            mask = MASKINGS[masking][1](keep)
            (out_o, grads_o), (out_p, grads_p) = (_run(f, q, k, v, mask, upstream) for f in (original, patched))
            tolerance = TOLERANCE[dtype]
            where = f"{case}, {dtype}"
            torch.testing.assert_close(out_p, out_o, atol=tolerance, rtol=tolerance, msg=lambda m: f"{where}: {m}")
            for name, ours, theirs in zip("qkv", grads_p, grads_o):
                assert ours.isfinite().all(), f"{where}: NaN in the gradient of {name}"
                torch.testing.assert_close(ours, theirs, atol=tolerance * 10, rtol=tolerance * 10,
                                           msg=lambda m, name=name: f"{where}, gradient of {name}: {m}")
            assert mask.grad is None if mask.requires_grad else True  # a comparison passes no gradient


def test_the_patch_runs_sdpa_on_fully_masked_inputs():
    original, patched = _functions("fill_eq0_bool", "1e9")
    _, keep = _keep_masks(torch.Generator().manual_seed(0))["padding_rank4"]
    q, k, v = (torch.randn(B, H, n, E) for n in (L, S, S))

    class Wrapper(torch.nn.Module):
        def forward(self, *inputs):
            return patched(*inputs)
    assert uses_sdpa(dispatched_ops(Wrapper(), (q, k, v, keep)))


def test_double_backward_matches_under_the_math_kernel():
    original, patched = _functions("fill_inverted", "finfo_scores")
    generator = torch.Generator().manual_seed(5)
    _, keep = _keep_masks(generator)["rows_rank4"]
    q, k, v = (torch.randn(B, H, n, E, generator=generator, dtype=torch.float64) for n in (L, S, S))
    results = []
    for function in (original, patched):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            out = function(*inputs, keep)
            (grad_q,) = torch.autograd.grad(out.square().sum(), inputs[0], create_graph=True)
            grad_q.square().sum().backward()
        results.append([grad_q.detach()] + [t.grad for t in inputs])
    for ours, theirs in zip(*reversed(results)):
        torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10)


DROPOUT = '''
import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) * 0.5
        scores = scores.masked_fill(mask == 0, -1e9)
        return self.drop(scores.softmax(dim=-1)) @ v
'''


def test_under_dropout_a_fully_masked_row_is_uniform_weights_dropped():
    """The original drops uniform weights on a fully masked row: its output varies around the mean of v. So does
    the patch's (SDPA's dropout on uniform weights); in eval mode both are the mean exactly."""
    fixed = analyze_source(DROPOUT, "case.py", unsafe_fixes=True).fixed
    assert "scaled_dot_product_attention" in fixed
    original = load_module_from_source(DROPOUT, "rows_dropout").Attn()
    patched = load_module_from_source(fixed, "rows_dropout_fixed").Attn()
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 1, n, 8, generator=generator) for n in (2, 16, 16))
    keep = torch.ones(1, 1, 2, 16, dtype=torch.bool)
    keep[..., 1, :] = False  # query row 1 masked everywhere
    mean = v.mean(-2)[0, 0]
    for model in (original, patched):
        model.eval()
        torch.testing.assert_close(model(q, k, v, keep)[0, 0, 1], mean)
        model.train()
        torch.manual_seed(0)
        draws = torch.stack([model(q, k, v, keep)[0, 0, 1] for _ in range(200)])
        assert draws.std(0).min() > 0.05  # dropped, not the mean every time
        torch.testing.assert_close(draws.mean(0), mean, atol=0.15, rtol=0)


def test_a_fill_that_does_not_fit_float16_raises_as_the_original_does():
    original, patched = _functions("fill_eq0_bool", "1e9")
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float16) for _ in range(3))
    keep = torch.ones(3, 3, dtype=torch.bool)
    for function in (original, patched):
        with pytest.raises(RuntimeError, match="overflow"):
            function(q, k, v, keep)


@pytest.mark.parametrize("masking, why", [
    ("scores.masked_fill(mask == 0, -1e9) + bias", "an additive term after the fill"),
    ("scores.masked_fill(mask == 0, -1e9).masked_fill(mask2, -1e4)", "two different fills"),
])
def test_where_the_row_is_not_constant_the_fact_stays_assumed(masking, why):
    source = textwrap.dedent(FUNCTION).replace("def attend(q, k, v, mask):", "def attend(q, k, v, mask, mask2, bias):") \
        .format(masking=masking)
    finding = _finding(source)
    assert "fully-masked-rows" in _facts(finding, "assumed"), why


def test_the_fixup_compiles_under_torchscript_and_matches():
    source = FUNCTION.replace("def attend", "@torch.jit.script\ndef attend").format(
        masking="scores.masked_fill(mask == 0, -1e9)")
    fixed = analyze_source(source, "case.py").fixed
    assert "attn_rows" in fixed
    original = load_module_from_source(source, "rows_scripted").attend
    patched = load_module_from_source(fixed, "rows_scripted_fixed").attend
    _, keep = _keep_masks(torch.Generator().manual_seed(6))["padding_rank4"]
    q, k, v = (torch.randn(B, H, n, E) for n in (L, S, S))
    torch.testing.assert_close(patched(q, k, v, keep.float()), original(q, k, v, keep.float()))


# a softmax upcast after the fill (fairseq's `softmax(s.float()).type_as(s)`, HF's `softmax(s, dtype=float32)`)
UPCASTS = {
    "float_type_as": "F.softmax(scores.float(), dim=-1).type_as(scores)",
    "dtype_to": "F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)",
}


@pytest.mark.parametrize("upcast", UPCASTS)
@pytest.mark.parametrize("fill", ["1e9", "finfo_scores"])
def test_a_softmax_upcast_after_the_fill_keeps_the_fixup(upcast, fill):
    """The scores' dtype at the fill is the query's when every cast comes after it, so the fixup (and, for a fill
    beyond float16, the guard) still holds; before, any cast in the block left the row fact assumed (unsafe)."""
    source = FUNCTION.format(masking=MASKINGS["fill_eq0_bool"][0].format(fill=FILLS[fill])).replace(
        "F.softmax(scores, dim=-1)", UPCASTS[upcast])
    finding = _finding(source)
    assert finding.fix_safety == "safe", finding.reason
    # -1e9 overflows float16 (masked_fill raises); finfo(float64).min becomes -inf in the float32 softmax (the
    # original's fully masked rows are NaN): either way a guard runs the original there
    assert "fully-masked-rows" in _facts(finding, "guarded")
    fixed = analyze_source(source, "case.py").fixed
    original = load_module_from_source(source, f"upcast_{upcast}_{fill}").attend
    patched = load_module_from_source(fixed, f"upcast_{upcast}_{fill}_fixed").attend
    generator = torch.Generator().manual_seed(4)
    for case, (batch, keep) in _keep_masks(generator).items():
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            q, k, v = (torch.randn(*batch, n, E, generator=generator).to(dtype) for n in (L, S, S))
            upstream = torch.randn(*batch, L, E, generator=generator).to(dtype)
            if dtype == torch.float16 and fill == "1e9":  # masked_fill raises: so must the patch
                for function in (original, patched):
                    with pytest.raises(RuntimeError, match="overflow"):
                        function(q, k, v, keep)
                continue
            (out_o, grads_o), (out_p, grads_p) = (_run(f, q, k, v, keep, upstream) for f in (original, patched))
            # float64 scores go through the original's float32 softmax (`.float()`, dtype=float32): its rounding
            tolerance = 2e-5 if dtype == torch.float64 else TOLERANCE.get(dtype, 3e-3)
            # (finfo(float64).min is -inf in float32: the original's rows are NaN, and the guard runs the original)
            torch.testing.assert_close(out_p, out_o, atol=tolerance, rtol=tolerance, equal_nan=True,
                                       msg=lambda m: f"{case} {dtype}: {m}")
            for ours, theirs in zip(grads_p, grads_o):
                torch.testing.assert_close(ours, theirs, atol=tolerance * 10, rtol=tolerance * 10, equal_nan=True)


def test_a_cast_before_the_fill_still_leaves_the_row_fact_assumed():
    """`s.float().masked_fill(..., finfo(s.dtype).min)`: the fill reads the float32 scores, the query may be bf16."""
    source = FUNCTION.format(masking="scores.float().masked_fill(mask == 0, -1e9)").replace(
        "F.softmax(scores, dim=-1)", "F.softmax(scores, dim=-1).to(q.dtype)")
    assert "fully-masked-rows" in _facts(_finding(source), "assumed")

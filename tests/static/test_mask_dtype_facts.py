"""Masks and dtypes a safe SDPA patch must not get wrong.

Each case is a minimal module in the form real code writes it; the test runs the original and the patch on the
same weights and inputs (with a fully masked query row where the case has masks), and checks that a safe patch
matches, or that the patch is unsafe and names the fact that the inputs break."""

from __future__ import annotations


import pytest
import torch

from advisor.engine.static import analyze_source
from attention_sources import fact_names, masked_module
from fixture_models import load_module_from_source



def _finding(source: str):
    findings = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    assert len(findings) == 1, [(f.rule, f.reason) for f in findings]
    return findings[0]


def _run(source: str, x: torch.Tensor, mask: torch.Tensor, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    model = load_module_from_source(source, "case").Attention().eval()
    with torch.no_grad():
        return model(x, mask)


def _outputs(body: str, mask: torch.Tensor, unsafe: bool = False):
    source = masked_module(body)
    fixed = analyze_source(source, "case.py", unsafe_fixes=unsafe).fixed
    assert "scaled_dot_product_attention" in fixed, "no patch was applied"
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    return _run(source, x, mask), _run(fixed, x, mask)


def _key_padding(dtype=torch.bool) -> torch.Tensor:
    """(B, S) keep-mask; batch 1 masks every key, so each of its query rows is fully masked."""
    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[0, 3:] = False
    keep[1] = False
    return keep.to(dtype)


# -- A: finite fills --------------------------------------------------------------------------------------------
FINITE_FILL = """
scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
scores = scores.masked_fill(~mask[:, None, None, :], -1e4)
out = scores.softmax(dim=-1) @ v
"""


def test_a_finite_fill_is_safe_and_its_fully_masked_rows_match():
    """The fully masked batch is uniform weights (the mean of v) in the original; the patch opens those rows to
    every key with a zero query (`attention.uniform_rows`), so they match too (before: unsafe, they differed)."""
    finding = _finding(masked_module(FINITE_FILL))
    assert finding.fix_safety == "safe", finding.reason
    assert "fully-masked-rows" in fact_names(finding, "proved")
    original, patched = _outputs(FINITE_FILL, _key_padding())
    torch.testing.assert_close(original, patched, atol=1e-5, rtol=1e-5)


def test_a_two_finite_masks_of_one_fill_are_safe():
    """Two masks of one fill add nothing up to -inf: the patch passes their keep masks joined by `&`."""
    body = """
    scores = (q @ k.transpose(-2, -1)) * 0.5
    scores = scores.masked_fill(~mask[:, None, None, :], -torch.finfo(scores.dtype).max)
    scores = scores.masked_fill(mask[:, None, :, None], -torch.finfo(scores.dtype).max)
    out = scores.softmax(dim=-1) @ v
    """
    finding = _finding(masked_module(body))
    assert finding.fix_safety == "safe" and "fully-masked-rows" in fact_names(finding, "proved"), finding.reason
    original, patched = _outputs(body, _key_padding())
    torch.testing.assert_close(original, patched, atol=1e-5, rtol=1e-5)


def test_a_fill_dtype_read_after_an_upcast_is_refused():
    body = """
    scores = (q @ k.transpose(-2, -1)).float() * 0.5
    scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
    out = scores.softmax(dim=-1).to(q.dtype) @ v
    """
    finding = _finding(masked_module(body))
    assert finding.rule == "ADV103" and "dtype" in finding.reason and "scores" in finding.reason


# -- B: -inf fills: NaN -> 0 is the accepted divergence ------------------------------------------------------------
NEGINF_FILL = FINITE_FILL.replace("-1e4", 'float("-inf")')


def test_b_neginf_fill_is_safe_with_the_accepted_divergence():
    finding = _finding(masked_module(NEGINF_FILL))
    assert finding.fix_safety == "safe", finding.reason
    assert "fully-masked-rows" in fact_names(finding, "accepted")
    original, patched = _outputs(NEGINF_FILL, _key_padding())
    assert torch.isnan(original[1]).all() and torch.isfinite(patched[1]).all()  # the divergence, and only it
    torch.testing.assert_close(original[0], patched[0], atol=1e-5, rtol=1e-5)


def test_b_causal_mask_proves_no_row_is_fully_masked():
    body = """
    n = x.shape[1]
    causal = torch.tril(torch.ones(n, n))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(causal == 0, float("-inf"))
    out = scores.softmax(dim=-1) @ v
    """
    finding = _finding(masked_module(body))
    assert finding.fix_safety == "safe" and "fully-masked-rows" in fact_names(finding, "proved")


# -- C: polarity of non-bool masks -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
def test_c_logical_not_of_a_non_bool_mask(dtype):
    body = NEGINF_FILL.replace("~mask[:, None, None, :]", "mask[:, None, None, :].logical_not()")
    finding = _finding(masked_module(body))
    assert finding.fix_safety == "safe", finding.reason
    original, patched = _outputs(body, _key_padding(dtype))
    torch.testing.assert_close(original[0], patched[0], atol=1e-5, rtol=1e-5)


# -- D: additive mask dtype and rank ---------------------------------------------------------------------------
ADDITIVE = """
scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
scores = scores + mask[:, None, None, :]
out = scores.softmax(dim=-1) @ v
"""


@pytest.mark.parametrize("mask", [
    _key_padding(torch.bool),  # adds +1 where True; SDPA would read True as keep
    (1 - _key_padding(torch.int64)) * -10000,  # an int64 tokenizer-style mask
    ((1.0 - _key_padding(torch.float32)) * -1e4).half(),  # fp16 mask on fp32 scores
], ids=["bool", "int64", "fp16"])
def test_d_additive_masks_of_other_dtypes_match(mask):
    """The dtype and rank facts are proved; only the fully-masked-row fact of an added mask is assumed (its values
    are not visible: a padded sample's row swallowed by `finfo.min` differs in SDPA's gradients)."""
    finding = _finding(masked_module(ADDITIVE))
    assert finding.fix_safety == "unsafe" and fact_names(finding, "assumed") == {"fully-masked-rows"}, finding.reason
    assert {"mask-dtype", "qkv-dtype", "mask-rank"} <= fact_names(finding, "proved")
    original, patched = _outputs(ADDITIVE, mask, unsafe=True)
    torch.testing.assert_close(original, patched, atol=1e-5, rtol=1e-5)


def test_d_mask_of_unknown_rank_is_guarded():
    """A (S,) key mask: eager broadcasting accepts it, SDPA rejects a 1-D mask on 4-D inputs. The rank is
    checked before the SDPA call, so the 1-D mask runs the original block: safe and exact."""
    body = NEGINF_FILL.replace("~mask[:, None, None, :]", "~mask")
    finding = _finding(masked_module(body))
    assert finding.fix_safety == "safe" and "mask-rank" in fact_names(finding, "guarded")
    keys = torch.ones(5, dtype=torch.bool)
    keys[3:] = False
    original, patched = _outputs(body, keys)
    torch.testing.assert_close(original, patched, atol=1e-5, rtol=1e-5)


def test_d_rank_from_indexing_and_output_permute_is_proved():
    """`mask[:, None, None, :]` has at least 4 dims, and the output's permute(0, 2, 1, 3) at most 4."""
    assert "mask-rank" in fact_names(_finding(masked_module(NEGINF_FILL)), "proved")


def test_d_mask_of_more_dims_than_the_scores_is_guarded():
    """Without the permute, a 3-D `mask` makes `mask[:, None, None, :]` 5-D: eager broadcasting gives a 5-D
    output (which `.transpose(1, 2).reshape(...)` accepts when the extra dim is 1); SDPA would raise. The guard
    sees the 5-D mask and runs the original block."""
    source = masked_module(NEGINF_FILL).replace("out.permute(0, 2, 1, 3)", "out.transpose(1, 2)")
    finding = _finding(source)
    assert finding.fix_safety == "safe" and "mask-rank" in fact_names(finding, "guarded")
    [rank] = [fact for fact in finding.extra["facts"]["guarded"] if fact["name"] == "mask-rank"]
    assert "more dims than the scores" in rank["why"]
    keep = _key_padding()[:1, None]  # (1, 1, S): one dim more than the scores need
    x = torch.randn(2, 5, 16)
    original = _run(source, x, keep)
    patched = _run(analyze_source(source, "case.py").fixed, x, keep)
    assert original.shape == (2, 5, 16)
    torch.testing.assert_close(original, patched, atol=1e-5, rtol=1e-5)


# -- J: leaf dtypes ----------------------------------------------------------------------------------------------
def test_j_upcast_operands_go_with_the_block_and_one_linear_ties_the_dtypes():
    """The upcasts go with the block (SDPA gets q and k uncast; tests/rewrite/test_operand_casts.py holds the
    parity), so the dtypes must be tied another way: here q, k and v are split from one Linear's output. Before,
    SDPA got `q.float()`, `k.float()` and an uncast v, and the patch assumed v was float32."""
    body = """
    scores = q.float() @ k.float().transpose(-2, -1) * 0.5
    weights = scores.softmax(dim=-1)
    out = weights.to(v.dtype) @ v
    """
    finding = _finding(masked_module(body))
    assert finding.fix_safety == "safe" and "qkv-dtype" in fact_names(finding, "proved")
    assert "precision" in fact_names(finding, "accepted")


def test_j_upcast_weights_and_value_with_query_of_another_dtype_is_guarded():
    """SDPA would get a float32 `v.float()` next to q of any dtype: the patch checks `q.dtype == k.dtype ==
    torch.float32` and runs the original block otherwise (tests/static/test_guarded_facts.py runs both paths)."""
    body = """
    weights = (q @ k.transpose(-2, -1) * 0.5).softmax(dim=-1)
    out = (weights.float() @ v.float()).to(q.dtype)
    """
    finding = _finding(masked_module(body))
    assert finding.fix_safety == "safe" and "qkv-dtype" in fact_names(finding, "guarded")
    original, patched = _outputs(body, _key_padding())
    torch.testing.assert_close(original, patched, atol=1e-5, rtol=1e-5)


def test_j_weights_cast_back_to_the_query_dtype_is_proved():
    body = """
    scores = q @ k.transpose(-2, -1) * 0.5
    weights = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    out = weights @ v
    """
    finding = _finding(masked_module(body))
    assert "qkv-dtype" in fact_names(finding, "proved")


def test_d_additive_mask_with_a_computed_query_is_not_cast_and_assumed():
    """Casting the mask to `self.q(x).dtype` would run the projection twice: the dtype is assumed instead."""
    source = masked_module(ADDITIVE).replace("scores = (q @ k.transpose(-2, -1))",
                                              "scores = (self.qkv(x)[..., :16].view(b, n, 2, 8).transpose(1, 2) "
                                              "@ k.transpose(-2, -1))")
    finding = _finding(source)
    assert finding.fix_safety == "unsafe" and "mask-dtype" in fact_names(finding, "assumed")
    added = [line for line in finding.patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert not [line for line in added if ".dtype" in line], added


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.float64])
def test_d_mask_added_in_place_is_rounded_to_the_scores_dtype(mask_dtype):
    """`s.add_(m)` keeps s's dtype: the original rounds s + m to it, SDPA rounds m; a wider (fp64) mask too."""
    body = ADDITIVE.replace("scores = scores + mask[:, None, None, :]", "scores.add_(mask[:, None, None, :])")
    finding = _finding(masked_module(body))
    assert fact_names(finding, "assumed") == {"fully-masked-rows"}
    assert {"qkv-dtype", "mask-dtype"} <= fact_names(finding, "proved")
    original, patched = _outputs(body, (1 - _key_padding(torch.int64)).to(mask_dtype) * -10000, unsafe=True)
    torch.testing.assert_close(original, patched, atol=1e-5, rtol=1e-5)


def test_b_rows_of_a_causal_buffer_sliced_from_the_first_column_keep_a_key():
    """GPT-2's `bias[:, :, S - L:S, :S]` with a finite fill: row r keeps keys 0..r, so none is fully masked."""
    source = masked_module("""
    L, S = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    keep = self.bias[:, :, S - L:S, :S].bool()
    scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)
    out = scores.softmax(dim=-1) @ v
    """).replace("        self.qkv = nn.Linear(dim, dim * 3)\n", "        self.qkv = nn.Linear(dim, dim * 3)\n"
                 "        self.register_buffer('bias', torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))\n")
    finding = _finding(source)
    assert "fully-masked-rows" in fact_names(finding, "proved"), finding.reason
    x = torch.randn(2, 5, 16)
    original = _run(source, x, None)
    torch.testing.assert_close(original, _run(analyze_source(source, "case.py", unsafe_fixes=True).fixed, x, None),
                               atol=1e-5, rtol=1e-5)


def test_b_flipped_causal_buffer_read_through_a_name_is_not_a_keep_mask():
    """`masked = self.bias[...] == 0` used as `where(masked, s, fill)` keeps the *upper* triangle: row 0 of it
    is not the first key's, so nothing proves a key is kept; its one finite fill makes the rows uniform instead."""
    source = masked_module("""
    L, S = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    masked = self.bias[:, :, S - L:S, :S] == 0
    scores = torch.where(masked, scores, torch.finfo(scores.dtype).min)
    out = scores.softmax(dim=-1) @ v
    """).replace("        self.qkv = nn.Linear(dim, dim * 3)\n", "        self.qkv = nn.Linear(dim, dim * 3)\n"
                 "        self.register_buffer('bias', torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))\n")
    (proved,) = [fact for fact in _finding(source).extra["facts"]["proved"] if fact["name"] == "fully-masked-rows"]
    assert "first key" not in proved["why"] and "one finite fill" in proved["why"]  # made uniform, not kept


@pytest.mark.parametrize("cast,dtype", [(".half()", "float16"), (".to(torch.bfloat16)", "bfloat16")])
def test_a_narrowing_cast_inside_the_block_makes_the_patch_unsafe(cast, dtype):
    """SDPA computes in the inputs' dtype; a softmax in half precision inside a float32 block rounds more than the
    patch does, by more than float32's tolerance, so the patch is not safe (q, k and v are one tensor's split)."""
    body = f"""
        s = (q @ k.transpose(-2, -1)) * 0.25
        out = F.softmax(s{cast}, dim=-1).float() @ v
    """
    [finding] = analyze_source(masked_module(body), "narrow.py").findings
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"]["assumed"]}
    assert finding.fix_safety == "unsafe" and dtype in assumed["precision"]


def test_a_float32_upcast_inside_the_block_is_a_stated_divergence_of_a_safe_patch():
    """`softmax(s.float()).type_as(s)`: nothing lost for half or float32 inputs; for float64 the original rounds
    through float32 and the patch does not, which the finding states (accepted), and the patch stays safe."""
    body = """
        s = (q @ k.transpose(-2, -1)) * 0.25
        out = F.softmax(s.float(), dim=-1).type_as(s) @ v
    """
    [finding] = analyze_source(masked_module(body), "widen.py").findings
    accepted = [fact["name"] for fact in finding.extra["facts"]["accepted"]]
    assert finding.fix_safety == "safe" and "precision" in accepted


def test_d_an_added_mask_that_swallows_a_padded_sample_is_why_the_row_fact_is_assumed():
    """The evidence for assuming `fully-masked-rows` on an added mask: HF's `(1 - m) * finfo.min` on a sample that
    is all padding. The outputs agree (the row is uniform either way), but the input gradients do not: SDPA's fused
    CPU backward differs from autograd through the eager softmax on a row the mask swallows."""
    source = masked_module(ADDITIVE)
    fixed = analyze_source(source, "case.py", unsafe_fixes=True).fixed
    padding = torch.ones(2, 5)
    padding[1] = 0  # the second sample is all padding
    mask = (1.0 - padding) * torch.finfo(torch.float32).min
    results = []
    for code in (source, fixed):
        torch.manual_seed(0)
        model = load_module_from_source(code, "case").Attention()
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = model(x, mask)
        (grad,) = torch.autograd.grad(out, x, torch.randn(out.shape, generator=torch.Generator().manual_seed(2)))
        results.append((out.detach(), grad))
    (original, original_grad), (patched, patched_grad) = results
    torch.testing.assert_close(original, patched, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(original_grad[0], patched_grad[0], atol=1e-5, rtol=1e-5)  # the real sample agrees
    assert not torch.allclose(original_grad[1], patched_grad[1], atol=1e-3)  # the swallowed one does not


# -- E: masks built by bitwise operators -------------------------------------------------------------------------
# Longformer's dense path: a band of keys, and the caller's padding mask, joined by `&`; `|` of an integer mask
# makes it an integer, and of a float one raises (as `~` and `^` do)
BANDED = """
idx = torch.arange(n, device=x.device)
keep = ((idx[None, :] - idx[:, None]).abs() <= 2) & mask[:, None, None, :]
scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
{bias}scores = scores.masked_fill(~keep, {fill})
out = scores.softmax(dim=-1) @ v
"""
DISTANCE_BIAS = "scores = scores + (idx[None, :] - idx[:, None]).abs().float().neg()\n"


def _raised_or_outputs(source: str, fixed: str, mask: torch.Tensor):
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    results = []
    for code in (source, fixed):
        try:
            results.append(_run(code, x, mask))
        except (RuntimeError, TypeError, NotImplementedError):
            results.append(None)
    return results


@pytest.mark.parametrize("fill", ["-1e4", 'float("-inf")'], ids=["finite fill", "-inf fill"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.uint8, torch.float32])
def test_e_a_mask_joined_by_a_bitwise_operator_is_no_float_and_an_integer_one_raises_in_both(fill, dtype):
    """`~keep` is dropped by the patch, which would add a float `keep`; but `&` never returns a float (it raises on
    one), and an integer `keep` makes SDPA raise where `masked_fill` does: the mask's dtype needs no proof, and the
    patch raises wherever the original does (before: mask-dtype assumed, the patch unsafe)."""
    source = masked_module(BANDED.format(bias="", fill=fill))
    finding = _finding(source)
    assert finding.fix_safety == "safe", finding.reason
    assert "mask-dtype" not in fact_names(finding, "assumed") | fact_names(finding, "guarded")
    original, patched = _raised_or_outputs(source, analyze_source(source, "case.py").fixed, _key_padding(dtype))
    assert (original is None) == (patched is None) == (dtype != torch.bool)
    if original is not None:  # an -inf fill's fully masked sample is NaN in the original (an accepted divergence)
        compared = slice(None) if fill == "-1e4" else 0
        torch.testing.assert_close(original[compared], patched[compared], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_e_a_bitwise_mask_merged_with_an_added_bias_must_be_bool(dtype):
    """Merged with an added float term, the keep mask goes through `torch.where`, which takes uint8 where the
    original's `masked_fill` raises: there the mask's dtype is a fact again, checked or assumed, never proved."""
    source = masked_module(BANDED.format(bias=DISTANCE_BIAS, fill='float("-inf")'))
    finding = _finding(source)
    assert "mask-dtype" in fact_names(finding, "assumed") | fact_names(finding, "guarded")
    fixed = analyze_source(source, "case.py", unsafe_fixes=True).fixed
    assert "torch.where" in fixed
    original, patched = _raised_or_outputs(source, fixed, _key_padding(dtype))
    assert (original is None) == (dtype == torch.uint8)
    if "mask-dtype" in fact_names(finding, "guarded"):
        assert (patched is None) == (original is None)

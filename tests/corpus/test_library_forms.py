"""Attention forms real projects write that the matcher used to miss.

Each source is written the way timm, vit-pytorch, x-transformers, lucidrains' repositories, diffusers or
Hugging Face write it. A form that is exact gets a safe patch, checked by running the original and the patched
module on the same random weights and inputs; one that is not gets a refusal whose reason names the cause.
"""

from __future__ import annotations

import pytest

from advisor.engine.static import analyze_source
from fixture_models import parity
from attention_sources import HEAD, MAKE, attention, the_finding

BHID_OUT = "return torch.einsum('bhij,bhjd->bhid', attn, v).transpose(1, 2).reshape(B, T, C)"
MATMUL_OUT = "return (attn @ v).transpose(1, 2).reshape(B, T, C)"


def assert_safe_and_exact(source: str, name: str) -> str:
    """One safe ADV101 finding whose patch calls SDPA and computes what the original computes; the patch."""
    result = analyze_source(source, "m.py")
    (finding,) = result.findings
    assert (finding.rule, finding.fix_safety) == ("ADV101", "safe"), finding.reason
    assert "scaled_dot_product_attention" in result.fixed
    parity(source, result.fixed, name=name)
    return result.fixed


def test_scale_from_a_starred_shape_unpack():  # vit-pytorch: `b, n, _, h = *x.shape, self.heads`
    source = attention(f"""
        b, h, n, d, heads = *q.shape, self.heads
        attn = (torch.einsum('bhid,bhjd->bhij', q, k) * d ** -0.5).softmax(dim=-1)
        {BHID_OUT}
    """, init="self.heads = 2")
    assert "scale=(d ** -0.5)" in assert_safe_and_exact(source, "starred")


OR_SCALE = HEAD + '''
class Attn(nn.Module):
    def __init__(self, dim=16, num_heads=2, qk_scale{annotation}=None):
        super().__init__()
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim ** -0.5
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(B, T, C)
''' + MAKE


def test_scale_or_default_names_the_unannotated_parameter():  # timm / Swin: `qk_scale or head_dim ** -0.5`
    source = OR_SCALE.format(annotation="")
    finding = the_finding(source)
    assert (finding.rule, finding.fix_safety) == ("ADV101", "safe")  # the scale is checked at run time
    (guarded,) = finding.extra["facts"]["guarded"]
    assert "`qk_scale`" in guarded["why"] and "tensor" in guarded["why"]
    parity(source, analyze_source(source, "m.py").fixed, name="or_scale")


def test_scale_or_default_with_a_float_parameter_is_safe():
    assert_safe_and_exact(OR_SCALE.format(annotation=": float | None"), "or_scale_float")


def test_tuple_assigned_attributes():  # `self.heads, self.scale = heads, dim_head ** -0.5`
    source = attention(f"""
        attn = (torch.matmul(q, k.transpose(-1, -2)) * self.scale).softmax(dim=-1)
        {MATMUL_OUT}
    """, init="self.heads, self.scale = 2, 8 ** -0.5")
    assert "scale=" in assert_safe_and_exact(source, "tuple_attr")


@pytest.mark.parametrize("spec", ["'bhjd,bhid->bhij', k, q", "'b h j d, b h i d -> b h i j', k, q"])
def test_key_first_einsum(spec):
    if " " in spec:  # einops: operands first, pattern last
        call = "einops_einsum(k, q, 'b h j d, b h i d -> b h i j')"
    else:
        call = f"torch.einsum({spec})"
    source = attention(f"""
        attn = ({call} * 8 ** -0.5).softmax(dim=-1)
        {BHID_OUT}
    """).replace("import math\n", "import math\nfrom einops import einsum as einops_einsum\n")
    assert "(q, k, v" in assert_safe_and_exact(source, "key_first")


def test_key_first_einsum_normalised_over_queries_keeps_its_roles():
    """`'bhjd,bhid->bhji', k, q` normalises over the queries: the k operand is the one the rows belong to."""
    source = attention("""
        attn = (torch.einsum('bhjd,bhid->bhji', k, q) * 8 ** -0.5).softmax(dim=-1)
        return torch.einsum('bhji,bhid->bhjd', attn, v).transpose(1, 2).reshape(B, T, C)
    """)
    assert "(k, q, v" in assert_safe_and_exact(source, "key_first_rows")


@pytest.mark.parametrize("softmax", ["s.log_softmax(dim=-1).exp()", "torch.exp(F.log_softmax(s, dim=-1))"])
def test_exp_of_log_softmax_is_the_softmax(softmax):
    source = attention(f"""
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        attn = {softmax}
        {MATMUL_OUT}
    """)
    assert_safe_and_exact(source, "log_softmax")


def test_log_softmax_alone_is_not_a_softmax():
    source = attention(f"""
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        attn = s.log_softmax(dim=-1)
        {MATMUL_OUT}
    """)
    assert analyze_source(source, "m.py").findings == []


STABLE_SOFTMAX = """
def stable_softmax(t, dim=-1):
    return F.softmax(t, dim, dtype=torch.float32)
"""


@pytest.mark.parametrize("call", ["stable_softmax(s, -1)", "stable_softmax(s)", "stable_softmax(s, dim=-1)"])
def test_softmax_through_a_module_level_helper(call):  # lucidrains: `stable_softmax(sim)`
    source = attention(f"""
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        attn = {call}
        {MATMUL_OUT}
    """, after=STABLE_SOFTMAX)
    fixed = assert_safe_and_exact(source, "helper_softmax")
    assert "def stable_softmax(t, dim=-1):\n    return F.softmax(t, dim, dtype=torch.float32)" in fixed


def test_softmax_helper_over_another_dim_is_refused_by_its_dim():
    source = attention(f"""
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        attn = stable_softmax(s, 1)
        {MATMUL_OUT}
    """, after=STABLE_SOFTMAX)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "softmax runs over dim 1" in finding.reason


def test_helper_that_does_more_than_softmax_is_not_taken_for_one():
    source = attention(f"""
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        attn = sharpened(s, -1)
        {MATMUL_OUT}
    """, after="""
    def sharpened(t, dim):
        return F.softmax(t * 2, dim)
    """)
    assert not [f for f in analyze_source(source, "m.py").findings if f.fix_safety == "safe"]


@pytest.mark.parametrize("built, called", [("partial(F.softmax, dim=-1)", "self.attn_fn(s)"),
                                           ("partial(F.softmax, dtype=torch.float32)", "self.attn_fn(s, dim=-1)")])
def test_partial_softmax_attribute(built, called):  # x-transformers: `partial(F.softmax, dtype=torch.float32)`
    source = attention(f"""
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        attn = {called}
        {MATMUL_OUT}
    """, init=f"self.attn_fn = {built}").replace("import math\n", "import math\nfrom functools import partial\n")
    assert_safe_and_exact(source, "partial")


METHOD_SCORES = HEAD + '''
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 8 ** -0.5

    def get_attention_scores(self, query, key, attention_mask=None):
        scores = torch.baddbmm(torch.empty(query.shape[0], query.shape[1], key.shape[1]), query,
                               key.transpose(-1, -2), beta=0, alpha=self.scale)
        return scores.softmax(dim=-1)


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.attn = Attention()

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4).flatten(1, 2)
        probs = self.attn.get_attention_scores(q, k, None)
        return torch.bmm(probs, v).view(B, 2, T, 8).transpose(1, 2).reshape(B, T, C)
''' + MAKE


def test_scores_from_a_method_of_another_object():  # diffusers: `attn.get_attention_scores(query, key, mask)`
    finding = the_finding(METHOD_SCORES)
    assert finding.rule == "ADV103" and finding.fix_safety == "unsafe"
    assert "returned to `self.attn.get_attention_scores(q, k, None)`, a call through another object" in finding.reason


def test_scores_function_returning_the_weights():
    source = attention(f"""
        attn = self.attention_weights(q, k)
        {MATMUL_OUT}
    """, methods="""
    def attention_weights(self, q, k):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        return s.softmax(dim=-1)
    """)
    assert_safe_and_exact(source, "scores_fn")


def test_attention_split_across_three_methods_with_the_weights_returned():
    source = attention("""
        out, weights = self.attend(q, k, v)
        return out.transpose(1, 2).reshape(B, T, C), weights
    """, methods="""
    def scores(self, q, k):
        return q @ k.transpose(-2, -1) * 8 ** -0.5

    def normalize(self, s):
        return s.softmax(dim=-1)

    def attend(self, q, k, v):
        weights = self.normalize(self.scores(q, k))
        return weights @ v, weights
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV102" and "weights are used outside the block" in finding.reason
    fixed = analyze_source(source, "m.py", unsafe_fixes=True).fixed
    assert "scaled_dot_product_attention" in fixed
    parity(source, fixed, name="three_methods", allow_dropped_weights=True)


def test_softmax_over_scores_joined_by_cat_and_split_across_two_values():  # memory key/values
    source = attention("""
        s_local = q @ k.transpose(-2, -1) * 8 ** -0.5
        s_mem = q @ self.mem_k.transpose(-2, -1) * 8 ** -0.5
        attn = torch.cat((s_mem, s_local), dim=-1).softmax(dim=-1)
        a_mem, a_local = attn[..., :4], attn[..., 4:]
        out = a_mem @ self.mem_v + a_local @ v
        return out.transpose(1, 2).reshape(B, T, C)
    """, init="self.mem_k = nn.Parameter(torch.randn(1, 2, 4, 8))\nself.mem_v = nn.Parameter(torch.randn(1, 2, 4, 8))")
    finding = the_finding(source)
    assert finding.rule == "ADV103"
    assert "joined from several sources by `torch.cat((s_mem, s_local), dim=-1)`" in finding.reason


FUSED = """
    if self.fused_attn:
        x = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
    else:
        s = q @ k.transpose(-2, -1) * self.scale
        s = {masked}
        x = s.softmax(dim=-1) @ v
    return x.transpose(1, 2).reshape(B, T, C)
"""
FUSED_INIT = "self.fused_attn = False\nself.scale = 8 ** -0.5"
ENABLE = "the other branch of `if self.fused_attn` already calls scaled_dot_product_attention: enable it"


def test_manual_branch_beside_fused_attn_with_a_mask_helper():  # timm
    source = attention(FUSED.format(masked="apply_mask(s, None)"), init=FUSED_INIT, after="""
    def apply_mask(scores, mask):
        if mask is None:
            return scores
        return scores + mask
    """)
    assert_safe_and_exact(source, "fused_branch_mask_helper")  # the helper is read as an optional additive mask
    assert the_finding(source).reason == ENABLE


def test_exact_manual_branch_beside_fused_attn_says_sdpa_exists():
    source = attention(FUSED.format(masked="s"), init=FUSED_INIT)
    assert_safe_and_exact(source, "fused_branch")
    assert the_finding(source).reason == ENABLE


@pytest.mark.parametrize("spec", ["f'bhid,bhjd->bhij'", "f'bhid,' 'bhjd->bhij'", "'bhid,' f'bhjd->bhij'"])
def test_constant_f_string_einsum_spec_is_read(spec):
    source = attention(f"""
        attn = (torch.einsum({spec}, q, k) * 8 ** -0.5).softmax(dim=-1)
        {BHID_OUT}
    """)
    assert_safe_and_exact(source, "fstring")


def test_f_string_einsum_spec_with_placeholders_is_refused_by_name():
    source = attention(f"""
        attn = (torch.einsum(f'{{self.ax}}id,{{self.ax}}jd->{{self.ax}}ij', q, k) * 8 ** -0.5).softmax(dim=-1)
        {BHID_OUT}
    """, init="self.ax = 'bh'")
    finding = the_finding(source)
    assert finding.rule == "ADV103"
    assert "einsum spec `f'{self.ax}id,{self.ax}jd->{self.ax}ij'` is not a literal" in finding.reason


def test_softmax_method_a_subclass_overrides_is_not_rewritten():
    source = attention(f"""
        attn = self.normalize(q @ k.transpose(-2, -1) * 8 ** -0.5)
        {MATMUL_OUT}
    """, methods="""
    def normalize(self, s):
        return s.softmax(dim=-1)
    """, after="""
    class Sharp(Attn):
        def normalize(self, s):
            return (s * 2).softmax(dim=-1)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "`normalize`" in finding.reason


def test_rebound_softmax_helper_is_not_read():
    source = attention(f"""
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        attn = stable_softmax(s)
        {MATMUL_OUT}
    """, after=STABLE_SOFTMAX + "\nstable_softmax = torch.compile(stable_softmax)\n")
    finding = the_finding(source)  # anchored by its name only, and refused
    assert not finding.fixable and "`stable_softmax`, which is not read as a softmax" in finding.reason


def test_method_mask_helper_with_two_returns_is_named():
    source = attention(FUSED.format(masked="self.apply_mask(s, None)"), init=FUSED_INIT, methods="""
    def apply_mask(self, scores, mask):
        if mask is None:
            return scores
        return scores + mask
    """)
    assert "`self.apply_mask(s, None)`, a helper with more than one `return`" in the_finding(source).reason


@pytest.mark.parametrize("transpose", ["rearrange(attn, 'b h i j -> b h j i')", "attn.permute(0, 1, 3, 2)",
                                       "attn.transpose(-1, -2)"])
def test_weights_transposed_before_a_value_first_einsum(transpose):
    """ldm's SpatialSelfAttention: `einsum('...cj,...ji->...ci', v, P^T)` is (P @ V^T)^T, channel-major output."""
    source = attention(f"""
        attn = (torch.einsum('bhid,bhjd->bhij', q, k) * 8 ** -0.5).softmax(dim=-1)
        attn = {transpose}
        out = torch.einsum('bhdj,bhji->bhdi', v.transpose(-2, -1), attn)
        return out.permute(0, 3, 1, 2).reshape(B, T, C)
    """).replace("import math\n", "import math\nfrom einops import rearrange\n")
    assert_safe_and_exact(source, "value_first_transposed")


@pytest.mark.parametrize("pattern", ["b h i j -> b h (i j)", "b h i j -> b i h j", "b h i j -> b h j"])
def test_a_rearrange_that_is_not_a_swap_of_the_last_two_axes_is_refused(pattern):
    source = attention(f"""
        attn = (torch.einsum('bhid,bhjd->bhij', q, k) * 8 ** -0.5).softmax(dim=-1)
        attn = rearrange(attn, '{pattern}')
        return torch.einsum('bhij,bhjd->bhid', attn, v).transpose(1, 2).reshape(B, T, C)
    """).replace("import math\n", "import math\nfrom einops import rearrange\n")
    assert not analyze_source(source, "m.py").findings[0].patch

"""Dataflow, scope and dispatch soundness of the attention rewrite.

Each source is a minimal reproduction of a "safe" patch that changed outputs or raised before the fix. A test
either checks that no safe patch is offered (and why), or runs the original and the patched module on the same
weights and inputs and compares them.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from advisor.engine.static import analyze_source
from advisor.static.module_index import ParsedModule
from attention_sources import HEAD, MAKE, attention, attention_finding_and_fix, findings, the_finding
from fixture_models import load_module_from_source, parity
from fuzz.differential import COUNTEREXAMPLE, INVALID, check


def safe_findings(source: str):
    return [f for f in findings(source) if f.rule == "ADV101" and f.fix_safety == "safe"]


def assert_exact_or_not_safe(source: str, name: str) -> bool:
    """A safe patch, if any, computes what the original computes. Returns whether one was offered."""
    result = analyze_source(source, "m.py")
    if not [f for f in result.findings if f.rule == "ADV101" and f.fix_safety == "safe"]:
        return False
    parity(source, result.fixed, name=name)
    return True


def assert_patch_exact(source: str, name: str) -> str:
    """Every patch, unsafe ones included (mask facts this test is not about may be unproved), is applied and the
    result computes what the original computes. Returns the patched source."""
    fixed = analyze_source(source, "m.py", unsafe_fixes=True).fixed
    assert fixed != source, "no patch was offered"
    parity(source, fixed, name=name)
    return fixed


# E: a triangle whose contents change later is not causal ----------------------------------------------------

def test_tril_written_locally_is_not_causal():
    source = attention("""
        mask = torch.tril(torch.ones(T, T))
        mask[:, :2] = 1  # prefix-LM: the first two keys are visible to every query
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s = s.masked_fill(mask == 0, float('-inf'))
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """)
    assert "is_causal" not in analyze_source(source, "m.py").fixed
    assert_exact_or_not_safe(source, "tril_local")


@pytest.mark.parametrize("write", ["self.bias[:, :, :, :2] = 1", "self.bias[..., 0].fill_(1)",
                                   "torch.ones(1, 1, 8, 8, out=self.bias)"])
def test_tril_buffer_written_in_init_or_another_method_is_not_causal(write):
    init = 'self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))'
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s = s.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init=init + "\nself.prefix()", methods=f"""
    def prefix(self):
        {write}
    """)
    assert "is_causal" not in analyze_source(source, "m.py").fixed
    assert_exact_or_not_safe(source, "tril_buffer")


# F: a factor in an `else:` applies when the test is false ----------------------------------------------------

@pytest.mark.parametrize("flag", [False, True])
def test_scale_in_else_branch_keeps_its_polarity(flag):
    source = attention("""
        s = q @ k.transpose(-2, -1)
        if self.unscaled:
            pass
        else:
            s = s * 0.5
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init=f"self.unscaled = {flag}")
    assert assert_exact_or_not_safe(source, "else_scale")
    assert "(1.0 if self.unscaled else 0.5)" in analyze_source(source, "m.py").fixed


@pytest.mark.parametrize("unscaled, half", [(False, True), (False, False), (True, True)])
def test_scale_in_elif_keeps_both_tests(unscaled, half):
    """The factor applies where the first test is false and the `elif`'s true: the SDPA path runs where the first
    test is false (the original where it is true), with the factor under the `elif`'s test."""
    source = attention("""
        s = q @ k.transpose(-2, -1)
        if self.unscaled:
            pass
        elif self.half:
            s = s * 0.5
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init=f"self.unscaled = {unscaled}\nself.half = {half}")
    assert assert_exact_or_not_safe(source, "elif_scale")
    assert "(0.5 if self.half else 1.0)" in analyze_source(source, "m.py").fixed


# G: a tensor is never proved a Python-number scale -----------------------------------------------------------

def test_parameter_scale_through_a_local_is_folded_into_q():
    """Not a Python number, but a 0-d tensor (followed through the local): folded into q."""
    source = attention("""
        s = q @ k.transpose(-2, -1) * self.scale
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init="scale = nn.Parameter(torch.tensor(0.3))\nself.scale = scale")
    finding = the_finding(source)
    proved = {fact["name"] for fact in finding.extra["facts"]["proved"]}
    assert "scale-is-number" not in proved and "scale-broadcast" in proved
    assert assert_exact_or_not_safe(source, "parameter_scale_local")


def test_inherited_scale_is_guarded():
    """The scale comes from a base class (here a Parameter): whether it is a Python number is checked before the
    SDPA call, so the Parameter runs the original block, exactly."""
    source = HEAD + '''
class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.3))


class Attn(Base):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) * self.scale
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
''' + MAKE
    finding = the_finding(source)
    assert finding.fix_safety == "safe" and not finding.extra["facts"]["assumed"]
    (guarded,) = finding.extra["facts"]["guarded"]
    assert guarded["name"] == "scale-is-number" and "not assigned in this class" in guarded["why"]
    assert "isinstance(self.scale, (int, float))" in finding.patch
    assert assert_exact_or_not_safe(source, "inherited_scale")


def test_unannotated_scale_parameter_is_guarded():
    source = HEAD + '''
def attend(q, k, v, scale):
    s = q @ k.transpose(-2, -1) * scale
    return s.softmax(dim=-1) @ v
'''
    finding = the_finding(source)
    [scale] = [fact for fact in finding.extra["facts"]["guarded"] if fact["name"] == "scale-is-number"]
    assert finding.fix_safety == "safe" and "no int/float annotation" in scale["why"]
    namespace: dict = {}
    exec(compile(analyze_source(source, "m.py").fixed, "m.py", "exec"), namespace)
    q, k, v = torch.randn(3, 2, 4, 8).unbind(0)
    for scale in (0.3, torch.tensor(0.3)):  # a tensor scale runs the original block
        torch.testing.assert_close(namespace["attend"](q, k, v, scale), (q @ k.mT * scale).softmax(-1) @ v)
    # Python does not enforce `scale: float` (a learned temperature passed there is a tensor): still guarded
    annotated = the_finding(source.replace("scale):", "scale: float):"))
    assert annotated.fix_safety == "safe"
    assert "does not enforce" in next(f["why"] for f in annotated.extra["facts"]["guarded"]
                                      if f["name"] == "scale-is-number")
    sized = the_finding(source.replace("scale):", "scale: int):"))  # nor `int` (breaker round 19b): guarded too
    assert "scale-is-number" in [f["name"] for f in sized.extra["facts"]["guarded"]] and sized.fix_safety == "safe"


# I: in-place writes and deletions between the scores and the value product -----------------------------------

@pytest.mark.parametrize("statement, how", [
    ("del q, k", "deleted"),
    ("q[..., 0] = 0", "written in place"),
    ("k.add_(1.0)", "written in place"),
    ("torch.mul(k, 2.0, out=k)", "written in place"),
    ("k[0] += 1", "written in place"),
    ("import math as q", "reassigned"),  # an import in the function binds its name there
    ("import q.linalg", "reassigned"),
    ("alias = q; alias.mul_(2.0)", "written in place"),  # through a name bound from q: the same storage
    ("row = k[0]; row.zero_()", "written in place"),
    ("ks = [k]; ks[0].mul_(2.0)", "written in place"),
    ("self.kept = v; self.kept.zero_()", "written in place"),
    ("for row in q: row.mul_(2.0)", "written in place"),
    ("cache = {'k': k}; cache['k'].zero_()", "written in place"),
    ("kt = k.transpose(-2, -1) if True else k; kt.zero_()", "written in place"),
    # a fourth breaker's: through a view, a walrus, a comprehension over it, numpy, a closure or a lambda called here
    ("k.view(-1)[:] = 0", "written in place"),
    ("(kk := k).zero_()", "written in place"),
    ("[row.zero_() for row in k]", "written in place"),
    ("q.detach().numpy()[...] *= 2", "written in place"),
    ("kd = torch.empty(0).set_(k); kd.mul_(2.0)", "written in place"),  # a sixth breaker's: set_ shares storage
    # a twelfth breaker's: through `.data`, operator methods, an in-place call inside an expression, a bound method
    ("q.data *= 2", "written in place"),
    ("q.__imul__(2)", "written in place"),
    ("k.__setitem__(0, 0.0)", "written in place"),
    ("y = q.mul_(2)", "written in place"),
    ("torch.Tensor.mul_(q, 2)", "written in place"),
    ("cb = q.mul_; cb(2)", "written in place"),
    ("q2 = q.tolist() and q.unbind(); q2[0].mul_(2)", "written in place"),
    # a fourteenth breaker's: `.data` replaced, an in-place method by name, a container element stored then written
    ("q.data = torch.zeros_like(q)", "written in place"),
    ("getattr(q, 'zero_')()", "written in place"),
    ("self.store['k'] = k; self.store['k'].mul_(0)", "written in place"),
    ("store = {}; store['k'] = k; store['k'].mul_(0)", "written in place"),
])
def test_inputs_changed_after_the_scores_are_refused(statement, how):
    source = attention(f"""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = s.softmax(dim=-1)
        {statement}
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and how in finding.reason, finding.reason


KV_CACHE = HEAD + '''

class KVCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache_k", torch.zeros(2, 2, 8, 8))
        self.register_buffer("cache_v", torch.zeros(2, 2, 8, 8))

    def forward(self, q, k_new, v_new, pos: int):
        T = k_new.size(2)
        self.cache_k[:, :, pos:pos + T] = k_new
        self.cache_v[:, :, pos:pos + T] = v_new
        k = self.cache_k[:, :, :pos + T]
        v = self.cache_v[:, :, :pos + T]
        s = q @ k.transpose(-2, -1) * 0.25
        p = s.softmax(-1)
        self.cache_k[:, :, :pos + T].mul_(0.5)
        return p @ v
'''


def test_a_buffer_an_input_is_a_view_of_written_after_the_scores_is_refused():
    """A fourteenth breaker's: k is a slice of a cache buffer, and the buffer is written between the scores and the
    value product (0.23 before)."""
    finding = the_finding(KV_CACHE)
    assert finding.rule == "ADV103" and "self.cache_k" in finding.reason, finding.reason


@pytest.mark.parametrize("method, refused", [("self.k_cache.mul_(0.5)", True), ("return self.k_cache.sum()", False)])
def test_a_method_writing_an_attribute_that_holds_an_input_is_refused(method, refused):
    """A fourteenth breaker's: `self.k_cache = k`, then `self.decay_cache()` writes it in place before the value
    product (0.66 before); a method that only reads it changes nothing."""
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = s.softmax(dim=-1)
        self.k_cache = k
        self.decay_cache()
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """, methods=f"""
    def decay_cache(self):
        {method}
    """)
    finding = the_finding(source)
    assert (finding.rule == "ADV103" and "decay_cache" in finding.reason) is refused, finding.reason


@pytest.mark.parametrize("defined, called", [
    ("def reset():\n    k.zero_()", "reset()"),
    ("clear = lambda: q.mul_(2.0)", "clear()"),
])
def test_a_nested_function_that_writes_an_input_in_place_is_refused(defined, called):
    """Defined before the scores, called between them and the product (a fourth breaker's): the write's own line
    lies outside the window, its call inside."""
    source = attention(f"""
        {textwrap.indent(defined, "        ").strip()}
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = s.softmax(dim=-1)
        {called}
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "in a function defined in this one" in finding.reason, finding.reason


@pytest.mark.parametrize("reader", ["self.probs = lambda: p.detach()", "def probs():\n    return p.detach()"])
def test_a_closure_defined_before_the_block_that_reads_the_weights_is_refused(reader):
    """A visualisation callback defined before the block (a thirteenth breaker's): the patch deletes every binding
    of the weights, so calling it afterwards raises NameError where the original returns them."""
    source = attention(f"""
        {textwrap.indent(reader, "        ").strip()}
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = s.softmax(dim=-1)
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "read by the nested" in finding.reason, finding.reason


def test_a_nested_function_that_rebinds_an_input_is_refused():
    """`nonlocal q` in a function defined in the block's function: calling it between the scores and the product
    rebinds q, which the original had read already."""
    source = attention("""
        def bump():
            nonlocal q
            q = q * 2
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = s.softmax(dim=-1)
        bump()
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "nonlocal" in finding.reason, finding.reason


def test_scores_written_in_place_are_refused():
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s[..., 0] = -1e9
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """)
    assert not assert_exact_or_not_safe(source, "scores_store")


def test_attribute_written_between_scores_and_value_product_is_refused():
    source = attention("""
        s = q @ self.mem_k.transpose(-2, -1) / math.sqrt(8)
        p = s.softmax(dim=-1)
        self.mem_k = k
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """, init="self.register_buffer('mem_k', torch.randn(2, 2, 6, 8))")
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "`self.mem_k` is written at line" in finding.reason


# H, I, M: every deleted step runs exactly when the value product runs ----------------------------------------

def test_weights_computed_before_a_loop_and_applied_inside_are_refused():
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = self.drop(s.softmax(dim=-1))
        o = v
        for _ in range(3):
            o = p @ o
        return o.transpose(1, 2).reshape(B, T, C)
    """, init="self.drop = nn.Dropout(0.5)")
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "loop" in finding.reason


def test_weights_of_the_previous_iteration_read_at_the_loop_top_are_seen():
    source = attention("""
        seen = []
        p = None
        for i in range(2):
            if p is not None:
                seen.append(p.sum())
            s = q @ k.transpose(-2, -1) / math.sqrt(8)
            p = s.softmax(dim=-1)
            o = p @ v
        return o.transpose(1, 2).reshape(B, T, C) + seen[0]
    """)
    assert not assert_exact_or_not_safe(source, "loop_top")


def test_value_products_in_a_comprehension_share_one_dropout_draw():
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = self.drop(s.softmax(dim=-1))
        outs = [p @ value for value in (v, v)]
        return (outs[0] - outs[1]).transpose(1, 2).reshape(B, T, C)
    """, init="self.drop = nn.Dropout(0.5)")
    assert the_finding(source).rule == "ADV103"


def test_scores_under_no_grad_and_value_product_outside_are_refused():
    source = attention("""
        with torch.no_grad():
            s = q @ k.transpose(-2, -1) / math.sqrt(8)
            p = s.softmax(dim=-1)
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "`with`" in finding.reason


def test_whole_block_inside_one_loop_is_still_rewritten():
    source = attention("""
        o = v
        for _ in range(2):
            s = q @ k.transpose(-2, -1) / math.sqrt(8)
            o = s.softmax(dim=-1) @ o
        return o.transpose(1, 2).reshape(B, T, C)
    """)
    assert assert_exact_or_not_safe(source, "loop_whole")


def test_value_product_into_out_buffer_is_refused():
    source = attention("""
        q, k, v = q.reshape(B * 2, T, 8), k.reshape(B * 2, T, 8), v.reshape(B * 2, T, 8)
        p = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
        buf = torch.empty(B * 2, T, 8)
        torch.bmm(p, v, out=buf)
        return buf.view(B, 2, T, 8).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "out=buf" in finding.reason


# K: static and class methods bind no `self` ------------------------------------------------------------------

@pytest.mark.parametrize("decorator, first", [("@staticmethod", ""), ("@classmethod", "cls, ")])
def test_static_and_class_method_score_helpers(decorator, first):
    source = attention("""
        s = self.scores(q, k)
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, methods=f"""
    {decorator}
    def scores({first}q, k):
        return q @ k.transpose(-2, -1) / math.sqrt(8)
    """)
    assert assert_exact_or_not_safe(source, "static_helper")


# L: rewrite mechanics ------------------------------------------------------------------------------------------

def test_second_name_bound_by_a_deleted_statement_is_kept():
    source = attention("""
        s = logits = q @ k.transpose(-2, -1) / math.sqrt(8)
        o = s.softmax(dim=-1) @ v
        return o.transpose(1, 2).reshape(B, T, C) + logits.mean()
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "`logits`" in finding.reason


def test_two_hoisted_masks_in_one_function_get_two_variables():
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        if self.use_mask:
            s = s + m
        o = s.softmax(dim=-1) @ v
        s2 = k @ q.transpose(-2, -1) / math.sqrt(8)
        if self.use_mask:
            s2 = s2 + m.T
        o2 = s2.softmax(dim=-1) @ v
        return (o + o2).transpose(1, 2).reshape(B, T, C)
    """, init="self.use_mask = True\nself.register_buffer('m', torch.randn(6, 6))").replace("+ m", "+ self.m")
    fixed = assert_patch_exact(source, "two_hoists")
    assert "attn_mask=attn_mask," in fixed or "attn_mask=attn_mask)" in fixed
    assert "attn_mask_1" in fixed


def test_hoisted_mask_under_torchscript_is_refused_without_torch_to_annotate_it():
    """TorchScript needs the hoisted variable annotated `torch.Tensor | None`
    (tests/rewrite/test_torchscript_patches.py), which a file that never imports torch as a module cannot spell."""
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        if self.use_mask:
            s = s + self.m
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init="self.use_mask = True\nself.m = nn.Parameter(nn.init.normal_(nn.Linear(6, 6).weight))",
        after="from torch.jit import script\nscripted = script(Attn())\n").replace("import torch\n", "")
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "TorchScript" in finding.reason and "annotated" in finding.reason


def test_output_viewed_after_the_rewrite_is_made_contiguous():
    source = attention("""
        o = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v
        return o.view(B, 2 * T, 8).reshape(B, T, C)
    """)
    fixed = analyze_source(source, "m.py").fixed
    assert ".contiguous()" in fixed
    assert assert_exact_or_not_safe(source, "view_after")
    finding = the_finding(source)
    assert any(f["name"] == "layout" for f in finding.extra["facts"]["proved"])


def test_output_reshaped_only_needs_no_copy():
    source = attention("""
        o = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v
        return o.transpose(1, 2).reshape(B, T, C)
    """)
    assert ".contiguous()" not in analyze_source(source, "m.py").fixed


MERGE_HEADS = {  # a helper of the class the output is handed to, and whether its body needs contiguous strides
    "permute_contiguous_view": ("x = x.permute(0, 2, 1, 3).contiguous()\n        return x.view(B, T, C)", False),
    "transpose_reshape": ("return x.transpose(1, 2).reshape(x.size(0), x.size(2), -1)", False),
    "view_directly": ("return x.view(B, 2 * T, 8)", True),
    "returned_then_viewed": ("return x * 2.0", True),  # the helper's result is viewed by the caller
}


@pytest.mark.parametrize("kind", sorted(MERGE_HEADS))
def test_a_helper_the_output_is_handed_to_is_followed_for_the_strides_it_reads(kind):
    """GPT-2's `a = self.merge_heads(a)`: the helper's uses of its parameter (and its result at the call) are
    followed as the block's own, so a helper that copies first costs no `.contiguous()` and one that views keeps
    it."""
    body, needs_copy = MERGE_HEADS[kind]
    after = "return o.view(B, 2 * T, 8).reshape(B, T, C)" if kind == "returned_then_viewed" else "return o"
    source = attention(f"""
        o = self.merge_heads((q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v, B, T, C)
        {after}
    """, methods=f"""
    def merge_heads(self, x, B, T, C):
        {body}
    """)
    fixed = analyze_source(source, "m.py").fixed
    assert (".contiguous()" in fixed.split("def merge_heads")[0]) is needs_copy
    assert assert_exact_or_not_safe(source, f"merge_heads_{kind}")


UNPACKED_CALLERS = {  # a function returning (output, weights), its caller unpacking the output (breaker round 14)
    "viewed": ("o, _ = attention(q, k, v)\n    return o.view(o.size(0), -1)", True),
    "reshaped": ("o, _ = attention(q, k, v)\n    return o.reshape(o.size(0), -1)", False),
    "indexed_then_viewed": ("return attention(q, k, v)[0].view(q.size(0), -1)", True),
    "written": ("o, _ = attention(q, k, v)\n    o.mul_(2.0)\n    return o.reshape(o.size(0), -1)", True),
}


@pytest.mark.parametrize("kind", sorted(UNPACKED_CALLERS))
def test_an_output_returned_in_a_tuple_is_followed_into_the_name_its_caller_unpacks(kind):
    tail, copies = UNPACKED_CALLERS[kind]
    source = HEAD + f'''

def attention(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    p_attn = scores.softmax(dim=-1)
    return p_attn @ v, p_attn


def run(x):
    B, N, C = x.shape
    q, k, v = x.view(B, N, 3, 2, C // 6).permute(2, 0, 3, 1, 4)
    {tail}
'''
    result = analyze_source(source, "m.py", unsafe_fixes=True)
    copied = ".contiguous()" in result.fixed or ".clone(memory_format=torch.contiguous_format)" in result.fixed
    assert "scaled_dot_product_attention" in result.fixed and copied is copies
    original = load_module_from_source(source, f"unpacked_{kind}").run
    patched = load_module_from_source(result.fixed, f"unpacked_{kind}_fixed").run
    x = torch.randn(2, 5, 48, dtype=torch.float64)
    torch.testing.assert_close(patched(x), original(x))


O = "    o = (q @ k.transpose(-2, -1) * 0.25).softmax(-1) @ v\n"
STORED_OR_SPLIT = {  # a fourteenth breaker's: the output reached a `.view` where the follower had stopped
    **{name: f"def run(x):\n    q, k, v = split(x)\n{O}    return {use}.view(2, -1)\n" for name, use in [
        ("negated", "(-o)"), ("clamped", "o.clamp(-1, 1)"), ("flipped", "o.flip(1)"),
        ("rounded", "o.round(decimals=3)"), ("unbound", "o.unbind(1)[0]"),
        ("conditional", "(o if x.dtype == torch.float32 else q)")]},
    "global": f"OUT = None\n\n\ndef attend(x):\n    global OUT\n    q, k, v = split(x)\n{O}    OUT = o\n\n\n"
              "def run(x):\n    attend(x)\n    return OUT.view(2, -1)\n",
    "yielded": f"def attend(x):\n    q, k, v = split(x)\n{O}    yield o\n\n\n"
               "def run(x):\n    return next(attend(x)).view(2, -1)\n",
    "walrus": "def run(x):\n    q, k, v = split(x)\n    if (o := (q @ k.transpose(-2, -1) * 0.25).softmax(-1) @ v) "
              "is not None:\n        return o.view(2, -1)\n    return x\n",
    "chunked": ("def run(x):\n    q, k, v = split(x)\n    o = (q @ k.transpose(-2, -1) * 0.25).softmax(-1) @ v\n"
                "    return o.chunk(2, dim=1)[0].view(2, -1)\n"),
    "stored_on_self": ("class A(nn.Module):\n    def forward(self, x):\n        q, k, v = split(x)\n"
                       "        self.cache = (q @ k.transpose(-2, -1) * 0.25).softmax(-1) @ v\n"
                       "        return self.flat()\n\n    def flat(self):\n        return self.cache.view(2, -1)\n\n\n"
                       "def run(x):\n    return A()(x)\n"),
}


@pytest.mark.parametrize("kind", sorted(STORED_OR_SPLIT))
def test_an_output_split_into_views_or_stored_on_the_module_keeps_the_product_s_layout(kind):
    source = HEAD + "\ndef split(x):\n    B, N, C = x.shape\n" \
        "    return x.view(B, N, 3, 2, C // 6).permute(2, 0, 3, 1, 4)\n\n\n" + STORED_OR_SPLIT[kind]
    result = analyze_source(source, "m.py")
    assert "scaled_dot_product_attention" in result.fixed
    original = load_module_from_source(source, f"stored_{kind}").run
    patched = load_module_from_source(result.fixed, f"stored_{kind}_fixed").run
    x = torch.randn(2, 5, 48, requires_grad=True)
    torch.testing.assert_close(patched(x), original(x))
    patched(x).square().sum().backward()  # a stored output is a fresh copy: nothing autograd saved is exposed


def test_a_helper_a_subclass_overrides_is_not_followed():
    source = attention("""
        return self.merge_heads((q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v, B, T, C)
    """, methods="""
    def merge_heads(self, x, B, T, C):
        return x.transpose(1, 2).reshape(B, T, C)
    """, after="""
    class Sub(Attn):
        def merge_heads(self, x, B, T, C):
            return x.view(B, 2 * T, 8).reshape(B, T, C)
    """)
    assert ".contiguous()" in analyze_source(source, "m.py").fixed.split("def merge_heads")[0]


IN_PLACE_WRITES = {  # the output, or what may share its storage, written after the block (breaker round 14)
    "method": "o.mul_(2.0)\n        return o.transpose(1, 2).reshape(B, T, C)",
    "through_contiguous": "y = o.contiguous()\n        y.mul_(2.0)\n"
                          "        return (o + y).transpose(1, 2).reshape(B, T, C)",
    "augmented": "o += 1.0\n        return o.transpose(1, 2).reshape(B, T, C)",
    "element_store": "o[..., 0] = 0.0\n        return o.transpose(1, 2).reshape(B, T, C)",
    "through_a_view": "o.transpose(1, 2).add_(1.0)\n        return o.transpose(1, 2).reshape(B, T, C)",
    "out_keyword": "torch.mul(o, 2.0, out=o)\n        return o.transpose(1, 2).reshape(B, T, C)",
    "inplace_keyword": "return F.relu(o.transpose(1, 2).reshape(B, T, C), inplace=True)",
    "torch_function": "y = o.transpose(1, 2).reshape(B, T, C)\n        torch.relu_(y)\n        return y",
    # breaker round 15: a function or module the file does not show to leave its argument unwritten
    "helper_of_the_file": "scale_(o)\n        return o.transpose(1, 2).reshape(B, T, C)",
    "module_of_the_user": "self.post(o)\n        return o.transpose(1, 2).reshape(B, T, C)",
    "through_a_cast": "y = o.transpose(1, 2).contiguous().float()\n        y.mul_(2.0)\n"
                      "        return y.reshape(B, T, C) + o.transpose(1, 2).reshape(B, T, C)",
    # the function's flow sees these writes through names that may alias the output (breaker round 15)
    "torch_reshape": "y = torch.reshape(o.transpose(1, 2), (B, T, C))\n        y.mul_(2.0)\n"
                     "        return y + o.transpose(1, 2).reshape(B, T, C)",
    "iterated": "y = o.transpose(1, 2).contiguous()\n        for t in y:\n            t.mul_(2.0)\n"
                "        return o.transpose(1, 2).reshape(B, T, C) + y.reshape(B, T, C)",
    "listed": "y = o.transpose(1, 2).contiguous()\n        ys = list(y)\n        ys[0].mul_(3.0)\n"
              "        return y.reshape(B, T, C) + o.transpose(1, 2).reshape(B, T, C)",
    "walrus": "(y := o.transpose(1, 2).contiguous()).mul_(2.0)\n"
              "        return o.transpose(1, 2).reshape(B, T, C) + y.reshape(B, T, C)",
    "listed_display": "ys = [o.transpose(1, 2).contiguous()]\n        scale_(ys[0])\n"
                      "        return o.transpose(1, 2).reshape(B, T, C) + ys[0].reshape(B, T, C)",
    "starred_display": "y = o.transpose(1, 2).contiguous()\n        scale_(*[y])\n"
                       "        return o.transpose(1, 2).reshape(B, T, C) + y.reshape(B, T, C)",
    "global_name": "global CACHE\n        CACHE = o.transpose(1, 2).contiguous()\n        bump()\n"
                   "        return o.transpose(1, 2).reshape(B, T, C)",
    "closure": "y = o.transpose(1, 2).contiguous()\n        def g():\n            y.mul_(2.0)\n        g()\n"
               "        return o.transpose(1, 2).reshape(B, T, C)",
    "positional_inplace": "return F.relu(o.transpose(1, 2).reshape(B, T, C), True)",
    "sequential_inplace": "y = self.seq(o.transpose(1, 2).reshape(B, T, C))\n"
                          "        return y + o.transpose(1, 2).reshape(B, T, C)",
    "list_then_written": "kept = []\n        kept.append(o)\n        kept[0].mul_(2.0)\n"
                         "        return o.transpose(1, 2).reshape(B, T, C)",
}
WRITERS = """
from einops import rearrange

CACHE = None


def bump():
    CACHE.mul_(2.0)


def scale_(t):
    t.mul_(2.0)
    return t


class Post(nn.Module):
    def forward(self, x):
        return x.mul_(2.0)
"""


@pytest.mark.parametrize("kind", sorted(IN_PLACE_WRITES))
def test_an_output_written_in_place_is_a_fresh_contiguous_tensor(kind):
    """SDPA's CPU flash kernel saves its output for the backward (a write then raises there), and its output is not
    contiguous where the product is (`.contiguous()` then copies where the original aliased): the patch's output
    gets `.clone(memory_format=torch.contiguous_format)` (one copy, the form ADV204 would fold `.contiguous().clone()`
    into), and the training step's values and gradients match."""
    source = attention(f"""
        o = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v
        {IN_PLACE_WRITES[kind]}
    """, init="self.post = Post()\nself.seq = nn.Sequential(nn.ReLU(inplace=True))", after=WRITERS)
    assert ".clone(memory_format=torch.contiguous_format)" in analyze_source(source, "m.py").fixed
    outcome = check(source)
    assert outcome.status not in (INVALID, COUNTEREXAMPLE), f"{outcome.kind}: {outcome.detail}"


def test_an_output_only_read_gets_no_clone():
    source = attention("""
        o = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v
        y = (o * 2.0).contiguous()
        y.mul_(2.0)
        print(total(o), len(o), torch.cat([o, o]).sum())
        return (o + y).transpose(1, 2).reshape(B, T, C)
    """, after="""
    def total(t):
        return t.sum()
    """)
    fixed = analyze_source(source, "m.py").fixed
    assert "scaled_dot_product_attention" in fixed and ".clone(" not in fixed


# N: dynamic dispatch and hook points ---------------------------------------------------------------------------

def test_subclass_overriding_the_scores_helper_is_refused():
    source = attention("""
        s = self.scores(q, k)
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, methods="""
    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / math.sqrt(8)
    """, after="""
    class Sub(Attn):
        def scores(self, q, k):
            return q @ k.transpose(-2, -1)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "`Sub` overrides `scores`" in finding.reason


def test_subclass_replacing_the_softmax_module_is_refused():
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        return (self.attend(s) @ v).transpose(1, 2).reshape(B, T, C)
    """, init="self.attend = nn.Softmax(dim=-1)", after="""
    class Sub(Attn):
        def __init__(self):
            super().__init__()
            self.attend = nn.Identity()
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "rebinds `self.attend`" in finding.reason


@pytest.mark.parametrize("module", ["nn.Identity()", "HookPoint()"])
def test_hook_point_inside_the_block_is_checked_or_refused(module):
    """An `nn.Identity` hook point is deleted only behind a check that it is exactly an Identity with no hook when
    the block runs (guarded); a HookPoint class of the file is not an op at all."""
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = self.hook_pattern(s.softmax(dim=-1))
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """, init=f"self.hook_pattern = {module}", after="""
    class HookPoint(nn.Module):
        def forward(self, x):
            return x
    """)
    finding = the_finding(source)
    if finding.rule == "ADV101":  # nn.Identity is read as an identity op; a HookPoint class is not an op at all
        assert finding.fix_safety == "safe" and not finding.extra["facts"]["assumed"]
        [fact] = [f for f in finding.extra["facts"]["guarded"] if f["name"] == "no-hooks"]
        assert "(torch.nn.Identity,)" in fact["why"]
    else:
        assert finding.rule == "ADV103" and "hook_pattern" in finding.reason


def test_dropout_module_without_hooks_in_the_file_is_proved_and_with_hooks_guarded():
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = self.drop(s.softmax(dim=-1))
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """, init="self.drop = nn.Dropout(0.1)")
    finding = the_finding(source)
    assert finding.fix_safety == "safe"
    assert any(f["name"] == "no-hooks" for f in finding.extra["facts"]["proved"])
    hooked = source.replace("def make(", "def hooked(model):\n    model.drop.register_forward_hook(print)\n\n\ndef make(")
    finding = the_finding(hooked)
    assert finding.fix_safety == "safe" and "no-hooks" in {f["name"] for f in finding.extra["facts"]["guarded"]}


# a crash on one block never loses the file's other findings ----------------------------------------------------

TWO_BLOCKS = HEAD + '''
def by_einsum(q, k, v):
    s = torch.einsum(f"bhid," f"bhjd->bhij", q, k)
    return s.softmax(-1) @ v


def by_matmul(q, k, v):
    s = q @ k.transpose(-2, -1)
    return s.softmax(-1) @ v
'''


def test_implicitly_concatenated_fstring_einsum_spec_is_read():
    """Once a crash that lost the file's other block; a constant f-string is now read as its text."""
    einsum, matmul = findings(TWO_BLOCKS)
    assert (einsum.rule, einsum.fix_safety) == ("ADV101", "safe")
    assert matmul.rule == "ADV101" and matmul.fix_safety == "safe"


def test_an_internal_error_in_one_block_is_reported_on_that_block_only(monkeypatch):
    from advisor.patterns import einsum

    def broken(*args):
        raise TypeError("boom")

    monkeypatch.setattr(einsum, "parse_spec", broken)
    einsum_finding, matmul = findings(TWO_BLOCKS)
    assert einsum_finding.rule == "ADV103" and "internal error" in einsum_finding.reason
    assert matmul.rule == "ADV101" and matmul.fix_safety == "safe"


def test_storage_of_an_input_written_through_another_name_is_refused():
    source = attention("""
        kt = k.transpose(-2, -1)
        p = (q @ kt / math.sqrt(8)).softmax(dim=-1)
        k.mul_(2.0)
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "written in place" in finding.reason, finding.reason


# §5: reasons that name the real cause ---------------------------------------------------------------------------

def test_a_factor_reading_the_scores_says_so():
    source = attention("""
        s = q @ k.transpose(-2, -1)
        s = s / math.sqrt(s.size(-1))
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and finding.reason == "`s.size(-1)` reads the scores, which the rewrite removes"


def test_a_method_of_the_escaping_weights_is_named():
    source = attention("""
        p = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1)
        self.last = p.detach()
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV102" and "the weights' `.detach` is used at line" in finding.reason


def test_an_entropy_loss_under_training_is_an_escape_on_request_not_a_transform():
    """The weights leave (a loss kept on the module) only under `if self.training:`: in eval the SDPA path runs
    behind a check of the flag, in training the original."""
    source = attention("""
        p = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1)
        if self.training:
            self.aux = -(p * p.log()).sum()
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV101" and finding.fix_safety == "safe"
    assert [fact["name"] for fact in finding.extra["facts"]["guarded"]] == ["flag-is-bool"]
    assert "self.training is None or self.training is False" in finding.patch
    assert assert_exact_or_not_safe(source, "entropy_under_training")


@pytest.mark.parametrize("forward, init", [
    ("b, n, d, h = *q.shape[:2], q.shape[-1], 2\ns = q @ k.transpose(-2, -1) * d ** -0.5", ""),
    ("s = q @ k.transpose(-2, -1) * self.scale", "self.scale, self.heads = 8 ** -0.5, 2"),
])
def test_unpacked_scales_are_followed(forward, init):
    source = attention(forward + "\nreturn (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)", init=init)
    assert assert_exact_or_not_safe(source, "unpacked")


def test_an_unfollowed_unpacking_is_named_as_the_reason():
    source = attention("""
        s = q @ k.transpose(-2, -1) * self.scale
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init="self.scale, self.heads = self.settings()", methods="""
    def settings(self):
        return 8 ** -0.5, 2
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "unpacking the analysis does not follow" in finding.reason


# H: reaching definitions around loops --------------------------------------------------------------------------

def _reaching_values(source: str, name: str) -> list[list[str]]:
    """For each read of `name`, the right-hand sides of the assignments that reach it ('?' when unbound)."""
    import libcst as cst

    from advisor.static.dataflow import UNDEFINED, build_flow

    module = cst.parse_module(textwrap.dedent(source))
    flow = build_flow(module.body[0])
    return [sorted("?" if i == UNDEFINED else module.code_for_node(flow.definitions[i].value) for i in ids)
            for read, ids in flow.reaching.items() if read.value == name]


def test_loops_reach_a_fixpoint_through_continue_and_break():
    reads = _reaching_values("""
        def f(a, b, c, d):
            x = a
            for i in range(3):
                y = x
                x = b
                if c:
                    continue
                x = c
                if i:
                    break
                x = d
            return x
    """, "x")
    assert reads == [["a", "b", "d"], ["a", "b", "c", "d"]]


def test_a_read_after_del_sees_nothing():
    assert _reaching_values("""
        def f(a):
            x = a
            del x
            return x
    """, "x") == [["?"]]


def test_augmented_update_of_the_scores_stays_an_update():
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s += self.bias
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init="self.register_buffer('bias', torch.randn(6, 6))")
    assert "scaled_dot_product_attention" in assert_patch_exact(source, "aug_scores")


def test_a_handler_sees_every_binding_the_try_body_may_have_made():
    reads = _reaching_values("""
        def f(a, b, c):
            x = a
            try:
                x = b
                g()
                x = c
            except ValueError:
                return x
            return x
    """, "x")
    assert reads == [["a", "b", "c"], ["a", "b", "c"]]


def test_a_helper_step_inside_a_loop_is_refused():
    source = attention("""
        p = self.weights(q, k)
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """, methods="""
    def weights(self, q, k):
        with torch.no_grad():
            s = q @ k.transpose(-2, -1) / math.sqrt(8)
        return s.softmax(dim=-1)
    """)
    assert not assert_exact_or_not_safe(source, "helper_loop")


# the fuzzer's counterexamples for these classes (fixtures/attention/regressions) --------------------------------

REGRESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "attention" / "regressions"
FLOW_REGRESSIONS = ["12_tril_buffer_written_in_init", "13_else_branch_scale", "14_scale_argument_tensor",
                    "15_residual_attention_loop", "16_no_grad_scores", "17_del_key", "20_chained_assignment",
                    "21_bmm_out_buffer", "22_hook_point"]


@pytest.mark.parametrize("name", FLOW_REGRESSIONS)
def test_fuzzer_counterexample_gets_no_wrong_safe_patch(name):
    source = (REGRESSIONS / f"{name}.py").read_text(encoding="utf-8")
    assert findings(source), "the block must be reported"
    assert_exact_or_not_safe(source, name)


def test_residual_attention_weights_cannot_be_dropped():
    source = (REGRESSIONS / "15_residual_attention_loop.py").read_text(encoding="utf-8")
    finding = the_finding(source)
    assert finding.rule == "ADV102" and not finding.fixable and "flow back into the scores" in finding.reason


def test_attribute_written_by_a_called_method_between_is_refused():
    source = attention("""
        s = q @ self.mem_k.transpose(-2, -1) / math.sqrt(8)
        p = s.softmax(dim=-1)
        self.remember(k)
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """, init="self.register_buffer('mem_k', torch.randn(2, 2, 6, 8))", methods="""
    def remember(self, k):
        self.mem_k = k
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "`self.mem_k` is written at line" in finding.reason


INLINE_DEVICE_MASK = """
    i, j = s.shape[-2:]
    s = s.masked_fill(torch.ones(i, j, device=s.device, dtype=torch.bool).triu(1), float('-inf'))
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_mask_reading_the_scores_device_inline_reads_the_query_instead(guarded):
    """`masked_fill(torch.ones(i, j, device=s.device, ...), -inf)` (lucidrains helpers): the removed scores'
    device and shape are the query's, read where the mask is evaluated (hoisted under an `if`, or at the call)."""
    mask = textwrap.indent(textwrap.dedent(INLINE_DEVICE_MASK), "    " if guarded else "")
    source = attention("s = q @ k.transpose(-2, -1) / math.sqrt(8)\n" + ("if self.causal:\n" if guarded else "")
                       + mask + "return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)\n",
                       init="self.causal = True")
    fixed = assert_patch_exact(source, "inline_device")
    assert "s.device" not in fixed and "q.device" in fixed


def test_the_weights_cast_to_their_own_dtype_are_one_use():
    """`w.type_as(w)` (ESM): the cast's argument gives only a dtype and goes away with the block."""
    source = attention("""
        w = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1)
        o = w.type_as(w) @ v
        return o.transpose(1, 2).reshape(B, T, C)
    """)
    assert assert_exact_or_not_safe(source, "type_as_itself")
    escaping = source.replace("return o.transpose(1, 2).reshape(B, T, C)",
                              "return o.transpose(1, 2).reshape(B, T, C), w")
    assert the_finding(escaping).rule == "ADV102"


GLOBAL_TEMPERATURE = """
    s = q @ k.transpose(-2, -1) / (math.sqrt(8) * TEMPERATURE)
    return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
"""


def test_a_module_level_number_is_a_scale():
    source = attention(GLOBAL_TEMPERATURE).replace("\nclass Attn", "\nTEMPERATURE = 2.0\n\n\nclass Attn")
    assert assert_exact_or_not_safe(source, "global_scale")


def test_a_module_level_number_rebound_by_a_setter_is_assumed():
    setter = "\ndef set_temperature(t):\n    global TEMPERATURE\n    TEMPERATURE = t\n"
    source = attention(GLOBAL_TEMPERATURE, after=setter).replace("\nclass Attn", "\nTEMPERATURE = 2.0\n\n\nclass Attn")
    finding = the_finding(source)
    assert finding.fix_safety == "unsafe" and "set_temperature" in finding.reason
    assert_patch_exact(source, "global_scale_setter")
    tensor = the_finding(source.replace("TEMPERATURE = 2.0", "TEMPERATURE = torch.tensor(2.0)"))
    assert tensor.fix_safety == "unsafe" and "TEMPERATURE" in tensor.reason  # a tensor whose shape is not followed


def test_fstring_einsum_specs_of_constant_local_strings_are_read():
    """audiocraft: `layout = "b h t d"; key_layout = layout.replace("t", "k")`, specs built as f-strings."""
    source = attention("""
        layout = "b h t d"
        key_layout = layout.replace("t", "k")
        s = torch.einsum(f"{layout},{key_layout}-> b h t k", q, k) / math.sqrt(8)
        o = torch.einsum(f"b h t k, {key_layout} -> {layout}", s.softmax(dim=-1), v)
        return o.transpose(1, 2).reshape(B, T, C)
    """)
    assert assert_exact_or_not_safe(source, "fstring_layouts")
    rebound = source.replace('        s = torch.einsum', '        if T > 3:\n            layout = "b h s d"\n'
                                                      '        s = torch.einsum', 1)
    assert "is not a literal" in the_finding(rebound).reason


def test_scores_masked_in_place_by_a_helper_get_a_reason():
    """megatron's `attention_mask_func(scores, mask)` fills the scores in place and returns them: no silence."""
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s = mask_func(s, torch.ones(T, T, dtype=torch.bool).triu(1))
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, after="def mask_func(scores, mask):\n    scores.masked_fill_(mask, -10000.0)\n    return scores\n")
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "`mask_func`" in finding.reason
    assert "updated in place there (`scores.masked_fill_(mask, -10000.0)`)" in finding.reason
    unchanged = source.replace("    scores.masked_fill_(mask, -10000.0)\n", "")
    assert "`mask_func` as its parameter `scores` and returned unchanged" in the_finding(unchanged).reason


ZERO_ONE_MASK = """
    s = q @ k.transpose(-2, -1) / math.sqrt(8)
    b = self.bias[:, :, :T, :T]
    s = s * b - 1e4 * (1 - b)
    return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
"""


def test_a_zero_one_buffer_mask_written_as_arithmetic_is_a_finite_fill():
    """OpenAI GPT-2's `w * b - 1e4 * (1 - b)`: where b is 1 the score, where 0 exactly -1e4 (b in {0, 1})."""
    init = "self.register_buffer('bias', torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))"
    source = attention(ZERO_ONE_MASK, init=init)
    filled = attention(ZERO_ONE_MASK.replace("s * b - 1e4 * (1 - b)", "s.masked_fill(b == 0, -1e4)"), init=init)
    def facts(finding):  # no-writes is stated only where the SDPA call reads an attribute (`self.bias` here)
        return {status: [fact["name"] for fact in group if fact["name"] != "no-writes"]
                for status, group in finding.to_json()["facts"].items()}
    assert facts(the_finding(source)) == facts(the_finding(filled))
    assert_patch_exact(source, "zero_one_mask")


def test_an_arithmetic_mask_of_unknown_values_is_not_a_fill():
    source = attention(ZERO_ONE_MASK, init="self.register_buffer('bias', torch.rand(1, 1, 8, 8))")
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "`1e4 * (1 - b)`" in finding.reason


GUARDED_DROPOUT = """
    w = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1)
    if self.p:
        w = F.dropout(w, p=self.p, training=self.training)
    return (w @ v).transpose(1, 2).reshape(B, T, C)
"""


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_dropout_under_a_test_of_its_own_probability_is_dropout(p):
    """MPT's `if dropout_p: w = dropout(w, p=dropout_p, ...)`: the test is false only where dropout is the
    identity, so the weights are dropped out unconditionally."""
    source = attention(GUARDED_DROPOUT, init=f"self.p = {p}")
    assert assert_exact_or_not_safe(source, "guarded_dropout")  # eval mode: parity without randomness
    assert "if self.p else 0.0" in analyze_source(source, "m.py").fixed
    for flag in (True, False):  # another flag: SDPA without dropout runs only where it is off
        other = attention(GUARDED_DROPOUT.replace("if self.p:", "if self.flag:"),
                          init=f"self.p = {p}\nself.flag = {flag}")
        assert "if self.flag is None or self.flag is False:" in analyze_source(other, "m.py").fixed
        assert assert_exact_or_not_safe(other, f"flagged_dropout_{flag}")


def test_an_output_returned_out_of_sight_is_accepted_as_unwritten_and_a_write_there_is_loud():
    """A caller outside the file writing the returned output in place while autograd records the block: the patch's
    backward raises (SDPA saved its output), the forward's values are the original's; no copy is added for it."""
    source = attention("""
        o = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v
        return o.transpose(1, 2).reshape(B, T, C)
    """)
    result = analyze_source(source, "m.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and ".clone(" not in result.fixed
    assert "output-writes" in {fact["name"] for fact in finding.extra["facts"]["accepted"]}
    outputs = []
    for text, name in ((source, "out_of_sight"), (result.fixed, "out_of_sight_fixed")):
        model, (x,) = load_module_from_source(text, name).make()
        x.requires_grad_(True)
        out = model(x)
        out += 1.0  # the caller's write
        outputs.append(out.detach().clone())
        try:
            out.sum().backward()
            outputs.append(None)
        except RuntimeError as error:
            outputs.append(str(error))
    torch.testing.assert_close(outputs[2], outputs[0])
    assert outputs[1] is None and "modified by an inplace operation" in outputs[3]


HANDED_ONCE = {
    "direct": "return self.post(o.transpose(1, 2).reshape(B, T, C))",
    "size_read_first": "c = o.permute(0, 2, 1, 3).contiguous()\n        shape = c.size()[:-2] + (C,)\n"
                       "        c = c.view(*shape)\n        return self.post(c)",
}


@pytest.mark.parametrize("kind", sorted(HANDED_ONCE))
def test_an_output_handed_on_once_to_a_callee_out_of_sight_is_accepted_as_unwritten(kind):
    """`self.post(o.transpose(1, 2).reshape(B, T, C))` with nothing else reading the output's values (BERT's
    `c.size()` reads its metadata): a write there reaches the same values in both (one alias is observable, the
    call's own), so only the backward can differ, loudly."""
    source = attention(f"""
        o = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v
        {HANDED_ONCE[kind]}
    """, init="self.post = Post()", after=WRITERS)
    result = analyze_source(source, "m.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and ".clone(" not in result.fixed
    [accepted] = [fact for fact in finding.extra["facts"]["accepted"] if fact["name"] == "output-writes"]
    assert "self.post(" in accepted["why"]
    model, (x,) = load_module_from_source(source, f"handed_once_{kind}").make()
    patched, _ = load_module_from_source(result.fixed, f"handed_once_{kind}_fixed").make()
    torch.testing.assert_close(patched(x), model(x))


CHOSEN_ACTIVATION = '''import functools
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, act_layer=nn.Identity):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.act = act_layer()

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        o = (q @ k.transpose(-2, -1) * 0.25).softmax(dim=-1) @ v
        o = self.act(o)
        return o.transpose(1, 2).reshape(B, T, C)


def make():
    torch.manual_seed(0)
    return Attention(act_layer={chosen})
'''


@pytest.mark.parametrize("chosen, written", [("functools.partial(nn.ReLU, inplace=True)", True),
                                             ("lambda: nn.ReLU(inplace=True)", True), ("nn.GELU", False)])
def test_an_output_handed_to_a_module_of_the_class_its_caller_chooses(tmp_path, chosen, written):
    """Breaker round 15, bug 15: `self.act = act_layer()` with a caller's `partial(nn.ReLU, inplace=True)` wrote the
    output SDPA saved for its backward, which raised. A construction in the tree that makes the chosen class write
    in place now gets the output a fresh copy; one that does not leaves the accepted `output-writes`."""
    from advisor.engine.static import scan_paths
    source = CHOSEN_ACTIVATION.replace("{chosen}", chosen)
    (tmp_path / "model.py").write_text(source, encoding="utf-8")
    result = scan_paths([str(tmp_path)], jobs=1)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    fixed = result.files[0].fixed
    assert finding.fix_safety == "safe" and (".clone(memory_format=torch.contiguous_format)" in fixed) == written
    runs = []
    for text, name in ((source, f"chosen_{written}"), (fixed, f"chosen_{written}_fixed")):
        model = load_module_from_source(text, name).make()
        x = torch.randn(2, 6, 16, requires_grad=True)
        out = model(x)
        out.square().sum().backward()
        runs.append((out.detach(), x.grad))
    torch.testing.assert_close(runs[1], runs[0])


@pytest.mark.parametrize("draw", ["self.drop(o)", "F.dropout(o, 0.5, self.training)", "o * torch.rand_like(o)"])
def test_random_draws_over_the_output_see_the_product_s_memory_order(draw):
    """Breaker round 16: dropout over the per-head output `(B, H, T, D)` draws its mask in memory order; SDPA's CPU
    output has the query's permuted strides, so the same seed dropped other elements (0.29 in training). A random
    op reading the output gets it contiguous, as the product is."""
    source = attention(f"""
        o = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v
        o = {draw}
        return o.transpose(1, 2).reshape(B, T, C)
    """, init="self.drop = nn.Dropout(0.5)")
    fixed = analyze_source(source, "m.py").fixed
    assert "scaled_dot_product_attention" in fixed and ".contiguous()" in fixed
    outputs = []
    for text, name in ((source, "draws"), (fixed, "draws_fixed")):
        model, (x,) = load_module_from_source(text, name).make()
        model.train()
        torch.manual_seed(7)
        outputs.append(model(x))
    torch.testing.assert_close(outputs[1], outputs[0])


def test_an_elementwise_layer_passes_the_output_s_strides_on_to_a_view():
    """Breaker round 16: `self.act = nn.GELU()` was taken to make a fresh contiguous tensor (every torch.nn layer
    but Identity and Dropout was); GELU keeps SDPA's permuted strides, and the `.view` after it raised."""
    source = attention("""
        o = self.act((q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v)
        return o.view(B * 2, T, 8)
    """, init="self.act = nn.GELU()")
    fixed = analyze_source(source, "m.py").fixed
    assert ".contiguous()" in fixed
    model, (x,) = load_module_from_source(source, "gelu_view").make()
    patched, _ = load_module_from_source(fixed, "gelu_view_fixed").make()
    torch.testing.assert_close(patched(x), model(x))


def test_a_hook_on_a_gradient_in_the_block_s_function_leaves_the_patch_assumed():
    """Breaker round 16: `v.register_hook(self.record)` viewing the gradient per head; the product's backward gives
    v a contiguous gradient, SDPA's the inputs' layout, and the view raised in the patch's backward."""
    source = attention("""
        if v.requires_grad:
            v.register_hook(lambda g: g.view(g.size(0), g.size(1), -1))
        o = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1) @ v
        return o.transpose(1, 2).reshape(B, T, C)
    """)
    (finding,) = [f for f in analyze_source(source, "m.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "unsafe" and "input-gradient-layout" in {
        fact["name"] for fact in finding.extra["facts"]["assumed"]}


def test_an_output_rearranged_by_einops_then_written_is_a_fresh_tensor():
    """Breaker round 16: `out = rearrange(att @ v, "b h n d -> b n (h d)")` then a residual `out += x`: the rearrange
    copies the product, but is a view of SDPA's output (its memory is b n h d), which SDPA saved for its backward."""
    source = attention("""
        att = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1)
        out = rearrange(att @ v, "b h n d -> b n (h d)")
        out += x
        return out
    """, after=WRITERS)
    assert ".clone(memory_format=torch.contiguous_format)" in analyze_source(source, "m.py").fixed
    outcome = check(source)
    assert outcome.status not in (INVALID, COUNTEREXAMPLE), f"{outcome.kind}: {outcome.detail}"


def test_a_module_function_called_between_the_scores_and_the_value_product_writes_no_input():
    """memorizing-transformers' `q, k = map(l2norm, (q, k))` put the module's `l2norm` beside q in an alias reading,
    so a later `mem_k = l2norm(mem_k)` was read as a write of q ("`q` is written in place", reach survey 3): a name
    the function never binds holds no method of its tensors. A local bound to one (`cb = q.mul_`) still does."""
    source = attention("""
        q, k = map(l2norm, (q, k))
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        other = l2norm(x)
        p = s.softmax(dim=-1)
        return (p @ v).transpose(1, 2).reshape(B, T, C) + other.sum()
    """, after="\n\ndef l2norm(t):\n    return F.normalize(t, dim=-1)\n")
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe" and "scaled_dot_product_attention" in fixed, finding.reason
    parity(source, fixed)


def test_a_torch_function_imported_by_name_returns_no_view_of_its_operands():
    """`from torch import einsum` (lucidrains' style): a call of it is `torch.einsum`, a fresh tensor, not a helper
    that may return what it is given; so the weights' einsum with v joins no name to q, and an in-place fill of the
    scores is no write of q (Stable Diffusion's `CrossAttention`, reach survey 3, was refused as "`q` is written in
    place"). A name the file also binds otherwise stays unknown code."""
    einsum_block = textwrap.dedent("""
        q, k, v = map(lambda t: t.reshape(B * 2, T, 8), (q, k, v))
        sim = einsum('b i d, b j d -> b i j', q, k) * (8 ** -0.5)
        sim.masked_fill_(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.finfo(sim.dtype).max)
        sim = sim.softmax(dim=-1)
        out = einsum('b i j, b j d -> b i d', sim, v)
        return out.reshape(B, 2, T, 8).transpose(1, 2).reshape(B, T, C)
    """)
    source = attention(einsum_block).replace("import math\n", "import math\nfrom torch import einsum\n", 1)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe" and "scaled_dot_product_attention" in fixed, finding.reason
    parity(source, fixed)
    assert "einsum" in ParsedModule(source, "m.py").library_functions
    shadowed = source.replace("import math\n", "import math\neinsum = None\n", 1)
    assert "einsum" not in ParsedModule(shadowed, "m.py").library_functions


MUTUAL_HELPERS = '''import torch

Q = torch.zeros(2)


def ping(n):
    if n:
        pong(n - 1)


def pong(n):
    if n:
        ping(n - 1){write}


def attend(q, k, v):
    s = (q @ k.transpose(-2, -1)) * 0.5
    p = s.softmax(dim=-1)
    ping(3)
    return p @ v
'''


@pytest.mark.parametrize("write, safe", [("", True), ("\n    Q.mul_(2)", False)], ids=["reads", "writes a global"])
def test_helpers_that_call_each_other_are_read_once_each(write, safe):
    """The check of what a helper called between the scores and the value product writes follows the helpers it
    calls; two that call each other recursed without end, and the file became an error."""
    result = analyze_source(MUTUAL_HELPERS.format(write=write), "m.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert (finding.fix_safety == "safe") is safe, finding.reason

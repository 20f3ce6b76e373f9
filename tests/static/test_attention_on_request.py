"""Weights that leave only on request: a block that reshapes, keeps or returns its weights only under
`if output_attentions:` (fairseq: `if need_weights:`) takes the SDPA path where the flag is off and runs the
original statements, verbatim, where it is on. Each patch is run against the original with the flag off and on:
outputs, the weights where they are returned, input and parameter gradients."""

from __future__ import annotations

import textwrap

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from attention_sources import attention_finding_and_fix, fact_names
from fixture_models import load_module_from_source

TEMPLATE = '''
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.dropout = 0.0
        self.output_attentions = False

    def forward(self, x, {flag}):
        bsz, tgt_len, dim = x.shape
        q = (self.q_proj(x) * self.scaling).view(bsz, tgt_len, self.heads, -1).transpose(1, 2)
        q = q.reshape(bsz * self.heads, tgt_len, self.head_dim)
        k = self.k_proj(x).view(bsz, tgt_len, self.heads, -1).transpose(1, 2).reshape(bsz * self.heads, -1, 8)
        v = self.v_proj(x).view(bsz, tgt_len, self.heads, -1).transpose(1, 2).reshape(bsz * self.heads, -1, 8)
        src_len = k.size(1)
{body}
'''

# transformers' BART family (MVP, LED, SpeechT5, TrOCR, FSMT) and DETR: the weights reshaped twice "to keep their
# gradient" under the flag, None otherwise; the scores' whole size checked after the product
RESHAPED_UNDER_FLAG = """
attn_weights = torch.bmm(q, k.transpose(1, 2))
if attn_weights.size() != (bsz * self.heads, tgt_len, src_len):
    raise ValueError(f"Attention weights should be of size {(bsz * self.heads, tgt_len, src_len)}")
attn_weights = nn.functional.softmax(attn_weights, dim=-1)
if output_attentions:
    attn_weights_reshaped = attn_weights.view(bsz, self.heads, tgt_len, src_len)
    attn_weights = attn_weights_reshaped.view(bsz * self.heads, tgt_len, src_len)
else:
    attn_weights_reshaped = None
attn_probs = nn.functional.dropout(attn_weights, p=self.dropout, training=self.training)
attn_output = torch.bmm(attn_probs, v)
return attn_output, attn_weights_reshaped
"""
# fairseq's MultiheadAttention: None first, the (head-averaged) weights only when asked; the flag is also set by
# another flag before the block
FAIRSEQ_NEED_WEIGHTS = """
if need_head_weights:
    need_weights = True
attn_weights = torch.bmm(q, k.transpose(1, 2))
attn_weights_float = F.softmax(attn_weights, dim=-1, dtype=torch.float32)
attn_weights = attn_weights_float.type_as(attn_weights)
attn_probs = F.dropout(attn_weights, p=self.dropout, training=self.training)
attn = torch.bmm(attn_probs, v)
attn_weights = None
if need_weights:
    attn_weights = attn_weights_float.view(bsz, self.heads, tgt_len, src_len).transpose(1, 0)
    if not need_head_weights:
        attn_weights = attn_weights.mean(dim=0)
return attn, attn_weights
"""
EARLY_RETURN = """
w = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
out = torch.bmm(w, v)
if output_attentions:
    return out, w
return out, None
"""
# an `elif` after the flag: with the flag off, the `elif` is the first test
ELIF_CHAIN = """
w = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
out = torch.bmm(w, v)
if output_attentions:
    extra = w
elif keep_first:
    extra = out[:, :1]
else:
    extra = None
return out, extra
"""
# the flag on the module itself, with no annotation: its truth test is checked at run time
ATTRIBUTE_FLAG = """
w = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
if self.output_attentions:
    kept = w.view(bsz, self.heads, tgt_len, src_len)
else:
    kept = None
return torch.bmm(w, v), kept
"""
# must NOT be rewritten: the weights are returned whatever the flag says
RETURNED_WHATEVER_THE_FLAG = """
w = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
if output_attentions:
    w = w.view(bsz, self.heads, tgt_len, src_len).view(bsz * self.heads, tgt_len, src_len)
return torch.bmm(w, v), w
"""
# the flag is rebound between the block and its `if`: the branch taken at the block says nothing of the `if`
FLAG_REBOUND = """
w = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
out = torch.bmm(w, v)
output_attentions = out.sum() > 0
if output_attentions:
    return out, w
return out, None
"""

ANNOTATED = "output_attentions: bool = False"
FAIRSEQ_FLAGS = "need_weights: bool = True, need_head_weights: bool = False"


def _source(body: str, flag: str = ANNOTATED) -> str:
    return TEMPLATE.format(flag=flag, body=textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8))


def _models(source: str, fixed: str):
    torch.manual_seed(0)
    original = load_module_from_source(source, "case").Attention().double()
    patched = load_module_from_source(fixed, "case_fixed").Attention().double()
    patched.load_state_dict(original.state_dict())
    return original, patched


def _run(model, x, kwargs, attribute):
    x = x.clone().requires_grad_(True)
    if attribute is not None:
        model.output_attentions = attribute
    model.zero_grad()
    outputs = [t for t in model(x, **kwargs) if t is not None]
    loss = sum((t * torch.cos(torch.arange(t.numel(), dtype=t.dtype).view(t.shape))).sum() for t in outputs)
    loss.backward()
    return outputs, [x.grad] + [p.grad for p in model.parameters()]


def _assert_parity(source: str, fixed: str, kwargs: dict, attribute=None, tol: float = 1e-10) -> None:
    """fp64 on both sides; `tol` 1e-6 where the finding accepts dropping an fp32 softmax upcast (precision)."""
    original, patched = _models(source, fixed)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for model in (original, patched):
        model.train(False)
    (out_a, grads_a), (out_b, grads_b) = _run(original, x, kwargs, attribute), _run(patched, x, kwargs, attribute)
    assert len(out_a) == len(out_b)  # the weights come back exactly where the original returns them
    for a, b in zip(out_a + grads_a, out_b + grads_b):
        torch.testing.assert_close(b, a, atol=tol, rtol=tol)


@pytest.mark.parametrize("body, flag, name, off, on", [
    (RESHAPED_UNDER_FLAG, ANNOTATED, "output_attentions", {"output_attentions": False}, {"output_attentions": True}),
    (FAIRSEQ_NEED_WEIGHTS, FAIRSEQ_FLAGS, "need_weights", {"need_weights": False},
     [{"need_weights": True}, {"need_weights": False, "need_head_weights": True}]),
    (EARLY_RETURN, ANNOTATED, "output_attentions", {"output_attentions": False}, {"output_attentions": True}),
    (ELIF_CHAIN, "output_attentions: bool = False, keep_first: bool = False", "output_attentions",
     {"output_attentions": False, "keep_first": True}, [{"output_attentions": True}, {"output_attentions": False}]),
], ids=["bart-reshaped", "fairseq-need-weights", "early-return", "elif"])
def test_a_proved_flag_gives_a_safe_branch_exact_with_the_flag_off_and_on(body, flag, name, off, on, monkeypatch):
    source = _source(body, flag)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.rule == "ADV101" and finding.fix_safety == "safe", finding.reason
    assert "flag-is-bool" in fact_names(finding, "proved")
    # the flag test leads the guard (a module's dropout probability is checked after it: dropout-range)
    assert (f"if not {name}:" in finding.patch or f"if not {name} and " in finding.patch) and \
        "scaled_dot_product_attention" in finding.patch
    tol = 1e-6 if "precision" in fact_names(finding, "accepted") else 1e-10
    for kwargs in [off] + (on if isinstance(on, list) else [on]):
        _assert_parity(source, fixed, kwargs, tol=tol)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    _, patched = _models(source, fixed)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    patched(x, **off)
    assert calls == [1]  # the SDPA path runs with the flag off, and only then
    patched(x, **(on[0] if isinstance(on, list) else on))
    assert calls == [1]
    assert analyze_source(fixed, "case.py").fixed == fixed  # the original kept under `else:` is no new finding


def test_a_flag_of_unknown_type_is_guarded():
    source = _source(ATTRIBUTE_FLAG, "unused=None")
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe" and fact_names(finding, "guarded") == {"flag-is-bool", "kv-length", "bmm-batch"}
    assert "self.output_attentions is None or self.output_attentions is False" in finding.patch
    for value in (False, None, True, torch.tensor(False)):  # a tensor flag runs the original's own truth test
        _assert_parity(source, fixed, {}, attribute=value)


def test_the_scores_whole_size_is_read_from_q_and_k():
    finding, _ = attention_finding_and_fix(_source(RESHAPED_UNDER_FLAG))
    assert "q.size()[:-1] + k.size()[-2:-1] != (bsz * self.heads, tgt_len, src_len)" in finding.patch


@pytest.mark.parametrize("body", [RETURNED_WHATEVER_THE_FLAG, FLAG_REBOUND], ids=["returned-anyway", "rebound"])
def test_weights_that_leave_whatever_the_flag_are_not_rewritten_behind_it(body):
    source = _source(body)
    finding, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert finding.fix_safety != "safe" and "flag-is-bool" not in str(finding.extra.get("facts"))
    assert "not output_attentions" not in (finding.patch or "")
    assert analyze_source(source, "case.py").fixed == source


# a shared function: it returns its weights, and every call of it in the scanned tree drops them
SHARED = '''
import torch
from torch import nn


def attend(q, k, v):
    w = torch.matmul(q, k.transpose(-2, -1)) / q.size(-1) ** 0.5
    w = w.softmax(dim=-1)
    return torch.matmul(w, v), w


class Block(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out, _ = attend(q, k, v)
        first = attend(q, k, v)[0]
        {third}
        return (out + first).transpose(1, 2).reshape(b, n, c)
'''


def _scanned(tmp_path, source: str, call_site_facts: bool = True):
    path = tmp_path / "shared.py"
    path.write_text(source)
    (result,) = scan_paths([str(path)], jobs=1, call_site_facts=call_site_facts).files
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    return finding, result.fixed


def test_weights_every_caller_drops_are_proved_from_the_call_sites(tmp_path):
    source = SHARED.replace("{third}", "attend(q, k, v)")
    finding, fixed = _scanned(tmp_path, source)
    assert finding.rule == "ADV101" and finding.fix_safety == "safe", finding.reason
    (fact,) = finding.extra["facts"]["from_call_sites"]
    assert fact["name"] == "weights-dropped" and [site.split(":")[-1] for site in fact["sites"]] == ["21", "22", "23"]
    assert "scaled_dot_product_attention(q, k, v), None" in fixed
    torch.manual_seed(0)
    original = load_module_from_source(source, "shared").Block().double()
    patched = load_module_from_source(fixed, "shared_fixed").Block().double()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(patched(x), original(x), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("third, options", [
    ("_, self.kept = attend(q, k, v)", {}),  # one caller keeps them
    ("_, kept = attend(q, k, v)\n        self.kept = kept", {}),
    ("attend(q, k, v)", {"call_site_facts": False}),  # a library whose callers live outside the tree
], ids=["stored", "read", "opt-out"])
def test_weights_a_caller_may_read_stay_unsafe(tmp_path, third, options):
    finding, fixed = _scanned(tmp_path, SHARED.replace("{third}", third), **options)
    assert finding.rule == "ADV102" and finding.fix_safety == "unsafe"
    statuses = {status for status, facts in finding.extra["facts"].items() for fact in facts
                if fact["name"] == "weights-dropped"}
    assert statuses == {"assumed"}  # named as what the patch's None relies on, not proved from call sites


# a module's forward returns its weights (for a visualiser), and its parents drop them
FORWARD = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)) * 0.25
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(b, n, c), attn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()

    def forward(self, x):
        y, _ = self.attn(x)
        {second}
        return x + y
'''


@pytest.mark.parametrize("second, viz", [
    # every parent drops them, and still: an eleventh breaker round reached the module through `_modules`,
    # `model.apply`, its own `__call__`, a hook written into `_forward_hooks` and IPython magics, and read them
    ("y = y + self.attn(y)[0]", None),
    ("_, self.maps = self.attn(y)", None),  # a parent keeps them
    ("pass", "self.attn.register_forward_hook(lambda m, i, o: print(o[1]))"),  # a hook in the same file reads them
    ("pass", "other"),  # a visualiser elsewhere in the tree hooks the module
], ids=["parents-drop", "stored", "hook-here", "hook-elsewhere"])
def test_weights_a_forward_returns_stay_unsafe(tmp_path, second, viz):
    source = FORWARD.replace("{second}", second)
    if viz is not None and viz != "other":
        source = source.replace("self.attn = Attention()", f"self.attn = Attention()\n        {viz}")
    path = tmp_path / "model.py"
    path.write_text(source)
    paths = [str(path)]
    if viz == "other":
        (tmp_path / "viz.py").write_text("from model import Block\n\nblock = Block()\n"
                                         "block.attn.register_forward_hook(lambda m, i, o: print(o[1].shape))\n")
        paths.append(str(tmp_path / "viz.py"))
    files = scan_paths(paths, jobs=1).files
    (finding,) = [f for r in files for f in r.findings if f.kind == "attention"]
    assert finding.rule == "ADV102" and finding.fix_safety == "unsafe"
    statuses = {status for status, facts in finding.extra["facts"].items() for fact in facts
                if fact["name"] == "weights-dropped"}
    assert statuses == {"assumed"}  # named as what the patch's None relies on, not proved from call sites

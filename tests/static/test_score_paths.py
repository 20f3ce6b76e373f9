"""Scores assigned on several paths. Where each branch of an `if`/`elif` chain masks the same scores (a flag-selected
bias, a bias in one branch and a causal fill in another), SDPA gets each path's mask, hoisted where its branch
applies it. Where an `if` before the softmax whose test runs no code (a flag, `x is None`, `x is not None`) selects a
path SDPA does not express (a module applied to the scores, head mixing, a training-only change), the patch takes
the SDPA path where that test is false, with the mask the remaining paths add, and runs the original statements,
verbatim, elsewhere. Each patch is run against the original with every path taken: outputs and input and parameter
gradients in fp32 and fp64, and the SDPA call counted where it must (and must not) run."""

from __future__ import annotations

import textwrap

import pytest
import torch

from advisor.engine.static import analyze_source
from attention_sources import attention_finding_and_fix, fact_names
from fixture_models import load_module_from_source

TEMPLATE = '''
import torch
from torch import nn


class AddedBias(nn.Module):
    """A relative-position bias module: its forward only adds a learned table."""

    def __init__(self, heads=2, n=5):
        super().__init__()
        self.table = nn.Parameter(torch.randn(heads, n, n))

    def forward(self, attn, shared=None):
        return attn + self.table


class HeadMixing(nn.Module):
    """Talking heads: each head's scores become a mix of every head's, which no SDPA mask expresses."""

    def __init__(self, heads=2):
        super().__init__()
        self.mixer = nn.Linear(heads, heads)

    def forward(self, attn, shared=None):
        return self.mixer(attn.transpose(1, -1)).transpose(1, -1)


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, rel=None):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.rel_pos = rel(heads) if rel is not None else None
        self.table = nn.Parameter(torch.randn(heads, 5, 5))
        self.jitter = HeadMixing(heads)
        self.table2 = nn.Parameter(torch.randn(heads, 5, 5))
        self.register_buffer("tril", torch.tril(torch.ones(5, 5)))
        self.use_table, self.causal = False, False

    def forward(self, x, bias=None):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
{body}
        return out.transpose(1, 2).reshape(B, N, C)
'''

# timm's RelPosAttention / maxxvit's AttentionCl: a bias module applied to the scores, else a shared bias if given
MODULE_ELSE_OPTIONAL_BIAS = """
q = q * self.scale
attn = q @ k.transpose(-2, -1)
if self.rel_pos is not None:
    attn = self.rel_pos(attn, shared=bias)
elif bias is not None:
    attn = attn + bias
attn = attn.softmax(dim=-1)
out = attn @ v
"""
# a change of the scores in training only (here: head mixing), SDPA in eval
TRAINING_ONLY = """
attn = (q * self.scale) @ k.transpose(-2, -1)
if self.training:
    attn = self.jitter(attn)
attn = attn.softmax(dim=-1)
out = attn @ v
"""
# a flag selects between a module applied to the scores and a learned bias: SDPA with the bias where it is off
FLAG_SELECTED_BIAS = """
attn = torch.matmul(q, k.transpose(-1, -2)) * self.scale
if self.use_table:
    attn = self.jitter(attn)
else:
    attn = attn + self.table
attn = torch.softmax(attn, dim=-1)
out = torch.matmul(attn, v)
"""
# both paths are learned biases: SDPA on each, with its own table
TWO_TABLES = """
attn = q @ k.transpose(-2, -1) * self.scale
if self.use_table:
    attn = attn + self.table
else:
    attn += self.table2
out = attn.softmax(dim=-1) @ v
"""
# a bias on one branch, a causal fill on an `elif`, none on the third path
BIAS_ELIF_CAUSAL = """
attn = (q @ k.transpose(-2, -1)) * self.scale
if self.use_table:
    attn = attn + self.table
elif self.causal:
    attn = attn.masked_fill(self.tril[:N, :N] == 0, float("-inf"))
attn = attn.softmax(dim=-1)
out = attn @ v
"""
# the caller's bias on one branch (its rows' facts assumed: an unsafe patch, run with --unsafe-fixes)
TABLE_OR_CALLER_BIAS = """
attn = q @ k.transpose(-2, -1) * self.scale
if self.use_table:
    attn = attn + self.table
elif bias is not None:
    attn = attn + bias
out = attn.softmax(dim=-1) @ v
"""


def _source(body: str) -> str:
    return TEMPLATE.format(body=textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8))


def _pair(source: str, fixed: str, dtype: torch.dtype, rel: str | None, flags: dict):
    original_module, patched_module = load_module_from_source(source, "case"), load_module_from_source(fixed, "fixed")
    models = []
    for module in (original_module, patched_module):
        torch.manual_seed(0)
        model = module.Attention(rel=getattr(module, rel) if rel else None).to(dtype)
        model.train(flags.get("training", False))
        model.use_table, model.causal = flags.get("use_table", False), flags.get("causal", False)
        models.append(model)
    models[1].load_state_dict(models[0].state_dict())
    return models


def _run(model, x, bias):
    x = x.clone().requires_grad_(True)
    bias = None if bias is None else bias.clone().requires_grad_(True)
    out = model(x, bias=bias)
    (out * torch.cos(torch.arange(out.numel(), dtype=out.dtype).view(out.shape))).sum().backward()
    grads = [x.grad] + ([bias.grad] if bias is not None else []) + [p.grad for p in model.parameters()]
    return [out] + [g if g is not None else torch.zeros(()) for g in grads]


OFF, TABLE, CAUSAL, TRAINING = {}, {"use_table": True}, {"causal": True}, {"training": True}
# (body, the ways each path is taken: (rel_pos class, flags, with a bias, SDPA expected))
CASES = {
    "two-tables": (TWO_TABLES, [(None, TABLE, False, True), (None, OFF, False, True)]),
    "bias-elif-causal": (BIAS_ELIF_CAUSAL, [(None, TABLE, False, True), (None, CAUSAL, False, True),
                                            (None, OFF, False, True)]),
    # the bias module's term is SDPA's mask where the module is exactly an `AddedBias` (a class of the file whose
    # forward adds a table of its own) and the caller passes no bias; any other module runs the original
    "module-else-optional-bias": (MODULE_ELSE_OPTIONAL_BIAS, [
        ("AddedBias", OFF, True, False), ("AddedBias", OFF, False, True), ("HeadMixing", OFF, False, False),
        (None, OFF, True, False), (None, OFF, False, True)]),
    "training-only": (TRAINING_ONLY, [(None, TRAINING, False, False), (None, OFF, False, True)]),
    "flag-selected-bias": (FLAG_SELECTED_BIAS, [(None, TABLE, False, False), (None, OFF, False, True)]),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_every_path_is_exact_and_sdpa_runs_on_each_path_proved(name, dtype, monkeypatch):
    body, ways = CASES[name]
    source = _source(body)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.rule == "ADV101" and finding.fix_safety == "safe", finding.reason
    branched = {"flag-is-bool", "fully-masked-rows", "module-identity"} & fact_names(finding, "guarded") or \
        "flag-is-bool" in fact_names(finding, "proved")
    assert bool(branched) == any(not sdpa for *_, sdpa in ways)  # the original kept only where a path needs it
    _assert_every_path_exact(source, fixed, ways, dtype, monkeypatch)
    assert analyze_source(fixed, "case.py").fixed == fixed  # the original kept under `else:` is no new finding


def _assert_every_path_exact(source: str, fixed: str, ways: list, dtype: torch.dtype, monkeypatch) -> None:
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for rel, flags, with_bias, sdpa_expected in ways:
        original, patched = _pair(source, fixed, dtype, rel, flags)
        torch.manual_seed(1)
        x = torch.randn(2, 5, 16, dtype=dtype)
        bias = torch.randn(2, 2, 5, 5, dtype=dtype) if with_bias else None
        expected = _run(original, x, bias)
        calls.clear()
        got = _run(patched, x, bias)
        assert calls == ([1] if sdpa_expected else []), (rel, flags, with_bias)
        for a, b in zip(expected, got):
            torch.testing.assert_close(b, a, atol=tol, rtol=tol)


def test_each_branch_assigns_its_own_mask_where_no_other_can_have_run():
    finding, _ = attention_finding_and_fix(_source(BIAS_ELIF_CAUSAL))
    assert "attn_mask = self.table.to(q.dtype)\n" in finding.patch and "attn_mask is None" not in finding.patch
    assert "flag-is-bool" not in str(finding.extra["facts"])  # no branch on the flag: SDPA on every path


def test_a_caller_bias_on_one_branch_leaves_an_unsafe_patch_exact_on_every_path(monkeypatch):
    source = _source(TABLE_OR_CALLER_BIAS)
    finding, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert finding.fixable and finding.fix_safety == "unsafe" and "fully-masked-rows" in fact_names(finding, "assumed")
    _assert_every_path_exact(source, fixed, [(None, TABLE, True, True), (None, OFF, True, True),
                                             (None, OFF, False, True)], torch.float64, monkeypatch)


def test_a_mask_of_an_elif_is_hoisted_above_its_first_if_in_the_unsafe_patch(monkeypatch):
    """With --unsafe-fixes the bias is passed to SDPA (its fully-masked-rows fact assumed) rather than guarded by
    its absence: hoisted where the `elif` adds it, with `attn_mask = None` above the whole `if` chain, which the
    SDPA path replaces by its `elif`; the bias module's term is hoisted where its `if` calls it, behind the module's
    check (an `AddedBias` exactly, or None)."""
    source = _source(MODULE_ELSE_OPTIONAL_BIAS)
    finding, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert finding.fixable and finding.fix_safety == "unsafe", finding.reason
    assert fact_names(finding, "assumed") == {"fully-masked-rows"}
    _assert_every_path_exact(source, fixed, [("AddedBias", OFF, True, True), ("HeadMixing", OFF, True, False),
                                             (None, OFF, True, True), (None, OFF, False, True)], torch.float64,
                             monkeypatch)


# must NOT be rewritten: the test calls a function (it could change what it selects), or both paths are ones SDPA
# does not express
CALLED_TEST = """
attn = q @ k.transpose(-2, -1) * self.scale
if self.uses_jitter():
    attn = self.jitter(attn)
elif bias is not None:
    attn = attn + bias
out = attn.softmax(-1) @ v
"""
NEITHER_PATH = """
attn = q @ k.transpose(-2, -1) * self.scale
if self.use_table:
    attn = self.jitter(attn)
else:
    attn = attn.flip(-1)
out = attn.softmax(-1) @ v
"""


@pytest.mark.parametrize("body, says", [
    (CALLED_TEST, "under `if self.uses_jitter()`, the scores are assigned by `attn = self.jitter(attn)`, which is no "
                  "mask"),
    (NEITHER_PATH, "under `if self.use_table`, the scores are assigned by `attn = self.jitter(attn)`, which is no "
                   "mask"),
], ids=["called-test", "neither-path"])
def test_paths_no_test_separates_are_refused_naming_the_path(body, says):
    source = _source(body)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety != "safe" and fixed == source
    assert finding.reason.startswith(says), finding.reason


def test_a_mask_in_the_else_of_its_own_not_none_test_is_not_passed_where_the_test_holds():
    """`if m is not None: pass else: s = s.masked_fill(~m, -inf)` masks only where m is None (and raises there):
    the mask applies on the `else:` path, so SDPA gets it only there, never `attn_mask=m` outright."""
    source = _source("""
attn = q @ k.transpose(-2, -1) * self.scale
if bias is not None:
    pass
else:
    attn = attn.masked_fill(~bias, float("-inf"))
out = attn.softmax(dim=-1) @ v
""")
    finding, fixed = attention_finding_and_fix(source)
    assert "attn_mask=bias" not in finding.patch
    original, patched = _pair(source, fixed, torch.float64, None, OFF)
    x, keep = torch.randn(2, 5, 16, dtype=torch.float64), torch.rand(2, 2, 5, 5) > 0.5
    torch.testing.assert_close(patched(x, bias=keep), original(x, bias=keep), atol=1e-10, rtol=1e-10)

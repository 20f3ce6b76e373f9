"""A helper of the same tree that adds a mask only where it is not None (timm's `maybe_add_mask`) is read as an
optional additive mask term, through decorators known to return the function unchanged. The mask's values come
from the caller, so the patch takes SDPA where the mask is None and runs the original block otherwise
(`fully-masked-rows` guarded by `mask is None`): exact for every input."""

from __future__ import annotations

import textwrap

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

TEMPLATE = '''
from typing import Optional

import torch
from torch import nn

_traced = set()


def untraced(fn):
    """Registers `fn` and hands it back unchanged."""
    _traced.add(fn)
    return fn


{decorators}
def with_bias(logits: torch.Tensor, bias: Optional[torch.Tensor] = None):
{body}


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, bias=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        q = q * self.scale
        scores = q @ k.transpose(-2, -1)
        scores = with_bias(scores, bias)
        weights = scores.softmax(dim=-1)
        return (weights @ v).transpose(1, 2).reshape(b, n, c)
'''
BODIES = {
    "conditional expression": "return logits if bias is None else logits + bias",
    "negated test, mask first": "return (bias + logits) if bias is not None else logits",
    "if/return": "if bias is None:\n    return logits\nreturn logits + bias",
    "if/else": "if bias is not None:\n    return logits + bias\nelse:\n    return logits",
}
KNOWN_DECORATORS = "@torch.fx.wrap\n@untraced"


def _source(body: str = BODIES["conditional expression"], decorators: str = KNOWN_DECORATORS) -> str:
    return TEMPLATE.format(decorators=decorators, body=textwrap.indent(body, " " * 4))


def _finding(source: str):
    (finding,) = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    return finding


def _names(finding, status: str) -> set[str]:
    return {fact["name"] for fact in finding.extra["facts"].get(status, [])}


@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
def test_the_helper_is_an_optional_mask_and_the_patch_is_safe_behind_its_absence(body):
    finding = _finding(_source(body))
    assert finding.fix_safety == "safe" and finding.fixable, finding.reason
    assert "fully-masked-rows" in _names(finding, "guarded") and not _names(finding, "assumed")
    guards = {fact["why"] for fact in finding.extra["facts"]["guarded"]}
    assert all("`bias is None`" in why for why in guards)
    assert "if bias is None:" in finding.patch and "attn_mask" not in finding.patch


@pytest.mark.parametrize("with_mask", [False, True], ids=["no mask: SDPA", "a mask: the original"])
def test_the_guard_takes_sdpa_only_without_a_mask_and_is_exact_both_ways(with_mask):
    source = _source()
    fixed = analyze_source(source, "case.py").fixed
    torch.manual_seed(0)
    original = load_module_from_source(source, "case").Attention().eval()
    patched = load_module_from_source(fixed, "case_fixed").Attention().eval()
    patched.load_state_dict(original.state_dict())
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 16, generator=generator)
    bias = torch.randn(2, 1, 5, 5, generator=generator) if with_mask else None
    if with_mask:
        bias[0, :, 1] = float("-inf")  # a fully masked row: the original's NaNs, kept
    outputs = []
    for model in (original, patched):
        leaf = x.clone().requires_grad_()
        out = model(leaf, bias)
        out.nan_to_num().sum().backward()
        outputs.append((out, leaf.grad))
    torch.testing.assert_close(outputs[1][0], outputs[0][0], atol=1e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(outputs[1][1], outputs[0][1], atol=1e-5, rtol=1e-5, equal_nan=True)
    assert uses_sdpa(dispatched_ops(patched, (x, bias))) is not with_mask


@pytest.mark.parametrize("decorators", ["@torch.no_grad()", "@unknown_decorator", "@torch.fx.wrap\n@wrapping"],
                         ids=["a decorator call", "an unresolved name", "a wrapper of the same file"])
def test_a_decorator_not_known_to_return_the_function_refuses(decorators):
    source = _source(decorators=decorators).replace(
        "_traced = set()", "_traced = set()\n\n\ndef wrapping(fn):\n    return lambda *a: fn(*a)")
    finding = _finding(source)
    assert not finding.fixable and "with_bias(scores, bias)" in finding.reason


@pytest.mark.parametrize("body", [
    "return logits if bias is None else logits * bias",  # not an addition
    "return logits if bias is None else logits + 2 * bias",  # another mask than the argument
    "return logits + 1 if bias is None else logits + bias",  # the scores changed where there is no mask
    "return bias if logits is None else logits + bias",  # the test reads the scores
    "_traced.add(bias)\nreturn logits if bias is None else logits + bias",  # does something else as well
])
def test_a_helper_whose_body_does_something_else_refuses(body):
    finding = _finding(_source(body))
    assert not finding.fixable and "with_bias(scores, bias)" in finding.reason


def test_scores_in_the_place_the_helper_tests_for_none_refuse():
    """`bias if logits is None else logits + bias` is an optional add of `logits`: called with the scores first,
    it raises where `bias` is None, which a patch taking SDPA there would not."""
    finding = _finding(_source("return bias if logits is None else logits + bias"))
    assert not finding.fixable and "tests for None" in finding.reason


# -- the bias built from the scores' metadata between the product and the helper (timm's resolve_self_attn_mask) --
RESOLVED = '''
from typing import Optional

import torch
from torch import nn


def bias_for(n, logits, mask=None, causal=False):
    if causal:
        return logits.new_full((n, n), float("-inf")).triu(1)
    if mask is None:
        return None
    return torch.zeros_like(mask, dtype=logits.dtype).masked_fill(~mask, float("-inf"))


@torch.fx.wrap
def with_bias(logits: torch.Tensor, bias: Optional[torch.Tensor] = None):
    return logits if bias is None else logits + bias


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, mask=None, causal: bool = False):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q * 0.25) @ k.transpose(-2, -1)
        bias = bias_for(n, scores, mask, causal)
        scores = with_bias(scores, bias)
        return (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)
'''


def test_a_bias_built_from_the_scores_metadata_is_built_from_the_query_above_the_guard():
    finding = _finding(RESOLVED)
    assert finding.fix_safety == "safe", finding.reason
    lines = finding.patch.splitlines()
    lifted = next(i for i, line in enumerate(lines) if "+" in line[:1] and "bias = bias_for(n, q" in line)
    assert "if bias is None:" in lines[lifted + 1]


@pytest.mark.parametrize("mask,causal,sdpa", [(None, False, True), (True, False, False), (None, True, False)],
                         ids=["no mask: SDPA", "a padding mask: the original", "causal: the original"])
def test_the_lifted_bias_keeps_values_and_gradients(mask, causal, sdpa):
    fixed = analyze_source(RESOLVED, "case.py").fixed
    torch.manual_seed(0)
    original = load_module_from_source(RESOLVED, "case").Attention().double()
    patched = load_module_from_source(fixed, "case_fixed").Attention().double()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    keep = None
    if mask:
        keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
        keep[0, ..., 3:] = False
    results = []
    for model in (original, patched):
        leaf = x.clone().requires_grad_()
        out = model(leaf, keep, causal)
        out.sum().backward()
        results.append((out, leaf.grad))
    torch.testing.assert_close(results[1], results[0])
    assert uses_sdpa(dispatched_ops(patched, (x, keep, causal))) is sdpa


def test_a_helper_that_reads_the_scores_values_keeps_the_block_refused():
    source = RESOLVED.replace('logits.new_full((n, n), float("-inf")).triu(1)', "logits.detach().amax() * 0")
    finding = _finding(source)
    assert not finding.fixable and "also used" in finding.reason


def test_the_helper_and_its_decorator_are_found_across_the_package(tmp_path):
    """`from pkg import with_bias` in one file, the helper re-exported by the package's `__init__` from another,
    decorated by a function of a third."""
    from advisor.engine.static import scan_paths

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .helpers import with_bias\n")
    (package / "_registry.py").write_text("_seen = []\n\n\ndef untraced(fn):\n    _seen.append(fn)\n    return fn\n")
    (package / "helpers.py").write_text(
        "from ._registry import untraced\n\n\n@untraced\ndef with_bias(logits, bias=None):\n"
        "    return logits if bias is None else logits + bias\n")
    model = _source().replace("from torch import nn", "from torch import nn\n\nfrom pkg import with_bias")
    model = model[:model.index("_traced = set()")] + model[model.index("class Attention"):]
    (package / "model.py").write_text(model)
    (finding,) = [f for f in scan_paths([str(package)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and "fully-masked-rows" in _names(finding, "guarded"), finding.reason

"""Attention split across methods of its class: the scores from `self._scores(q, k)`, the value product from
`self._mix(w, v)` (`@`, matmul or einsum), the weights returned only under `if output_attentions:`. The facts a
whole block would prove or guard hold across the helpers too: their parameters are the call's arguments, and
their `self` is the caller's, so a guard reads `self.p` or `self.hd` where the block starts. Each patch is run
against the original: outputs and gradients in fp32 and fp64, dropout under one seed in training, the flag on and
off, and a dropout probability out of range (the original raises, so must the patch)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from attention_sources import attention_finding_and_fix, fact_names
from dtype_parity import FP32, FP64, compare_run, load_pair
from fixture_models import dispatched_ops, uses_sdpa

SPLIT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, d=16, h=2, p=0.1):
        super().__init__()
        self.h, self.hd = h, d // h
        self.qkv = nn.Linear(d, 3 * d)
        self.p = p

    def forward(self, x, output_attentions=False):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
{body}

    def _scores(self, q, k):
        return {scores}

    def _mix(self, att, v):
        return {mix}


def build(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return Attn(p=dropout), (torch.randn(2, 5, 16),)
'''
MATMUL = ("(q @ k.transpose(-2, -1)) * self.hd ** -0.5", "att @ v")
EINSUM = ("torch.einsum('bhqd,bhkd->bhqk', q, k) * self.hd ** -0.5", "torch.einsum('bhqk,bhkd->bhqd', att, v)")
TORCH_MATMUL = ("torch.matmul(q, k.mT) * self.hd ** -0.5", "torch.matmul(att, v)")
DROPOUT = """
att = self._scores(q, k).softmax(dim=-1)
att = F.dropout(att, p=self.p, training=self.training)
return self._mix(att, v)
"""
ON_REQUEST = """
att = self._scores(q, k).softmax(dim=-1)
y = self._mix(att, v)
if output_attentions:
    return y, att
return y, None
"""


def _source(body: str, products: tuple[str, str]) -> str:
    return SPLIT.format(body=textwrap.indent(body.strip("\n"), " " * 8), scores=products[0], mix=products[1])


@pytest.mark.parametrize("products", [MATMUL, EINSUM, TORCH_MATMUL], ids=["at", "einsum", "matmul"])
def test_helper_products_with_dropout_get_a_safe_patch_with_parity(products) -> None:
    source = _source(DROPOUT, products)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe", finding.reasons
    assert {"dropout-range", "scale-is-number"} <= fact_names(finding, "guarded")
    assert "self._scores(q, k)" in fixed  # kept in the fallback the guard runs
    original, rewritten = load_pair(source, fixed, "helper_methods")
    for dtype, atol, rtol in (FP32, FP64):
        for seed in (0, 1):
            compare_run(original, rewritten, seed=seed, dtype=dtype, atol=atol, rtol=rtol)
            compare_run(original, rewritten, seed=seed, dtype=dtype, atol=atol, rtol=rtol, dropout=0.0, train=True)
    model, inputs = rewritten.build(0, 0.1)
    assert uses_sdpa(dispatched_ops(model, inputs))


def test_the_guard_runs_the_original_where_the_probability_is_out_of_range() -> None:
    """`self.p = 1.5`: F.dropout raises even in eval mode, and so does the patch, through its fallback."""
    source = _source(DROPOUT, EINSUM)
    _, fixed = attention_finding_and_fix(source)
    original, rewritten = load_pair(source, fixed, "helper_methods_range")
    for side in (original, rewritten):
        model, inputs = side.build(0, 1.5)
        with pytest.raises(ValueError, match="dropout probability"):
            model.eval()(*inputs)


@pytest.mark.parametrize("products", [MATMUL, EINSUM], ids=["matmul", "einsum"])
def test_weights_returned_on_request_from_helper_methods(products) -> None:
    source = _source(ON_REQUEST, products)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe", finding.reasons
    assert "flag-is-bool" in fact_names(finding, "guarded")
    original, rewritten = load_pair(source, fixed, "helper_methods_flag")
    for flag in (False, True):
        for dtype, atol, rtol in (FP32, FP64):
            compare_run(original, rewritten, dtype=dtype, atol=atol, rtol=rtol,
                        inputs_hook=lambda inputs, flag=flag: (*inputs, flag))
    model, inputs = rewritten.build(0, 0.0)
    assert uses_sdpa(dispatched_ops(model, (*inputs, False)))
    assert not uses_sdpa(dispatched_ops(model, (*inputs, True)))


def test_a_helper_reading_the_weights_twice_is_not_a_value_product() -> None:
    """`_mix` that also adds the weights back (`w @ v + w.sum(-1, keepdim=True)`) is no one-op helper: refused."""
    source = _source(DROPOUT, (MATMUL[0], "att @ v + att.sum(-1, keepdim=True)"))
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety != "safe" and fixed == source


HOSTILE_BASE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
{top}

class Attn(nn.Module{bases}):
    def __init__(self):
        super().__init__()
        self.hd = 64
{init}
    def _scores(self, q, k{extra}):
        return (q @ k.transpose(-2, -1)) * {scale}

    def _mix(self, att, v):
        return att @ v
{methods}
    def forward(self, q, k, v):
{before}        att = F.softmax(self._scores(q, k), dim=-1)
{between}        y = self._mix(att, {value})
        return y
{after}'''
# breaker round 19: each of these had a safe patch that computed another value (or raised where the original ran)
HOSTILE = {
    "instance_method_in_init": dict(init="        self._scores = lambda q, k: (q @ k.transpose(-2, -1)) * 0.5\n"),
    "instance_dict_entry": dict(init="        self.__dict__['_mix'] = lambda a, v: a @ v * 2\n"),
    "init_replaced": dict(after="_orig = Attn.__init__\n\n\ndef _init(self):\n    _orig(self)\n"
                                "    object.__setattr__(self, '_scores', lambda q, k: q @ k.transpose(-2, -1))\n\n\n"
                                "Attn.__init__ = _init\n"),
    "metaclass": dict(top="\n\nclass Meta(type):\n    def __new__(mcls, name, bases, ns):\n"
                          "        ns['_mix'] = lambda self, a, v: a @ v * 2\n"
                          "        return super().__new__(mcls, name, bases, ns)\n", bases=", metaclass=Meta"),
    "lookup_hook": dict(top="\n\nclass Traced:\n    def __getattribute__(self, name):\n"
                            "        return object.__getattribute__(self, name)\n", bases=", Traced"),
    "forward_borrowed": dict(after="\n\nclass Sharp(nn.Module):\n    hd = 4\n\n    def _scores(self, q, k):\n"
                                   "        return q @ k.transpose(-2, -1)\n\n    forward = Attn.forward\n"),
    "default_computed_at_def": dict(top="HD = 64\n", extra=", d: int = HD", scale="d ** -0.5",
                                    after="\n\nHD = 4\n"),
    "global_shadowed_by_a_local": dict(top="HD = 64\n", scale="HD ** -0.5", before="        HD = q.size(-1)\n"),
    "property_read_twice": dict(scale="self.width ** -0.5",
                                methods="\n    @property\n    def width(self):\n        self.hd += 1\n"
                                        "        return self.hd\n"),
    "written_through_an_alias": dict(scale="self.hd ** -0.5", between="        self.tweak()\n",
                                     methods="\n    def tweak(self):\n        s = self\n        s.hd = 4\n"),
    "written_through_the_namespace": dict(scale="self.hd ** -0.5", between="        self.tweak()\n",
                                          methods="\n    def tweak(self):\n        self.__dict__['hd'] = 4\n"),
    "written_in_the_value_product_s_statement": dict(scale="self.hd ** -0.5", value="self.widen(v)",
                                                     methods="\n    def widen(self, t):\n        self.hd = 4\n"
                                                             "        return t\n"),
    "mode_switched_in_the_value_product_s_statement": dict(
        init="        self.drop = nn.Dropout(0.5)\n", between="        att = self.drop(att)\n",
        value="self.maybe_freeze(v)",
        methods="\n    def maybe_freeze(self, t):\n        self.eval()\n        return t\n"),
}


def _hostile(name: str) -> str:
    parts = dict(top="", bases="", init="", extra="", scale="0.125", methods="", before="", between="", value="v",
                 after="")
    parts.update(HOSTILE[name])
    return HOSTILE_BASE.format(**parts)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_helpers_whose_meaning_may_change_at_run_time_get_no_safe_patch(name):
    from advisor.engine.static import analyze_source

    result = analyze_source(_hostile(name), "case.py")
    assert not [f for f in result.findings if f.kind == "attention" and f.fixable and f.fix_safety == "safe"], \
        [(f.rule, f.fix_safety, f.reasons) for f in result.findings]


def test_the_hostile_base_is_rewritten_where_nothing_changes_its_helpers():
    """The harness is not vacuous: the same class with none of the above gets a safe patch."""
    finding, fixed = attention_finding_and_fix(_hostile("property_read_twice").replace("self.width", "self.hd"))
    assert finding.fix_safety == "safe" and fixed.count("scaled_dot_product_attention") == 1


def test_a_subclass_declared_on_a_name_bound_by_unpacking_or_getattr_counts(tmp_path):
    """Breaker round 19: `A, B = m.Attn, None` or `A = getattr(m, "Attn")`, then `class S(A)` redefining `_scores` in
    another file: S runs Attn's forward with its own scores."""
    from advisor.engine.static import scan_paths

    (tmp_path / "m.py").write_text(_hostile("property_read_twice").replace("self.width", "self.hd"))
    for alias in ('A, B = m.Attn, None', 'A = getattr(m, "Attn")', "B = m.Attn\nA = B", "A: type = m.Attn",
                  "for A in [m.Attn]:\n    pass", "A = m.Attn if m else None", "from m import Attn as A"):
        (tmp_path / "sub.py").write_text(f"import m\n{alias}\n\n\nclass S(A):\n    def _scores(self, q, k):\n"
                                         "        return q @ k.transpose(-2, -1)\n")
        [finding] = scan_paths([str(tmp_path)], cache=False).findings
        assert not (finding.fixable and finding.fix_safety == "safe"), alias


MASK_IN_HELPER = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def _scores(self, q, k, mask):
        return ((q @ k.transpose(-2, -1)) * 0.125).masked_fill(~mask, float("-inf"))

    def _mix(self, att, v):
        return att @ v

    def forward(self, q, k, v):
        T, S = q.size(-2), k.size(-2)
        mask = torch.ones(T, S, dtype=torch.bool).triu()  # another tensor by the helper's parameter's name
        keep = torch.ones(T, S, dtype=torch.bool).tril()
        att = F.softmax(self._scores(q, k, keep), dim=-1)
        return self._mix(att, v), mask
'''


def test_a_mask_a_helper_applies_is_the_one_its_call_passes():
    """Breaker round 19: the SDPA call got `attn_mask=mask`, the helper's parameter's name, which the caller binds to
    another tensor; it now gets the argument (`keep`), and its dtype and rank are guarded where the block starts."""
    from fixture_models import load_module_from_source

    finding, fixed = attention_finding_and_fix(MASK_IN_HELPER)
    assert finding.fix_safety == "safe" and {"mask-dtype", "mask-rank"} <= fact_names(finding, "guarded")
    assert "attn_mask=keep" in fixed
    original, patched = (load_module_from_source(text, "mask_in_helper").Attn() for text in (MASK_IN_HELPER, fixed))
    q, k, v = (torch.randn(2, 2, 5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    for got, want in zip(patched(q, k, v), original(q, k, v)):
        torch.testing.assert_close(got, want)


def test_a_subclass_of_a_name_a_package_re_exports_counts(tmp_path):
    """Breaker round 19: `from .m import Attn as Core` in the package's `__init__`, `class S(Core)` redefining
    `_scores` in another module."""
    from advisor.engine.static import scan_paths

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .m import (\n    Attn as Core,\n)\n")
    (package / "m.py").write_text(_hostile("property_read_twice").replace("self.width", "self.hd"))
    (package / "sub.py").write_text("from pkg import Core\n\n\nclass S(Core):\n    def _scores(self, q, k):\n"
                                    "        return q @ k.transpose(-2, -1)\n")
    [finding] = scan_paths([str(tmp_path)], cache=False).findings
    assert not (finding.fixable and finding.fix_safety == "safe")
    (package / "sub.py").write_text("from pkg import Core\n\n\nclass S(Core):\n    pass\n")
    [finding] = scan_paths([str(tmp_path)], cache=False).findings
    assert finding.fixable and finding.fix_safety == "safe"


@pytest.mark.parametrize("call", ["self._scores(q, k.contiguous())",  # run once by the original, at the call
                                  "self._scores(q, k, scale=0.5)",  # TypeError in the original
                                  "self._scores(q, q=k)"])
def test_a_helper_call_whose_arguments_run_code_or_do_not_bind_gets_no_safe_patch(call):
    """Breaker round 19: an argument that calls code moved into the SDPA call ran in another order than the
    original's (or twice, for a parameter read twice); a call the helper's signature rejects raised before the
    patch and ran after it."""
    from advisor.engine.static import analyze_source

    source = _hostile("property_read_twice").replace("self.width", "self.hd").replace("self._scores(q, k)", call)
    assert not [f for f in analyze_source(source, "case.py").findings
                if f.kind == "attention" and f.fixable and f.fix_safety == "safe"]


def test_a_helper_deleted_from_the_class_elsewhere_gets_no_safe_patch(tmp_path):
    """Breaker round 19: `del Attn._mix` in a module function: the original raises AttributeError, the patch ran."""
    from advisor.engine.static import scan_paths

    (tmp_path / "m.py").write_text(_hostile("property_read_twice").replace("self.width", "self.hd") +
                                   "\n\ndef strip():\n    del Attn._mix\n")
    [finding] = scan_paths([str(tmp_path)], cache=False).findings
    assert not (finding.fixable and finding.fix_safety == "safe")

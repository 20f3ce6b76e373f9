"""The accepted facts a safe patch names for inputs where SDPA does not do what the original does (breaker round 12):
`query-rank` (a 1-D query the source does not show: matmul takes it, SDPA raises), `mask-sizes` (a mask whose sizes
grow the scores: the original broadcasts up, SDPA raises) and `replaced-scores` (a NaN key at a masked position:
masked_fill discards its score, SDPA adds -inf to it). Each is measured here as stated, on the patch the scan
offers, and is absent where the source rules it out."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from fixture_models import load_module_from_source

HELPER = '''import math
import torch


def attend(q, k, v, keep):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    {apply}
    return torch.matmul(torch.softmax(scores, dim=-1), v)
'''
MASKED_FILL = "scores = scores.masked_fill(keep == 0, float('-inf'))"
ADDED = "scores = scores + keep"  # an additive mask: the original adds it too, so a NaN key is NaN in both
NO_MASK = "del keep"

VISIBLE_QUERY = '''import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x, keep):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)).masked_fill(keep == 0, float('-inf')) * 0.5
        return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, n, 8)
'''


def _scan(source: str, name: str):
    result = analyze_source(source, f"{name}.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.reason
    return {fact["name"] for fact in finding.extra["facts"]["accepted"]}, \
        load_module_from_source(source, name), load_module_from_source(result.fixed, f"{name}_fixed")


def _qkv(*shapes):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, dtype=torch.float64, generator=generator) for shape in shapes]


def test_a_query_of_no_visible_rank_is_accepted_as_2_d_and_a_1_d_one_raises_in_the_patch_only():
    accepted, original, patched = _scan(HELPER.format(apply=NO_MASK), "query_rank")
    assert "query-rank" in accepted
    q, k, v = _qkv((4,), (5, 4), (5, 4))  # one vector attending over five keys
    assert original.attend(q, k, v, None).shape == (4,)  # matmul takes the 1-D query
    with pytest.raises(RuntimeError):
        patched.attend(q, k, v, None)
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), (2, 5, 4))  # any query of 2 dims or more: equal
    torch.testing.assert_close(patched.attend(q, k, v, None), original.attend(q, k, v, None))


def test_a_mask_that_grows_the_scores_is_accepted_and_makes_the_patch_raise_where_the_original_grows():
    accepted, original, patched = _scan(HELPER.format(apply=MASKED_FILL), "mask_sizes")
    assert "mask-sizes" in accepted
    q, k, v = _qkv((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    keep = torch.ones(3, 1, 1, 5, dtype=torch.bool)  # three samples' masks for one sample's queries
    assert original.attend(q, k, v, keep).shape == (3, 2, 5, 4)
    with pytest.raises(RuntimeError):
        patched.attend(q, k, v, keep)
    keep = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    torch.testing.assert_close(patched.attend(q, k, v, keep), original.attend(q, k, v, keep))


def test_a_nan_key_at_a_masked_position_is_nan_in_the_patch_only_where_the_mask_replaces_scores():
    accepted, original, patched = _scan(HELPER.format(apply=MASKED_FILL), "replaced")
    assert "replaced-scores" in accepted
    q, k, v = _qkv((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    k[..., 4, :] = float("nan")  # the padded key
    keep = torch.tensor([[[[1, 1, 1, 1, 0]]]], dtype=torch.bool)
    assert not original.attend(q, k, v, keep).isnan().any()
    assert patched.attend(q, k, v, keep).isnan().all()
    k[..., 4, :] = 0.0
    torch.testing.assert_close(patched.attend(q, k, v, keep), original.attend(q, k, v, keep))


def test_an_added_mask_keeps_a_nan_in_both_and_names_no_replaced_scores():
    result = analyze_source(HELPER.format(apply=ADDED), "added.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    names = {fact["name"] for group in finding.extra["facts"].values() for fact in group}
    assert "mask-sizes" in names and "replaced-scores" not in names


def test_a_float_mask_refilled_in_place_before_backward_raises_in_the_patch_only():
    """Breaker round 15's U01: micro-batches sharing one additive mask buffer, refilled in place between their
    forwards, then one backward. SDPA's fused CPU kernel saved the mask; `scores + mask` did not. Named as the
    accepted `mask-writes`, and measured here on the patch the scan offers (unsafe: the mask's values are unseen)."""
    source = HELPER.format(apply=ADDED)
    result = analyze_source(source, "mask_writes.py", unsafe_fixes=True)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert "mask-writes" in {fact["name"] for fact in finding.extra["facts"]["accepted"]}
    outcomes = []
    for text, name in ((source, "mask_writes"), (result.fixed, "mask_writes_fixed")):
        attend = load_module_from_source(text, name).attend
        q, k, v = (t.float().requires_grad_(True) for t in _qkv((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4)))
        mask = torch.zeros(2, 1, 1, 5)
        loss = 0.0
        for padded in (4, 3):  # one buffer for both micro-batches
            mask.zero_()
            mask[..., padded:] = -1e4
            loss = loss + attend(q, k, v, mask).square().sum()
        try:
            loss.backward()
            outcomes.append(q.grad)
        except RuntimeError as error:
            outcomes.append(str(error))
    assert isinstance(outcomes[0], torch.Tensor) and "modified by an inplace operation" in outcomes[1]


def test_a_query_the_source_shapes_names_no_query_rank():
    accepted, original, patched = _scan(VISIBLE_QUERY, "visible_query")
    assert "query-rank" not in accepted and "mask-sizes" in accepted
    torch.manual_seed(0)
    model, twin = original.Attention().double(), patched.Attention().double()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    torch.testing.assert_close(twin(x, keep), model(x, keep))


TEMPERATURE = '''import torch


def attend(q, k, v, temperature):
    scores = torch.matmul(q, k.transpose(-2, -1)) * temperature
    return torch.matmul(torch.softmax(scores, dim=-1), v)
'''


def test_a_tensor_scale_folded_into_q_names_the_float16_range_it_may_leave():
    """`q * s` in float16 overflows where `(q·kᵀ)·s` does not (a thirteenth breaker's): the accepted `fold-range`,
    measured; in float32 the same inputs agree."""
    accepted, original, patched = _scan(TEMPERATURE, "fold_range")
    assert "fold-range" in accepted
    generator = torch.Generator().manual_seed(0)
    q = 300 + torch.rand(1, 2, 4, 8, generator=generator)
    k = 0.01 * torch.rand(1, 2, 4, 8, generator=generator)
    v = torch.randn(1, 2, 4, 8, generator=generator)
    temperature = torch.full((1, 2, 1, 1), 300.0)
    half = [t.half() for t in (q, k, v, temperature)]
    assert original.attend(*half).isfinite().all()
    assert not patched.attend(*half).isfinite().all()
    torch.testing.assert_close(patched.attend(q, k, v, temperature), original.attend(q, k, v, temperature))


# `replaced-scores` is not accepted where the source shows a NaN key (breaker round 13, bug 21): cosine keys divided
# by their norm are 0/0 on the zero vectors of padding, exactly where the padding mask masks.
COSINE = '''import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def attend(q, k, v, keep):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(keep == 0, -1e9)
    return torch.matmul(scores.softmax(dim=-1), v)


class Cosine(nn.Module):
    def forward(self, q, x, keep):
        {keys}
        return attend(q, k, x, keep)
'''
DIVIDED_KEYS = {
    "norm": "k = x / x.norm(dim=-1, keepdim=True)",
    "rsqrt": "k = x * x.pow(2).sum(-1, keepdim=True).rsqrt()",
    "div_method": "n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)\n        k = x.div(n)",
}
BOUNDED_KEYS = {
    "eps": "k = x / (x.norm(dim=-1, keepdim=True) + 1e-6)",
    "clamp": "k = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-6)",
    "normalize": "k = F.normalize(x, dim=-1)",
    "number": "k = x / math.sqrt(x.size(-1))",
}


def _cosine_findings(tmp_path, keys: str):
    (tmp_path / "cosine.py").write_text(COSINE.format(keys=keys), encoding="utf-8")
    (finding,) = [f for f in scan_paths([str(tmp_path)], jobs=1, cache=False).findings if f.kind == "attention"]
    return finding


@pytest.mark.parametrize("kind", sorted(DIVIDED_KEYS))
def test_keys_a_caller_divides_by_what_may_be_zero_leave_replaced_scores_assumed(tmp_path, kind: str):
    finding = _cosine_findings(tmp_path, DIVIDED_KEYS[kind])
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"]["assumed"]}
    assert finding.fix_safety == "unsafe" and "cosine.py:" in assumed["replaced-scores"]


@pytest.mark.parametrize("kind", sorted(BOUNDED_KEYS))
def test_keys_divided_by_what_is_kept_from_zero_keep_replaced_scores_accepted(tmp_path, kind: str):
    finding = _cosine_findings(tmp_path, BOUNDED_KEYS[kind])
    assert finding.fix_safety == "safe"
    assert "replaced-scores" in {fact["name"] for fact in finding.extra["facts"]["accepted"]}


def test_the_cosine_key_s_padding_is_what_makes_the_patch_nan(tmp_path):
    """Measured: the original is finite on padded zero vectors, the unsafe patch NaN; keys in the block's own
    function are read too."""
    source = COSINE.replace("    scores = torch.matmul(q, k", "    k = k / k.norm(dim=-1, keepdim=True)\n"
                                                             "    scores = torch.matmul(q, k")
    result = analyze_source(source.format(keys="k = x"), "own.py", unsafe_fixes=True)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "unsafe"
    original = load_module_from_source(source.format(keys="k = x"), "cosine_original")
    patched = load_module_from_source(result.fixed, "cosine_patched")
    q, x = _qkv((2, 2, 5, 4), (2, 2, 5, 4))
    keep = torch.tensor([1, 1, 1, 1, 0], dtype=torch.bool).view(1, 1, 1, 5)
    x[..., 4, :] = 0.0  # the padded token: a zero vector
    assert not original.Cosine()(q, x, keep).isnan().any()
    assert patched.Cosine()(q, x, keep).isnan().all()


# Keys normalised by a helper (stop 37's noticed item): the helper's return is read as the key's definition, in the
# file or in another file of its package.
HELPER_MODEL = '''import torch
import torch.nn as nn
from . import utils
from .utils import l2norm


class Norm(nn.Module):
    def forward(self, t):
        return utils.divided(t)


class Attend(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = Norm()

    def _normed(self, t):
        return utils.divided(t)

    def forward(self, q, x, v, keep):
        {keys}
        scores = q @ k.transpose(-2, -1)
        scores = scores.masked_fill(~keep, float("-inf"))
        return scores.softmax(dim=-1) @ v
'''
HELPER_KEYS = {
    "imported_function": "k = l2norm(x)",
    "module_function": "k = utils.l2norm(x)",
    "method": "k = self._normed(x)",
    "module_of_the_class": "k = self.norm(x)",
    "lambda": "normed = lambda t: t / t.norm(dim=-1, keepdim=True)\n        k = normed(x)",
}


def _helper_finding(tmp_path, keys: str, divided: str, cache: bool = False):
    package = tmp_path / "pkg"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    utils = f"def l2norm(t):\n    return divided(t)\n\n\ndef divided(t):\n    return {divided}\n"
    (package / "utils.py").write_text(utils, encoding="utf-8")
    (package / "model.py").write_text(HELPER_MODEL.format(keys=keys), encoding="utf-8")
    (finding,) = [f for f in scan_paths([str(package / "model.py")], jobs=1, cache=cache).findings
                  if f.kind == "attention"]
    return finding


@pytest.mark.parametrize("kind", sorted(HELPER_KEYS))
def test_keys_a_helper_divides_by_what_may_be_zero_leave_replaced_scores_assumed(tmp_path, kind: str):
    finding = _helper_finding(tmp_path, HELPER_KEYS[kind], "t / t.norm(dim=-1, keepdim=True)")
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"]["assumed"]}
    assert finding.fix_safety == "unsafe" and "(in this function)" in assumed["replaced-scores"]


@pytest.mark.parametrize("kind", sorted(set(HELPER_KEYS) - {"lambda"}))
def test_keys_a_helper_keeps_from_zero_keep_replaced_scores_accepted(tmp_path, kind: str):
    finding = _helper_finding(tmp_path, HELPER_KEYS[kind], "t / t.norm(dim=-1, keepdim=True).clamp(min=1e-6)")
    assert finding.fix_safety == "safe"
    assert "replaced-scores" in {fact["name"] for fact in finding.extra["facts"]["accepted"]}


def test_an_edit_of_the_helper_s_file_reaches_a_cached_scan(tmp_path, monkeypatch):
    """The helper's file is read during the analysis, so the cached result of the model's file goes stale with it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bounded = _helper_finding(tmp_path, HELPER_KEYS["imported_function"], "t / (t.norm(dim=-1, keepdim=True) + 1e-6)",
                              cache=True)
    divided = _helper_finding(tmp_path, HELPER_KEYS["imported_function"], "t / t.norm(dim=-1, keepdim=True)",
                              cache=True)
    assert (bounded.fix_safety, divided.fix_safety) == ("safe", "unsafe")


def test_a_helper_s_divided_key_is_what_makes_the_patch_nan(tmp_path):
    """Measured: with padding keys of zeros, the original is finite and the unsafe patch NaN."""
    import importlib
    import sys

    finding = _helper_finding(tmp_path, HELPER_KEYS["method"], "t / t.norm(dim=-1, keepdim=True)")
    assert finding.fix_safety == "unsafe"
    original = (tmp_path / "pkg" / "model.py").read_text(encoding="utf-8")
    patched = analyze_source(original, str(tmp_path / "pkg" / "model.py"), unsafe_fixes=True).fixed
    assert patched != original
    root = str(tmp_path)
    sys.path.insert(0, root)
    try:
        outputs = []
        for text in (original, patched):
            (tmp_path / "pkg" / "model.py").write_text(text, encoding="utf-8")
            for name in ("pkg", "pkg.utils", "pkg.model"):
                sys.modules.pop(name, None)
            module = importlib.import_module("pkg.model")
            q, x = _qkv((2, 2, 5, 4), (2, 2, 5, 4))
            x[..., 4, :] = 0.0
            keep = torch.tensor([1, 1, 1, 1, 0], dtype=torch.bool).view(1, 1, 1, 5)
            outputs.append(module.Attend()(q, x, x.clone(), keep))
    finally:
        sys.path.remove(root)
        for name in ("pkg", "pkg.utils", "pkg.model"):
            sys.modules.pop(name, None)
    assert not outputs[0].isnan().any() and outputs[1].isnan().all()


CACHED_BIAS = '''import functools
import math
import torch


@functools.lru_cache
def causal_bias(n):
    return torch.triu(torch.full((n, n), float("-inf")), 1)


def attend(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + causal_bias(q.size(-2))
    return torch.softmax(scores, dim=-1) @ v
'''


def test_a_float_mask_cached_as_an_inference_tensor_raises_in_the_patch_s_backward_only():
    """Breaker round 16: a validation pass under `torch.inference_mode()` filled an `lru_cache` helper with an
    inference tensor; SDPA saves its mask for the backward (and may not save an inference tensor), the original's
    `scores + bias` saves nothing of it. Named by the accepted `mask-writes`."""
    result = analyze_source(CACHED_BIAS, "cached_bias.py", unsafe_fixes=True)  # q's dtype is the caller's here
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert "mask-writes" in {f["name"] for f in finding.extra["facts"]["accepted"]}
    outcomes = []
    for text, name in ((CACHED_BIAS, "cached_bias"), (result.fixed, "cached_bias_fixed")):
        attend = load_module_from_source(text, name).attend
        q = torch.randn(1, 2, 5, 4)
        with torch.inference_mode():
            attend(q, q, q)  # the validation pass fills the cache
        q.requires_grad_(True)
        try:
            attend(q, q, q).sum().backward()
            outcomes.append(q.grad)
        except RuntimeError as error:
            outcomes.append(str(error))
    assert isinstance(outcomes[0], torch.Tensor) and "Inference tensors cannot be saved" in outcomes[1]

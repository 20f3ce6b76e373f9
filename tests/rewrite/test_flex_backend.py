"""`--backend flex`: the five forms SDPA cannot take or can take only as a dense mask, written the way public
projects write them (`fixtures/attention/flex/`), become FlexAttention patches whose outputs and gradients match
the original's in fp32 (1e-5), run by torch's own flex_attention uncompiled and by the helper's eager path
(`ADVISOR_FLEX_EAGER=1`); no compile in tests.

torch 2.13's flex_attention raises on CPU when q, k or v requires grad (the helper then runs its dense path); the
gradient checks through flex_attention itself lift that device check, which runs its own eager backward.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module

from advisor.engine.static import analyze_source
from fixture_models import FIXTURE_ROOT, build, fixture_inputs, golden_path, load_module_from_source

FLEX = fixture_inputs(FIXTURE_ROOT / "flex")


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    monkeypatch.setenv("ADVISOR_FLEX_EAGER", "1")


def _flex_rewrite(path: Path):
    source = path.read_text(encoding="utf-8")
    return source, analyze_source(source, str(path), unsafe_fixes=True, backend="flex")


def _run(module, seed: int, grad: bool):
    """Output, then the gradients of every parameter and floating input for one fixed cotangent."""
    model, inputs = build(module, seed)
    model.eval()
    inputs = tuple(x.clone().requires_grad_(grad and x.is_floating_point()) for x in inputs)
    if not grad:
        with torch.no_grad():
            return model(*inputs), []
    out = model(*inputs)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)))
    return out.detach(), [p.grad for p in model.parameters()] + [x.grad for x in inputs if x.is_floating_point()]


def torch_flex_eagerly(q, k, v, score_mod=None, mask_mod=None, mask_key=None, scale=None, enable_gqa=False):
    """The emitted call run by torch's own flex_attention, uncompiled (the helper's eager path is its own dense
    code): what the score_mod/mask_mod give inside FlexAttention itself."""
    block_mask = None if mask_mod is None else flex_module.create_block_mask(
        mask_mod, q.size(0), q.size(1), q.size(-2), k.size(-2), device=q.device)
    return flex_module.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                      enable_gqa=enable_gqa)


def _compare(original_source: str, fixed: str, name: str, grad: bool) -> None:
    """The original against the patch run by torch's eager flex_attention and by the helper's eager path."""
    original = load_module_from_source(original_source, f"{name}_original")
    patched = load_module_from_source(fixed, f"{name}_flex")
    helper = load_module_from_source(fixed, f"{name}_helper")
    patched.advisor_flex_attention = torch_flex_eagerly
    for seed, module in ((0, patched), (1, patched), (0, helper)):
        _compare_seed(original, module, seed, grad)


def _compare_seed(original, patched, seed: int, grad: bool) -> None:
    expected, expected_grads = _run(original, seed, grad)
    got, grads = _run(patched, seed, grad)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()
    for want, have in zip(expected_grads, grads, strict=True):
        assert torch.allclose(have, want, atol=1e-5, rtol=1e-5), (have - want).abs().max()


@pytest.mark.parametrize("path", FLEX, ids=[p.stem for p in FLEX])
def test_flex_patch_matches_the_original_and_its_golden(path):
    source, result = _flex_rewrite(path)
    (finding,) = result.findings
    assert finding.extra["emission"]["emitted"] == "flex", finding.reason
    assert "advisor_flex_attention(" in result.fixed
    assert result.fixed == golden_path(path).read_text(encoding="utf-8")
    _compare(source, result.fixed, path.stem, grad=False)
    assert analyze_source(result.fixed, str(path), unsafe_fixes=True, backend="flex", select=["ADV1"]).fixed == result.fixed


@pytest.mark.parametrize("path", FLEX, ids=[p.stem for p in FLEX])
def test_flex_patch_gradients_match(path, monkeypatch):
    """Gradients of every parameter (the T5 relative-position table included) and input, through flex_attention's
    eager backward with torch 2.13's CPU device check lifted."""
    monkeypatch.setattr(flex_module, "_validate_device", lambda *tensors: None)
    source, result = _flex_rewrite(path)
    _compare(source, result.fixed, path.stem + "_grad", grad=True)


def test_training_on_cpu_runs_the_helpers_dense_path_with_the_tables_gradient(monkeypatch):
    """`flex-backward` is proved by the helper: on CPU with inputs that require grad (no FlexAttention backward in
    torch 2.13) it runs its dense path, no compile, and the relative-position table gets the original's gradient."""
    monkeypatch.delenv("ADVISOR_FLEX_EAGER")
    path = next(p for p in FLEX if "t5" in p.stem)
    source, result = _flex_rewrite(path)
    (finding,) = result.findings
    assert "flex-backward" in {fact["name"] for fact in finding.extra["facts"]["proved"]}
    grads = []
    for name, text in (("original", source), ("flex", result.fixed)):
        model, inputs = build(load_module_from_source(text, f"t5_table_{name}"), 0)
        model(*inputs).sum().backward()
        grads.append(model.relative_attention_bias.weight.grad)
    assert grads[1].abs().sum() > 0 and torch.allclose(grads[1], grads[0], atol=1e-5)


def test_soft_capping_is_refused_for_sdpa_with_the_flex_hint():
    path = next(p for p in FLEX if "softcap" in p.stem)
    (finding,) = analyze_source(path.read_text(encoding="utf-8"), str(path), unsafe_fixes=True).findings
    assert finding.rule == "ADV103" and not finding.fixable
    assert "soft-capped by `torch.tanh(attn_weights)`" in finding.reason and "--backend flex" in finding.reason


@pytest.mark.parametrize("path", [p for p in FLEX if "softcap" not in p.stem], ids=lambda p: p.stem)
def test_forms_sdpa_can_take_keep_their_sdpa_patch_without_flex(path):
    result = analyze_source(path.read_text(encoding="utf-8"), str(path), unsafe_fixes=True)
    (finding,) = result.findings
    assert finding.fixable and "scaled_dot_product_attention(" in result.fixed
    assert "advisor_flex_attention" not in result.fixed
    assert finding.extra["backends"]["flex"]["eligible"] is True


def test_masks_of_positions_are_computed_per_index_and_cached_others_are_captured():
    by_stem = {path.stem: _flex_rewrite(path)[1] for path in FLEX}
    window = by_stem["02_mistral_sliding_window"].fixed
    assert 'mask_key=("SlidingWindowAttention.forward:29", self.sliding_window)' in window
    # the dense mask is built only where the original block runs (positions that do not span the scores)
    guard = "if seqlen == xq.size(-2) and seqlen == xk.size(-2):"
    assert "_flex_tensor" not in window and "positions" not in window.split(guard)[1].split("else:")[0]
    assert "((q_idx - kv_idx) >= 0) & ((q_idx - kv_idx) < self.sliding_window)" in window
    documents = by_stem["05_packed_document_mask"].fixed
    assert "mask_key=" not in documents.split("def make", 1)[0].split("class ", 1)[1] and "_flex_tensor[b, h, q_idx, kv_idx]" in documents


PADDED = """
import torch
from torch import nn


class Padded(nn.Module):
    def forward(self, q, k, v, keep):
        scores = q @ k.transpose(-2, -1) / 4.0
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        return torch.softmax(scores, dim=-1) @ v
"""


def test_a_fully_masked_row_is_zero_where_the_original_is_nan_as_the_finding_accepts():
    """flex_attention returns 0 for a row its mask masks everywhere (torch 2.13, measured here), the original NaN."""
    result = analyze_source(PADDED, "padded.py", unsafe_fixes=True, backend="flex")
    (finding,) = result.findings
    assert "fully-masked-rows" in {fact["name"] for fact in finding.extra["facts"]["accepted"]}
    q, k, v = (torch.randn(2, 2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    keep = torch.tensor([[True, True, False, True, False], [False] * 5])
    expected = load_module_from_source(PADDED, "padded_original").Padded()(q, k, v, keep)
    got = load_module_from_source(result.fixed, "padded_flex").Padded()(q, k, v, keep)
    assert expected[1].isnan().all() and (got[1] == 0).all()
    assert torch.allclose(got[0], expected[0], atol=1e-5)


def test_transformers_gemma2_with_optional_soft_cap_mask_and_dropout_runs_flex_in_eval(monkeypatch):
    """HF Gemma-2's eager attention: the soft-cap under `if self.attn_logit_softcapping is not None`, the mask under
    `if attention_mask is not None`, dropout in training. The flex patch applies each where the original does and
    runs the original block where dropout would run (flex has none)."""
    path = FIXTURE_ROOT / "public4" / "p14_gemma2_softcap.py"
    source = path.read_text(encoding="utf-8")
    result = analyze_source(source, str(path), unsafe_fixes=True, backend="flex")
    (finding,) = result.findings
    assert finding.fixable and finding.extra["emission"]["emitted"] == "flex"
    # the two constructor numbers (a caller may pass tensors) are checked with the dropout, its probability's range
    # and the soft-cap divisor's (not 0, not NaN); key and value states are parameters: their lengths too; the mask's
    # rank and dtype as the caller passes it (`causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]` keeps
    # them)
    assert [fact["name"] for fact in finding.extra["facts"]["guarded"]] == [
        "dropout-range", "scale-is-number", "scale-is-number", "scale-nonzero", "mask-dtype", "mask-rank",
        "kv-length", "operand-rank", "flex-dropout"]
    assert "return (torch.tanh(score) * self.attn_logit_softcapping if self.attn_logit_softcapping is not None " \
           "else score)" in result.fixed
    original, patched = (load_module_from_source(text, f"p14_{name}")
                         for name, text in (("original", source), ("flex", result.fixed)))
    for softcap in (50.0, None):
        torch.manual_seed(0)
        model, (x, mask) = original.build()
        model.attn_logit_softcapping = softcap
        flex_model, _ = patched.build()
        flex_model.load_state_dict(model.state_dict())
        flex_model.attn_logit_softcapping = softcap
        for module in (model, flex_model):
            module.eval()
        with torch.no_grad():
            for attention_mask in (mask, None):
                expected, got = model(x, attention_mask), flex_model(x, attention_mask)
                assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()


# position masks written many ways: each must become a mask_mod computed per index (cached BlockMask) that equals
# the dense mask the original builds
_COLUMNS = ("i[:, None]", "i.unsqueeze(-1)", "i.view(-1, 1)")
_ROWS = ("i[None, :]", "i.unsqueeze(0)", "i.reshape(1, -1)", "i[None]")
_KEEPS = ("{q} >= {k}", "({q} - {k} < {w}) & ({q} >= {k})", "({k} <= {q}) | ({k} < {p})",
          "~({k} > {q})", "torch.tril(torch.ones(T, T, device=x.device), diagonal={d}).bool()",
          "torch.ones(T, T, device=x.device).triu(-{w}).bool() & ({q} >= {k})", "({q} - {k}).abs() < {w}")
_BLOCK = '''
import torch
from torch import nn


class Attend(nn.Module):
    def __init__(self, window={w}):
        super().__init__()
        self.window = window

    def forward(self, x):
        T = x.size(-2)
        i = torch.arange(T, device=x.device)
        keep = {keep}
        s = torch.matmul(x, x.transpose(-2, -1)) * 0.5
        s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, dim=-1) @ x


def make(seed: int = 0):
    torch.manual_seed(seed)
    return Attend(), (torch.randn(2, 3, 9, 4),)
'''


def test_generated_position_masks_become_computed_mask_mods_with_parity():
    import random

    rng = random.Random(18)
    for case, form in enumerate(_KEEPS * 2):  # every form twice, in random orientations and numbers
        keep = form.format(q=rng.choice(_COLUMNS), k=rng.choice(_ROWS), w="self.window",
                                         p=rng.randint(1, 4), d=rng.randint(-3, 2))
        source = _BLOCK.format(w=rng.randint(1, 5), keep=keep)
        result = analyze_source(source, f"generated_{case}.py", unsafe_fixes=True, backend="flex")
        (finding,) = result.findings
        assert finding.extra["emission"]["emitted"] == "flex", (keep, finding.reason)
        assert "mask_key=" in result.fixed.split("class Attend", 1)[1] and "_flex_tensor" not in result.fixed, keep
        original = load_module_from_source(source, f"generated_{case}_original")
        patched = load_module_from_source(result.fixed, f"generated_{case}_flex")
        (x,) = original.make()[1]
        with torch.no_grad():
            expected, got = original.Attend()(x), patched.Attend()(x)
        both_nan = expected.isnan() & (got == 0)  # fully masked rows: NaN in the original, 0 in flex (accepted)
        assert torch.allclose(got[~both_nan], expected[~both_nan], atol=1e-5), keep


def test_folded_heads_are_a_flex_refusal_and_keep_sdpa():
    path = FIXTURE_ROOT / "positive" / "05_diffusers_baddbmm.py"
    result = analyze_source(path.read_text(encoding="utf-8"), str(path), backend="flex")
    (finding,) = result.findings
    assert finding.extra["emission"]["emitted"] == "sdpa" and "scaled_dot_product_attention(" in result.fixed
    assert "3-D (heads folded into the batch)" in finding.extra["emission"]["reason"] and finding.extra["backends"]["flex"]["eligible"] is False


def test_multi_query_keys_run_as_grouped_query_flex_attention():
    """PaLM's one K/V head (`k.unsqueeze(1)` in SDPA's layout): flex_attention takes it only with enable_gqa."""
    path = FIXTURE_ROOT / "positive" / "28_palm_multi_query_einsum.py"
    source = path.read_text(encoding="utf-8")
    result = analyze_source(source, str(path), unsafe_fixes=True, backend="flex")
    assert "enable_gqa=True" in result.fixed.split("class ", 1)[1]
    _compare(source, result.fixed, "palm_mqa", grad=False)


def test_a_flex_patched_file_scanned_again_has_no_finding_in_advisors_helper():
    """The pasted helper's dense path is attention written by hand; it is advisor's own, so fixing the fixed file
    reports nothing new (every top-level function of the prelude is recognised by its name)."""
    path = FIXTURE_ROOT / "flex" / "01_gemma2_softcap.py"
    _, result = _flex_rewrite(path)
    assert "def _advisor_flex_dense(" in result.fixed
    again = analyze_source(result.fixed, str(path), unsafe_fixes=True, backend="flex")
    assert [(f.rule, f.function) for f in again.findings] == []


OPTIONAL_BIAS = """
import torch
from torch import nn


class Biased(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, bias=None):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5
        if bias is not None:
            attn = attn + bias
        attn = attn.softmax(dim=-1)
        x = attn @ v
        return x.transpose(1, 2).reshape(B, N, C)
"""


@pytest.mark.parametrize("unsafe", [False, True])
def test_a_bias_under_its_own_if_runs_on_both_paths_of_the_flex_patch(unsafe):
    """The SDPA proof guards such a bias by its absence and drops its `if`; flex's score_mod reads the bias on
    every path, so under flex the patch passes it (once offered safe, it raised NameError where bias was None)."""
    result = analyze_source(OPTIONAL_BIAS, "biased.py", unsafe_fixes=unsafe, backend="flex")
    (finding,) = result.findings
    assert finding.fix_safety != "safe"
    if not unsafe:
        return
    original = load_module_from_source(OPTIONAL_BIAS, "biased_original").Biased()
    patched = load_module_from_source(result.fixed, "biased_flex").Biased()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    for bias in (None, torch.randn(2, 1, 5, 5)):
        assert torch.allclose(patched(x, bias), original(x, bias), atol=1e-5)


SCRIPTED_CAUSAL = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=16, n_head=2, block_size=8):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.n_head = n_head
        self.n_embd = n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        return y.transpose(1, 2).contiguous().view(B, T, C)


def export(model):
    return torch.jit.script(model)
'''


def test_a_module_the_file_scripts_keeps_sdpa_which_torchscript_compiles():
    """Found by attacking safe flex patches (s17): TorchScript compiles neither the nested mask_mod nor the helper,
    so `torch.jit.script` of the patched module raised where the original's compiled."""
    result = analyze_source(SCRIPTED_CAUSAL, "scripted.py", backend="flex")
    (finding,) = result.findings
    assert finding.fix_safety == "safe" and finding.extra["emission"]["emitted"] == "sdpa"
    assert "TorchScript" in finding.extra["backends"]["flex"]["reason"]
    original = load_module_from_source(SCRIPTED_CAUSAL, "scripted_original")
    patched = load_module_from_source(result.fixed, "scripted_patched")
    torch.manual_seed(0)
    model, x = original.CausalSelfAttention().eval(), torch.randn(2, 5, 16)
    again = patched.CausalSelfAttention().eval()
    again.load_state_dict(model.state_dict())
    assert torch.allclose(patched.export(again)(x), original.export(model)(x), atol=1e-5)

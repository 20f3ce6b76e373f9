"""Tensor scales: a scale of size 1 in the key axis (a learned per-head temperature, a cosine-attention
logit scale, a 0-d tensor, a per-query-row factor) is folded into q (`q * s`, `scale=1.0`). Each form is run
original vs patched in float32, float64 and bfloat16, outputs and the learned scale's gradient compared; a factor
whose shape is not visible is guarded; one of another last size (a multiplicative mask) is refused."""

from __future__ import annotations

import textwrap

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

TEMPLATE = '''
import math
import torch
from torch import nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
{init}

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
{body}
        return out.transpose(1, 2).reshape(b, n, c)
'''

FOLDED = {
    "xcit_temperature": ("self.temperature = nn.Parameter(torch.rand(heads, 1, 1) + 0.5)", """
        attn = (q @ k.transpose(-2, -1)) * self.temperature
        out = attn.softmax(dim=-1) @ v
    """),
    # timm 1.0's factory keywords (`dd = dict(device=device, dtype=dtype)`): `**dd` cannot pass a size
    "edgenext_factory_keywords": ("dd = dict(device=None, dtype=None)\n"
                                  "self.temperature = nn.Parameter(torch.ones(heads, 1, 1, **dd))", """
        attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)) * self.temperature
        out = attn.softmax(dim=-1) @ v
    """),
    "swin_v2_cosine": ("self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((heads, 1, 1))))", """
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        logit_scale = torch.clamp(self.logit_scale, max=math.log(1.0 / 0.01)).exp()
        attn = attn * logit_scale
        out = attn.softmax(dim=-1) @ v
    """),
    "heads_4d_and_number": ("self.temp = nn.Parameter(torch.full((1, heads, 1, 1), 0.7))", """
        attn = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) * self.temp
        out = attn.softmax(dim=-1) @ v
    """),
    "vector_indexed": ("self.temp = nn.Parameter(torch.rand(heads) + 0.5)", """
        attn = (q @ k.transpose(-2, -1)) / self.temp[:, None, None]
        out = attn.softmax(dim=-1) @ v
    """),
    "vector_viewed": ("self.temp = nn.Parameter(torch.rand(heads) + 0.5)", """
        attn = q @ k.transpose(-2, -1)
        attn = attn * self.temp.view(-1, 1, 1)
        out = attn.softmax(dim=-1) @ v
    """),
    # in place, the scores keep their dtype whatever the scale's: the query's is checked at run time
    "in_place_dtype_guarded": ("self.temp = nn.Parameter(torch.rand(heads, 1, 1) + 0.5)", """
        attn = q @ k.transpose(-2, -1)
        attn *= self.temp
        out = attn.softmax(dim=-1) @ v
    """),
    "zero_dim_buffer": ('self.register_buffer("temp", torch.tensor(0.7))', """
        attn = (q @ k.transpose(-2, -1)) * self.temp
        out = attn.softmax(dim=-1) @ v
    """),
    "per_query_row": ("", """
        attn = (q @ k.transpose(-2, -1)) * q.norm(dim=-1, keepdim=True)
        out = attn.softmax(dim=-1) @ v
    """),
    "under_a_flag": ("self.temp = nn.Parameter(torch.rand(heads, 1, 1) + 0.5)\nself.use_temp = True", """
        attn = q @ k.transpose(-2, -1)
        if self.use_temp:
            attn = attn * self.temp
        out = attn.softmax(dim=-1) @ v
    """),
}
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 2e-2}


def _source(init: str, body: str) -> str:
    return TEMPLATE.format(init=textwrap.indent(init, " " * 8),
                           body=textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8))


def _finding(source: str):
    (finding,) = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    return finding


def _facts(finding, status: str) -> set[str]:
    return {fact["name"] for fact in finding.extra["facts"].get(status, [])}


# a learned divisor may hold 0, where (q / t)·kᵀ is not (q·kᵀ) / t: the fold is unsafe (offered on request)
DIVIDING = {"vector_indexed"}


def _pair(source: str, dtype: torch.dtype, unsafe: bool = False):
    fixed = analyze_source(source, "case.py", unsafe_fixes=unsafe).fixed
    torch.manual_seed(0)
    original = load_module_from_source(source, "case").Attention().to(dtype)
    patched = load_module_from_source(fixed, "case_fixed").Attention().to(dtype)
    patched.load_state_dict(original.state_dict())
    return original, patched


@pytest.mark.parametrize("form", FOLDED)
def test_a_tensor_scale_is_folded_into_q_by_a_safe_patch(form):
    finding = _finding(_source(*FOLDED[form]))
    if form in DIVIDING:
        assert finding.fix_safety == "unsafe" and _facts(finding, "assumed") == {"scale-divisor-nonzero"}
        finding = [f for f in analyze_source(_source(*FOLDED[form]), "case.py", unsafe_fixes=True).findings
                   if f.kind == "attention"][0]
    else:
        assert finding.fix_safety == "safe" and finding.patch, finding.reason
    assert "scale-broadcast" in _facts(finding, "proved")
    assert "scale-dtype" in _facts(finding, "guarded" if "guarded" in form else "proved")
    assert "scale=1.0" in finding.patch or "scale=" not in finding.patch.split("scaled_dot_product_attention")[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", FOLDED)
def test_the_fold_matches_the_original_and_its_gradients(form, dtype):
    original, patched = _pair(_source(*FOLDED[form]), dtype, unsafe=form in DIVIDING)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    outputs = [model(x) for model in (original, patched)]
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(outputs[1], outputs[0], atol=tolerance, rtol=tolerance)
    assert uses_sdpa(dispatched_ops(patched, (x,)))
    for model, output in zip((original, patched), outputs):
        output.float().square().sum().backward()
    for (name, theirs), ours in zip(original.named_parameters(), patched.parameters()):
        scale = theirs.grad.abs().max().item() + 1
        torch.testing.assert_close(ours.grad, theirs.grad, atol=tolerance * 10 * scale, rtol=tolerance * 10,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")


def test_a_pairwise_factor_is_a_multiplicative_mask_and_is_refused():
    finding = _finding(_source("self.gain = nn.Parameter(torch.rand(5, 5))", """
        attn = (q @ k.transpose(-2, -1)) * self.gain
        out = attn.softmax(dim=-1) @ v
    """))
    assert not finding.fixable and "multiplicative mask" in finding.reason


def test_a_tensor_scale_after_a_mask_is_refused():
    finding = _finding(_source("self.temp = nn.Parameter(torch.rand(heads, 1, 1))", """
        attn = q @ k.transpose(-2, -1)
        attn = attn.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        attn = attn * self.temp
        out = attn.softmax(dim=-1) @ v
    """))
    assert not finding.fixable and "after a mask" in finding.reason


FUNCTION = '''
import torch


def attend(q, k, v, temperature):
    attn = (q @ k.transpose(-2, -1)) * temperature
    return attn.softmax(dim=-1) @ v
'''


def test_a_scale_of_unknown_shape_is_guarded_and_exact_on_every_input():
    """A parameter may hold a number, a per-head tensor (SDPA path) or a pairwise one (the original runs)."""
    finding = _finding(FUNCTION)
    assert finding.fix_safety == "safe"
    assert {"scale-broadcast", "scale-dtype"} <= _facts(finding, "guarded") and not _facts(finding, "assumed")
    original = load_module_from_source(FUNCTION, "function").attend
    patched = load_module_from_source(analyze_source(FUNCTION, "case.py").fixed, "function_fixed").attend
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=generator) for _ in range(3))
    for temperature, fast in ((torch.rand(2, 1, 1, generator=generator), True), (0.5, True),
                              (torch.rand(5, 5, generator=generator), False),
                              (torch.rand(1, 2, 5, 1, generator=generator), True)):
        torch.testing.assert_close(patched(q, k, v, temperature), original(q, k, v, temperature))
        assert uses_sdpa(_ops(patched, q, k, v, temperature)) == fast


def test_a_wider_tensor_scale_runs_the_original_and_raises_as_it_does():
    """A float64 (H, 1, 1) scale widens float32 scores to float64: the guard fails and the original raises at the
    value product (float64 weights, float32 v), as before the patch."""
    original = load_module_from_source(FUNCTION, "function").attend
    patched = load_module_from_source(analyze_source(FUNCTION, "case.py").fixed, "function_fixed").attend
    q = k = v = torch.randn(2, 2, 5, 4)
    for function in (original, patched):
        with pytest.raises(RuntimeError):
            function(q, k, v, torch.rand(2, 1, 1, dtype=torch.float64))


def _ops(function, *args) -> set[str]:
    class Wrapper(torch.nn.Module):
        def forward(self, *inputs):
            return function(*inputs)
    return dispatched_ops(Wrapper(), args)


CAUSAL_WITH_TEMPERATURE = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, rows=1):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.temperature = nn.Parameter(torch.rand(heads, rows, 1) + 0.5)
        self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.temperature
        attn = attn.masked_fill(self.bias[:, :, :n, :n] == 0, float("-inf"))
        return attn.softmax(dim=-1) @ v
'''


def test_a_causal_buffer_under_a_temperature_is_guarded_where_the_rows_are_the_querys():
    """The temperature may broadcast the scores' rows (a (H, L, 1) one against a single query), so the triangle's
    extent is checked against the query's rows and the temperature's: a (H, 1, 1) or (H, L, 1) temperature takes
    SDPA, one with rows against a single query runs the original (which broadcasts the rows up)."""
    finding = _finding(CAUSAL_WITH_TEMPERATURE)
    assert finding.fix_safety == "safe", finding.reason
    assert "causal-extent" in _facts(finding, "guarded") and "is_causal=True" in finding.patch
    original_module = load_module_from_source(CAUSAL_WITH_TEMPERATURE, "causal_temperature")
    patched_module = load_module_from_source(analyze_source(CAUSAL_WITH_TEMPERATURE, "case.py").fixed,
                                             "causal_temperature_fixed")
    for rows, tokens, fast in ((1, 5, True), (5, 5, True), (5, 1, False)):
        for dtype in (torch.float32, torch.float64):
            torch.manual_seed(rows)
            original = original_module.Attention(rows=rows).to(dtype)
            patched = patched_module.Attention(rows=rows).to(dtype)
            patched.load_state_dict(original.state_dict())
            x = torch.randn(2, tokens, 16, dtype=dtype, generator=torch.Generator().manual_seed(3))
            outputs = [model(x) for model in (original, patched)]
            torch.testing.assert_close(outputs[1], outputs[0], atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
            for output in outputs:
                output.square().sum().backward()
            torch.testing.assert_close(patched.temperature.grad, original.temperature.grad,
                                       atol=TOLERANCE[dtype] * 10, rtol=TOLERANCE[dtype] * 10)
        assert uses_sdpa(dispatched_ops(patched, (x,))) == fast



class _PowerToTensor(int):
    """An int whose power is a tensor (breaker round 59's was per position, folded into q it scaled the head dim
    where the original scales the keys): `isinstance(dh, int)` holds, the scale is no number."""

    def __pow__(self, exponent):
        return torch.tensor([4.0]) ** exponent


COMPUTED_SCALE = '''
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, d, n_heads=4, n_kv_heads=2):
        super().__init__()
        self.h, self.kvh = n_heads, n_kv_heads
        self.dh = d // n_heads
        self.wq = nn.Linear(d, n_heads * self.dh, bias=False)
        self.wkv = nn.Linear(d, 2 * n_kv_heads * self.dh, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.h, -1).transpose(1, 2)
        k, v = self.wkv(x).view(b, t, 2, self.kvh, -1).permute(2, 0, 3, 1, 4)
        k = k.repeat_interleave(self.h // self.kvh, dim=1)
        v = v.repeat_interleave(self.h // self.kvh, dim=1)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.dh ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)
'''


def test_a_scale_computed_from_an_attribute_is_checked_as_a_number_read_once():
    """`self.dh ** -0.5` where a caller may set `self.dh` to a tensor (a hybrid model's attention, held-out corpus):
    each fact of a folded tensor scale is checked as `isinstance(self.dh, (int, float))`, once, since a number
    proves them all; a tensor there runs the original (was: the facts assumed, the patch unsafe)."""
    finding = _finding(COMPUTED_SCALE)
    assert finding.fix_safety == "safe", finding.reason
    assert {"scale-broadcast", "scale-dtype", "causal-extent"} <= _facts(finding, "guarded")
    assert finding.patch.count("isinstance(self.dh ** -0.5, (int, float))") == 1 and "(self.dh ** -0.5).dim()" \
        not in finding.patch
    original_module = load_module_from_source(COMPUTED_SCALE, "computed_scale")
    patched_module = load_module_from_source(analyze_source(COMPUTED_SCALE, "case.py").fixed, "computed_scale_fixed")
    for dh, fast in ((4, True), (torch.tensor(4.0), False), (torch.full((4, 1, 1), 4.0), False),
                     (_PowerToTensor(4), False)):
        for dtype in (torch.float32, torch.float64):
            torch.manual_seed(0)
            original, patched = original_module.Attention(16).to(dtype), patched_module.Attention(16).to(dtype)
            patched.load_state_dict(original.state_dict())
            original.dh = patched.dh = dh.to(dtype) if isinstance(dh, torch.Tensor) else dh
            x = torch.randn(2, 5, 16, dtype=dtype, generator=torch.Generator().manual_seed(1), requires_grad=True)
            outputs = [model(x) for model in (original, patched)]
            torch.testing.assert_close(outputs[1], outputs[0], atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
            grads = [torch.autograd.grad(output.square().sum(), x)[0] for output in outputs]
            torch.testing.assert_close(grads[1], grads[0], atol=TOLERANCE[dtype] * 10, rtol=TOLERANCE[dtype] * 10)
        assert uses_sdpa(dispatched_ops(patched, (x,))) == fast

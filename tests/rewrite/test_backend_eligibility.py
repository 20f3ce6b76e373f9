"""Backend eligibility: the table of conditions, agreement with torch's own CPU dispatch, and the verdicts a
static scan attaches to every proved attention finding."""

from __future__ import annotations

import json

import pytest
import torch

from advisor.backends.eligibility import SiteFacts, backend_eligibility
from advisor.backends.tensor_eligibility import facts_from_tensors, torch_eligibility
from advisor.cli import main
from fixture_models import fixture_paths

KNOWN_CPU = dict(device="cpu", rank=4, kv_heads="same", head_dim=64, value_head_dim=64, unit_stride=True)
KNOWN_CUDA = dict(device="cuda", rank=4, kv_heads="same", head_dim=64, value_head_dim=64, unit_stride=True)


def _eligible(facts: SiteFacts) -> dict[str, bool | None]:
    return {name: verdict.eligible for name, verdict in backend_eligibility(facts).items()}


@pytest.mark.parametrize("facts, expected", [
    (SiteFacts(dtype="float16", **KNOWN_CUDA),
     {"sdpa-flash": True, "sdpa-efficient": True, "sdpa-math": True, "flash-attn": True}),
    (SiteFacts(mask="causal", dtype="bfloat16", dropout="0.1", **KNOWN_CUDA),
     {"sdpa-flash": True, "sdpa-efficient": True, "flash-attn": True}),
    (SiteFacts(mask="bool", dtype="float16", **KNOWN_CUDA),
     {"sdpa-flash": False, "sdpa-efficient": True, "flash-attn": False}),
    (SiteFacts(mask="float", dtype="float32", **KNOWN_CUDA),
     {"sdpa-flash": False, "sdpa-efficient": True, "flash-attn": False}),
    (SiteFacts(dtype="float16", **{**KNOWN_CUDA, "head_dim": 320, "value_head_dim": 320}),
     {"sdpa-flash": False, "sdpa-efficient": True, "flash-attn": False}),
    (SiteFacts(dtype="float32", **{**KNOWN_CUDA, "head_dim": 6, "value_head_dim": 6}),
     {"sdpa-flash": False, "sdpa-efficient": False}),
    (SiteFacts(dtype="float16", **{**KNOWN_CUDA, "rank": 3}),
     {"sdpa-flash": False, "sdpa-efficient": False, "flash-attn": False}),
    (SiteFacts(dtype="float16", **{**KNOWN_CUDA, "kv_heads": "grouped"}),
     {"sdpa-flash": True, "sdpa-efficient": False, "flash-attn": True}),
    (SiteFacts(dtype="float32", **KNOWN_CPU),
     {"sdpa-flash": True, "sdpa-efficient": False, "flash-attn": False}),
    (SiteFacts(dtype="float32", **KNOWN_CPU, dropout="0.1"),
     {"sdpa-flash": False}),
    (SiteFacts(dtype="float32", **KNOWN_CPU,
               dropout="self.p if self.training else 0.0"),
     {"sdpa-flash": None}),
    # a static scan: nothing about dtype, device or shapes is known, so nothing is claimed either way
    (SiteFacts(), {"sdpa-flash": None, "sdpa-efficient": None, "sdpa-math": True, "flash-attn": None,
                   "sdpa-flash-cpu": None}),
    (SiteFacts(mask="bool"), {"sdpa-flash": False, "flash-attn": False, "sdpa-flash-cpu": None}),
    (SiteFacts(mask="float", mask_conditional=True), {"sdpa-flash": None, "flash-attn": None}),
])
def test_eligibility_table(facts, expected):
    got = _eligible(facts)
    assert {name: got[name] for name in expected} == expected


def test_unknown_verdicts_name_what_must_hold_and_refusals_name_the_cause():
    verdicts = backend_eligibility(SiteFacts(mask="float"))
    assert "attn_mask" in verdicts["sdpa-flash"].reason
    unknown = verdicts["sdpa-efficient"]
    assert unknown.eligible is None and "not known" in unknown.reason and "float16/bfloat16/float32" in unknown.reason


def test_variants_are_offered_only_where_they_make_the_kernel_eligible():
    broadcast = backend_eligibility(SiteFacts(kv_heads="broadcast", dtype="float16", device="cuda", rank=4,
                                              head_dim=64, value_head_dim=64))
    assert broadcast["sdpa-flash"].eligible is False and "enable_gqa=True" in broadcast["sdpa-flash"].variant
    assert broadcast["sdpa-efficient"].eligible is False and broadcast["sdpa-efficient"].variant is None
    guarded = backend_eligibility(SiteFacts(mask="bool", causal_guard="self.causal", dtype="float16",
                                            **KNOWN_CUDA))
    assert guarded["sdpa-flash"].eligible is False
    assert guarded["sdpa-flash"].variant.startswith("pass `is_causal=self.causal`")


def _cpu_cases():
    q = torch.randn(2, 4, 16, 32)
    kv = torch.randn(2, 4, 16, 32)
    one_head = torch.randn(2, 1, 16, 32)
    yield "plain", (q, kv, kv), {}
    yield "dropout", (q, kv, kv), {"dropout_p": 0.2}
    yield "bool mask", (q, kv, kv), {"attn_mask": torch.ones(16, 16, dtype=torch.bool).tril()}
    yield "float mask", (q, kv, kv), {"attn_mask": torch.zeros(16, 16)}
    yield "causal", (q, kv, kv), {"is_causal": True}
    yield "3-D", (q[0], kv[0], kv[0]), {}
    yield "v head dim", (q, kv, torch.randn(2, 4, 16, 16)), {}
    yield "broadcast heads", (q, one_head, one_head), {}
    yield "gqa", (q, one_head, one_head), {"enable_gqa": True}
    yield "bf16", (q.bfloat16(), kv.bfloat16(), kv.bfloat16()), {}
    yield "head dim 300", (torch.randn(1, 2, 8, 300),) * 3, {}
    channel_major = torch.randn(2, 4, 32, 16).transpose(-2, -1)
    yield "last-dim stride", (channel_major, channel_major, channel_major), {}


@pytest.mark.parametrize("name, tensors, options", list(_cpu_cases()), ids=[c[0] for c in _cpu_cases()])
def test_cpu_flash_rules_agree_with_torch_dispatch(name, tensors, options):
    """The static CPU flash rules, given full facts, say what torch's own dispatcher does."""
    from torch.nn.attention import SDPBackend

    facts = facts_from_tensors(*tensors, **options)
    ours = backend_eligibility(facts)["sdpa-flash"].eligible
    torch_choice = SDPBackend(torch._fused_sdp_choice(*tensors, options.get("attn_mask"), options.get("dropout_p", 0.0),
                                                      options.get("is_causal", False),
                                                      enable_gqa=options.get("enable_gqa", False)))
    assert ours == (torch_choice == SDPBackend.FLASH_ATTENTION)
    assert torch_eligibility(*tensors, **options)["sdpa-flash"].eligible == ours


def test_every_proved_finding_carries_backends_in_json_and_text(capsys):
    paths = [str(p) for p in fixture_paths("positive")]
    assert main(["scan", "--format", "json", *paths]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    proved = [f for f in findings if f["rule"] in ("ADV101", "ADV102")]
    assert proved and all(set(f["backends"]) >= {"sdpa-flash", "sdpa-efficient", "sdpa-math", "flash-attn"}
                          for f in proved)
    assert all(v["eligible"] in (True, False, None) and v["reason"] for f in proved for v in f["backends"].values())
    main(["scan", str(fixture_paths("positive")[10])])  # 11_tensor_matmul_where: a boolean mask
    text = capsys.readouterr().out
    assert "flash" in text and "attn_mask" in text


GPT2_STYLE = '''
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, n_ctx):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((n_ctx, n_ctx), dtype=torch.uint8)).view(1, 1, n_ctx, n_ctx))

    def forward(self, q, k, v):
        w = torch.matmul(q, k.transpose(-1, -2)) / (float(v.size(-1)) ** 0.5)
        nd, ns = w.size(-2), w.size(-1)
        mask = self.bias[:, :, {rows}, :ns].bool()
        w = torch.where(mask, w, torch.finfo(w.dtype).min)
        w = nn.functional.softmax(w, dim=-1)
        return torch.matmul(w, v)
'''


@pytest.mark.parametrize("rows, expected", [("ns - nd : ns", True), (":nd", False), ("ns - nd : nd", False)])
def test_bottom_right_causal_buffer_slices_get_the_causal_lower_right_variant(rows, expected):
    from advisor.patterns.attention import find_attention
    from advisor.backends.site import site_facts
    from advisor.static.module_index import ParsedModule

    parsed = ParsedModule(GPT2_STYLE.format(rows=rows), "gpt2_style.py")
    (match,) = [m for m in find_attention(parsed) if m.output_node is not None]
    facts = site_facts(parsed, match)
    assert facts.bottom_right_causal is expected
    variant = backend_eligibility(facts)["sdpa-flash"].variant
    assert (variant is not None and "causal_lower_right" in variant) is expected


def test_causal_lower_right_states_the_sliced_buffer_exactly():
    """The variant's claim, measured: L != S, finfo.min fill, the buffer sliced [S - L:S, :S]."""
    from torch.nn.attention.bias import causal_lower_right

    torch.manual_seed(0)
    length_q, length_k = 5, 9
    q, k, v = torch.randn(2, 3, length_q, 16), torch.randn(2, 3, length_k, 16), torch.randn(2, 3, length_k, 16)
    buffer = torch.tril(torch.ones(12, 12, dtype=torch.uint8)).view(1, 1, 12, 12)
    scores = q @ k.transpose(-1, -2) / 4.0
    mask = buffer[:, :, length_k - length_q:length_k, :length_k].bool()
    original = torch.where(mask, scores, torch.finfo(scores.dtype).min).softmax(-1) @ v
    variant = torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                               attn_mask=causal_lower_right(length_q, length_k))
    torch.testing.assert_close(variant, original, atol=1e-6, rtol=1e-5)


def test_profiled_math_fallback_carries_backends_from_the_recorded_call():
    """The profile knows shapes, dtype and device: the verdicts are decided, and agree with the kernel that ran."""
    from profile_helpers import by_rule, run_fixture

    [fallback] = by_rule(run_fixture("sdpa_fallback.py"), "ADV401")
    backends = fallback.extra["evidence"]["backends"]
    assert backends["sdpa-flash"]["eligible"] is False and "dropout" in backends["sdpa-flash"]["reason"]
    assert backends["sdpa-efficient"]["eligible"] is False and backends["flash-attn"]["eligible"] is False
    assert backends["sdpa-math"]["eligible"] is True

"""Round 3 of the outside check: 40 attention modules written from memory of public projects the earlier rounds
did not cover (fixtures/attention/public3). For each, advisor's outcome must match the judgement recorded below;
every safe patch is held to the original's outputs and gradients in fp32 and fp64, its outputs in bf16 and under
CPU autocast, and in train mode with dropout 0; every unsafe patch must at least run; every refusal's reason must
name the obstacle the judgement names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from advisor.engine.static import analyze_source
from dtype_parity import BF16, FP32, FP64, compare_run, load_pair

PUBLIC3 = Path(__file__).resolve().parents[2] / "fixtures" / "attention" / "public3"
SAFE, UNSAFE, REFUSED, NONE = "safe", "unsafe", "refused", "none"


@dataclass(frozen=True)
class Judgement:
    """What advisor should do with one module, as judged by reading it: `outcome` of its attention findings
    (one entry per finding, in line order), `obstacle` words the reason must contain (the real obstacle),
    `verdict` the judgement in words (a MISS is a standard block refused or left unsafe that SDPA computes)."""

    outcomes: tuple[str, ...]
    obstacle: tuple[str, ...] = ()
    verdict: str = "right"


J = Judgement
JUDGEMENTS: dict[str, Judgement] = {
    "p01_fairseq_mha": J((UNSAFE,), ("attn_mask", "fully masked"),
                         "right: the float attn_mask parameter's values are unseen (its dtype is checked)"),
    "p02_whisper_openai": J((REFUSED,), ("`qk`", "line 39"), "right: the pre-softmax scores are returned (line 39)"),
    "p03_whisper_no_cache": J((SAFE,)),
    "p04_sam_relpos": J((REFUSED,), ("rel_h",), "right: a bias from q added through a 5-D view of the scores"),
    "p05_sam_plain": J((SAFE,)),
    "p06_segformer": J((SAFE,)),
    "p07_pvt_sr": J((SAFE,)),
    "p08_diffusers_classic": J((REFUSED,), ("beta", "returned"),
                               "MISS, reason accurate: beta is 0 or 1 on two paths and the weights come back from "
                               "get_attention_scores to the caller's bmm"),
    "p09_gpt_neox": J((REFUSED,), ("reshaped",),
                      "MISS, reason accurate: the (b*h) -> (b, h) view of the scores before the softmax is exact"),
    "p10_falcon": J((UNSAFE,), ("fully masked",),
                    "right: the added mask's values are unseen (its dtype and rank, once a MISS, are guarded)"),
    "p11_bloom_alibi": J((REFUSED,), ("never reach a value product",),
                         "MISS, reason misleading: the weights reach bmm through a (b, h) -> (b*h) view (before "
                         "this round it was silent: alibi.baddbmm(batch1=, batch2=) and beta=self.beta were unread)"),
    "p12_opt": J((REFUSED, REFUSED), ("torch.max",), "right: the clamp torch.max(scores, finfo.min)"),
    "p13_mpt": J((SAFE,), (),
                 "right since the padding and causal fills of one finite value share a keep mask (was UNSAFE on "
                 "fully masked rows): dropout under `if dropout_p:` is dropout, the unannotated scale is guarded"),
    "p14_mistral_gqa": J((UNSAFE,), ("causal_mask",), "right: the mask parameter's values are unseen (its dtype and "
                         "rank are checked)"),
    "p15_blip_saved_map": J((UNSAFE,), ("fully masked",),
                            "right: the map is saved and hooked only under `if self.save_attention:`, "
                            "so SDPA runs where that flag is off (a guarded check) and the original where it is on; "
                            "the caller's -10000 mask values are unseen"),
    "p16_bert_head_mask": J((REFUSED,), ("head_mask",)),
    "p17_bigbird_dense_intmask": J((UNSAFE,), ("fully masked", "finfo"),
                                   "right since this round (was an UNSOUND safe patch): a fully padded sample's rows "
                                   "get other gradients from SDPA, see test_finite_additive_mask_fully_masked_rows"),
    "p18_sagan": J((UNSAFE,), ("line 28",), "right: ADV102, the attention map is returned"),
    "p19_nonlocal": J((SAFE,)),
    "p20_pct_offset": J((REFUSED,), ("attention.sum",)),
    "p21_set_transformer": J((SAFE,)),
    "p22_conformer_relpos": J((UNSAFE,), ("pos_attn", "fully masked"),
                              "right: the relative-position term rides as an additive mask of unseen dtype"),
    "p23_openfold_bias_loop": J((REFUSED,), ("several paths",), "right but vague: `a += b` in a loop over biases"),
    "p24_swinv2_cosine": J((UNSAFE,), ("additive mask",), "right: the logit scale folds into q; the "
                                                          "added sigmoid bias's dtype and rank are left open"),
    "p25_diff_attention": J((REFUSED,), (".view(", "mixed"), "right: two softmax maps combined"),
    "p26_kv_cache_causal": J((SAFE,)),
    "p27_linear_attention": J(()),
    "p28_slot_attention": J((REFUSED,), ("dim 1",)),
    "p29_vivit_einops": J((SAFE,)),
    "p30_audiocraft_einsum": J((SAFE,), (), "right since stop 41: torch.full_like(pre_w, -inf) reads only the "
                               "scores' shape, in the statement the patch deletes (a MISS with an accurate reason "
                               "before)"),
    "p31_jadore_sdpa_module": J((UNSAFE,), ("line 23",), "right: ADV102, the helper returns attn"),
    "p32_t2t_token_transformer": J((SAFE,)),
    "p33_esm_inplace": J((SAFE,)),
    "p34_attention_maps_list": J((REFUSED,), ("line 23",), "right: the weights are appended to a list"),
    "p35_where_keep_float01": J((REFUSED,), ("masked_fill(~keep, 0.0)", "SDPA applies nothing"),
                                "right (it said 'heads or positions are mixed' before this round)"),
    "p36_chunked_queries": J((SAFE,)),
    "p37_nan_to_num_rows": J((REFUSED,), ("nan_to_num",)),
    "p38_tf_style_mult_mask": J((REFUSED,), ("10000.0 * (1 - m)",)),
    "p39_clip_causal_buffer_bmm": J((SAFE,), (), "right again: the added buffer is built by a helper with "
                                    "fill_(-inf).triu_(1), so every row keeps key 0 (proved; a MISS for a while "
                                    "after added masks stopped getting the NaN -> 0 acceptance)"),
    "p41_bart_eager_param_mask": J((UNSAFE,), ("fully masked", "finfo.min"),
                                   "right since main's eb10150 (was an UNSOUND safe patch: under bf16 autocast the "
                                   "caller's fp32 finfo.min mask became -inf, rows of 0 instead of the mean of V)"),
    "p40_detr_decoder_cross": J((UNSAFE,), ("fully masked",),
                                "MISS of a fact: the bias is torch.zeros(..., dtype=q.dtype).masked_fill(..., -inf) "
                                "(its dtype is guarded now; its values are not read, so fully masked rows stay "
                                "assumed where -inf rows are the accepted NaN -> 0)"),
}

MODULES = sorted(path.stem for path in PUBLIC3.glob("p*.py"))


def _analysis(name: str):
    path = PUBLIC3 / f"{name}.py"
    source = path.read_text(encoding="utf-8")
    return source, analyze_source(source, str(path), unsafe_fixes=True)


def _attention(result) -> list:
    return sorted((f for f in result.findings if f.kind == "attention"), key=lambda f: f.line)


def _outcome(finding) -> str:
    if not finding.fixable:
        return REFUSED
    return finding.fix_safety


def _accepts(finding, name: str) -> bool:
    return any(fact["name"] == name for fact in (finding.extra.get("facts") or {}).get("accepted", []))


def test_every_module_is_judged():
    assert len(MODULES) >= 30
    assert set(MODULES) == set(JUDGEMENTS)


@pytest.mark.parametrize("name", MODULES)
def test_outcome_matches_judgement(name):
    _, result = _analysis(name)
    findings = _attention(result)
    judgement = JUDGEMENTS[name]
    assert tuple(_outcome(f) for f in findings) == judgement.outcomes, [f.reason for f in findings]
    for finding in findings:
        if _outcome(finding) == SAFE:
            continue
        reason = finding.reason or ""
        assert reason.endswith((")", ".")) or reason[:1].islower(), reason  # one sentence, not a code
        for word in judgement.obstacle:
            assert word.lower() in reason.lower(), f"{name}: the reason does not name `{word}`: {reason}"


@pytest.mark.parametrize("name", [n for n in MODULES if SAFE in JUDGEMENTS[n].outcomes])
def test_safe_patch_parity(name):
    """Each safe patch alone (and all of a file's safe patches together) against the original: fp32 and fp64
    outputs and gradients, bf16 outputs, CPU bf16 autocast outputs, train mode with dropout 0, a second seed."""
    source, result = _analysis(name)
    safe = [f for f in _attention(result) if _outcome(f) == SAFE]
    assert safe
    variants = [(f"line {f.line}", result.fixed_with([f]).text, f) for f in safe]
    if len(safe) > 1:
        variants.append(("all", result.fixed_with(safe).text, None))
    for label, fixed, finding in variants:
        findings = [finding] if finding is not None else safe
        accept_nan = all(_accepts(f, "fully-masked-rows") for f in findings)
        # the documented divergence: an fp32 upcast in the original rounds float64 scores, SDPA does not
        fp64_tol = 1e-6 if any(_accepts(f, "precision") for f in findings) else FP64[1]
        original, rewritten = load_pair(source, fixed, f"{name}_{label.replace(' ', '_')}")
        checks = {
            "fp32": dict(dtype=torch.float32, atol=FP32[1], rtol=FP32[2]),
            "fp64": dict(dtype=torch.float64, atol=fp64_tol, rtol=fp64_tol),
            "bf16": dict(dtype=torch.bfloat16, atol=BF16[1], rtol=BF16[2], grad=False),
            "autocast": dict(dtype=torch.float32, atol=BF16[1], rtol=BF16[2], grad=False, autocast=True),
            "train, dropout 0": dict(dtype=torch.float32, atol=FP32[1], rtol=FP32[2], train=True, dropout=0.0),
            "seed 1": dict(seed=1, dtype=torch.float32, atol=FP32[1], rtol=FP32[2]),
        }
        for check, options in checks.items():
            try:
                compare_run(original, rewritten, accept_nan=accept_nan, **options)
            except AssertionError as exc:
                raise AssertionError(f"{name} ({label}), {check}: {exc}") from exc


@pytest.mark.parametrize("name", [n for n in MODULES if UNSAFE in JUDGEMENTS[n].outcomes])
def test_unsafe_patch_runs(name):
    """The unsafe path is not held to parity (its assumed facts may be false on these inputs) but must import
    and run, in eval and in train mode, and return the original's structure and shapes."""
    source, result = _analysis(name)
    original, rewritten = load_pair(source, result.fixed_with(result.applicable(True)).text, name)
    assert result.fixed_with(result.applicable(True)).text != source
    for train in (False, True):
        model_o, inputs = original.build(0, 0.0)
        model_r, _ = rewritten.build(0, 0.0)
        model_r.load_state_dict(model_o.state_dict())
        out_o, out_r = model_o.train(train)(*inputs), model_r.train(train)(*inputs)
        flat_o = out_o if isinstance(out_o, tuple) else (out_o,)
        flat_r = out_r if isinstance(out_r, tuple) else (out_r,)
        assert len(flat_o) == len(flat_r)
        for a, b in zip(flat_o, flat_r):
            assert b is None or a.shape == b.shape  # ADV102 puts None where the weights went


def test_finite_additive_mask_fully_masked_rows():
    """BERT's extended mask `(1.0 - m) * finfo.min` on a fully padded sample: SDPA's output matches the original's
    in fp32, but its gradients for the fully masked rows are S times the original's (its backward rebuilds the
    weights from a log-sum-exp the fill swallowed) and under bf16 autocast the mask's cast to q's dtype turns fp32
    finfo.min into -inf (rows of 0, not the mean of V). So the patch assumes no fully masked row (unsafe); on
    inputs where that holds it is exact."""
    source, result = _analysis("p17_bigbird_dense_intmask")
    (finding,) = _attention(result)
    assert finding.fix_safety == "unsafe"
    assert "fully-masked-rows" in {fact["name"] for fact in finding.extra["facts"]["assumed"]}
    original, rewritten = load_pair(source, result.fixed_with([finding]).text, "p17_rows")
    compare_run(original, rewritten, dtype=torch.float32, atol=FP32[1], rtol=FP32[2], grad=False)
    with pytest.raises(AssertionError, match="gradient"):
        compare_run(original, rewritten, dtype=torch.float32, atol=FP32[1], rtol=FP32[2])
    with pytest.raises(AssertionError, match="output"):
        compare_run(original, rewritten, dtype=torch.float32, atol=BF16[1], rtol=BF16[2], grad=False, autocast=True)

    def partly_padded(inputs):
        x, mask = inputs
        mask = mask.clone()
        mask[0, :3] = 1
        return x, mask

    for dtype, atol, rtol in (FP32, FP64):
        compare_run(original, rewritten, dtype=dtype, atol=atol, rtol=rtol, inputs_hook=partly_padded)
    compare_run(original, rewritten, dtype=torch.float32, atol=BF16[1], rtol=BF16[2], grad=False, autocast=True,
                inputs_hook=partly_padded)


def test_baddbmm_keywords_and_attribute_beta():
    """BLOOM's `alibi.baddbmm(batch1=q, batch2=k, beta=self.beta, alpha=...)` with `self.beta = 1.0`: the alibi is
    an added float mask, as for `torch.baddbmm(alibi, q, k, beta=1.0)`."""
    source = ("import torch\nimport torch.nn as nn\n\n\n"
              "class A(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.beta = 1.0\n\n"
              "    def forward(self, alibi, q, k, v):\n"
              "        s = alibi.baddbmm(batch1=q, batch2=k.transpose(1, 2), beta=self.beta, alpha=0.25)\n"
              "        return torch.bmm(s.softmax(dim=-1), v)\n")
    (finding,) = analyze_source(source, "bloom_like.py", unsafe_fixes=True).findings
    assert finding.fixable and "attn_mask=alibi" in finding.patch and "scale=0.25" in finding.patch
    (refused,) = analyze_source(source.replace("self.beta = 1.0", "self.beta = 0.5"), "beta.py").findings
    assert not refused.fixable and "beta" in refused.reason


def test_inline_softmax_module_is_read():
    """`nn.Softmax(dim=-1)(scores)` (BLIP, ALBEF) is a softmax: the block is found and proved like any other."""
    source = ("import math\nimport torch\nimport torch.nn as nn\n\n\n"
              "def attend(q, k, v):\n"
              "    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))\n"
              "    p = nn.Softmax(dim=-1)(s)\n"
              "    return torch.matmul(p, v)\n")
    findings = analyze_source(source, "inline_softmax.py").findings
    assert [(f.rule, f.fix_safety) for f in findings] == [("ADV101", "safe")]
    assert "scaled_dot_product_attention(q, k, v)" in findings[0].patch
    dropout = source.replace("nn.Softmax(dim=-1)(s)", "nn.Dropout(0.1)(s.softmax(-1))")
    assert not any(f.fixable for f in analyze_source(dropout, "inline_dropout.py").findings)  # always training

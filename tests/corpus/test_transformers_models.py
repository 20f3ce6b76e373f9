"""Real code: the installed transformers package. Its eager attention functions return their weights, so the
safe answer is a finding with a reason; the unsafe fix rewrites them, and the rewritten model must match the
library's own SDPA path on the same weights."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import transformers

from advisor.engine.static import analyze_source, scan_paths
from fixture_models import dispatched_ops, uses_sdpa

MODELS = Path(transformers.__file__).resolve().parent / "models"
FAMILIES = ("llama", "gpt2", "bert", "vit", "t5", "mistral", "whisper", "clip")


def _modeling_file(family: str) -> Path:
    return MODELS / family / f"modeling_{family}.py"


def test_scan_of_transformers_families_reports_eager_attention_with_reasons():
    result = scan_paths([str(_modeling_file(family)) for family in FAMILIES], jobs=1)
    assert not result.errors
    by_file: dict[str, list] = {}
    for finding in result.findings:
        by_file.setdefault(Path(finding.path).name, []).append(finding)
    for family in FAMILIES:
        findings = by_file[f"modeling_{family}.py"]
        eager = [f for f in findings if f.function == "eager_attention_forward"]
        assert len(eager) == 1, family
        (finding,) = eager
        assert finding.rule == "ADV102" and finding.fix_safety == "unsafe" and finding.fixable
        assert "weights are used outside the block" in finding.reason
        assert "scaled_dot_product_attention" in finding.patch
    # no safe patch is ever applied to this code: the weights are part of the return value
    for family in FAMILIES:
        source = _modeling_file(family).read_text()
        assert analyze_source(source, str(_modeling_file(family))).fixed == source


def _rewritten_module(family: str, tmp_path: Path, monkeypatch):
    source = _modeling_file(family).read_text()
    fixed = analyze_source(source, str(_modeling_file(family)), unsafe_fixes=True).fixed
    assert fixed != source
    return _loaded(family, fixed, tmp_path, monkeypatch)


def _loaded(family: str, fixed: str, tmp_path: Path, monkeypatch):
    path = tmp_path / f"advisor_modeling_{family}.py"
    path.write_text(fixed)
    name = f"transformers.models.{family}.advisor_modeling_{family}"  # relative imports resolve in the package
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # transformers inspects classes through sys.modules
    spec.loader.exec_module(module)
    return module


TINY = {
    "llama": ("LlamaConfig", "LlamaModel", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=97)),
    "gpt2": ("GPT2Config", "GPT2Model", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=97, n_positions=64)),
    "bert": ("BertConfig", "BertModel", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, vocab_size=97)),
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_unsafe_rewrite_matches_the_library_sdpa_path(family, tmp_path, monkeypatch):
    config_name, model_name, sizes = TINY[family]
    rewritten = _rewritten_module(family, tmp_path, monkeypatch)
    config = getattr(transformers, config_name)(**sizes)
    torch.manual_seed(0)
    reference_config = copy.deepcopy(config)
    reference_config._attn_implementation = "sdpa"
    reference = getattr(transformers, model_name)(reference_config).eval()
    eager_config = copy.deepcopy(config)
    eager_config._attn_implementation = "eager"  # the path that now runs the rewritten function
    candidate = getattr(rewritten, model_name)(eager_config).eval()
    candidate.load_state_dict(reference.state_dict())
    input_ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(2, 12, dtype=torch.long)
    attention_mask[1, 9:] = 0  # right padding in the second sequence
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        actual = candidate(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    valid = attention_mask.bool()  # padded query rows are not compared
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-5, rtol=1e-5)
    ops = dispatched_ops(candidate, (input_ids,))
    assert uses_sdpa(ops) and "aten::_softmax" not in ops  # the eager path now runs SDPA, not a softmax


# BART's form (MVP, LED, SpeechT5, TrOCR): the weights reshaped under `if output_attentions:`, None
# otherwise. The patch runs SDPA only with the flag off, the library's own code with it on.
SMALL = dict(d_model=32, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64, vocab_size=97,
             max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
ON_REQUEST = {
    "mvp": ("MvpConfig", "MvpModel", dict(SMALL, encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=64)),
    "trocr": ("TrOCRConfig", "TrOCRForCausalLM", SMALL),
}


def _outputs_and_grads(model, inputs: dict, output_attentions: bool):
    model.zero_grad()
    output = model(**inputs, output_attentions=output_attentions)
    tensors = [value for key, value in output.items() if isinstance(value, torch.Tensor)]
    tensors += [weights for key, value in output.items() if "attentions" in key and value for weights in value]
    loss = sum((t * torch.cos(torch.arange(t.numel(), dtype=t.dtype).view(t.shape))).sum() for t in tensors)
    loss.backward()
    return tensors, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("family", sorted(ON_REQUEST))
def test_weights_on_request_take_sdpa_with_the_flag_off_and_the_library_path_with_it_on(family, tmp_path,
                                                                                         monkeypatch):
    result = analyze_source(_modeling_file(family).read_text(), str(_modeling_file(family)), unsafe_fixes=True)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fixable and "flag-is-bool" in str(finding.extra["facts"])
    # the only unproved fact is the caller's mask: what an unsafe patch of any eager attention of transformers assumes
    assert [fact["name"] for fact in finding.extra["facts"]["assumed"]] == ["fully-masked-rows"]
    config_name, model_name, sizes = ON_REQUEST[family]
    rewritten = _loaded(family, result.fixed, tmp_path, monkeypatch)
    config = getattr(transformers, config_name)(**sizes)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    original = getattr(transformers, model_name)(copy.deepcopy(config)).eval()
    patched = getattr(rewritten, model_name)(copy.deepcopy(config)).eval()
    patched.load_state_dict(original.state_dict())
    generator = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(0, 97, (2, 8), generator=generator)}
    if family == "mvp":  # encoder padding (no fully padded row) and a decoder: self- and cross-attention
        inputs["attention_mask"] = torch.ones(2, 8, dtype=torch.long)
        inputs["attention_mask"][1, 6:] = 0
        inputs["decoder_input_ids"] = torch.randint(0, 97, (2, 6), generator=generator)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *args, **kwargs: calls.append(1) or sdpa(*args, **kwargs))
    for flag in (False, True):
        calls.clear()
        expected, expected_grads = _outputs_and_grads(original, inputs, flag)
        assert not calls  # the library's eager path
        actual, actual_grads = _outputs_and_grads(patched, inputs, flag)
        assert bool(calls) is not flag  # SDPA where the flag is off, the original statements where it is on
        assert len(actual) == len(expected)  # the weights come back exactly when asked for
        for a, b in zip(actual + actual_grads, expected + expected_grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# Swin's windows (and other forms that return the weights by `... if output_attentions else ...`): the patch's
# fallback under `else:` holds the original block, which must be read as the fallback it is, not patched again
# (breaker round 56: `fix --unsafe-fixes` nested the patch 16 deep, once per fix round)
SETTLED = ("donut/modeling_donut_swin.py", "maskformer/modeling_maskformer_swin.py", "clap/modeling_clap.py",
           "swin/modeling_swin.py", "fsmt/modeling_fsmt.py", "speecht5/modeling_speecht5.py",
           "dab_detr/modeling_dab_detr.py")


@pytest.mark.parametrize("relative", SETTLED)
def test_a_patched_file_offers_no_patch_of_its_own_fallback(relative):
    path = MODELS / relative
    first = analyze_source(path.read_text(), str(path), unsafe_fixes=True)
    patched = [f for f in first.findings if f.kind == "attention" and f.fixable]
    assert patched, relative
    second = analyze_source(first.fixed, str(path), unsafe_fixes=True)
    again = [(f.line, f.rule) for f in second.findings if f.kind == "attention" and f.fixable]
    assert again == [], again

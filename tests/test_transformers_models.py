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

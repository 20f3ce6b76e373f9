"""An unsafe patch may differ from the original only where a named fact fails: it must still run. Real code from
the installed transformers package (BLIP text, CANINE) once kept `attention_mask.to(attention_scores.dtype)` in a
hoisted mask after deleting `attention_scores`, a NameError on every call."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import transformers

from advisor.engine.static import analyze_source

MODELS = Path(transformers.__file__).resolve().parent / "models"


def _modules(family: str, file: str, tmp_path: Path, monkeypatch):
    """The library's module and its --unsafe-fixes rewrite, both importable inside the package."""
    source = (MODELS / family / file).read_text()
    fixed = analyze_source(source, str(MODELS / family / file), unsafe_fixes=True).fixed
    assert fixed != source
    path = tmp_path / f"advisor_{file}"
    path.write_text(fixed)
    name = f"transformers.models.{family}.advisor_{file[:-3]}"  # relative imports resolve in the package
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return importlib.import_module(f"transformers.models.{family}.{file[:-3]}"), module


def _same_outputs(original, patched, kwargs):
    torch.manual_seed(0)
    patched.load_state_dict(original.state_dict())
    with torch.no_grad():
        expected, actual = original(**kwargs)[0], patched(**kwargs)[0]
    return expected, actual


TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=97)


def test_blip_text_unsafe_patch_runs_and_matches(tmp_path, monkeypatch):
    original_module, patched_module = _modules("blip", "modeling_blip_text.py", tmp_path, monkeypatch)
    config = transformers.BlipTextConfig(**TINY, max_position_embeddings=32)
    torch.manual_seed(0)
    original = original_module.BlipTextModel(config, add_pooling_layer=False).eval()
    patched = patched_module.BlipTextModel(config, add_pooling_layer=False).eval()
    input_ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    expected, actual = _same_outputs(original, patched, dict(input_ids=input_ids, attention_mask=mask))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_canine_unsafe_patch_runs_and_matches(tmp_path, monkeypatch):
    original_module, patched_module = _modules("canine", "modeling_canine.py", tmp_path, monkeypatch)
    config = transformers.CanineConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=4, downsampling_rate=2, num_hash_buckets=64,
                                       num_hash_functions=2, local_transformer_stride=4)
    torch.manual_seed(0)
    original = original_module.CanineModel(config).eval()
    patched = patched_module.CanineModel(config).eval()
    input_ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    expected, actual = _same_outputs(original, patched, dict(input_ids=input_ids, attention_mask=mask))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


CHANNEL_MAJOR_INT_MASK = '''
import torch


def attend(q, k, v, attention_mask):
    dots = q.transpose(-2, -1) @ k
    bias = (1 - attention_mask[:, None, None, :]) * -10000
    dots = dots + bias
    return v @ dots.softmax(dim=-1).transpose(-2, -1)
'''


def test_an_int_mask_added_to_scores_of_a_transposed_query_reaches_sdpa_in_the_query_dtype():
    """The fuzzer's channel-major variants: the mask cast reads the dtype of `q` under `q.transpose(-2, -1)`
    (SDPA rejects an int64 attn_mask; eager promotion added it as floats)."""
    fixed = analyze_source(CHANNEL_MAJOR_INT_MASK, "attend.py", unsafe_fixes=True).fixed
    assert "bias.to(q.dtype)" in fixed
    original, patched = {}, {}
    exec(compile(CHANNEL_MAJOR_INT_MASK, "attend.py", "exec"), original)
    exec(compile(fixed, "attend.py", "exec"), patched)
    q, k, v = torch.randn(3, 2, 2, 4, 6).unbind(0)  # (B, H, D, L): channel-major
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    torch.testing.assert_close(patched["attend"](q, k, v, mask), original["attend"](q, k, v, mask))

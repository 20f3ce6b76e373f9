"""PyTorch's own list of real attention shapes (torch/_inductor/fx_passes/fuse_attention.py): every pattern
advisor rewrites must compute what the original computes. Inductor pairs each pattern with an SDPA
replacement, so these are forms the PyTorch team considers plain attention."""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import pytest
import torch

import torch._inductor.fx_passes.fuse_attention as fuse_attention
from advisor.engine.static import analyze_source

SOURCE_PATH = Path(fuse_attention.__file__)
SCALARS = {"inv_scale": 2.5, "inv_scale_factor": 2.5, "scale_factor": 0.4, "dropout_p": 0.0}


def _arguments(parameters, batch: tuple[int, ...], padding_mask: bool = False) -> list:
    """All trailing dims equal, so every permutation a pattern applies keeps the shapes compatible;
    `batch` is (2, 6) for 4-D patterns and (12,) for the bmm ones; `padding_mask`: (batch, keys), which
    DistilBert's pattern views as (bs, 1, 1, k_len)."""
    mask = batch[:1] + (6,) if padding_mask else batch[:1] + (1,) * (len(batch) - 1) + (6, 6)
    tensors = {"query": batch + (6, 6), "key": batch + (6, 6), "value": batch + (6, 6), "attn_mask": mask}
    tensors["attention_mask"] = tensors["attn_mask"]
    out = []
    for name in parameters:
        if name in SCALARS:
            out.append(SCALARS[name])
        elif name == "causal_mask":
            out.append(torch.ones(6, 6, dtype=torch.bool).tril().view((1,) * len(batch) + (6, 6)))
        else:
            out.append(torch.randn(tensors[name]))
    return out


def _load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(f"torch._inductor.fx_passes.{name}")
    module.__file__ = str(SOURCE_PATH)
    module.__package__ = "torch._inductor.fx_passes"  # its relative imports resolve as in the package
    exec(compile(source, str(SOURCE_PATH), "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def rewritten():
    source = SOURCE_PATH.read_text()
    result = analyze_source(source, str(SOURCE_PATH))
    patterns = sorted(f.function for f in result.findings if f.rule == "ADV101")
    return _load(source, "original_patterns"), _load(result.fixed, "rewritten_patterns"), patterns


def test_most_inductor_patterns_are_rewritten(rewritten):
    _, _, patterns = rewritten
    assert len(patterns) >= 15 and all(name.startswith("_sfdp_pattern_") for name in patterns)


def test_each_rewritten_pattern_matches_the_original(rewritten):
    original, candidate, patterns = rewritten
    for name in patterns:
        code = getattr(original, name).__code__
        parameters = code.co_varnames[:code.co_argcount]
        torch.manual_seed(0)
        text = inspect.getsource(getattr(original, name))
        arguments = _arguments(parameters, (12,) if "bmm" in text else (2, 6), "(bs, 1, 1, k_len)" in text)
        expected = getattr(original, name)(*arguments)
        actual = getattr(candidate, name)(*arguments)
        expected, actual = (x[0] if isinstance(x, tuple) else x for x in (expected, actual))
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")

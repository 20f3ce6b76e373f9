"""A mask applied while folded scores are viewed as (b, h, L, S) and viewed back (fairseq, BART, CLIP).

`s.view(b, h, L, S).masked_fill(pad[:, None, None, :], ...)` broadcasts the scores up where the mask has more dims
than the view, and the view back to (b*h, L, S) still works wherever those extra dims are 1 (a batch of one with a
(1, 1, S) padding mask). The patch must then run too, not raise in `expand` (breaker round 56), and give the same
values wherever the original runs; where the extra dims are not 1 both raise. With the padding alone the patch is
safe; with an added bias too it is unsafe (the bias's values may swallow a row), and tried on inputs where every
row keeps a key.
"""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import FIXTURE_ROOT, load_module_from_source

SOURCE = '''
import torch
import torch.nn.functional as F


def attention(q, k, v, pad, bias):
    b, h, L, d = q.shape
    S = k.size(2)
    qq, kk, vv = q.reshape(b * h, L, d), k.reshape(b * h, S, d), v.reshape(b * h, S, d)
    s = torch.bmm(qq, kk.transpose(1, 2)) * d ** -0.5
    s = s.view(b, h, L, S) + bias
    s = s.view(b * h, L, S)
    s = s.view(b, h, L, S).masked_fill(pad[:, None, None, :], float("-inf"))
    s = s.view(b * h, L, S)
    p = F.softmax(s, dim=-1)
    return torch.bmm(p, vv).view(b, h, L, d)
'''


PAD_ONLY = SOURCE.replace("    s = s.view(b, h, L, S) + bias\n    s = s.view(b * h, L, S)\n", "")


def _outcome(function, *args):
    try:
        return function(*args)
    except RuntimeError as error:
        return type(error)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("batch, pad_shape, bias_shape", [
    (1, (1, 1, 7), (1, 1, 1, 5, 7)),  # extra dims of 1: the original runs
    (2, (2, 7), (2, 1, 5, 7)),  # the usual ranks
    (1, (1, 7), (5, 7)),
    (2, (2, 2, 7), (2, 1, 5, 7)),  # an extra dim of 2: the view back raises in the original
])
def test_a_mask_of_more_dims_than_the_view_runs_where_the_original_runs(batch, pad_shape, bias_shape, with_bias):
    source = SOURCE if with_bias else PAD_ONLY
    result = analyze_source(source, "case.py", unsafe_fixes=with_bias)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert "scaled_dot_product_attention" in result.fixed, finding.reason
    assert finding.fix_safety == ("unsafe" if with_bias else "safe")
    name = f"viewed_rank_{with_bias}"
    original = load_module_from_source(source, name).attention
    patched = load_module_from_source(result.fixed, f"{name}_fixed").attention
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, 3, length, 8, dtype=torch.float64, generator=generator)
               for length in (5, 7, 7))
    pad = torch.zeros(pad_shape, dtype=torch.bool)
    pad[..., 5:] = True  # every row keeps keys 0-4
    bias = torch.randn(bias_shape, dtype=torch.float64, generator=generator)
    expected, got = _outcome(original, q, k, v, pad, bias), _outcome(patched, q, k, v, pad, bias)
    if isinstance(expected, type):
        assert got is expected
    else:
        assert not isinstance(got, type), got
        torch.testing.assert_close(got, expected)


def test_the_broadcast_mask_compiles_under_torchscript():
    """The view's sizes are a list, which TorchScript takes (it cannot size a starred tuple of a shape)."""
    fixed = analyze_source(PAD_ONLY, "case.py").fixed
    assert ".new_ones([b, h, L, S]" in fixed
    original = load_module_from_source(PAD_ONLY, "viewed_rank_script").attention
    scripted = torch.jit.script(load_module_from_source(fixed, "viewed_rank_script_fixed").attention)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, length, 8, generator=generator) for length in (5, 7, 7))
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[:, 5:] = True
    torch.testing.assert_close(scripted(q, k, v, pad, torch.zeros(())), original(q, k, v, pad, torch.zeros(())))


def test_a_view_that_infers_a_size_compiles_under_torchscript():
    """Swin's `attn.view(-1, num_win, heads, N, N) + mask`: the scores' shape is built as a list."""
    source = (FIXTURE_ROOT / "positive" / "29_swin_window_mask_view.py").read_text()
    fixed = analyze_source(source, "swin.py", unsafe_fixes=True).fixed
    assert "list(q.shape[:-1]) + [k.shape[-2]]" in fixed
    original_module = load_module_from_source(source, "swin_script")
    patched_module = load_module_from_source(fixed, "swin_script_fixed")
    original, inputs = original_module.make(fully_masked=False)
    patched, _ = patched_module.make(fully_masked=False)
    patched.load_state_dict(original.state_dict())
    scripted = torch.jit.script(patched.eval())
    with torch.no_grad():
        torch.testing.assert_close(scripted(*inputs), original.eval()(*inputs))

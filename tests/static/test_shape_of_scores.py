"""Reads of the score product's shape alone: `mask.expand_as(scores)` (XLM, Flaubert), `bias.reshape_as(scores)`
(SAM's decomposed relative positions), `x.view_as(scores)`. Each method reads only `scores.size()`, a matmul's is
Q's and K's batch dims broadcast then (L, S), so the patch reads it from the SDPA call's Q and K
(`torch.broadcast_shapes`) and the product can go. Each patch runs against the original: fp64 outputs and
gradients, padding rows and a row masked everywhere."""

from __future__ import annotations

import pytest
import torch

from attention_sources import attention_finding_and_fix, fact_names, masked_module
from fixture_models import load_module_from_source

XLM = """
scores = torch.matmul(q / math.sqrt(8), k.transpose(2, 3))
mask = (mask == 0).view(b, 1, 1, -1).expand_as(scores)
scores.masked_fill_(mask, torch.finfo(scores.dtype).min)
weights = F.softmax(scores.float(), dim=-1).type_as(scores)
out = torch.matmul(weights, v)
"""

SAM = """
attn = (q * 0.25) @ k.transpose(-2, -1)
bias = (mask[:, None, :, None] * mask[:, None, None, :]).repeat(1, 2, 1, 1).to(q.dtype).{method}(attn)
attn = attn + bias
out = attn.softmax(dim=-1) @ v
"""


def _parity(source: str, fixed: str, mask: torch.Tensor) -> None:
    """fp32 (the patch's path; 1e-5: the fp32 softmax upcast it drops) and fp64 (NaN where the original's is)."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
        torch.manual_seed(0)
        original = load_module_from_source(source, "shape_case").Attention().to(dtype)
        patched = load_module_from_source(fixed, "shape_case_fixed").Attention().to(dtype)
        patched.load_state_dict(original.state_dict())
        x = torch.randn(3, 5, 16, dtype=dtype)
        results = []
        for model in (original, patched):
            inputs = x.clone().requires_grad_(True)
            out = model(inputs, mask)
            (out * torch.cos(torch.arange(out.numel(), dtype=out.dtype).view(out.shape))).sum().backward()
            results.append([out, inputs.grad] + [p.grad for p in model.parameters()])
        for a, b in zip(*results):
            torch.testing.assert_close(b, a, atol=tol, rtol=tol, equal_nan=True)


def _padding(everywhere: bool) -> torch.Tensor:
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[1, 3:] = 0
    if everywhere:
        mask[2] = 0
    return mask


def test_a_mask_expanded_as_the_product_is_read_from_q_and_k_and_has_its_rank():
    source = masked_module(XLM)
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe", finding.reason
    assert "mask-rank" in fact_names(finding, "proved")
    assert ".expand(torch.broadcast_shapes(" in fixed
    for everywhere in (False, True):
        _parity(source, fixed, _padding(everywhere))


@pytest.mark.parametrize("method", ["reshape_as", "view_as", "expand_as"])
def test_a_bias_shaped_as_the_product_is_read_from_q_and_k(method):
    source = masked_module(SAM.format(method=method))
    finding, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert finding.fixable and fact_names(finding, "assumed") == {"fully-masked-rows"}, finding.reason  # 0/1 bias
    assert f".{method.removesuffix('_as')}(torch.broadcast_shapes(" in fixed
    _parity(source, fixed, _padding(False).double())


def test_the_shape_of_masked_scores_is_not_read_as_the_products():
    """After a mask is added the scores may have broadcast beyond Q's and K's batch dims: not translated."""
    body = SAM.format(method="reshape_as").replace("bias = (", "attn = attn + 0.0 * mask[:, None, None, :]\n"
                                                             "bias = (")
    finding, _ = attention_finding_and_fix(masked_module(body))
    assert "also used" in (finding.reason or ""), finding.reason


def test_a_file_that_fx_traces_keeps_the_product_s_shape_read():
    """torch.fx cannot trace `torch.broadcast_shapes` of Proxy sizes (breaker round 12, bug 13): where the file
    traces its modules the shape read is not translated, and the patched module still traces and matches."""
    source = masked_module(SAM.format(method="expand_as")) + \
        "\n\ndef traced():\n    return torch.fx.symbolic_trace(Attention())\n"
    _, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert "broadcast_shapes" not in fixed
    torch.manual_seed(0)
    model = load_module_from_source(source, "fx_shape").Attention().double()
    twin = load_module_from_source(fixed, "fx_shape_fixed").Attention().double()
    twin.load_state_dict(model.state_dict())
    x, mask = torch.randn(3, 5, 16, dtype=torch.float64), _padding(False).double()
    torch.testing.assert_close(torch.fx.symbolic_trace(twin)(x, mask), model(x, mask))


LLAMA_CHECK = """
attn = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(8)
if attn.size() != (b, {heads}, n, n):
    raise ValueError("attention weights of the wrong size")
attn = attn.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
out = torch.matmul(attn.softmax(dim=-1), v)
"""


def test_the_whole_size_of_a_scaled_matmul_product_is_read_from_q_and_k():
    """LLaMA's and Mistral's (transformers before 4.36) `if attn_weights.size() != (...): raise`, read after the
    product is divided by a number: the check stays and reads Q's and K's shapes, and raises where it raised."""
    source = masked_module(LLAMA_CHECK.format(heads="self.heads"))
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe", finding.reason
    assert "torch.broadcast_shapes(" in fixed and "attn.size()" not in fixed.split("else:")[0]
    _parity(source, fixed, _padding(False))
    wrong = masked_module(LLAMA_CHECK.format(heads="self.heads + 1"))
    _, fixed_wrong = attention_finding_and_fix(wrong)
    x = torch.randn(3, 5, 16)
    for text in (wrong, fixed_wrong):
        with pytest.raises(ValueError, match="wrong size"):
            load_module_from_source(text, "llama_check").Attention()(x, _padding(False))


def test_the_size_of_a_product_scaled_by_a_tensor_is_not_read_as_the_products():
    """A tensor factor may broadcast the scores beyond Q's and K's batch dims: the read stays the scores'."""
    body = "t = torch.ones(1, 1, 1, 1)\n" + LLAMA_CHECK.format(heads="self.heads").replace("/ math.sqrt(8)", "* t")
    finding, _ = attention_finding_and_fix(masked_module(body), unsafe_fixes=True)
    assert "also used" in (finding.reason or ""), finding.reason

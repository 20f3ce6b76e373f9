"""SDPA's output has the original product's values, not always its strides (the CPU kernels lay (B, H, L, E) out as
(B, L, H, E)). A use that reads the strides (a `.view`, `as_strided`, `is_contiguous`), reached through ops that keep
them (elementwise ops, casts, views) or hidden in a helper, a container or an unbound method (a thirteenth breaker's
round), gets `.contiguous()` on the output; the patched module runs and matches the original."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from attention_sources import CAUSAL_BUFFER_BLOCK as SOURCE
from fixture_models import load_module_from_source


STRIDED = {
    "elementwise then view": "y = y * 2.0\n        return y.view(B * self.h, L, C // self.h)",
    "cast then view": "y = y.double()\n        return y.view(B * self.h, L, C // self.h)",
    "helper method": "return self._merge(y)",
    "module function": "return merge(y)",
    "unbound view": "return torch.Tensor.view(y, B * self.h, L, C // self.h)",
    "container": "ys = [y]\n        return ys[0].view(B * self.h, L, C // self.h)",
    "as_strided": "return torch.as_strided(y, (B, L, C), (L * C, C, 1))",
    "is_contiguous": "return y if y.is_contiguous() else y * 0",
    # breaker round 17: a reshape the strides allow is a view of SDPA's output, not a fresh tensor
    "reshape keeping the shape": "return y.reshape(y.shape).view(B * self.h, L, C // self.h)",
}


@pytest.mark.parametrize("use", STRIDED.values(), ids=STRIDED)
def test_a_use_of_the_output_s_strides_gets_a_contiguous_output(use):
    source = SOURCE.format(use=use)
    result = analyze_source(source, "layout.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.reason
    model, twin = _both(source, result.fixed, "layout")
    x = torch.randn(2, 8, 16)
    torch.testing.assert_close(twin(x), model(x))


def _both(source: str, fixed: str, name: str):
    """The original module and the patched one, with the same weights."""
    torch.manual_seed(0)
    model = load_module_from_source(source, name).Attn()
    twin = load_module_from_source(fixed, f"{name}_fixed").Attn()
    twin.load_state_dict(model.state_dict())
    return model, twin


def test_an_output_made_contiguous_by_the_caller_gets_no_copy():
    source = SOURCE.format(use="return y.transpose(1, 2).contiguous().view(B, L, C)")
    fixed = analyze_source(source, "layout.py").fixed
    assert "is_causal=True)" in fixed and "is_causal=True).contiguous()" not in fixed


def test_heads_merged_by_a_reshape_after_the_transpose_get_no_copy():
    """The reshape merging the heads back copies the patch's output as it copies the original's product: no
    `.contiguous()` is added for it (only a reshape right on the output can be a view of SDPA's strides)."""
    source = SOURCE.format(use="return y.transpose(1, 2).reshape(B, L, C)")
    fixed = analyze_source(source, "layout.py").fixed
    assert "is_causal=True)" in fixed and "is_causal=True).contiguous()" not in fixed


@pytest.mark.parametrize("write", ["y.detach().numpy()[..., 0] = 0.0",
                                   "torch.from_numpy(y.detach().numpy()).mul_(0.5)"])
def test_a_write_through_numpy_gets_a_fresh_output(write):
    """Breaker round 17: numpy writes the output behind autograd's version counter, and SDPA's backward reads the
    output it saved (q and k gradients 0.43 apart, silently): the patch's output is a fresh copy there."""
    source = SOURCE.format(use=f"{write}\n        return y")
    result = analyze_source(source, "layout.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert ").clone(memory_format=torch.contiguous_format)" in result.fixed, finding.reason
    model, twin = _both(source, result.fixed, "layout_np")
    x = torch.randn(2, 8, 16)
    model(x).sum().backward()
    twin(x).sum().backward()
    for theirs, ours in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)

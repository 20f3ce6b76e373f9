"""A causal mask changed through a view is no longer causal: `torch.narrow(m.mask, -1, 0, 2).fill_(1)` (a
prefix-LM's first keys made visible to every query), einops' `rearrange(m.mask, ...)`, `mask[:, :p].fill_(1)`,
`m2 = mask[:, :p]; m2 += 1`, a loop over its rows. Each write goes through a value that may share the mask's storage,
which the source shows as clearly as `mask[0] = 1` (breaker round 10, bugs 02-05: up to 5.4 in fp32). Each program
runs original against patch, fp64, values and gradients; none may take `is_causal`."""

from __future__ import annotations

import pytest
import torch

from attention_sources import attention_finding_and_fix
from fixture_models import load_module_from_source

MODEL = '''import math
import einops
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

    def forward(self, x, prefix=2):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        {local}
        att = (q @ k.transpose(-2, -1)) / math.sqrt(4)
        att = att.masked_fill({mask} == 0, float("-inf"))
        return (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)


def build():
    m = Attn()
    {outside}
    return m
'''

BUFFER = "self.mask[:, :, :T, :T]"
LOCAL = "mask = torch.tril(torch.ones(T, T))"


@pytest.mark.parametrize("local, mask, outside", [
    ("pass", BUFFER, "torch.narrow(m.mask, -1, 0, 2).fill_(1)"),
    ("pass", BUFFER, "torch.split(m.mask, 2, dim=-1)[0].fill_(1)"),
    ("pass", BUFFER, "torch.flatten(m.mask)[:16].fill_(1)"),
    ("pass", BUFFER, 'einops.rearrange(m.mask, "a b c d -> (a b c d)")[:16].fill_(1)'),
    ("pass", BUFFER, "b = m.mask\n    torch.narrow(b, -1, 0, 2).fill_(1)"),
    (f"{LOCAL}\n        mask[:, :prefix].fill_(1)", "mask", "pass"),
    (f"{LOCAL}\n        mask.narrow(1, 0, prefix).fill_(1)", "mask", "pass"),
    (f"{LOCAL}\n        torch.narrow(mask, 1, 0, prefix).fill_(1)", "mask", "pass"),
    (f"{LOCAL}\n        m2 = mask[:, :prefix]\n        m2 += 1", "mask", "pass"),
    (f"{LOCAL}\n        first, rest = mask.split([prefix, T - prefix], dim=1)\n        first.fill_(1)", "mask", "pass"),
    (f"{LOCAL}\n        for row in mask:\n            row[:prefix] = 1", "mask", "pass"),
    # breaker round 12: writes the dataflow does not read as statements of their own, followed as every read of
    # the local mask must be (causal.local_value)
    (f"{LOCAL}\n        y = mask.add_(1)", "mask", "pass"),
    (f"{LOCAL}\n        (lambda m: m.fill_(1))(mask)", "mask", "pass"),
    (f"{LOCAL}\n        torch.Tensor.fill_(mask, 1)", "mask", "pass"),
    (f"{LOCAL}\n        mask.__setitem__(0, 1)", "mask", "pass"),
    (f"{LOCAL}\n        y = torch.as_tensor(mask)\n        y.fill_(1)", "mask", "pass"),
    (f"{LOCAL}\n        y = {{'m': mask}}\n        y['m'].fill_(1)", "mask", "pass"),
    (f"{LOCAL}\n        cb = mask.fill_\n        cb(1)", "mask", "pass"),
    (f"{LOCAL}\n        m2 = mask.__getitem__(0)\n        m2.fill_(1)", "mask", "pass"),
], ids=["narrow", "split", "flatten", "einops", "alias", "local-index", "local-method", "local-function",
        "local-alias", "local-unpacked", "local-rows", "nested-in-place", "lambda", "unbound-method", "dunder",
        "as-tensor", "container", "bound-method", "dunder-view"])
def test_a_mask_written_through_a_view_is_not_causal(local, mask, outside):
    source = MODEL.format(local=local, mask=mask, outside=outside)
    finding, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert "is_causal=True" not in fixed, finding.extra.get("facts")
    torch.manual_seed(0)
    original = load_module_from_source(source, "viewed_write").build().double()
    patched = load_module_from_source(fixed, "viewed_write_fixed").build().double()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    results = []
    for model in (original, patched):
        inputs = x.clone().requires_grad_(True)
        out = model(inputs)
        (out * torch.cos(torch.arange(out.numel(), dtype=out.dtype).view(out.shape))).sum().backward()
        results.append([out, inputs.grad] + [p.grad for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-10, equal_nan=True)


def test_names_that_share_no_storage_are_not_aliased():
    """A constant (`else None`), a size (`b, n, c = x.size()`) or a fresh product joins nothing: mask2former's
    `attn_weights += attention_mask` had written q, k and v through `None` and `batch_size`, and lost its patch."""
    import libcst as cst

    from advisor.static.tensor_views import view_aliases

    function = cst.parse_module('''
def forward(self, x, pos=None, mask=None, flag=False):
    x = x.permute(1, 0, 2) if x is not None else None
    b, n, c = x.size()
    q = self.q(x) * 0.5
    k = self._shape(self.k(x), -1, b)
    w = torch.bmm(q, k.transpose(1, 2))
    w += mask
    if flag:
        shown = w.view(b, 2, n, n)
        w = shown.view(b * 2, n, n)
    else:
        shown = None
    return torch.bmm(w.softmax(-1), k), shown
''').body[0]
    aliases = view_aliases(function)
    assert aliases["w"] == {"shown"} and "w" not in aliases.get("k", set()) and "b" not in aliases
    assert "None" not in aliases and aliases["k"] == {"x"}  # a helper of the class may return what it is given


POLARITY = '''import math
import torch
from torch import nn


class Attn(nn.Module):
    def forward(self, q, k, v):
        T = q.size(-2)
        mask = torch.tril(torch.ones(T, T))
        w = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        w = {masking}
        return torch.softmax(w, dim=-1) @ v
'''


@pytest.mark.parametrize("masking, causal", [
    ('w.masked_fill(mask == 0, float("-inf"))', True),
    ('w.masked_fill(mask != 1, float("-inf"))', True),
    ('w.masked_fill(mask <= 0, float("-inf"))', True),
    ('w.masked_fill(mask < 1, float("-inf"))', True),
    ('torch.where(mask == 1.0, w, float("-inf"))', True),
    ('torch.where(mask > 0, w, float("-inf"))', True),
    # breaker round 12: each flip counts once, and a test that is no polarity of a 0/1 mask proves nothing
    ('w.masked_fill(~(mask == 0), float("-inf"))', False),  # masks the lower triangle
    ('w.masked_fill((mask == 0) == 0, float("-inf"))', False),
    ('torch.where(mask != 1, w, float("-inf"))', False),
    ('torch.where(mask <= 0, w, float("-inf"))', False),
    ('torch.where(mask == 0.0, w, float("-inf"))', False),
    ('w.masked_fill(mask > 1, float("-inf"))', False),  # masks nothing
])
def test_the_polarity_of_a_causal_mask_is_read_from_every_flip(masking, causal):
    source = POLARITY.format(masking=masking)
    finding, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert ("is_causal=True" in fixed) == causal, finding.extra.get("facts")
    original = load_module_from_source(source, "polarity").Attn()
    patched = load_module_from_source(fixed, "polarity_fixed").Attn()
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    expected, got = original(q, k, v), patched(q, k, v)
    rows = ~expected.isnan().any(-1)  # a fully masked row: NaN in the original, accepted as 0 where listed
    torch.testing.assert_close(got[rows], expected[rows], atol=1e-10, rtol=1e-10)
    if not rows.all():
        assert "fully-masked-rows" in {f["name"] for f in finding.extra["facts"].get("accepted", [])}

"""Position masks are rewritten only where their positions span the scores' axes. SDPA's `is_causal` is a square
triangle's replacement only where the triangle is the scores' (L, S); `--backend flex` computes a position mask per
(q_idx, kv_idx) only where the positions it was built from span those axes: `arange(n)` as a column is the query position only where n is the query count (an `arange(1)`
column broadcasts position 0 over every row; another length raises in the original), and `ones(a, b)` under a
triangle is (L, S) only where a and b are. Found by attacking the flex patch with a decode step (one query against
a KV cache) and a one-row arange; the patch now checks those lengths before the call and runs the original
where they differ."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

PROJECTIONS = """
import math
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(16, 16)
        self.wk = nn.Linear(16, 16)
        self.wv = nn.Linear(16, 16)

    def forward(self, x, ctx):
        B, L, _ = x.shape
        S = ctx.shape[1]
        q = self.wq(x).view(B, L, 2, 8).transpose(1, 2)
        k = self.wk(ctx).view(B, S, 2, 8).transpose(1, 2)
        v = self.wv(ctx).view(B, S, 2, 8).transpose(1, 2)
{mask}
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(~keep, float("-inf"))
        return torch.matmul(scores.softmax(dim=-1), v)
"""
MASKS = {
    # one row of positions: it broadcasts over every query (position 0), never the query index
    "arange_one_row": """        rows = torch.arange(1, device=q.device)[:, None]
        cols = torch.arange(S, device=q.device)[None, :]
        keep = cols >= rows + 1""",
    # the query positions counted on the keys: right only where L == S (a decode step broadcasts one row)
    "query_count_on_both_axes": """        idx = torch.arange(L, device=q.device)
        keep = idx[None, :] <= idx[:, None]""",
    # a (L, L) triangle against (L, S) scores: a decode step's (1, 1) triangle keeps every key
    "square_triangle": """        keep = torch.tril(torch.ones(L, L, dtype=torch.bool, device=q.device))""",
}


def _outcome(module, seed, lengths):
    torch.manual_seed(seed)
    model = module.Attention()
    x, ctx = (torch.randn(2, n, 16, requires_grad=True) for n in lengths)
    try:
        out = model(x, ctx)
    except RuntimeError as error:
        return type(error)
    out.nan_to_num().pow(2).sum().backward()
    return [out.detach().nan_to_num(), x.grad, ctx.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("form", sorted(MASKS))
def test_position_masks_match_the_original_where_positions_do_not_span_the_axes(form, backend, monkeypatch):
    monkeypatch.setenv("ADVISOR_FLEX_EAGER", "1")
    source = PROJECTIONS.format(mask=MASKS[form])
    result = analyze_source(source, f"{form}.py", backend=backend)
    (finding,) = result.findings
    assert finding.fix_safety == "safe" and finding.extra["emission"]["emitted"] == backend, finding.reason
    original = load_module_from_source(source, f"{form}_original")
    patched = load_module_from_source(result.fixed, f"{form}_flex")
    for lengths in ((5, 5), (1, 5), (3, 5), (1, 1)):
        want, got = _outcome(original, 0, lengths), _outcome(patched, 0, lengths)
        if not isinstance(want, list):
            assert got is want, (lengths, got)
            continue
        for expected, actual in zip(want, got, strict=True):
            assert torch.allclose(actual.nan_to_num(), expected.nan_to_num(), atol=1e-5), lengths  # NaN rows: 0 (accepted)

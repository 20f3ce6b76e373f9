"""One triangle reader serves the matcher's causal proof and the flash backend's bottom-right check: every
spelling either of them accepted reads as the same triangle, and nothing else does."""

from __future__ import annotations

import libcst as cst
import pytest
import torch

from advisor.engine.static import analyze_source

from advisor.patterns.attention.causal import triangle
from advisor.static.module_index import ParsedModule
from fixture_models import load_module_from_source


def _read(expression: str) -> str | None:
    parsed = ParsedModule(f"import torch\nmask = {expression}\n", "model.py")
    statement = parsed.module.body[1].body[0]
    assert isinstance(statement, cst.Assign)
    return triangle(parsed, statement.value)


@pytest.mark.parametrize(("expression", "expected"), [
    ("torch.tril(torch.ones(n, n))", "lower"),
    ("torch.tril(torch.ones((n, n)), diagonal=0)", "lower"),
    ("torch.tril(torch.ones([n, n]), 0)", "lower"),
    ("torch.ones(n, n).tril()", "lower"),
    ("torch.ones(n, n).tril_()", "lower"),
    ("torch.tril(torch.ones(n, n)).view(1, 1, n, n)", "lower"),
    ("torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None, :, :]", "lower"),
    # expanded to leading sizes other than 1, it may broadcast the scores up in the original (breaker round 12)
    ("torch.ones(n, n).tril().long().unsqueeze(0).expand(b, n, n)", None),
    ("torch.ones(n, n).tril().long().unsqueeze(0).expand(1, n, n)", "lower"),
    ("torch.tril(torch.ones(n, n)).to(torch.uint8).half()", "lower"),
    ("torch.triu(torch.ones(n, n), diagonal=1)", "upper"),
    ("torch.ones(n, n).triu(1).bool()", "upper"),
    ("torch.ones(n, n).triu_(diagonal=1)", "upper"),
    ("torch.tril(torch.ones(n, m))", None),  # not square
    ("torch.tril(torch.ones(n, n), diagonal=1)", None),  # keeps the next key too
    ("torch.triu(torch.ones(n, n))", None),  # masks the diagonal
    ("torch.tril(torch.rand(n, n))", None),  # not ones
    ("torch.tril(torch.ones(n, n)).cumsum(0)", None),  # changes the values
    ("torch.tril(torch.ones(n, n))[1:, :]", None),  # drops a row
    ("mask.tril()", None),  # not built here
    ("torch.tril(torch.ones(n, n)).reshape(-1, n, n).expand(b, h, -1, -1)", None),
    ("torch.tril(torch.ones(n, n)).reshape(-1, n, n).expand(-1, -1, -1)", "lower"),
    ("torch.tril(torch.ones(8, 8)).view(1, 1, 4, 16)", None),  # the same values, another mask
    ("torch.tril(torch.ones(n, n)).view(n, 1, n)", None),
    ("torch.tril(torch.ones(n, n))[:, None]", None),  # (n, 1, n): rows are no longer the second-to-last dim
    ("torch.tril(torch.ones(n, n))[None, :, None]", None),
    ("torch.tril(torch.ones(n, n)).unsqueeze(-1)", None),
    ("torch.tril(torch.ones(n, n)).unsqueeze(1)", None),
    ("torch.tril(torch.ones(n, n)).expand(b, m, m)", None),  # only a 1 x 1 triangle expands to m x m: all ones
])
def test_triangle_of_ones(expression, expected):
    """'lower' keeps keys up to the query's position, 'upper' masks the keys after it; None is no triangle."""
    assert _read(expression) == expected


ADDED_MASK = '''import torch
from torch import nn


{helper}


class Attention(nn.Module):
    def __init__(self, n=6):
        super().__init__()
        self.register_buffer("causal", {built}, persistent=False)

    def forward(self, q, k, v):
        L, S = q.size(-2), k.size(-2)
        w = (q @ k.transpose(-2, -1) + self.causal{sliced}).softmax(dim=-1)
        return w @ v
'''
HELPER = '''def build(n):
    mask = torch.empty(n, n)
    mask.fill_(float("-inf"))
    mask.triu_(1)
    return mask'''


@pytest.mark.parametrize(("helper", "built", "sliced", "proved"), [
    ("", 'torch.full((n, n), float("-inf")).triu(1)', "", True),
    ("", 'torch.triu(torch.full([n, n], -float("inf")), diagonal=1)', "[:L, :S]", True),
    ("", 'torch.empty(n, n).fill_(float("-inf")).triu_(1)', "[S - L:S, :S]", True),
    (HELPER, "build(n)", "", True),  # CLIP's build_attention_mask
    ("", 'torch.full((n, n), float("-inf")).triu(0)', "", False),  # masks the diagonal: row 0 keeps nothing
    ("", 'torch.full((n, n), -1e9).triu(1)', "", True),  # a finite fill: each row keeps key 0 at 0 all the same
    ("", 'torch.full((n, n), -1e9).triu(0)', "", False),  # the finite fill on the diagonal too: row 0 swallowed
    ("", 'torch.empty(n, n).triu_(1)', "", False),  # never filled: any values
    ("", 'torch.full((n, n), float("-inf")).triu(1)', "[:L, 1:S]", False),  # drops key 0
    (HELPER.replace("    mask.triu_(1)\n", "    mask.triu_(1)\n    mask[0] = float('-inf')\n"), "build(n)", "",
     False),  # a write the fold does not read
    (HELPER.replace("mask.triu_(1)", "mask.tril_(-1)"), "build(n)", "", False),  # the other triangle
    # breaker round 18: the key index compared with the query index (a module-level `BIAS` of a reach census)
    ("", "(torch.arange(n)[None, :] > torch.arange(n)[:, None]) * -1e9", "[:L, :S]", True),
    ("", "(torch.arange(n).unsqueeze(-1) < torch.arange(n)).float() * -1e9", "", True),
    ("", 'torch.where(torch.arange(n)[None, :] > torch.arange(n)[:, None], float("-inf"), 0.0)', "", True),
    ("", "(torch.arange(n)[None, :] >= torch.arange(n)[:, None]) * -1e9", "", False),  # the diagonal too
    ("", "(torch.arange(n)[None, :] > torch.arange(n + 1)[:, None]) * -1e9", "", False),  # not square
    ("", "(torch.arange(n)[None, :] > torch.arange(n)[None, :]) * -1e9", "", False),  # two key indices
])
def test_an_added_neginf_triangle_keeps_the_first_key(helper, built, sliced, proved):
    """An added buffer of -inf strictly above the diagonal (0 elsewhere) keeps key 0 in every row: the patch is
    safe without assuming anything about fully masked rows. Anything else added leaves that fact assumed."""
    from advisor.engine.static import analyze_source

    source = ADDED_MASK.format(helper=helper, built=built, sliced=sliced)
    (finding,) = [f for f in analyze_source(source, "model.py").findings if f.kind == "attention"]
    facts = finding.extra["facts"]
    assert ("fully-masked-rows" in {f["name"] for f in facts["proved"]}) == proved, finding.reason
    if proved:
        import torch

        fixed = analyze_source(source, "model.py", unsafe_fixes=True).fixed  # the buffer's dtype is not visible
        assert "scaled_dot_product_attention" in fixed and "fully-masked-rows" not in {
            f["name"] for f in facts["assumed"]}

        from fixture_models import load_module_from_source

        q, k, v = (torch.randn(2, 3, 6, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
        outputs = [load_module_from_source(code, f"added_{i}").Attention()(q, k, v)
                   for i, code in enumerate((source, fixed))]
        torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)


REGISTERED = '''import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, n=6):
        super().__init__()
{build}
        self.register_buffer("causal", mask)

    def forward(self, q, k, v):
        L, S = q.size(-2), k.size(-2)
        w = (q @ k.transpose(-2, -1) + self.causal[:, :, :L, :S]).softmax(dim=-1)
        return w @ v
{extra}'''


@pytest.mark.parametrize(("build", "extra", "proved"), [
    # llama2.c: the buffer built through a local rebound from itself, a stack of squares
    ('mask = torch.full((1, 1, n, n), float("-inf"))\nmask = torch.triu(mask, diagonal=1)', "", True),
    ('mask = torch.full((1, 1, n, n), float("-inf")).triu(1)', "", True),
    ('mask = torch.full((1, 1, n, n), float("-inf"))\nmask = torch.triu(mask, diagonal=1)\n'
     'mask[..., 0] = float("-inf")', "", False),  # key 0 masked after it is built: row 0 keeps nothing
    ('mask = torch.full((1, 1, n, n), float("-inf"))\nmask = mask.triu(1)\nmask.fill_(float("-inf"))', "", False),
    ('mask = torch.full((1, 1, n, n), float("-inf"))\nif n > 4:\n    mask = torch.triu(mask, diagonal=1)', "",
     False),  # all -inf where n <= 4
    ('mask = torch.full((1, 1, n, n), float("-inf"))\nmask = torch.triu(mask, diagonal=1)',
     '\n    def block_first_key(self):\n        self.causal[..., 0] = float("-inf")\n', False),
    ('mask = torch.full((1, 1, n, n + 1), float("-inf"))\nmask = torch.triu(mask, diagonal=1)', "", False),
])
def test_a_buffer_registered_from_a_local_is_read_where_the_local_is_built(build, extra, proved):
    """`self.register_buffer("mask", mask)` after `mask = torch.full(...)` and `mask = torch.triu(mask, 1)`: the
    buffer is what the local holds at that read, read through its assignments as long as no other read of the
    local, nor the class, writes it."""
    from advisor.engine.static import analyze_source

    body = "\n".join("        " + line for line in build.splitlines())
    source = REGISTERED.format(build=body, extra=extra)
    (finding,) = [f for f in analyze_source(source, "model.py").findings if f.kind == "attention"]
    facts = finding.extra["facts"]
    assert ("fully-masked-rows" in {f["name"] for f in facts["proved"]}) == proved, finding.reason
    if not proved:
        assert "fully-masked-rows" in {f["name"] for f in facts["assumed"]}
        return
    from unittest import mock

    import torch

    from fixture_models import load_module_from_source

    assert finding.fix_safety == "safe", finding.reason  # the buffer's dtype is checked where the patch runs
    fixed = analyze_source(source, "model.py").fixed
    modules = [load_module_from_source(code, f"registered_{i}").Attention() for i, code in enumerate((source, fixed))]
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
        inputs = [torch.randn(2, 3, 6, 4, generator=torch.Generator().manual_seed(i), dtype=dtype,
                              requires_grad=True) for i in range(3)]
        results = []
        for module in modules:
            with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention",
                                   wraps=torch.nn.functional.scaled_dot_product_attention) as sdpa:
                out = module.to(dtype)(*inputs)
            assert sdpa.call_count == (module is modules[1])  # the patch takes SDPA on these inputs
            results.append((out, torch.autograd.grad(out.square().sum(), inputs)))
        torch.testing.assert_close(results[1][0], results[0][0], atol=tolerance, rtol=tolerance)
        for got, want in zip(results[1][1], results[0][1]):
            torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    assert "scaled_dot_product_attention" in fixed


def test_a_triangle_viewed_as_another_shape_is_not_causal():
    """An 8 x 8 triangle viewed as (1, 1, 4, 16) lets row i see keys 0..2i: never `is_causal`."""
    from attention_sources import attention_finding_and_fix
    from fixture_models import load_module_from_source
    import torch

    source = '''import math
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 1, 4, 16))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(4)
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        return (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
'''
    finding, fixed = attention_finding_and_fix(source, unsafe_fixes=True)
    assert "is_causal=True" not in fixed
    torch.manual_seed(0)
    original = load_module_from_source(source, "viewed_triangle").Attn().double()
    patched = load_module_from_source(fixed, "viewed_triangle_fixed").Attn().double()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    torch.testing.assert_close(patched(x), original(x), atol=1e-10, rtol=1e-10)


RANKED = '''import math
import torch
from torch import nn


class Attn(nn.Module):
    def forward(self, q, k, v):
        q, k, v = q.view(1, 4, 5, 4), k.view(1, 4, 5, 4), v.view(1, 4, 5, 4)
        T = q.size(-2)
        mask = {mask}
        w = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        w = w.masked_fill(mask == 0, float("-inf"))
        return torch.softmax(w, dim=-1) @ v
'''


@pytest.mark.parametrize("mask, causal", [
    ("torch.tril(torch.ones(T, T))[None, None]", True),
    ("torch.tril(torch.ones(T, T))[None, None, None]", False),  # 5-D: the original's weights are 5-D
    ("torch.tril(torch.ones(T, T)).view(1, 1, 1, T, T)", False),
])
def test_a_causal_mask_of_more_dims_than_the_scores_is_not_is_causal(mask, causal):
    """`is_causal` drops the mask; the original broadcasts the scores up to a mask of more dims (breaker round 12,
    bug 12: 5-D weights against the patch's 4-D; a larger leading size, `expand(3, 1, T, T)`, is no triangle:
    test_triangle_of_ones)."""
    source = RANKED.format(mask=mask)
    result = analyze_source(source, "ranked.py")
    assert ("is_causal=True" in result.fixed) == causal
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    expected = load_module_from_source(source, "ranked").Attn()(q, k, v)
    got = load_module_from_source(result.fixed, "ranked_fixed").Attn()(q, k, v)
    torch.testing.assert_close(got, expected)


BUFFER_OF_FOUR_DIMS = '''import math
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return att.softmax(dim=-1) @ v
'''


@pytest.mark.parametrize("shape", [(2, 2, 5, 4), (4, 5, 4)], ids=["4-D", "heads folded, 3-D"])
def test_a_causal_buffer_of_more_dims_than_scores_of_unknown_rank_is_checked_at_run_time(shape):
    """q, k, v of any rank: the causal-extent check compares the buffer's dims with q's, so 3-D scores, which the
    4-D buffer broadcasts up to 4-D in the original, run the original."""
    result = analyze_source(BUFFER_OF_FOUR_DIMS, "buffer.py")
    assert "is_causal=True" in result.fixed and ".dim() <= q.dim()" in result.fixed
    q, k, v = (torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    expected = load_module_from_source(BUFFER_OF_FOUR_DIMS, "buffer").Attn()(q, k, v)
    got = load_module_from_source(result.fixed, "buffer_fixed").Attn()(q, k, v)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)

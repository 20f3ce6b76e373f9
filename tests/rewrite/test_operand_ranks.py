"""Operands of the ranks their products take (`operand-rank`): bmm and baddbmm raise unless both factors are 3-D, an
einsum without `...` unless each operand has one dim per subscript; SDPA broadcasts any batch dims, so a 4-D input
gave values after the patch where the original raised (breaker round 19b, bugs 25 and 35). Stated ranks prove the
fact; others are checked (`q.dim() == 3`), the original running and raising where the check fails."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

FORMS = {
    "bmm": ("def attend(q, k, v):\n    s = torch.bmm(q, k.transpose(1, 2)) * 0.125\n"
            "    return torch.bmm(s.softmax(dim=-1), v)\n", 3),
    "baddbmm": ("def attend(q, k, v):\n"
                "    s = torch.baddbmm(torch.zeros(1, 1, 1, dtype=q.dtype), q, k.transpose(1, 2), alpha=0.125)\n"
                "    return torch.bmm(s.softmax(dim=-1), v)\n", 3),
    "einsum": ("def attend(q, k, v):\n    s = torch.einsum('bhid,bhjd->bhij', q, k) * 0.125\n"
               "    return torch.einsum('bhij,bhjd->bhid', s.softmax(dim=-1), v)\n", 4),
    "einsum_on_scaled": ("def attend(q, k, v):\n    s = torch.einsum('bid,bjd->bij', q * 0.125, k.float())\n"
                         "    return torch.einsum('bij,bjd->bid', s.softmax(dim=-1), v.float())\n", 3),
}


def _finding(source: str):
    [finding] = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    return finding


def _states(finding) -> dict[str, str]:
    return {fact["name"]: state for state, facts in finding.extra["facts"].items() for fact in facts}


def _outcome(function, *args):
    try:
        return function(*args)
    except (RuntimeError, IndexError) as error:
        return type(error)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_unstated_ranks_are_checked_and_other_ranks_raise_as_the_original(form):
    body, rank = FORMS[form]
    source = "import torch\n\n\n" + body
    finding = _finding(source)
    assert finding.fix_safety == "safe" and _states(finding)["operand-rank"] == "guarded", finding.reason
    original = load_module_from_source(source, f"rank_{form}")
    patched = load_module_from_source(analyze_source(source, "case.py").fixed, f"rank_{form}_fixed")
    make = torch.Generator().manual_seed(0)
    for dims in (rank, rank + 1, rank - 1):
        shape = (2, 3, 5, 8)[-dims:] if dims <= 4 else (2, 2, 3, 5, 8)
        q, k, v = (torch.randn(*shape, dtype=torch.float64, generator=make) for _ in range(3))
        expected, got = _outcome(original.attend, q, k, v), _outcome(patched.attend, q, k, v)
        if isinstance(expected, type) or isinstance(got, type):
            assert got is expected, (dims, got, expected)
        else:
            torch.testing.assert_close(got, expected)


def test_stated_ranks_prove_the_fact():
    source = '''import torch
from einops import rearrange


def attend(x, h):
    q, k, v = (rearrange(t, "b n (h d) -> (b h) n d", h=h) for t in x.chunk(3, dim=-1))
    q, k, v = rearrange(q, "b n d -> b n d"), rearrange(k, "b n d -> b n d"), rearrange(v, "b n d -> b n d")
    s = torch.bmm(q, k.transpose(1, 2)) * 0.125
    return torch.bmm(s.softmax(dim=-1), v)
'''
    finding = _finding(source)
    assert _states(finding)["operand-rank"] == "proved", finding.extra["facts"]
    assert "dim() ==" not in (analyze_source(source, "case.py").fixed or "")


def test_matmul_takes_any_batch_dims_and_needs_no_such_fact():
    source = "import torch\n\n\ndef attend(q, k, v):\n    return (q @ k.transpose(-2, -1)).softmax(-1) @ v\n"
    assert "operand-rank" not in _states(_finding(source))


def test_an_einsum_broadcasting_a_size_one_axis_is_a_loud_failure_accepted():
    """Breaker round 20 (bug 09): an einsum broadcasts a key head dim of 1 against the query's 8, SDPA raises: the
    patch names that as accepted (a failure on inputs no attention takes, never another value)."""
    body, _ = FORMS["einsum"]
    source = "import torch\n\n\n" + body
    finding = _finding(source)
    assert _states(finding)["einsum-broadcast"] == "accepted"
    original = load_module_from_source(source, "einsum_broadcast")
    patched = load_module_from_source(analyze_source(source, "case.py").fixed, "einsum_broadcast_fixed")
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 1), torch.randn(2, 3, 6, 8)
    assert isinstance(original.attend(q, k, v), torch.Tensor)
    with pytest.raises(RuntimeError):
        patched.attend(q, k, v)


DROPPED_INPUT = {
    "parameter": "def attend(q, k, v, bias):\n"
                 "    s = torch.baddbmm(bias, q, k.transpose(-1, -2), beta=0, alpha=0.125)\n"
                 "    return s.softmax(dim=-1) @ v\n",
    "sizes_of_other_axes": "def attend(q, k, v, bias=None):\n"
                           "    bias = torch.empty(q.shape[0], q.shape[1], q.shape[1], dtype=q.dtype)\n"
                           "    s = torch.baddbmm(bias, q, k.transpose(-1, -2), beta=0, alpha=0.125)\n"
                           "    return s.softmax(dim=-1) @ v\n",
}
SCORES_SIZED = {  # diffusers' get_attention_scores, and forms of it
    "diffusers": "bias = torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype, device=q.device)",
    "tuple_and_broadcast": "bias = torch.zeros((q.size(0), 1, k.size(-2)), dtype=q.dtype)",
    "two_dims": "bias = torch.zeros(q.shape[-2], k.shape[-2], dtype=q.dtype)",
    "upcast_query": "if q.dtype == torch.float16:\n        q = q.float()\n    "
                    "bias = torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype)",
}


@pytest.mark.parametrize("form", sorted(DROPPED_INPUT))
def test_a_dropped_baddbmm_input_of_another_shape_raises_as_the_original(form):
    """baddbmm checks its input's shape even at beta=0; the patch drops the input, so where the source does not
    size it as the scores the patch checks the shape (a broadcast one runs the original, whose values it keeps)."""
    source = "import torch\n\n\n" + DROPPED_INPUT[form]
    finding = _finding(source)
    assert finding.fix_safety == "safe" and _states(finding)["baddbmm-input"] == "guarded", finding.reason
    original = load_module_from_source(source, f"dropped_{form}")
    patched = load_module_from_source(analyze_source(source, "case.py").fixed, f"dropped_{form}_fixed")
    make = torch.Generator().manual_seed(1)
    q, v = torch.randn(2, 4, 8, generator=make), torch.randn(2, 6, 8, generator=make)
    for k_length, bias_shape in ((6, (2, 4, 6)), (6, (2, 4, 5)), (6, (3, 4, 6)), (6, (4, 6)), (4, (2, 4, 4))):
        k, bias = torch.randn(2, k_length, 8, generator=make), torch.zeros(bias_shape)
        expected, got = _outcome(original.attend, q, k, v, bias), _outcome(patched.attend, q, k, v, bias)
        if isinstance(expected, type) or isinstance(got, type):
            assert got is expected, (k_length, bias_shape, got, expected)
        else:
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("form", sorted(SCORES_SIZED))
def test_an_input_sized_as_the_scores_proves_the_fact(form):
    source = ("import torch\n\n\ndef attend(q, k, v):\n    " + SCORES_SIZED[form] +
              "\n    s = torch.baddbmm(bias, q, k.transpose(-1, -2), beta=0, alpha=0.125)\n"
              "    return s.softmax(dim=-1) @ v\n")
    finding = _finding(source)
    assert finding.fix_safety == "safe" and _states(finding)["baddbmm-input"] == "proved", finding.reason
    original = load_module_from_source(source, f"sized_{form}")
    patched = load_module_from_source(analyze_source(source, "case.py").fixed, f"sized_{form}_fixed")
    q, k, v = (torch.randn(2, n, 8, generator=torch.Generator().manual_seed(n)) for n in (4, 6, 6))
    torch.testing.assert_close(patched.attend(q, k, v), original.attend(q, k, v))


BATCHES = {"k and v": ((6, 5, 8), (1, 6, 8), (1, 6, 8)), "v": ((6, 5, 8), (6, 6, 8), (1, 6, 8)),
           "q": ((1, 5, 8), (6, 6, 8), (6, 6, 8)), "equal": ((6, 5, 8), (6, 6, 8), (6, 6, 8))}


@pytest.mark.parametrize("form", ["bmm", "baddbmm"])
@pytest.mark.parametrize("batches", sorted(BATCHES))
def test_a_batch_of_one_raises_as_the_original_where_sdpa_would_broadcast_it(form, batches):
    """`bmm-batch` (breaker round 47): bmm and baddbmm raise unless their factors share the batch size."""
    source = "import torch\n\n\n" + FORMS[form][0]
    finding = _finding(source)
    assert finding.fix_safety == "safe" and _states(finding)["bmm-batch"] == "guarded", finding.reason
    original = load_module_from_source(source, f"batch_{form}")
    patched = load_module_from_source(analyze_source(source, "case.py").fixed, f"batch_{form}_fixed")
    make = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, dtype=torch.float64, generator=make) for shape in BATCHES[batches])
    expected, got = _outcome(original.attend, q, k, v), _outcome(patched.attend, q, k, v)
    assert (expected is RuntimeError) == (batches != "equal")
    if isinstance(expected, type) or isinstance(got, type):
        assert got is expected
    else:
        torch.testing.assert_close(got, expected)


def test_batches_from_one_size_prove_the_fact():
    source = '''import torch


def attend(x, mem):
    bh, n, d = x.shape
    q = x.view(bh, n, d)
    k = mem.view(bh, -1, d)
    v = mem.view(bh, -1, d)
    s = torch.bmm(q, k.transpose(1, 2)) * 0.125
    return torch.bmm(s.softmax(dim=-1), v)


def apart(x, mem, kv_bh):
    bh, n, d = x.shape
    q = x.view(bh, n, d)
    k = mem.view(kv_bh, -1, d)
    v = mem.view(kv_bh, -1, d)
    s = torch.bmm(q, k.transpose(1, 2)) * 0.125
    return torch.bmm(s.softmax(dim=-1), v)


def passed(x, mem, bh, n, d):  # a parameter may hold an object whose `__index__` answers each reshape anew
    q = x.view(bh, n, d)
    k = mem.view(bh, -1, d)
    v = mem.view(bh, -1, d)
    s = torch.bmm(q, k.transpose(1, 2)) * 0.125
    return torch.bmm(s.softmax(dim=-1), v)
'''
    tied, apart, passed = (f for f in analyze_source(source, "case.py").findings if f.kind == "attention")
    assert _states(tied)["bmm-batch"] == "proved" and _states(apart)["bmm-batch"] == "guarded"
    assert _states(passed)["bmm-batch"] == "guarded"
    assert analyze_source(source, "case.py").fixed.count("q.shape[:1] == k.shape[:1] == v.shape[:1]") == 2

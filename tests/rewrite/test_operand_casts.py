"""Casts on Q·K^T's operands (`q.float() @ k.float().mT`, an fp32 upcast written on the inputs): the patch once
kept them on q and k and gave SDPA an uncast v, so it raised on bf16 inputs where the original ran. The casts now
go with the block like a cast of the scores, and q, k and v sharing a dtype is checked where the product no
longer ties them."""

from __future__ import annotations

import textwrap

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

CAST_BACK = textwrap.dedent('''\
    import torch


    def attend(q, k, v):
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) / 8.0
        p = torch.softmax(s, dim=-1).to(q.dtype)
        return torch.matmul(p, v)
    ''')
UPCAST_ONLY = textwrap.dedent('''\
    import torch


    def attend(q, k, v):
        s = (q.float() * 0.125) @ k.float().mT
        return s.softmax(dim=-1) @ v
    ''')
EINSUM = textwrap.dedent('''\
    import torch


    def attend(q, k, v):
        s = torch.einsum("bhid,bhjd->bhij", q.to(torch.float32), k.to(torch.float32)) * 0.125
        return torch.einsum("bhij,bhjd->bhid", s.softmax(-1).type_as(v), v)
    ''')


ALL_THREE = textwrap.dedent('''\
    import torch


    def attend(q, k, v):
        s = (q.float() @ k.float().transpose(-2, -1)) * 0.125
        return (s.softmax(dim=-1) @ v.float()).to(q.dtype)
    ''')


def _patched(source: str) -> tuple[object, object, str]:
    result = analyze_source(source, "casts.py")
    safe = [f for f in result.findings if f.kind == "attention" and f.fixable and f.fix_safety == "safe"]
    assert safe, [(f.rule, f.fix_safety, f.reason) for f in result.findings]
    fixed = result.fixed_with(safe).text
    return (load_module_from_source(source, "casts_original").attend,
            load_module_from_source(fixed, "casts_patched").attend, fixed)


def _inputs(*dtypes: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randn(2, 3, 6, 16, generator=generator).to(dtype) for dtype in dtypes]


@pytest.mark.parametrize("source", [CAST_BACK, UPCAST_ONLY, EINSUM], ids=["cast-back", "upcast-only", "einsum"])
def test_the_patch_gives_sdpa_the_uncast_operands_and_checks_their_dtypes(source):
    _, _, fixed = _patched(source)
    assert "scaled_dot_product_attention(q, k, v" in fixed
    assert ".dtype == k.dtype == v.dtype" in fixed


@pytest.mark.parametrize("source", [CAST_BACK, EINSUM], ids=["cast-back", "einsum"])
@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 2e-2), (torch.float32, 1e-5), (torch.float64, 1e-5)])
def test_one_input_dtype_takes_sdpa_with_the_original_values(source, dtype, tol):
    original, patched, _ = _patched(source)
    args = _inputs(dtype, dtype, dtype)
    want, got = original(*args), patched(*args)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_float64_inputs_hold_gradients_to_the_original():
    original, patched, _ = _patched(CAST_BACK)
    grads = []
    for attend in (original, patched):
        args = [x.requires_grad_() for x in _inputs(torch.float64, torch.float64, torch.float64)]
        out = attend(*args)
        grads.append((out, *torch.autograd.grad(out.square().sum(), args)))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # the original rounds through float32


@pytest.mark.parametrize("source, dtypes", [
    (CAST_BACK, (torch.bfloat16, torch.float32, torch.bfloat16)),  # k of another dtype: the original runs
    (UPCAST_ONLY, (torch.bfloat16, torch.bfloat16, torch.float32)),  # v float32, q and k not: the original runs
    (EINSUM, (torch.float16, torch.bfloat16, torch.float16)),
], ids=["k-other", "v-float32", "einsum-k-other"])
def test_mixed_input_dtypes_run_the_original_block(source, dtypes):
    original, patched, _ = _patched(source)
    args = _inputs(*dtypes)
    want = original(*args)
    torch.testing.assert_close(patched(*args), want, atol=0, rtol=0)


def test_q_k_and_v_cast_alike_keep_their_casts_and_need_no_guard():
    """All three computed in float32 in the original: SDPA gets them cast and computes in float32 too, for any input
    dtype (stripping the operands' casts would leave SDPA only the float32 inputs, behind a dtype guard)."""
    original, patched, fixed = _patched(ALL_THREE)
    call = "".join(fixed.split())  # the call may be laid out over lines
    assert "scaled_dot_product_attention(q.float(),k.float(),v.float()" in call and "dtype ==" not in fixed
    for dtype, tol in ((torch.bfloat16, 1e-2), (torch.float16, 1e-3), (torch.float64, 1e-5)):
        args = _inputs(dtype, dtype, dtype)
        want, got = original(*args), patched(*args)
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_integer_inputs_run_the_original():
    """The original casts int64 operands to float32 and the weights back; SDPA takes floats only (a guard)."""
    original, patched, fixed = _patched(CAST_BACK.replace("p = torch.softmax(s, dim=-1).to(q.dtype)",
                                                          "p = torch.softmax(s, dim=-1).to(v.dtype)"))
    assert "q.is_floating_point()" in fixed
    args = [torch.randint(-3, 3, (2, 3, 6, 16)) for _ in range(3)]
    torch.testing.assert_close(patched(*args), original(*args), atol=0, rtol=0)


@pytest.mark.parametrize("product", ["q.float() @ (k.float() * 0.25).transpose(-2, -1)",
                                     "q.type(torch.float32) @ k.type(torch.float32).transpose(-2, -1)"])
def test_a_cast_left_inside_an_operand_is_named_by_the_dtype_fact(product):
    """Where a cast stays on an operand (inside a scaled one, a spelling not stripped), SDPA gets the operands as
    written: the fact names them, so it fails where the patch would raise (bf16 inputs)."""
    source = CAST_BACK.replace("torch.matmul(q.float(), k.float().transpose(-1, -2)) / 8.0", f"({product}) / 8.0")
    [finding] = [f for f in analyze_source(source, "casts.py").findings if f.kind == "attention"]
    facts = {fact["name"]: fact["statement"] for group in finding.extra["facts"].values() for fact in group}
    assert "`q" in facts["qkv-dtype"] and "`v` have one dtype" in facts["qkv-dtype"], facts


def test_operand_casts_to_two_dtypes_are_kept_where_the_original_always_raises():
    """`q.float() @ k.double().mT` raises on every input; stripping both casts gave SDPA one dtype, and a patch that
    returned a tensor (bug_19). Casts to two dtypes stay on the operands, so the patch raises as the original does."""
    source = CAST_BACK.replace("q.float(), k.float()", "q.float(), k.double()")
    result = analyze_source(source, "casts.py", unsafe_fixes=True)
    [finding] = [f for f in result.findings if f.kind == "attention"]
    fixed = result.fixed_with([finding]).text
    assert "scaled_dot_product_attention(q, k, v" not in fixed
    original = load_module_from_source(source, "casts_two_original").attend
    patched = load_module_from_source(fixed, "casts_two_patched").attend
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        args = _inputs(dtype, dtype, dtype)
        for attend in (original, patched):
            with pytest.raises(RuntimeError):
                attend(*args)

"""The `advisor_flex_attention` helper, executed from its pasted source as a user's module would run it.

The eager path (ADVISOR_FLEX_EAGER=1) against hand-written attention and SDPA with gradients, and against torch's
own flex_attention; the BlockMask cache; the fallback when torch.compile raises; one small test that the compiled
path compiles once for a repeated shape. Elsewhere torch.compile is replaced by identity, so flex_attention runs
its uncompiled implementation and no test but the last one compiles.
"""

from __future__ import annotations

import math
import time
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import flex_attention as flex_module

from advisor.rewrite.flex_prelude import HELPER_NAME, prelude_source

TOL = 1e-5
pytestmark = [pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
              pytest.mark.filterwarnings("ignore:advisor_flex_attention. FlexAttention has no backward")]


def load_helper(torch_name: str = "torch") -> dict:
    """The namespace a patched module has after its prelude ran: torch under the user's spelling, then the helper."""
    namespace = {torch_name: torch}
    exec(compile(prelude_source(torch_name), "<advisor prelude>", "exec"), namespace)
    return namespace


def qkv(batch=2, heads=2, length=256, dim=16, kv_heads=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, length, dim)] + [(batch, kv_heads or heads, length, dim)] * 2
    return [torch.randn(s, generator=generator, requires_grad=True) for s in shapes]


def soft_cap(score, b, h, q_idx, kv_idx):
    return 20.0 * torch.tanh(score / 20.0)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 64)


def hand_written_soft_cap(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return torch.softmax(20.0 * torch.tanh(scores / 20.0), dim=-1) @ v


def dense_mask(mask_mod, length):
    index = torch.arange(length)
    return mask_mod(None, None, index[:, None], index[None, :])


def assert_parity(helper, inputs, reference, **mods):
    """The helper's eager path against the reference (values and grads) and against torch's flex_attention."""
    got, want = helper(*inputs, **mods), reference(*inputs)
    assert (got - want).abs().max().item() <= TOL
    upstream = torch.randn_like(want)
    grads_got = torch.autograd.grad(got, inputs, upstream)
    grads_want = torch.autograd.grad(want, inputs, upstream)
    for a, b in zip(grads_got, grads_want):
        assert (a - b).abs().max().item() <= TOL
    assert (got.detach() - flex_reference(inputs, **mods)).abs().max().item() <= TOL


def flex_reference(inputs, score_mod=None, mask_mod=None, mask_key=None, **options):
    """torch's uncompiled flex_attention (no grad: it has no CPU backward) for the same call."""
    q, k, v = (t.detach() for t in inputs)
    block_mask = None if mask_mod is None else flex_module.create_block_mask(mask_mod, q.size(0), q.size(1),
                                                                             q.size(-2), k.size(-2), device="cpu")
    return flex_module.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, **options)


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setenv("ADVISOR_FLEX_EAGER", "1")


@pytest.fixture
def compile_is_identity(monkeypatch):
    """No compile anywhere: the helper's "compiled" flex_attention is the uncompiled one, which also calls compile."""
    compiles = []

    def identity(fn, **kwargs):
        compiles.append(getattr(fn, "__name__", fn))
        return fn

    monkeypatch.delenv("ADVISOR_FLEX_EAGER", raising=False)
    monkeypatch.setattr(torch, "compile", identity)
    return compiles


def test_soft_cap_score_mod_matches_hand_written_attention(eager):
    helper = load_helper()[HELPER_NAME]
    assert_parity(helper, qkv(), hand_written_soft_cap, score_mod=soft_cap)


@pytest.mark.parametrize("mask_mod", [causal, sliding_window])
def test_mask_mod_matches_sdpa_with_the_dense_mask(eager, mask_mod):
    helper = load_helper()[HELPER_NAME]

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(mask_mod, 256))

    assert_parity(helper, qkv(), sdpa, mask_mod=mask_mod, mask_key=mask_mod.__name__)


def test_scale_and_grouped_query_heads_reach_flex_attention(eager):
    helper = load_helper()[HELPER_NAME]

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)

    assert_parity(helper, qkv(heads=4, kv_heads=2, length=128), sdpa, mask_mod=causal, scale=0.3, enable_gqa=True)


def test_alibi_and_document_mask_read_captured_tensors_by_head_and_batch(eager):
    """ALiBi slopes indexed by head and document ids by batch and position, as the helper's callers capture them."""
    helper = load_helper()[HELPER_NAME]
    slopes = torch.tensor([0.5, 0.0625])
    document = torch.tensor([[0] * 100 + [1] * 156, [0] * 30 + [1] * 200 + [2] * 26])

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def same_document(b, h, q_idx, kv_idx):
        return (document[b, q_idx] == document[b, kv_idx]) & (q_idx >= kv_idx)

    def hand_written(q, k, v):
        index = torch.arange(256)
        scores = q @ k.transpose(-2, -1) / 4 + slopes[:, None, None] * (index[None, :] - index[:, None])
        allowed = (document[:, None, :, None] == document[:, None, None, :]) & dense_mask(causal, 256)
        return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v

    assert_parity(helper, qkv(), hand_written, score_mod=alibi, mask_mod=same_document, mask_key="document")


def test_rows_masked_throughout_give_zeros_and_a_learned_bias_table_gets_its_gradient(eager):
    """FlexAttention's value for a row with no visible key is 0; the eager path agrees, with finite grads."""
    helper = load_helper()[HELPER_NAME]
    table = torch.randn(2, 2 * 128 - 1, requires_grad=True)  # per head, per relative position (T5/Swin style)

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + 127]

    def late_causal(b, h, q_idx, kv_idx):
        return (q_idx >= 40) & (kv_idx <= q_idx)

    def hand_written(q, k, v):
        index = torch.arange(128)
        scores = q @ k.transpose(-2, -1) / 4 + table[:, index[:, None] - index[None, :] + 127]
        weights = torch.softmax(scores.masked_fill(~dense_mask(late_causal, 128), float("-inf")), dim=-1)
        return weights.nan_to_num(0.0) @ v

    inputs = qkv(length=128)
    mods = dict(score_mod=relative_bias, mask_mod=late_causal)
    out = helper(*inputs, **mods)
    flex = flex_reference(inputs, **mods)
    assert (out.detach() - flex).abs().max().item() <= TOL and not flex[:, :, :40].any()
    assert all(g.isfinite().all() for g in torch.autograd.grad(out.sum(), [*inputs, table]))
    want = torch.autograd.grad(hand_written(*inputs)[:, :, 40:].sum(), table)[0]
    got = torch.autograd.grad(helper(*inputs, **mods)[:, :, 40:].sum(), table)[0]
    assert (got - want).abs().max().item() <= TOL


def test_inputs_that_require_grad_on_cpu_take_the_eager_path(compile_is_identity):
    """torch 2.13's flex_attention raises for them on CPU, compiled or not; training must still work."""
    helper = load_helper()[HELPER_NAME]
    inputs = qkv(length=128)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_module.flex_attention(*inputs, score_mod=soft_cap)
    with pytest.warns(UserWarning, match="FlexAttention has no backward on cpu; running eager"):
        assert_parity(helper, inputs, hand_written_soft_cap, score_mod=soft_cap)


@pytest.fixture
def block_mask_builds(monkeypatch):
    """Calls of create_block_mask, which the helper imports at call time from torch's module."""
    calls = []
    original = flex_module.create_block_mask

    def counting(mask_mod, B, H, Q_LEN, KV_LEN, device=None):
        calls.append((mask_mod.__name__, B, H, Q_LEN, KV_LEN))
        return original(mask_mod, B, H, Q_LEN, KV_LEN, device=device)

    monkeypatch.setattr(flex_module, "create_block_mask", counting)
    return calls


def test_block_mask_is_cached_per_key_and_shape(compile_is_identity, block_mask_builds):
    namespace = load_helper()
    helper = namespace[HELPER_NAME]
    q, k, v = (t.detach() for t in qkv(length=128))
    first = helper(q, k, v, mask_mod=causal, mask_key="causal")
    helper(q, k, v, mask_mod=causal, mask_key="causal")
    assert block_mask_builds == [("causal", 2, 2, 128, 128)]
    assert (first - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max().item() <= TOL
    longer = [t.detach() for t in qkv(length=256)]
    helper(*longer, mask_mod=causal, mask_key="causal")
    helper(q, k, v, mask_mod=sliding_window, mask_key="window")
    assert block_mask_builds[1:] == [("causal", 2, 2, 256, 256), ("sliding_window", 2, 2, 128, 128)]
    helper(*longer, mask_mod=causal, mask_key="causal")
    assert len(block_mask_builds) == 3
    assert len(namespace["_advisor_flex_state"]["block_masks"]) == 3


def test_block_mask_without_a_key_is_rebuilt_and_the_cache_is_bounded(compile_is_identity, block_mask_builds):
    namespace = load_helper()
    helper = namespace[HELPER_NAME]
    q, k, v = (t.detach()[:1, :1, :, :4] for t in qkv(length=128))
    helper(q, k, v, mask_mod=causal)
    helper(q, k, v, mask_mod=causal)
    assert len(block_mask_builds) == 2
    assert namespace["_advisor_flex_state"]["block_masks"] == {}
    for key in range(34):
        helper(q, k, v, mask_mod=causal, mask_key=key)
    cache = namespace["_advisor_flex_state"]["block_masks"]
    assert len(cache) == 32 and [key[0] for key in cache] == list(range(2, 34))


def raise_at_compile(fn, **kwargs):
    raise RuntimeError("Dynamo is not supported on this Python\nsecond line")


def compiled_that_raises(fn, **kwargs):
    def run(*args, **kw):
        raise RuntimeError("InductorError: C++ compile error\ndetails")
    return run


@pytest.mark.parametrize("broken_compile", [raise_at_compile, compiled_that_raises])
def test_compile_failure_warns_once_and_runs_eager(monkeypatch, broken_compile):
    monkeypatch.delenv("ADVISOR_FLEX_EAGER", raising=False)
    monkeypatch.setattr(torch, "compile", broken_compile)
    helper = load_helper("th")[HELPER_NAME]  # a module that spells torch `import torch as th`
    inputs = [t.detach() for t in qkv(length=128)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = helper(*inputs, score_mod=soft_cap)
        second = helper(*inputs, score_mod=soft_cap)
    ours = [str(w.message) for w in caught if "advisor_flex_attention" in str(w.message)]
    assert len(ours) == 1 and "torch.compile failed (RuntimeError:" in ours[0] and "second line" not in ours[0]
    assert torch.equal(first, second)
    assert (first - hand_written_soft_cap(*inputs)).abs().max().item() <= TOL


def test_an_error_of_the_call_itself_is_raised_and_keeps_the_compiled_path(monkeypatch):
    monkeypatch.delenv("ADVISOR_FLEX_EAGER", raising=False)
    monkeypatch.setattr(torch, "compile", compiled_that_raises)
    namespace = load_helper()
    q, k, v = (t.detach() for t in qkv(length=128))
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning
        namespace[HELPER_NAME](q, k[..., :8], v)  # head dims differ: the eager path raises too
    assert namespace["_advisor_flex_state"]["eager_reason"] is None


def test_compile_is_lazy_and_the_eager_switch_is_read_at_call_time(monkeypatch, compile_is_identity):
    monkeypatch.setenv("ADVISOR_FLEX_EAGER", "1")
    helper = load_helper()[HELPER_NAME]
    q, k, v = (t.detach() for t in qkv(length=128))
    assert compile_is_identity == []
    helper(q, k, v)
    assert compile_is_identity == []
    monkeypatch.delenv("ADVISOR_FLEX_EAGER")
    helper(q, k, v)
    helper(q, k, v)
    assert compile_is_identity.count("flex_attention") == 1


def test_compiled_path_compiles_once_for_a_repeated_shape(monkeypatch):
    """The one test that really compiles (tiny shapes); a second call of the same shape must not recompile."""
    from torch._dynamo.utils import counters

    monkeypatch.delenv("ADVISOR_FLEX_EAGER", raising=False)
    torch._dynamo.reset()
    helper = load_helper()[HELPER_NAME]
    q, k, v = (t.detach() for t in qkv(batch=1, heads=1, length=128, dim=16))
    graphs = counters["stats"]["unique_graphs"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.perf_counter()
        first = helper(q, k, v, score_mod=soft_cap, mask_mod=causal, mask_key="causal")
        second = helper(q, k, v, score_mod=soft_cap, mask_mod=causal, mask_key="causal")
    assert not [w for w in caught if "advisor_flex_attention" in str(w.message)], "compile fell back to eager"
    assert counters["stats"]["unique_graphs"] - graphs == 1, f"compiled in {time.perf_counter() - started:.1f}s"
    scores = soft_cap(q @ k.transpose(-2, -1) / 4, None, None, None, None)
    reference = torch.softmax(scores.masked_fill(~dense_mask(causal, 128), float("-inf")), dim=-1) @ v
    assert torch.equal(first, second)
    assert (first - reference).abs().max().item() <= TOL


def test_no_mask_mod_runs_with_an_all_true_block_mask_of_128_token_blocks(compile_is_identity, block_mask_builds,
                                                                          monkeypatch):
    """Without a mask, block_mask=None makes torch 2.13's CPU kernel take the whole sequence as one tile (an
    Lq x Lkv fp32 buffer per thread: +134 MiB at 4,096 tokens, and slower); the helper passes a BlockMask whose
    128-token blocks are all full instead, built from the block counts (no create_block_mask over every pair), one
    per (Lq, Lkv, device), broadcast over batch and heads."""
    passed = []
    original = flex_module.flex_attention

    def recording(q, k, v, block_mask=None, **options):
        passed.append(block_mask)
        return original(q, k, v, block_mask=block_mask, **options)

    monkeypatch.setattr(flex_module, "flex_attention", recording)
    helper = load_helper()[HELPER_NAME]
    q, k, v = (t.detach() for t in qkv(length=256))
    first = helper(q, k, v, score_mod=soft_cap)
    helper(q[:1], k[:1], v[:1], score_mod=soft_cap)
    ragged = helper(q[:, :, :200], k[:, :, :72], v[:, :, :72], score_mod=soft_cap)
    assert block_mask_builds == [] and passed[0] is passed[1] and passed[2] is not passed[0]
    assert [(m.BLOCK_SIZE, tuple(m.shape)) for m in passed[1:]] == [((128, 128), (1, 1, 256, 256)),
                                                                     ((128, 128), (1, 1, 200, 72))]
    assert [m.kv_num_blocks.sum().item() for m in passed[1:]] == [0, 0]  # no block evaluates a mask_mod
    assert [m.full_kv_num_blocks.tolist() for m in passed[1:]] == [[[[2, 2]]], [[[1, 1]]]]
    assert (first - hand_written_soft_cap(q, k, v)).abs().max().item() <= TOL
    assert (ragged - hand_written_soft_cap(q[:, :, :200], k[:, :, :72], v[:, :, :72])).abs().max().item() <= TOL


def test_compiled_all_true_block_mask_keeps_ragged_sequence_ends_exact(monkeypatch):
    """Compiled, the full blocks that run past a ragged sequence end are cut by the kernel, not by a mask_mod."""
    monkeypatch.delenv("ADVISOR_FLEX_EAGER", raising=False)
    torch._dynamo.reset()
    helper = load_helper()[HELPER_NAME]
    q, k, v = (t.detach() for t in qkv(batch=1, heads=1, length=200, dim=16))
    k, v = k[:, :, :136], v[:, :, :136]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = helper(q, k, v, score_mod=soft_cap)
    assert not [w for w in caught if "advisor_flex_attention" in str(w.message)], "compile fell back to eager"
    assert (out - hand_written_soft_cap(q, k, v)).abs().max().item() <= TOL


# The caller's own transformations (found by attacking safe flex patches, s17): inside the caller's
# `torch.compile(fullgraph=True)` the helper's cache, warnings and compile broke the graph ("Attempted to call function
# marked as skipped"), and under `torch.jit.trace` building the BlockMask raised ("Unsupported value kind: Tensor");
# the hand-written block runs under both.

class _Attend(torch.nn.Module):
    def __init__(self, helper):
        super().__init__()
        self.helper = helper

    def forward(self, q, k, v):
        return self.helper(q, k, v, mask_mod=causal, mask_key="traced")


def test_the_callers_full_graph_compile_traces_the_call(monkeypatch):
    """With inputs that require grad (a model's parameters do), the eager path used to warn inside the graph."""
    monkeypatch.delenv("ADVISOR_FLEX_EAGER", raising=False)
    helper = load_helper()[HELPER_NAME]
    q, k, v = (t.detach().requires_grad_(True) for t in qkv(length=8))
    compiled = torch.compile(_Attend(helper), fullgraph=True, backend="eager")
    got, want = compiled(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (got - want).abs().max().item() <= TOL
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        assert (a - b).abs().max().item() <= TOL


def test_a_jit_trace_records_the_eager_path(monkeypatch):
    monkeypatch.delenv("ADVISOR_FLEX_EAGER", raising=False)
    helper = load_helper()[HELPER_NAME]
    q, k, v = (t.detach() for t in qkv(length=8))
    traced = torch.jit.trace(_Attend(helper), (q, k, v), check_trace=False)
    q2, k2, v2 = (t.detach() for t in qkv(length=8, seed=1))
    got = traced(q2, k2, v2)
    assert (got - F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)).abs().max().item() <= TOL

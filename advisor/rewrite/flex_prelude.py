"""The `advisor_flex_attention` helper that `--backend flex` patches paste into user modules.

The source is self-contained (no import of advisor) because it lands in the user's file and diff. It compiles
FlexAttention once per process, lazily at the first call, so importing the patched module stays cheap. Its eager
path is plain PyTorch, not uncompiled `flex_attention`: that one runs through `torch.compile` itself (so it fails
where compile is unavailable) and raises for inputs that require grad on CPU (torch 2.13 has no CPU backward).
"""

from __future__ import annotations

from string import Template

from advisor.contracts.emitted_names import FLEX_HELPER_NAME

HELPER_NAME = FLEX_HELPER_NAME

# `$torch` is the user's module's spelling of torch; nothing else in the template uses `$`
_PRELUDE = Template('''\
_advisor_flex_state = {"compiled": None, "eager_reason": None, "block_masks": {}, "warned": set()}


def _advisor_flex_warn_once(why, message):
    import warnings

    if why not in _advisor_flex_state["warned"]:
        _advisor_flex_state["warned"].add(why)
        warnings.warn(f"advisor_flex_attention: {message}", stacklevel=3)


def _advisor_flex_dense(q, k, v, score_mod, mask_mod, scale, enable_gqa):
    """FlexAttention's result with the scores materialised in plain PyTorch: no compile, debuggable, has autograd."""
    if enable_gqa:
        k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
    b, h, q_idx, kv_idx = (
        $torch.arange(n, device=q.device).view([-1 if axis == i else 1 for axis in range(4)])
        for i, n in enumerate((q.size(0), q.size(1), q.size(-2), k.size(-2)))
    )
    scores = (q @ k.transpose(-2, -1)) * (q.size(-1) ** -0.5 if scale is None else scale)
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(b, h, q_idx, kv_idx), float("-inf"))
    live = scores.amax(-1, keepdim=True) > float("-inf")  # FlexAttention gives 0 where a whole row is masked
    return ($torch.softmax(scores.masked_fill(~live, 0.0), dim=-1) * live) @ v


def _advisor_flex_block_mask(q, k, mask_mod, mask_key):
    """mask_mod's BlockMask, cached per (mask_key, B, H, Lq, Lkv, device) when mask_key is given (the last 32 kept).

    No mask_mod is an all-true mask of 128-token blocks, cached per (Lq, Lkv, device), not block_mask=None: torch
    2.13's CPU kernel takes None as one Lq x Lkv tile, an fp32 buffer that size per thread (64 MiB each at 4,096
    tokens), and runs slower.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    lengths = (q.size(-2), k.size(-2))
    key = (None, *lengths, q.device) if mask_mod is None else (mask_key, q.size(0), q.size(1), *lengths, q.device)
    cache = _advisor_flex_state["block_masks"]
    block_mask = cache.get(key) if mask_mod is None or mask_key is not None else None
    if block_mask is None:
        if mask_mod is None:
            block_mask = _advisor_flex_all_true(*lengths, q.device)
        else:
            block_mask = create_block_mask(mask_mod, key[1], key[2], *lengths, device=q.device)
        if mask_mod is None or mask_key is not None:
            if len(cache) >= 32:
                cache.pop(next(iter(cache)))
            cache[key] = block_mask
    return block_mask


def _advisor_flex_all_true(q_len, kv_len, device):
    """Every 128-token block full, built from the block counts (create_block_mask would evaluate all Lq x Lkv
    pairs); the kernels mask the ragged ends of the sequences themselves."""
    from torch.nn.attention.flex_attention import BlockMask, noop_mask

    rows, columns = -(-q_len // 128), -(-kv_len // 128)
    counts = $torch.full((1, 1, rows), columns, dtype=$torch.int32, device=device)
    indices = $torch.arange(columns, dtype=$torch.int32, device=device).expand(1, 1, rows, columns).contiguous()
    return BlockMask.from_kv_blocks($torch.zeros_like(counts), $torch.zeros_like(indices), counts, indices,
                                    BLOCK_SIZE=128, mask_mod=noop_mask, seq_lengths=(q_len, kv_len))


def _advisor_flex_traced(q, k, v, score_mod, mask_mod, scale, enable_gqa):
    """The call as the caller's torch.compile traces it: no cache, no warning, no compile of its own (each would
    break the caller's graph, and `fullgraph=True` raises), the BlockMask built in the graph."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if q.device.type in ("cpu", "mps") and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _advisor_flex_dense(q, k, v, score_mod, mask_mod, scale, enable_gqa)
    if mask_mod is None:
        block_mask = _advisor_flex_all_true(q.size(-2), k.size(-2), q.device)
    else:
        block_mask = create_block_mask(mask_mod, q.size(0), q.size(1), q.size(-2), k.size(-2), device=q.device)
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def advisor_flex_attention(q, k, v, score_mod=None, mask_mod=None, mask_key=None, scale=None, enable_gqa=False):
    """FlexAttention with score_mod/mask_mod, inserted by advisor (`--backend flex`) for a hand-written block.

    Runs torch.compile(flex_attention), compiled once per process at the first call (dynamic=None: a second
    shape recompiles once with dynamic sizes, later shapes reuse it). The eager path applies the same mods to
    materialised scores (what uncompiled flex_attention does, minus its own use of torch.compile): it runs, after
    one warning naming why, when torch.compile is unavailable or fails, and where FlexAttention has no backward
    (inputs that require grad on CPU/MPS); ADVISOR_FLEX_EAGER=1 forces it for debugging. mask_mod becomes a
    BlockMask, cached per (mask_key, B, H, Lq, Lkv, device) when mask_key is given (the last 32 kept); no mask_mod
    is an all-true BlockMask, cached per (Lq, Lkv, device). Inside the caller's own torch.compile (or export) the
    call is traced into that graph instead, and under torch.jit.trace the eager path is recorded.
    """
    import os

    from torch.nn.attention.flex_attention import flex_attention

    state = _advisor_flex_state
    eager = (score_mod, mask_mod, scale, enable_gqa)
    if $torch.jit.is_tracing():  # a trace records the dense path's ops (building a BlockMask cannot be traced)
        return _advisor_flex_dense(q, k, v, *eager)
    if $torch.compiler.is_compiling():  # inside the caller's torch.compile or export: flex_attention joins its graph
        return _advisor_flex_traced(q, k, v, *eager)
    if os.environ.get("ADVISOR_FLEX_EAGER") == "1" or state["eager_reason"] is not None:
        return _advisor_flex_dense(q, k, v, *eager)
    if q.device.type in ("cpu", "mps") and (q.requires_grad or k.requires_grad or v.requires_grad):
        _advisor_flex_warn_once("backward", f"FlexAttention has no backward on {q.device.type}; running eager")
        return _advisor_flex_dense(q, k, v, *eager)
    block_mask = _advisor_flex_block_mask(q, k, mask_mod, mask_key)
    try:
        if state["compiled"] is None:
            state["compiled"] = $torch.compile(flex_attention)
        return state["compiled"](q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                 enable_gqa=enable_gqa)
    except Exception as exc:  # the eager call below re-raises what is not a compile failure
        out = _advisor_flex_dense(q, k, v, *eager)
        state["eager_reason"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        _advisor_flex_warn_once("compile", f"torch.compile failed ({state['eager_reason']}); running eager")
        return out
''')


def prelude_source(torch_name: str = "torch") -> str:
    """Module-level source defining `advisor_flex_attention`, spelling torch as the user's module does."""
    return _PRELUDE.substitute(torch=torch_name)

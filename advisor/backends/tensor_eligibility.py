"""Backend eligibility from real tensors: PyTorch's own checks where it exposes them, the static rules otherwise.

On CUDA, `torch.backends.cuda.can_use_flash_attention(params, debug=True)` and friends decide (their debug
warnings are the reasons); on CPU, `torch._fused_sdp_choice` says whether the CPU flash kernel would run. The
flash_attn package has no such check: its documented limits (see eligibility.py) plus whether it imports.
"""

from __future__ import annotations

import importlib.util
import warnings

import torch

from advisor.backends.eligibility import SiteFacts, Verdict, backend_eligibility


def facts_from_tensors(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                       enable_gqa: bool = False) -> SiteFacts:
    """The facts of one SDPA call, all known."""
    mask = None if attn_mask is None else ("bool" if attn_mask.dtype == torch.bool else "float")
    return facts_from_shapes(list(query.shape), list(key.shape), list(value.shape), str(query.dtype),
                             [t.stride(-1) for t in (query, key, value)], mask, dropout_p, is_causal,
                             query.device.type, enable_gqa)


def facts_from_shapes(q_shape: list[int], k_shape: list[int], v_shape: list[int], dtype: str,
                      last_strides: list[int | None], mask: str | None, dropout_p: float | None, is_causal: bool,
                      device: str, enable_gqa: bool | None = None) -> SiteFacts:
    """The facts of one SDPA call from what a profile records (shapes, dtype, strides, mask kind or "given")."""
    heads = "same"
    if len(q_shape) == 4 and k_shape[-3] != q_shape[-3]:
        heads = "grouped" if enable_gqa else "broadcast" if enable_gqa is False and k_shape[-3] == 1 else None
    return SiteFacts(mask="causal" if is_causal else mask or "none",
                     dropout=None if not dropout_p else repr(float(dropout_p)),
                     head_dim=q_shape[-1], value_head_dim=v_shape[-1], dtype=dtype.removeprefix("torch."),
                     device=device, rank=len(q_shape), kv_heads=heads,
                     unit_stride=None if None in last_strides else all(s == 1 for s in last_strides))


def torch_eligibility(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                      enable_gqa: bool = False) -> dict[str, Verdict]:
    """Verdicts for one call on the tensors' own device, decided by torch where it can decide."""
    facts = facts_from_tensors(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    verdicts = backend_eligibility(facts)
    if query.device.type == "cuda":
        params = torch.backends.cuda.SDPAParams(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        verdicts["sdpa-flash"] = _ask_torch(torch.backends.cuda.can_use_flash_attention, params)
        verdicts["sdpa-efficient"] = _ask_torch(torch.backends.cuda.can_use_efficient_attention, params)
        if importlib.util.find_spec("flash_attn") is None:
            verdicts["flash-attn"] = Verdict(False, "the flash_attn package is not installed")
    elif query.device.type == "cpu":
        from torch.nn.attention import SDPBackend

        choice = SDPBackend(torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal,
                                                    enable_gqa=enable_gqa))
        static = verdicts["sdpa-flash"]
        if choice == SDPBackend.FLASH_ATTENTION:
            verdicts["sdpa-flash"] = Verdict(True, "torch chose the CPU flash kernel")
        else:
            reason = static.reason if static.eligible is False else "torch refused the CPU flash kernel"
            verdicts["sdpa-flash"] = Verdict(False, reason, static.variant)
    return verdicts


def _ask_torch(check, params) -> Verdict:
    """One of torch's can_use_* checks with debug=True: its warnings say why a kernel is refused."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eligible = bool(check(params, True))
    if eligible:
        return Verdict(True, "accepted by torch's own check")
    said = "; ".join(str(w.message).strip() for w in caught)
    return Verdict(False, said or "refused by torch's own check (its reason went to stderr)")

"""Why scaled_dot_product_attention ran the math kernel: the conditions each fused kernel refuses.

Shared by `profile` (arguments seen by the recorder) and `analyze` (argument shapes/types in a trace).
The lists follow aten/src/ATen/native/transformers/sdp_utils*.cpp for torch 2.x; a reason is only given
when the arguments show it, otherwise the finding says the reason is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

_HALF = ("float16", "bfloat16", "c10::Half", "c10::BFloat16", "Half", "BFloat16")


@dataclass
class SdpaArgs:
    q_shape: list[int]
    k_shape: list[int]
    v_shape: list[int]
    dtype: str
    last_strides: list[int | None]  # stride of the last dim of q, k, v (None when unknown)
    has_mask: bool | None
    dropout_p: float | None
    is_causal: bool | None


def fallback_reasons(args: SdpaArgs, device: str) -> list[str]:
    reasons = []
    if len(args.q_shape) != 4:
        reasons.append(f"inputs are {len(args.q_shape)}-D; fused kernels need 4-D (batch, heads, seq, head_dim)")
    if any(s not in (None, 1) for s in args.last_strides):
        reasons.append("a q/k/v input has a last-dim stride other than 1 (call .contiguous() on it or fix the "
                       "transpose that produced it)")
    if args.q_shape and args.v_shape and args.q_shape[-1] != args.v_shape[-1] and device == "cpu":
        reasons.append(f"head dims differ (q {args.q_shape[-1]}, v {args.v_shape[-1]})")
    if args.dropout_p and device == "cpu":
        reasons.append(f"dropout_p={args.dropout_p:g}: the CPU flash kernel has no dropout (pass "
                       "`p if self.training else 0.0`)")
    if device == "cuda":
        if args.dtype not in _HALF:
            reasons.append(f"dtype {args.dtype}: the flash kernel needs float16/bfloat16")
        if args.has_mask:
            reasons.append("an attn_mask is given: the flash kernel refuses explicit masks (use is_causal=True "
                           "when the mask is causal and L == S)")
        if args.q_shape and args.q_shape[-1] > 256:
            reasons.append(f"head_dim {args.q_shape[-1]} > 256")
    return reasons

"""Which attention kernel a rewritten site can get, and why not the fastest: a pure function of what the rewrite
passes to scaled_dot_product_attention (mask kind, dropout, head dim, dtype, device, heads, rank).

Each backend gets a verdict: eligible True (every condition known to hold), False (a condition is known to fail:
the reason names it) or None (nothing known fails, but a condition is not known, e.g. the dtype in a static scan:
the reason lists what must hold). Never a guess. The conditions follow torch 2.x's own checks
(aten/src/ATen/native/transformers/sdp_utils_cpp.cpp for the CPU flash kernel, cuda/sdp_utils.cpp for CUDA) and
the `flash_attn` package's documented limits; on a machine that can run the kernels, `tensor_eligibility.py` asks torch
itself instead.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass, field, replace
from functools import cache

HALF = ("float16", "bfloat16")
CPU_FLASH_DTYPES = ("float32", "float64", "float16", "bfloat16")
EFFICIENT_DTYPES = ("float16", "bfloat16", "float32")
FLASH_MAX_HEAD_DIM = 256
# the torch release from which the CPU flash kernel takes 3-D inputs and K/V whose batch or head axis broadcasts
# (measured against `torch._fused_sdp_choice`: 2.13.0 sends both to the math kernel, 2.14.1 to flash)
CPU_FLASH_BROADCASTS_FROM = (2, 14)
BACKENDS = ("sdpa-flash", "sdpa-efficient", "sdpa-math", "flash-attn")


@dataclass(frozen=True)
class SiteFacts:
    """What one SDPA call receives; None means not known (static scans rarely know dtype, device or shapes)."""

    mask: str = "none"  # "none", "bool", "float", "given" (of unknown dtype), "causal" (is_causal=True)
    mask_conditional: bool = False  # the mask is only built under an `if` (SDPA gets None otherwise)
    causal_guard: str | None = None  # the mask is one causal mask applied under `if <causal_guard>:`
    bottom_right_causal: bool = False  # the mask is causal aligned to the bottom-right corner (L != S possible)
    dropout: str | None = None  # the dropout_p expression, None when there is no dropout
    head_dim: int | None = None  # q/k head dim
    value_head_dim: int | None = None
    dtype: str | None = None  # "float16", "bfloat16", "float32", ...
    device: str | None = None  # "cpu" or "cuda"
    rank: int | None = None  # 3 (heads folded into batch) or 4
    kv_heads: str | None = None  # "same", "broadcast" (size-1 head axis, no enable_gqa), "grouped" (enable_gqa)
    unit_stride: bool | None = None  # q/k/v all have last-dim stride 1 (False only when measured)
    transposed: tuple[str, ...] = ()  # inputs passed as a transpose of their last two dims (stride 1 not known)


@dataclass
class Verdict:
    eligible: bool | None
    reason: str
    variant: str | None = None  # an equivalent rewrite that would be eligible

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"eligible": self.eligible, "reason": self.reason}
        if self.variant:
            data["variant"] = self.variant
        return data


@dataclass
class _Checks:
    """Conditions of one backend: those known to fail, those not known."""

    refused: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def need(self, holds: bool | None, condition: str, failure: str) -> None:
        if holds is None:
            self.unknown.append(condition)
        elif not holds:
            self.refused.append(failure)

    def verdict(self, ok: str) -> Verdict:
        if self.refused:
            return Verdict(False, "; ".join(self.refused))
        if self.unknown:
            return Verdict(None, "needs " + "; ".join(self.unknown) + " (not known here)")
        return Verdict(True, ok)


def backend_eligibility(facts: SiteFacts) -> dict[str, Verdict]:
    """Verdicts keyed by backend. On an unknown device the SDPA keys describe CUDA and `sdpa-flash-cpu` the CPU
    flash kernel; on a known CPU, `sdpa-flash` is the CPU flash kernel and the CUDA-only backends are refused."""
    if facts.device == "cpu":
        verdicts = {"sdpa-flash": _cpu_flash(facts),
                    "sdpa-efficient": Verdict(False, "no memory-efficient kernel on CPU"),
                    "sdpa-math": _math(),
                    "flash-attn": Verdict(False, "flash_attn runs on CUDA GPUs only")}
    else:
        verdicts = {"sdpa-flash": _cuda_flash(facts), "sdpa-efficient": _cuda_efficient(facts),
                    "sdpa-math": _math(), "flash-attn": _flash_attn_package(facts)}
        if facts.device is None:
            verdicts["sdpa-flash-cpu"] = _cpu_flash(facts)
    for name, verdict in verdicts.items():
        if verdict.eligible is False:
            verdict.variant = _eligible_variant(name, facts)
    return verdicts


def to_json(verdicts: dict[str, Verdict]) -> dict[str, dict[str, object]]:
    return {name: verdict.to_json() for name, verdict in verdicts.items()}


# one function per kernel --------------------------------------------------------------------------------------
def _cuda_flash(facts: SiteFacts) -> Verdict:
    checks = _Checks()
    _device(checks, facts, "cuda", "a CUDA device (sm80 or newer)")
    _no_mask(checks, facts, "the CUDA flash kernel takes no attn_mask")
    _four_d(checks, facts)
    _unit_stride(checks, facts)
    _heads(checks, facts, grouped_ok=True)
    _head_dims(checks, facts, equal_value=True, maximum=FLASH_MAX_HEAD_DIM)
    _dtype(checks, facts, HALF, "float16/bfloat16 inputs")
    return checks.verdict("no mask, 4-D fp16/bf16 inputs on CUDA, head dim <= 256")


def _cuda_efficient(facts: SiteFacts) -> Verdict:
    checks = _Checks()
    _device(checks, facts, "cuda", "a CUDA device")
    _four_d(checks, facts)
    _unit_stride(checks, facts)
    _heads(checks, facts, grouped_ok=False)
    _dtype(checks, facts, EFFICIENT_DTYPES, "float16/bfloat16/float32 inputs")
    alignment = 8 if facts.dtype in HALF else 4 if facts.dtype == "float32" else None
    dims = [d for d in (facts.head_dim, facts.value_head_dim) if d is not None]
    if alignment is None or not dims:
        checks.unknown.append("head dims divisible by 8 (fp16/bf16) or 4 (fp32)")
    else:
        checks.need(all(d % alignment == 0 for d in dims), "",
                    f"head dim {dims[0]} is not a multiple of {alignment} for {facts.dtype}")
    return checks.verdict("masks and dropout accepted; aligned head dims on CUDA")


def _cpu_flash(facts: SiteFacts) -> Verdict:
    checks = _Checks()
    if facts.dropout is not None:
        literal = _number(facts.dropout)
        if literal is None:
            checks.unknown.append(f"dropout_p `{facts.dropout}` to be 0 (it is in eval mode; the CPU flash kernel "
                                  "has no dropout)")
        else:
            checks.need(literal == 0, "", f"dropout_p={facts.dropout}: the CPU flash kernel has no dropout")
    broadcasts = installed_torch() >= CPU_FLASH_BROADCASTS_FROM
    if broadcasts:
        checks.need(None if facts.rank is None else facts.rank in (3, 4), "3-D or 4-D inputs",
                    f"{facts.rank}-D inputs; the CPU flash kernel needs 3-D or 4-D")
    else:
        _four_d(checks, facts)
    _unit_stride(checks, facts)
    if not broadcasts or facts.kv_heads is None:
        _heads(checks, facts, grouped_ok=True)
    _head_dims(checks, facts, equal_value=True, maximum=None)
    _dtype(checks, facts, CPU_FLASH_DTYPES, "float32/float64/float16/bfloat16 inputs")
    shape = "3-D or 4-D inputs (K/V heads may broadcast)" if broadcasts else "4-D inputs"
    return checks.verdict(f"{shape} with equal head dims and no dropout (masks accepted)")


@cache
def installed_torch() -> tuple[int, int]:
    """(major, minor) of the torch this process would import, from its metadata (the CPU flash kernel's checks
    changed between releases); (0, 0) where none is installed."""
    try:
        found = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        return (0, 0)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _math() -> Verdict:
    return Verdict(True, "always available (the fallback; materialises the L x S scores)")


def _flash_attn_package(facts: SiteFacts) -> Verdict:
    checks = _Checks()
    _device(checks, facts, "cuda", "a CUDA GPU and the flash_attn package")
    _no_mask(checks, facts, "flash_attn_func takes no mask (only causal)")
    _four_d(checks, facts)
    # a size-1 K/V head axis is flash_attn's own multi-query layout: no head condition
    _head_dims(checks, facts, equal_value=True, maximum=FLASH_MAX_HEAD_DIM)
    _dtype(checks, facts, HALF, "float16/bfloat16 inputs")
    return checks.verdict("no mask, fp16/bf16 on CUDA, head dim <= 256 (GPU path not verified on a GPU by advisor)")


# shared conditions ----------------------------------------------------------------------------------------------
def _device(checks: _Checks, facts: SiteFacts, wanted: str, condition: str) -> None:
    checks.need(None if facts.device is None else facts.device == wanted, condition,
                f"runs on {facts.device}; needs {condition}")


def _no_mask(checks: _Checks, facts: SiteFacts, failure: str) -> None:
    if facts.mask in ("none", "causal"):
        return
    if facts.mask_conditional:
        checks.unknown.append(f"no attn_mask at run time (a {facts.mask} mask is built under an `if`; {failure})")
    else:
        kind = "an" if facts.mask == "given" else f"a {facts.mask}"
        checks.refused.append(f"{kind} attn_mask is passed: {failure}")


def _unit_stride(checks: _Checks, facts: SiteFacts) -> None:
    """Every fused kernel needs last-dim stride 1; a transposed view has it only if its source was transposed."""
    if facts.transposed:
        checks.unknown.append(f"last-dim stride 1 for {', '.join(facts.transposed)} (passed transposed: true only "
                              "if already transposed before)")
    else:
        checks.need(facts.unit_stride, "last-dim stride 1 for q/k/v", "a q/k/v input has a last-dim stride other "
                    "than 1")


def _four_d(checks: _Checks, facts: SiteFacts) -> None:
    checks.need(None if facts.rank is None else facts.rank == 4, "4-D (batch, heads, seq, dim) inputs",
                f"{facts.rank}-D inputs; fused kernels need 4-D (batch, heads, seq, dim)")


def _heads(checks: _Checks, facts: SiteFacts, grouped_ok: bool) -> None:
    if facts.kv_heads == "broadcast":
        checks.refused.append("K/V have a size-1 head axis broadcast against Q's heads (without enable_gqa)")
    elif facts.kv_heads == "grouped" and not grouped_ok:
        checks.refused.append("grouped-query attention (enable_gqa) is not supported by this kernel")
    elif facts.kv_heads is None:
        checks.unknown.append("Q and K/V with the same number of heads (or enable_gqa)")


def _head_dims(checks: _Checks, facts: SiteFacts, equal_value: bool, maximum: int | None) -> None:
    if facts.head_dim is None:
        checks.unknown.append("equal q/k/v head dims" + (f" <= {maximum}" if maximum else ""))
        return
    if equal_value and facts.value_head_dim is not None and facts.value_head_dim != facts.head_dim:
        checks.refused.append(f"head dims differ (q/k {facts.head_dim}, v {facts.value_head_dim})")
    if maximum is not None and facts.head_dim > maximum:
        checks.refused.append(f"head dim {facts.head_dim} > {maximum}")


def _dtype(checks: _Checks, facts: SiteFacts, allowed: tuple[str, ...], condition: str) -> None:
    checks.need(None if facts.dtype is None else facts.dtype in allowed, condition,
                f"dtype {facts.dtype}; needs {condition}")


def _number(code: str) -> float | None:
    try:
        return float(code)
    except ValueError:
        return None


# equivalent variants ---------------------------------------------------------------------------------------------
def _eligible_variant(backend: str, facts: SiteFacts) -> str | None:
    """An equivalent rewrite the backend would take, found by changing one fact and re-checking."""
    if facts.kv_heads == "broadcast":
        grouped = replace(facts, kv_heads="grouped")
        if _verdict(backend, grouped).eligible is not False:
            return "pass K/V with their single head and `enable_gqa=True` (torch >= 2.5): the same values"
    if facts.bottom_right_causal:
        causal = replace(facts, mask="causal", bottom_right_causal=False)
        if _verdict(backend, causal).eligible is not False:
            if backend == "flash-attn":
                return "flash_attn_func(causal=True) is aligned bottom-right: it states this sliced causal mask exactly"
            return ("pass `attn_mask=causal_lower_right(L, S)` (torch.nn.attention.bias) for the sliced causal "
                    "mask: the same mask, and the flash kernel takes it")
    if facts.causal_guard is not None:
        causal = replace(facts, mask="causal", mask_conditional=False, causal_guard=None)
        if _verdict(backend, causal).eligible is not False:
            return f"pass `is_causal={facts.causal_guard}` instead of the conditional causal mask: the same values"
    return None


def _verdict(backend: str, facts: SiteFacts) -> Verdict:
    return backend_eligibility(facts)[backend]

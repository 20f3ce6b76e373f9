"""Findings from a trace alone: what op names, nesting, shapes and stacks can show without tensor identities.

Detected: hand-written attention (matmul -> softmax -> matmul outside any SDPA op), SDPA calls that ran the
math kernel (and why, when shapes were recorded), `.contiguous()`/`.to()` calls that did nothing (no copy op
under them), layout copies and casts with their time, tril/triu of S x S masks. Locations are the first user
frame of the op's stack, whose line is the function's first line (traces do not carry statement lines).
"""

from __future__ import annotations

from advisor.runtime.detect.ops import FUSED_SDPA
from advisor.runtime.events import OpEvent
from advisor.runtime.sdpa import SdpaArgs, fallback_reasons
from advisor.rules.attention import MASK_REBUILT, MATH_FALLBACK, MEASURED
from advisor.rules.copies_casts import ALREADY_CONTIGUOUS, SAME_DTYPE, TRACED_CAST, TRACED_COPY

_MATMUL = {"aten::matmul", "aten::bmm", "aten::baddbmm"}
_SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax"}


class TraceHit:
    """A detection in a trace: rule, the events it covers, and a message."""

    def __init__(self, rule: str, events: list[int], message: str, evidence: dict | None = None):
        self.rule, self.events, self.message, self.evidence = rule, events, message, evidence or {}


def _children(events: list[OpEvent]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for i, e in enumerate(events):
        if e.parent is not None:
            children.setdefault(e.parent, []).append(i)
    return children


def _inside(events: list[OpEvent], i: int, names: set[str]) -> bool:
    up = events[i].parent
    while up is not None:
        if events[up].name in names:
            return True
        up = events[up].parent
    return False


def detect(events: list[OpEvent], on_device: bool) -> list[TraceHit]:
    children = _children(events)
    hits = _attention(events) + _sdpa(events, children, "cuda" if on_device else "cpu")
    for i, e in enumerate(events):
        if e.step < 0:
            continue
        kids = {events[k].name for k in children.get(i, [])}
        called_from_python = e.parent is None
        if e.name == "aten::contiguous" and called_from_python:
            if kids:
                hits.append(TraceHit(TRACED_COPY.code, [i], "layout copy (`.contiguous()` that copied); whether a user "
                                     "needs it takes `advisor profile`", {"dims": e.dims[:1]}))
            else:
                hits.append(TraceHit(ALREADY_CONTIGUOUS.code, [i],
                                     "`.contiguous()` on a tensor that was already contiguous: "
                                     "it copied nothing, remove it"))
        elif e.name == "aten::to" and called_from_python:
            if "aten::_to_copy" in kids:
                hits.append(TraceHit(TRACED_CAST.code, [i], "dtype/device cast that copied; whether it is needed takes "
                                     "`advisor profile`", {"dims": e.dims[:1], "types": e.types[:1]}))
            else:
                hits.append(TraceHit(SAME_DTYPE.code, [i], "`.to()` that returned its input (already that dtype): "
                                     "remove it"))
        elif e.name in ("aten::tril", "aten::triu") and e.dims and len(e.dims[0]) >= 2 \
                and e.dims[0][-1] == e.dims[0][-2] and not _inside(events, i, {"aten::scaled_dot_product_attention"}):
            size = e.dims[0][-1]
            hits.append(TraceHit(MASK_REBUILT.code, [i],
                                 f"{size}x{size} mask built with {e.name[6:]} in every step: build "
                                 "it once (register_buffer) or use is_causal=True", {"dims": e.dims[:1]}))
    return hits


def _attention(events: list[OpEvent]) -> list[TraceHit]:
    """matmul, then softmax, then matmul, in order on one stack frame, outside SDPA."""
    hits, pending = [], {}
    skip = {"aten::scaled_dot_product_attention"}
    for i, e in enumerate(events):
        if e.step < 0 or _inside(events, i, skip | _MATMUL | _SOFTMAX):
            continue
        key = (e.step, e.frame)
        state = pending.get(key)
        if e.name in _MATMUL:
            if state and state[1] is not None:
                qk, softmax = state
                hits.append(TraceHit(MEASURED.code, [qk, softmax, i],
                                     "hand-written attention (matmul, softmax, matmul): "
                                     "use torch.nn.functional.scaled_dot_product_attention",
                                     {"score_dims": events[softmax].dims[:1]}))
                pending[key] = None
            else:
                pending[key] = (i, None)
        elif e.name in _SOFTMAX and state:
            pending[key] = (state[0], i)
    return hits


def _sdpa(events: list[OpEvent], children: dict[int, list[int]], device: str) -> list[TraceHit]:
    hits = []
    for i, e in enumerate(events):
        if e.name != "aten::scaled_dot_product_attention" or e.step < 0:
            continue
        kernels = {events[k].name.removeprefix("aten::") for k in children.get(i, [])}
        if kernels & FUSED_SDPA:
            continue
        if len(e.dims) >= 3:
            concrete = list(e.concrete) + [""] * 8
            strides = [s[-1] if s else None for s in (list(e.strides) + [[]] * 3)[:3]]
            args = SdpaArgs(e.dims[0], e.dims[1], e.dims[2], (e.types or ["?"])[0], strides,
                            bool(len(e.dims) > 3 and e.dims[3]), _number(concrete[4]), concrete[5] in ("True", True))
            reasons = fallback_reasons(args, device) or ["not determined from the recorded arguments"]
        else:
            reasons = ["unknown: the trace has no input shapes (record_shapes=True)"]
        hits.append(TraceHit(MATH_FALLBACK.code, [i],
                             "scaled_dot_product_attention ran the math kernel: " + "; ".join(reasons),
                             {"reasons": reasons, "dims": e.dims[:3]}))
    return hits


def _number(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None

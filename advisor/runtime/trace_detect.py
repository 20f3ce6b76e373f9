"""Findings from a trace alone: what op names, nesting, shapes and stacks can show without tensor identities.

Detected: hand-written attention (matmul -> softmax -> matmul outside any SDPA op), SDPA calls that ran the
math kernel (and why, when shapes were recorded), `.contiguous()`/`.to()` calls that did nothing (no copy op
under them), layout copies and casts with their time, tril/triu of S x S masks. Locations are the first user
frame of the op's stack, whose line is the function's first line (traces do not carry statement lines).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

from advisor.contracts.detection import TraceHit
from advisor.runtime.detect.ops import FUSED_SDPA
from advisor.runtime.events import OpEvents
from advisor.runtime.sdpa import SdpaArgs, fallback_reasons
from advisor.rules.attention import MASK_REBUILT, MATH_FALLBACK, MEASURED
from advisor.rules.copies_casts.already_contiguous import RULE as ALREADY_CONTIGUOUS
from advisor.rules.copies_casts.same_dtype_cast import RULE as SAME_DTYPE
from advisor.rules.copies_casts.traced_cast import RULE as TRACED_CAST
from advisor.rules.copies_casts.traced_copy import RULE as TRACED_COPY

_MATMUL = {"aten::matmul", "aten::bmm", "aten::baddbmm"}
_SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax"}
_SDPA = "aten::scaled_dot_product_attention"
_CALLS = {"aten::contiguous", "aten::to", "aten::tril", "aten::triu"}  # what detect's per-op loop looks at


class _Children:
    """Each op's child ops as two index arrays (a dict of lists took ~100 bytes an op on a large trace)."""

    def __init__(self, parent: array) -> None:
        self._offset = array("I", bytes(4 * (len(parent) + 1)))
        for up in parent:
            if up >= 0:
                self._offset[up + 1] += 1
        for i in range(len(parent)):
            self._offset[i + 1] += self._offset[i]
        self._child = array("I", bytes(4 * self._offset[-1]))
        cursor = array("I", self._offset)
        for i, up in enumerate(parent):
            if up >= 0:
                self._child[cursor[up]] = i
                cursor[up] += 1

    def of(self, i: int) -> array:
        return self._child[self._offset[i]:self._offset[i + 1]]


def _inside(events: OpEvents, i: int, names: set[str]) -> bool:
    up = events.parent[i]
    while up >= 0:
        if events.names[events.name[up]] in names:
            return True
        up = events.parent[up]
    return False


def _named(events: OpEvents, names: set[str]) -> Iterator[int]:
    """Indices of the ops in a profiled step with one of these names: the other ops are never made into objects."""
    for i, (name, step) in enumerate(zip(events.name, events.step)):
        if step >= 0 and events.names[name] in names:
            yield i


def detect(events: OpEvents, on_device: bool) -> Iterator[TraceHit]:
    """Hits one at a time (a large trace has one per layer and step), in a fixed order."""
    children = _Children(events.parent)
    yield from _attention(events)
    yield from _sdpa(events, children, "cuda" if on_device else "cpu")
    for i in _named(events, _CALLS):
        e = events[i]
        kids = {events.names[events.name[k]] for k in children.of(i)}
        called_from_python = e.parent is None
        if e.name == "aten::contiguous" and called_from_python:
            if kids:
                yield TraceHit(TRACED_COPY.code, [i],
                               "layout copy (`.contiguous()` that copied); whether a user needs it "
                               "takes `advisor profile`", {"dims": e.dims[:1]})
            else:
                yield TraceHit(ALREADY_CONTIGUOUS.code, [i],
                               "`.contiguous()` on a tensor that was already contiguous: it copied "
                               "nothing, remove it")
        elif e.name == "aten::to" and called_from_python:
            if "aten::_to_copy" in kids:
                yield TraceHit(TRACED_CAST.code, [i], "dtype/device cast that copied; whether it is needed takes "
                               "`advisor profile`", {"dims": e.dims[:1], "types": e.types[:1]})
            else:
                yield TraceHit(SAME_DTYPE.code, [i], "`.to()` that returned its input (already that dtype): remove it")
        elif e.name in ("aten::tril", "aten::triu") and e.dims and len(e.dims[0]) >= 2 \
                and e.dims[0][-1] == e.dims[0][-2] and not _inside(events, i, {_SDPA}):
            size = e.dims[0][-1]
            yield TraceHit(MASK_REBUILT.code, [i],
                           f"{size}x{size} mask built with {e.name[6:]} in every step: build it once "
                           "(register_buffer) or use is_causal=True", {"dims": e.dims[:1]})


def _attention(events: OpEvents) -> Iterator[TraceHit]:
    """matmul, then softmax, then matmul, in order on one stack frame, outside SDPA."""
    pending = {}
    for i in _named(events, _MATMUL | _SOFTMAX):
        if _inside(events, i, {_SDPA} | _MATMUL | _SOFTMAX):
            continue
        e = events[i]
        key = (e.step, e.frame)
        state = pending.get(key)
        if e.name in _MATMUL:
            if state and state[1] is not None:
                qk, softmax = state
                yield TraceHit(MEASURED.code, [qk, softmax, i], "hand-written attention (matmul, softmax, matmul): use "
                               "torch.nn.functional.scaled_dot_product_attention",
                               {"score_dims": events[softmax].dims[:1]})
                pending[key] = None
            else:
                pending[key] = (i, None)
        elif state:  # a softmax after a matmul
            pending[key] = (state[0], i)


def _sdpa(events: OpEvents, children: _Children, device: str) -> Iterator[TraceHit]:
    for i in _named(events, {_SDPA}):
        e = events[i]
        kernels = {events.names[events.name[k]].removeprefix("aten::") for k in children.of(i)}
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
        yield TraceHit(MATH_FALLBACK.code, [i],
                       "scaled_dot_product_attention ran the math kernel: " + "; ".join(reasons),
                       {"reasons": reasons, "dims": e.dims[:3]})


def _number(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None

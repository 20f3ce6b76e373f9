"""The attention family's trace detectors (its `trace` hook runs them with its rules): hand-written attention
(matmul -> softmax -> matmul outside any SDPA op), SDPA calls that ran the math kernel (and why, when shapes were
recorded), and S x S masks built with tril/triu in every step."""

from __future__ import annotations

from collections.abc import Iterator

from advisor.contracts.detection import TraceHit
from advisor.contracts.rule import Rule
from advisor.runtime.detect.op_kinds import FUSED_SDPA
from advisor.runtime.sdpa_fallback import SdpaArgs, fallback_reasons
from advisor.runtime.trace_detect import TraceView

_MATMUL = {"aten::matmul", "aten::bmm", "aten::baddbmm"}
_SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax"}
_SDPA = "aten::scaled_dot_product_attention"
_TRIANGLES = ("aten::tril", "aten::triu")


def attention_hits(view: TraceView, rule: Rule) -> Iterator[TraceHit]:
    """matmul, then softmax, then matmul, in order on one stack frame, outside SDPA."""
    events, pending = view.events, {}
    for i in view.named(_MATMUL | _SOFTMAX):
        if view.inside(i, {_SDPA} | _MATMUL | _SOFTMAX):
            continue
        e = events[i]
        key = (e.step, e.frame)
        state = pending.get(key)
        if e.name in _MATMUL:
            if state and state[1] is not None:
                qk, softmax = state
                yield TraceHit(rule.code, [qk, softmax, i], "hand-written attention (matmul, softmax, matmul): use "
                               "torch.nn.functional.scaled_dot_product_attention",
                               {"score_dims": events[softmax].dims[:1]})
                pending[key] = None
            else:
                pending[key] = (i, None)
        elif state:  # a softmax after a matmul
            pending[key] = (state[0], i)


def math_fallback_hits(view: TraceView, rule: Rule) -> Iterator[TraceHit]:
    device = "cuda" if view.on_device else "cpu"
    for i in view.named({_SDPA}):
        e = view.events[i]
        kernels = {name.removeprefix("aten::") for name in view.child_names(i)}
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
        yield TraceHit(rule.code, [i],
                       "scaled_dot_product_attention ran the math kernel: " + "; ".join(reasons),
                       {"reasons": reasons, "dims": e.dims[:3]})


def mask_rebuilt_hits(view: TraceView, rule: Rule) -> Iterator[TraceHit]:
    """tril/triu of a square (S x S) tensor outside SDPA, in every step."""
    for i in view.named(_TRIANGLES):
        e = view.events[i]
        if e.dims and len(e.dims[0]) >= 2 and e.dims[0][-1] == e.dims[0][-2] and not view.inside(i, {_SDPA}):
            size = e.dims[0][-1]
            yield TraceHit(rule.code, [i],
                           f"{size}x{size} mask built with {e.name[6:]} in every step: build it once "
                           "(register_buffer) or use is_causal=True", {"dims": e.dims[:1]})


def _number(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None

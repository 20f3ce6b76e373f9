"""ADV302: a cast A -> B -> A with nothing in between that needs B, measured by a profile."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_profiled, profiled
from advisor.contracts.detection import Detection

roles = lazy_import("advisor.patterns.copy_cast_roles")
casts = lazy_import("advisor.runtime.detect.casts")


def join(request):
    """Drop both casts of the one `.B().A()` chain on the line; unsafe, since that drops B's rounding."""
    parsed, hit = request.parsed, request.hit
    plan = request.plan()
    data = hit.extra.get("evidence", {})
    source, middle = data.get("from"), data.get("to")

    def back_cast(call) -> bool:
        return roles.cast_dtype(parsed, call) == source and roles.cast_dtype(parsed, call.func.value) == middle

    site, plan.reason = request.one(back_cast, f"{middle} -> {source} cast")
    if site is None:
        return plan
    plan.site = site
    inner = site.call.func.value
    plan.rewrite = roles.Rewrite(site.call, parsed.code(inner.func.value), "drops both casts")
    plan.facts.assumed("rounding-unneeded", f"the rounding to {middle} is not needed",
                       f"the round trip rounds every value to {middle}; without it the values change by up to that "
                       "rounding")
    plan.facts.assumed("dtype-fixed", f"the input is {source} in every call", f"observed in {hit.calls} call(s)")
    return plan


def detect(op_graph, device: str) -> list[Detection]:
    """Casts of an activation whose every reader (through views) casts straight back."""
    graph = op_graph.graph
    found = []
    for cast in casts.dtype_changes(graph):
        if cast.round_trip:
            end = max(graph.nodes[u]["loc"].line for u in cast.users if graph.nodes[u]["loc"] is not None)
            back = casts.dtype_name(cast.source.dtype)
            found.append(Detection(RULE.code, cast.loc, end, frozenset({cast.node, *cast.users}),
                                   f"round trip {cast.change}->{back} with nothing in between that needs "
                                   f"{casts.dtype_name(cast.result.dtype)}: remove both casts", cast.evidence))
    return found


RULE = CallRule(
    code="ADV302", kind="cast", title="Cast round trip A -> B -> A",
    summary="cast round trip A -> B -> A", fix="remove-call", fix_safety="unsafe",
    fix_summary="unsafe at most: removing it changes values by B's rounding",
    what="A tensor cast to B and straight back to A, with no op in between that computes in B.",
    why="It pays two full copies and may lose precision on the way.",
    fix_doc="Removing both casts changes results by that rounding, so the fix (`fix --profile --unsafe-fixes`, both "
            "casts in one chain on the line) is unsafe and says so.",
    example="y = x.half().float()",
    detectors=("runtime",),
    examples=(profiled("return x.half().float() * 2", "return x * 2", unsafe=True),
              not_profiled("return (x.half() * 2).float()")),
    references=("https://pytorch.org/docs/stable/tensor_attributes.html#torch-dtype",), threshold_share=0.005,
    join=join, graph=detect,
)

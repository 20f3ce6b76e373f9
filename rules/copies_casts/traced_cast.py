"""ADV305: a cast seen in a Chrome trace (its `trace` finds it: a trace has no op graph)."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.contracts.detection import TraceHit


def trace(view):
    """A `.to()` that copied (`_to_copy` ran under it)."""
    for i, event in view.python_calls("aten::to"):
        if "aten::_to_copy" in view.child_names(i):
            yield TraceHit(RULE.code, [i], "dtype/device cast that copied; whether it is needed takes "
                           "`advisor profile`", {"dims": event.dims[:1], "types": event.types[:1]})


RULE = CallRule(
    code="ADV305", kind="cast", title="Cast seen in a trace",
    summary="cast seen in a trace (`analyze`)", fix="none", fix_safety="unsafe", fix_summary="report",
    what="A `.to()` that copied, with its time, in a trace.",
    why="A trace does not show what the result feeds, so it cannot tell a round trip or a softmax-only upcast from a "
        "needed cast.",
    fix_doc="No fix: run `advisor profile` on the workload to get ADV302-ADV304.",
    example="y = x.to(torch.float16)  # seen in a Chrome trace",
    detectors=("runtime",),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.to.html",), threshold_share=0.005, trace=trace,
)

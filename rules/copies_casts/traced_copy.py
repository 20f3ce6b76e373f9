"""ADV205: a layout copy seen in a Chrome trace (its `trace` finds it: a trace has no op graph)."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.contracts.detection import TraceHit


def trace(view):
    """A `.contiguous()` that copied (ops ran under it)."""
    for i, event in view.python_calls("aten::contiguous"):
        if view.child_names(i):
            yield TraceHit(RULE.code, [i], "layout copy (`.contiguous()` that copied); whether a user needs it "
                           "takes `advisor profile`", {"dims": event.dims[:1]})


RULE = CallRule(
    code="ADV205", kind="contiguous", title="Layout copy seen in a trace",
    summary="copy seen in a trace (`analyze`)", fix="none", fix_safety="unsafe", fix_summary="report",
    what="A `.contiguous()` that copied, with its time, in a trace.",
    why="A trace does not show which ops read the copy, so it cannot tell a needed copy from a useless one.",
    fix_doc="No fix: run `advisor profile` on the workload to get ADV202-ADV204.",
    example="y = x.transpose(1, 2).contiguous()  # seen in a Chrome trace",
    detectors=("runtime",),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.contiguous.html",), threshold_share=0.005,
    trace=trace,
)

"""ADV305: a cast seen in a Chrome trace (advisor.runtime.trace_detect finds it: a trace has no op graph)."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule

RULE = CallRule(
    code="ADV305", kind="cast", title="Cast seen in a trace",
    summary="cast seen in a trace (`analyze`)", fix="none", fix_safety="unsafe", fix_summary="report",
    what="A `.to()` that copied, with its time, in a trace.",
    why="A trace does not show what the result feeds, so it cannot tell a round trip or a softmax-only upcast from a "
        "needed cast.",
    fix_doc="No fix: run `advisor profile` on the workload to get ADV302-ADV304.",
    example="y = x.to(torch.float16)  # seen in a Chrome trace",
    detectors=("runtime",),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.to.html",), threshold_share=0.005,
)

"""ADV303: a parameter or buffer cast on every call, measured by a profile; reported, never hoisted."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_profiled, profiled
from advisor.contracts.detection import Detection

casts = lazy_import("advisor.runtime.detect.casts")


def join(request):
    """No patch: the reason says what hoisting would change."""
    data = request.hit.extra.get("evidence", {})
    plan = request.plan()
    plan.reason = (f"not hoisted: storing `{data.get('param')}` as {data.get('to')} changes the module's state "
                   "(its state_dict dtype, and what a later `.to()`/`.double()` of the module converts); create it "
                   f"in {data.get('to')} or cast the module once where it is built")
    return plan


def detect(op_graph, device: str) -> list[Detection]:
    """Casts whose input is a parameter or buffer of the module."""
    return [Detection(RULE.code, cast.loc, cast.loc.line, frozenset({cast.node}),
                      f"`{cast.source.param}` is cast {cast.change} on every call: store it in "
                      f"{casts.dtype_name(cast.result.dtype)} or cast the module once",
                      cast.evidence | {"param": cast.source.param})
            for cast in casts.dtype_changes(op_graph.graph) if cast.source.param is not None]


RULE = CallRule(
    code="ADV303", kind="cast", title="Parameter or buffer cast on every call",
    summary="parameter/buffer cast on every call", fix="none", fix_safety="unsafe",
    fix_summary="report, with why it is not hoisted (it would change the module's state_dict dtype and `.to()` "
                "behaviour)",
    what="A weight or buffer stored in one dtype and cast to another inside forward.",
    why="The weight is converted again on every call, a full read and write of it each time.",
    fix_doc="No automatic fix: hoisting the cast out of forward changes the module's state (the state_dict dtype of "
            "the parameter or buffer, and what a later `.to()`/`.double()` of the module converts); store it in the "
            "dtype it is used in, or cast the module once with `.to(dtype)`.",
    example="return x @ self.weight.half()  # in forward",
    detectors=("runtime",),
    examples=(profiled("return x @ self.table.float()", reason="not hoisted"), not_profiled("return x @ x.mT")),
    references=("https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.to",),
    threshold_share=0.005, join=join, graph=detect,
)

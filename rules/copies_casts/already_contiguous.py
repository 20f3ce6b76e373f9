"""ADV201: `.contiguous()` of a tensor that is contiguous already, proved from the source or measured."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_profiled, not_returned, profiled, returned
from advisor.contracts.detection import Detection, TraceHit

roles = lazy_import("advisor.patterns.copy_cast_roles")
engine = lazy_import("advisor.fixes.copy_cast_fix")


def prove(parsed, call):
    """`.contiguous()` of a value contiguous by construction returns that same object."""
    if not roles.is_contiguous_call(call):
        return None
    why = roles.produces_contiguous(parsed, call.func.value)
    if why is None:
        return None
    return roles.Rewrite(call, roles.removed_call(parsed, call), f"`.contiguous()` returns its input unchanged: {why}")


def join(request):
    return engine.copy_removal(request, roles.is_contiguous_call,
                               "the tensor was contiguous in every profiled call, where `.contiguous()` returns it")


def detect(op_graph, device: str) -> list[Detection]:
    """Every recorded `.contiguous()` call that dispatched no op: it returned its input."""
    return [Detection(RULE.code, call.loc, call.loc.line, frozenset(),
                      f"`.contiguous()` on a tensor that is already contiguous {list(call.self_meta.shape)}: "
                      "it returns its input, remove it", {"shape": list(call.self_meta.shape)})
            for call in op_graph.calls
            if call.name == "contiguous" and call.first_op == call.last_op and call.loc is not None]


def trace(view):
    """A `.contiguous()` that copied nothing (no op ran under it)."""
    for i, event in view.python_calls("aten::contiguous"):
        if not view.child_names(i):
            yield TraceHit(RULE.code, [i], "`.contiguous()` on a tensor that was already contiguous: it copied "
                           "nothing, remove it")


RULE = CallRule(
    code="ADV201", kind="contiguous", title="`.contiguous()` on a tensor that is already contiguous",
    summary="`.contiguous()` of a contiguous tensor", fix="remove-call", fix_safety="safe",
    fix_summary="safe when proved from the source (its input is `.contiguous()`, or a name assigned one in the "
                "statement before) or every profiled call returned its input and no value derived from the result is "
                "`.view`ed, returned or stored; else unsafe, naming why",
    what="Finds `.contiguous()` on a tensor that is contiguous already (its input is itself `.contiguous()` or a "
         "contiguous clone, or every profiled call on the line returned its input).",
    why="The call copies nothing and costs only a Python call; it is reported so the reader stops assuming a copy "
        "happens there.",
    fix_doc="Removes the call. Proved from the source, or from a profile (`fix --profile`) when every call that ran "
            "on the line returned its input. Unsafe, naming the assumption, when the layout of the result or of any "
            "value derived from it (operators, views, torch functions, indexing keep or share its strides; only "
            "matrix products, reductions and softmax make a new contiguous tensor) is read later (`.view`, "
            "`as_strided`, `.stride()`) or drawn over at random (dropout, `randn_like`, `.bernoulli()`: one seed "
            "puts the draws on other elements), leaves the function (returned, stored, passed outside torch), or a "
            "tensor of the function is written in place (an array of `.numpy()` too, whose methods write without a "
            "trailing underscore).",
    detectors=("static", "runtime"),
    examples=(returned("x.contiguous().contiguous()", "x.contiguous()"),
              not_returned("x.contiguous()"), not_returned("x.contiguous().view(-1)"),
              profiled("return x.contiguous().sum(-1)", "return x.sum(-1)"),
              not_profiled("return x.transpose(1, 2).contiguous().view(2, -1)")),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.contiguous.html",), threshold_share=0.005,
    tokens=("contiguous",), prove=prove, join=join, graph=detect, redundant_call="contiguous", trace=trace,
    methods=("contiguous",),
)

"""ADV301: a cast to the dtype the tensor already has, proved from the source or measured."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_profiled, not_returned, profiled, returned
from advisor.contracts.detection import Detection, TraceHit

roles = lazy_import("advisor.patterns.copy_cast_roles")
casts = lazy_import("advisor.runtime.detect.casts")


def prove(parsed, call):
    """A cast of a value just cast to that same dtype (or moved by `.to()` of the same argument) returns it."""
    if _same_argument_to(call):
        return roles.Rewrite(call, roles.removed_call(parsed, call),
                             "its input was just moved with `.to()` of the same argument (a dtype, device or tensor), "
                             "so it already matches and `.to()` returns it")
    dtype = roles.cast_dtype(parsed, call)
    if dtype is None:
        return None
    receiver = call.func.value
    if roles.cast_dtype(parsed, receiver) == dtype:
        return roles.Rewrite(call, roles.removed_call(parsed, call),
                             f"its input was just cast to {dtype}, so the cast returns it")
    value = roles.assigned_value(parsed, receiver)
    if value is not None and roles.cast_dtype(parsed, value) == dtype:
        return roles.Rewrite(call, roles.removed_call(parsed, call), f"`{receiver.value}` was cast to {dtype} at line "
                                                                     f"{parsed.line(value)}, so the cast returns it")
    return None


def _same_argument_to(call) -> bool:
    """`x.to(a).to(a)`: the same single name passed to both, nothing evaluated between the two reads of it."""
    import libcst as cst

    found = roles.method(call)
    inner = roles.method(found[0]) if found else None
    if not (found and inner and found[1] == inner[1] == "to"):
        return False
    args = [call.args, found[0].args]
    return all(len(a) == 1 and a[0].keyword is None and not a[0].star and isinstance(a[0].value, cst.Name)
               for a in args) and args[0][0].value.value == args[1][0].value.value


def join(request):
    """Remove the one cast to the measured dtype on the line, when every call there was redundant. Unsafe: the
    dtype follows the caller's inputs, which a profile samples."""
    parsed, hit = request.parsed, request.hit
    plan = request.plan()
    dtype = hit.extra.get("evidence", {}).get("dtype")
    site, plan.reason = request.one(lambda c: roles.cast_dtype(parsed, c) == dtype, f"cast to {dtype}")
    if site is None:
        return plan
    plan.site = site
    every = request.not_every_call(roles.method(site.call)[1], "cast")
    if every is not None:
        plan.reason = every
        return plan
    proof = f"the input was already {dtype} in every profiled call ({hit.calls}), where the cast returns it"
    plan.rewrite = roles.Rewrite(site.call, roles.removed_call(parsed, site.call), proof)
    plan.facts.assumed("dtype-fixed", f"the input is {dtype} in every call, not only the profiled ones",
                       f"observed in {hit.calls} call(s); its dtype follows the caller's inputs and the module's "
                       "dtype, which a caller can change")
    return plan


def detect(op_graph, device: str) -> list[Detection]:
    """Every recorded cast call to the dtype its input had (it dispatched no op)."""
    return [Detection(RULE.code, call.loc, call.loc.line, frozenset(),
                      f"`.{call.name}(...)` casts to {casts.dtype_name(call.options['dtype'])}, the dtype the tensor "
                      "already has: it does nothing, remove it", {"dtype": casts.dtype_name(call.options["dtype"])})
            for call in op_graph.calls
            if call.name in casts.CAST_CALLS and call.loc is not None and call.first_op == call.last_op
            and call.options.get("dtype") == call.self_meta.dtype]


def trace(view):
    """A `.to()` that returned its input (no `_to_copy` under it)."""
    for i, event in view.python_calls("aten::to"):
        if "aten::_to_copy" not in view.child_names(i):
            yield TraceHit(RULE.code, [i], "`.to()` that returned its input (already that dtype): "
                           "remove it")


RULE = CallRule(
    code="ADV301", kind="cast", title="Cast to the dtype the tensor already has",
    summary="cast to the dtype it has", fix="remove-call", fix_safety="safe",
    fix_summary="safe when the source proves the dtype (`x.float().float()`); from a profile alone unsafe (the dtype "
                "follows the caller's inputs)",
    what="`.to(dtype)`, `.float()` and friends on a tensor that already has that dtype.",
    why="The call returns its input and costs nothing measurable; it is reported because it usually hides a wrong "
        "belief about dtypes.",
    fix_doc="Removes the cast. Safe when the source proves the dtype (the input was just cast to it). A profile alone "
            "(`fix --profile`) gives an unsafe fix naming the assumption: the dtype follows the caller's inputs and "
            "the module's dtype, which a caller can change.",
    detectors=("static", "runtime"),
    examples=(returned("x.float().float()", "x.float()"), not_returned("x.float().half()"),
              not_returned("x.to(x.device).float()"),
              profiled("return x.float() * 2", "return x * 2", unsafe=True), not_profiled("return x.double() * 2")),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.to.html",), threshold_share=0.005,
    # every spelling of a cast: its method or dtype name holds one of these, or it is `.to(`
    tokens=("float", "half", "double", "long", "int", "short", "char", "byte", "bool", ".to("),
    methods=("float", "half", "bfloat16", "double", "long", "int", "short", "char", "byte", "bool", "to"),
    prove=prove, join=join, graph=detect, redundant_call="cast", trace=trace,
)

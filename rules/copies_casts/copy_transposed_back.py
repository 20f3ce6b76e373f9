"""ADV203: a layout copy transposed again right away, measured by a profile."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_profiled, profiled
from advisor.contracts.detection import Detection

roles = lazy_import("advisor.patterns.copy_cast_roles")
engine = lazy_import("advisor.fixes.copy_cast_fix")
aliasing = lazy_import("advisor.fixes.aliasing")
copies = lazy_import("advisor.runtime.detect.copies")
ops = lazy_import("advisor.runtime.detect.op_kinds")

TRANSPOSES = frozenset({"transpose", "permute", "t"})


def join(request):
    """Remove the `.contiguous()`; the aliasing and layout obligations hold on the transpose back, which is what
    carries the un-copied memory on."""
    parsed = request.parsed
    plan = engine.copy_removal(request, lambda call: transpose_back(parsed, call) is not None,
                               "the copy's layout is transposed away at once; the values are the same without it",
                               result_of=lambda call: transpose_back(parsed, call))
    if plan.site is None and any(roles.is_contiguous_call(site.call) for site in request.sites):
        plan.reason = (f"the `.contiguous()` on line {request.hit.line} is not transposed back, in its expression or "
                       "as the only use of the name it is assigned to")
    return plan


def transpose_back(parsed, call):
    """The transpose that undoes the layout of `x.transpose(...).contiguous()`: in the same expression, or as the
    only use of the one name the copy is assigned to (`y = x.mT.contiguous()` then `z = y.mT`); else None."""
    import libcst as cst

    inner = roles.method(call.func.value)
    if not (roles.is_contiguous_call(call) and inner is not None and inner[1] in TRANSPOSES):
        return None
    reader = call
    assign = parsed.parents.get(call)
    if isinstance(assign, cst.Assign) and assign.value is call:
        function = parsed.innermost(assign, cst.FunctionDef)
        flow = parsed.flow(function) if function is not None else None
        reads = aliasing.reads_of_assignment(flow, assign) if flow is not None else None
        # its one read must see this assignment alone (a read of it sees it; one definition means only it)
        if not reads or len(reads) != 1 or len(flow.definitions_of(reads[0])) != 1 or flow.sees_undefined(reads[0]):
            return None
        reader = reads[0]
    outer = parsed.parents.get(reader)
    caller = parsed.parents.get(outer)
    if isinstance(outer, cst.Attribute) and outer.value is reader and outer.attr.value in TRANSPOSES and \
            isinstance(caller, cst.Call) and caller.func is outer:
        return caller
    return None


def detect(op_graph, device: str) -> list[Detection]:
    """Copies of a strided tensor read only by transposes."""
    return [Detection(RULE.code, copy.loc, copy.loc.line, frozenset({copy.node}),
                      f"layout copy of {copy.size} is transposed again right away: drop the `.contiguous()` or the "
                      "transpose", copy.evidence)
            for copy in copies.layout_copies(op_graph.graph)
            if not copy.source.contiguous and copy.user_ops <= ops.TRANSPOSES]


RULE = CallRule(
    code="ADV203", kind="contiguous", title="Layout copy immediately transposed again",
    summary="layout copy transposed right back (profile)", fix="remove-call", fix_safety="safe",
    fix_summary="`--profile`: remove the `.contiguous()`, same obligations as ADV202",
    what="A transpose/permute right after a `.contiguous()` (in the same expression, or as the only use of the name "
         "the copy is assigned to), measured by a profile.",
    why="The transpose gives back a strided tensor, so the copy's layout is thrown away at once.",
    fix_doc="`advisor fix --profile`: removes the `.contiguous()` between the two transposes, with the same "
            "aliasing and layout obligations as ADV202 (the un-copied result is a view of the input).",
    example="y = x.transpose(1, 2).contiguous().transpose(1, 2)",
    detectors=("runtime",),
    examples=(profiled("y = x.transpose(1, 2).contiguous().transpose(1, 2)\nreturn y.sum(-1)",
                       "y = x.transpose(1, 2).transpose(1, 2)\nreturn y.sum(-1)"),
              not_profiled("y = x.transpose(1, 2).contiguous()\nreturn y @ x")),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.contiguous.html",), threshold_share=0.005,
    join=join, graph=detect, redundant_call="contiguous",
)

"""ADV204: a copy whose only reader copies again; a `.contiguous()`/`.clone()` chain folds into one clone."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_profiled, not_returned, profiled, returned
from advisor.contracts.detection import Detection

roles = lazy_import("advisor.patterns.copy_cast_roles")
engine = lazy_import("advisor.fixes.copy_cast_fix")
copies = lazy_import("advisor.runtime.detect.copies")
ops = lazy_import("advisor.runtime.detect.op_kinds")


# What the fold cannot prove (breaker round 17): a tensor `.contiguous()` leaves alone keeps its strides through the
# clone, channels-last ones on size-1 dims included (a pooled (N, C, 1, 1) map), and later ops pick their memory
# format from them; the folded clone makes them contiguous. MKLDNN tensors reject the memory_format argument.
STRIDES = ("size-one-strides", "the tensor has no size-1 dims with other strides, and a strided layout",
           "`.contiguous()` returns an already contiguous tensor unchanged, and the clone keeps its strides, those of "
           "size-1 dims included (a channels-last (N, C, 1, 1) map keeps channels-last, and so do the ops after it); "
           "the folded clone gives contiguous strides, after which a `.view` of a later op's output can raise; an "
           "MKLDNN tensor rejects `memory_format=`")


def prove(parsed, call):
    """`x.contiguous().clone()` and `x.clone().contiguous()` each give a fresh contiguous tensor with x's values;
    `x.clone(memory_format=torch.contiguous_format)` gives the same with one copy, but for the strides of size-1
    dims (STRIDES)."""
    torch = roles.torch_alias(parsed)
    found = roles.method(call)
    if torch is None or found is None:
        return None
    inner, _ = found
    if roles.is_contiguous_call(call) and roles.is_plain_clone(inner):  # x.clone().contiguous(): the clone is fresh
        source = inner.func.value
    elif roles.is_plain_clone(call) and roles.is_contiguous_call(inner):
        source = inner.func.value
    else:
        return None  # `.contiguous().to(D)` has no one-copy twin: `.to(D, memory_format=...)` may return an alias
    code = f"{roles.standalone(parsed.code(source))}.clone(memory_format={torch}.contiguous_format)"
    return roles.Rewrite(call, code, "one contiguous clone: fresh, contiguous, same values", (STRIDES,))


def join(request):
    return engine.proved_on_line(request, prove, "the two copies are not a `.contiguous()`/`.clone()` chain on this line")


def detect(op_graph, device: str) -> list[Detection]:
    """Copies read only by other copies."""
    return [Detection(RULE.code, copy.loc, copy.loc.line, frozenset({copy.node}),
                      f"copy of {copy.size} is copied again by {', '.join(sorted(copy.user_ops))}: fold the two into "
                      "one copy", copy.evidence)
            for copy in copies.layout_copies(op_graph.graph) if copy.user_ops <= ops.COPIES]


RULE = CallRule(
    code="ADV204", kind="contiguous", title="Copy followed by another copy",
    summary="copy copied again", fix="fold-copies", fix_safety="unsafe",
    fix_summary="unsafe: `x.contiguous().clone()` / `x.clone().contiguous()` become "
                "`x.clone(memory_format=torch.contiguous_format)`, which drops the strides of size-1 dims; "
                "`.contiguous()` then a cast is report only",
    what="A copy (`.contiguous()`, `.clone()`, a reshape that copies) whose only reader copies again (`.to()`, "
         "`.float()`, `.clone()`).",
    why="The data is read and written twice where one copy gives the same tensor.",
    fix_doc="`x.contiguous().clone()` and `x.clone().contiguous()` become one "
            "`x.clone(memory_format=torch.contiguous_format)`: unsafe, since a tensor `.contiguous()` leaves alone "
            "keeps the strides of its size-1 dims through the clone (a channels-last pooled (N, C, 1, 1) map stays "
            "channels-last, and so do the ops after it) where the fold makes them contiguous. A `.contiguous()` "
            "followed by a cast is reported only: `.to(dtype, memory_format=...)` returns a strided input unchanged "
            "when it already has that dtype.",
    detectors=("static", "runtime"),
    examples=(returned("x.contiguous().clone()", "x.clone(memory_format=torch.contiguous_format)", unsafe=True),
              not_returned("x.contiguous().double()"),
              profiled("return x.transpose(1, 2).contiguous().clone().sum(-1)",
                       "return x.transpose(1, 2).clone(memory_format=torch.contiguous_format).sum(-1)", unsafe=True),
              not_profiled("return x.transpose(1, 2).contiguous() @ x")),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.clone.html",), threshold_share=0.005,
    tokens=("contiguous",), methods=("contiguous", "clone"), prove=prove, join=join, graph=detect,
)

"""ADV202: a layout copy whose readers all take strided input, measured by a profile."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_profiled, profiled
from advisor.contracts.detection import Detection

roles = lazy_import("advisor.patterns.copy_cast_roles")
engine = lazy_import("advisor.fixes.copy_cast_fix")
copies = lazy_import("advisor.runtime.detect.copies")
ops = lazy_import("advisor.runtime.detect.op_kinds")


def join(request):
    return engine.copy_removal(request, roles.is_contiguous_call,
                               "every op reading the copy accepts strided input (views replayed on meta tensors)")


def detect(op_graph, device: str) -> list[Detection]:
    """Copies of a strided tensor whose every reader works on it un-copied. A copy read only by copies or only by
    transposes is left to ADV204 and ADV203, which say more."""
    graph = op_graph.graph
    return [Detection(RULE.code, copy.loc, copy.loc.line, frozenset({copy.node}),
                      f"`.contiguous()` copy of {copy.size} feeds only ops that accept strided input "
                      f"({', '.join(sorted(copy.user_ops))}): remove it", copy.evidence)
            for copy in copies.layout_copies(graph)
            if not copy.source.contiguous and not copy.user_ops <= ops.COPIES and not copy.user_ops <= ops.TRANSPOSES
            and all(copies.takes_strides(graph, user, copy.source) for user in copy.users)]


RULE = CallRule(
    code="ADV202", kind="contiguous", title="Layout copy whose users all accept strided input",
    summary="layout copy whose readers all take strides (profile)", fix="remove-call", fix_safety="safe",
    fix_summary="`--profile`: remove it; safe when no value derived from the result is returned, stored, `.view`ed "
                "or read by a lambda, a generator or a callable outside torch, nothing in the function writes in "
                "place (static, and no in-place op measured there) and no call it makes can reach the copy's input "
                "(module state reaches every method and helper); else unsafe. Accepted: `input-writes`",
    what="A `.contiguous()` of a transposed or permuted tensor whose every reader (matmul, elementwise ops, softmax, "
         "views that succeed on the strided layout) takes strided input, as measured by a profile.",
    why="The copy writes every element: it costs memory bandwidth and buys nothing.",
    fix_doc="`advisor fix --profile`: removes the call when every call on the line was redundant. Removing a copy "
            "never changes values (a later reduction may sum in another order: last-bit differences); the result "
            "then shares its input's memory and strides, so the patch is safe only when no code reads the layout of "
            "the result or of a value derived from it (random draws too: dropout, `randn_like`, `.bernoulli()` "
            "follow memory order, so one seed puts them on other elements; a profile in eval mode drew nothing), "
            "none of them leaves the function (returned, stored, read by "
            "a lambda or a generator, handed to a callable outside torch), nothing in the function writes in place "
            "(`x.add_()`, `out=`, `inplace=True`, an array of `.numpy()`, whose methods write without a trailing "
            "underscore) and no call it makes can reach the copy's input (a method or helper "
            "reaches `self.` state and globals; any callee reaches what it is handed); otherwise it is unsafe and "
            "names what could differ. Accepted, `input-writes`: autograd may save the un-copied tensor, now a view "
            "of the input the caller holds; refilling that input in place before `backward()` raises there (or, "
            "through `.numpy()`/`.data`, which autograd does not see, gives other gradients).",
    example="y = x.transpose(1, 2).contiguous()\nreturn y @ w  # matmul takes strided input",
    detectors=("runtime",),
    examples=(profiled("y = x.transpose(1, 2).contiguous()\nreturn y @ x", "y = x.transpose(1, 2)\nreturn y @ x"),
              not_profiled("y = x.transpose(1, 2).contiguous()\nreturn y.view(2, -1)")),
    references=("https://pytorch.org/docs/stable/notes/cuda.html#memory-management",), threshold_share=0.005,
    join=join, graph=detect, redundant_call="contiguous",
)

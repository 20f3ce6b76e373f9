"""Copies and casts (advisor.fixes.copies_casts over advisor.patterns.copies_casts): proved redundant from the
source, or measured by a profile (`fix --profile`) and joined to the call on that line. Each fix states its
safety and why; runtime-only codes (ADV205, ADV305) come from a trace, which cannot tell a needed copy apart."""

from __future__ import annotations

from advisor.registry import Family, Rule, negative, positive

HEADER = "import torch\nimport torch.nn.functional as F\n\n\ndef f(x):\n    return {}\n"


def _returned(expression: str, fixed: str | None = None, **kwargs):
    return positive(HEADER.format(expression), fixed=HEADER.format(fixed) if fixed else None, **kwargs)


def _not(expression: str, reason: str | None = None):
    return negative(HEADER.format(expression), reason=reason)


ALREADY_CONTIGUOUS = Rule(
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
            "`as_strided`, `.stride()`), leaves the function (returned, stored, passed outside torch), or a tensor "
            "of the function is written in place.",
    detectors=("static", "runtime"),
    examples=(_returned("x.contiguous().contiguous()", "x.contiguous()"),
              _not("x.contiguous()"), _not("x.contiguous().view(-1)")),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.contiguous.html",), threshold_share=0.005,
)

STRIDED_OK = Rule(
    code="ADV202", kind="contiguous", title="Layout copy whose users all accept strided input",
    summary="layout copy whose readers all take strides (profile)", fix="remove-call", fix_safety="safe",
    fix_summary="`--profile`: remove it; safe when no value derived from the result is returned, stored or `.view`ed "
                "and nothing in the function writes in place (static, and no in-place op measured there); else unsafe",
    what="A `.contiguous()` of a transposed or permuted tensor whose every reader (matmul, elementwise ops, softmax, "
         "views that succeed on the strided layout) takes strided input, as measured by a profile.",
    why="The copy writes every element: it costs memory bandwidth and buys nothing.",
    fix_doc="`advisor fix --profile`: removes the call when every call on the line was redundant. Removing a copy "
            "never changes values (a later reduction may sum in another order: last-bit differences); the result "
            "then shares its input's memory and strides, so the patch is safe only when no code reads the layout of "
            "the result or of a value derived from it, none of them leaves the function, and nothing in the "
            "function writes in place; otherwise it is unsafe and names what could differ.",
    example="y = x.transpose(1, 2).contiguous()\nreturn y @ w  # matmul takes strided input",
    detectors=("runtime",),
    references=("https://pytorch.org/docs/stable/notes/cuda.html#memory-management",), threshold_share=0.005,
)

UNDONE = Rule(
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
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.contiguous.html",), threshold_share=0.005,
)

COPY_COPY = Rule(
    code="ADV204", kind="contiguous", title="Copy followed by another copy",
    summary="copy copied again", fix="fold-copies", fix_safety="safe",
    fix_summary="safe: `x.contiguous().clone()` / `x.clone().contiguous()` become "
                "`x.clone(memory_format=torch.contiguous_format)`; `.contiguous()` then a cast is report only",
    what="A copy (`.contiguous()`, `.clone()`, a reshape that copies) whose only reader copies again (`.to()`, "
         "`.float()`, `.clone()`).",
    why="The data is read and written twice where one copy gives the same tensor.",
    fix_doc="`x.contiguous().clone()` and `x.clone().contiguous()` become one "
            "`x.clone(memory_format=torch.contiguous_format)` (safe, proved from the source). A `.contiguous()` "
            "followed by a cast is reported only: `.to(dtype, memory_format=...)` returns a strided input unchanged "
            "when it already has that dtype.",
    detectors=("static", "runtime"),
    examples=(_returned("x.contiguous().clone()", "x.clone(memory_format=torch.contiguous_format)"),
              _not("x.contiguous().double()")),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.clone.html",), threshold_share=0.005,
)

TRACED_COPY = Rule(
    code="ADV205", kind="contiguous", title="Layout copy seen in a trace",
    summary="copy seen in a trace (`analyze`)", fix="none", fix_safety="unsafe", fix_summary="report",
    what="A `.contiguous()` that copied, with its time, in a trace.",
    why="A trace does not show which ops read the copy, so it cannot tell a needed copy from a useless one.",
    fix_doc="No fix: run `advisor profile` on the workload to get ADV202-ADV204.",
    example="y = x.transpose(1, 2).contiguous()  # seen in a Chrome trace",
    detectors=("runtime",),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.contiguous.html",), threshold_share=0.005,
)

SAME_DTYPE = Rule(
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
    examples=(_returned("x.float().float()", "x.float()"), _not("x.float().half()"), _not("x.to(x.device).float()")),
    references=("https://pytorch.org/docs/stable/generated/torch.Tensor.to.html",), threshold_share=0.005,
)

ROUND_TRIP = Rule(
    code="ADV302", kind="cast", title="Cast round trip A -> B -> A",
    summary="cast round trip A -> B -> A", fix="remove-call", fix_safety="unsafe",
    fix_summary="unsafe at most: removing it changes values by B's rounding",
    what="A tensor cast to B and straight back to A, with no op in between that computes in B.",
    why="It pays two full copies and may lose precision on the way.",
    fix_doc="Removing both casts changes results by that rounding, so the fix (`fix --profile --unsafe-fixes`, both "
            "casts in one chain on the line) is unsafe and says so.",
    example="y = x.half().float()",
    detectors=("runtime",),
    references=("https://pytorch.org/docs/stable/tensor_attributes.html#torch-dtype",), threshold_share=0.005,
)

PARAM_CAST = Rule(
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
    references=("https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.to",),
    threshold_share=0.005,
)

SOFTMAX_UPCAST = Rule(
    code="ADV304", kind="cast", title="Upcast that only feeds softmax",
    summary="upcast that only feeds softmax", fix="softmax-dtype", fix_safety="safe",
    fix_summary="safe: `softmax(x.float(), dim)` becomes `softmax(x, dim, dtype=torch.float32)` (fused on CUDA for "
                "float16; neutral on CPU); inside an attention block the attention rewrite replaces it",
    what="`softmax(x.float(), dim)` and its spellings: an upcast whose only reader is softmax.",
    why="It writes an upcast copy of the scores and then reads it; `softmax(x, dim, dtype=torch.float32)` asks for "
        "the same result and lets the kernel upcast while it reads (fused on CUDA for float16).",
    fix_doc="Safe, proved from the source: softmax's dtype= casts its input first, whatever its dtype. Elsewhere than "
            "CUDA float16 softmax's dtype= dispatches the same cast itself, so the change is neutral there. Inside a "
            "hand-written attention block the attention rule's rewrite replaces the softmax instead.",
    detectors=("static", "runtime"),
    examples=(_returned("F.softmax(x.float(), dim=-1)", "F.softmax(x, dim=-1, dtype=torch.float32)"),
              _not("F.softmax(x.float(), dim=-1, dtype=torch.float64)"), _not("F.softmax(x, dim=-1).float()")),
    references=("https://pytorch.org/docs/stable/generated/torch.nn.functional.softmax.html",), threshold_share=0.005,
)

TRACED_CAST = Rule(
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


def _detect(context):
    from advisor.fixes.copies_casts import copy_cast_findings

    return copy_cast_findings(context.parsed, context.evidence, context.earlier)


FAMILY = Family(
    name="copies_casts",
    rules=(ALREADY_CONTIGUOUS, STRIDED_OK, UNDONE, COPY_COPY, TRACED_COPY, SAME_DTYPE, ROUND_TRIP, PARAM_CAST,
           SOFTMAX_UPCAST, TRACED_CAST),
    # what a static proof needs: a copy, a softmax, or a cast (each spelling of advisor.patterns.copies_casts'
    # cast methods and dtypes holds one of these; a test checks it); runtime evidence bypasses it
    prefilter=("contiguous", "clone", "softmax", "float", "half", "double", "long", "int", "short", "char", "byte",
               "bool"),
    static=_detect, uses_evidence=True,
    graph_detectors=("advisor.runtime.detect.copies", "advisor.runtime.detect.casts"),
)

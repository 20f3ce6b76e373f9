"""ADV304: an upcast whose only reader is softmax; softmax's dtype= does the cast while it reads."""

from __future__ import annotations

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_profiled, not_returned, profiled, returned
from advisor.contracts.detection import Detection

roles = lazy_import("advisor.patterns.copy_cast_roles")
engine = lazy_import("advisor.fixes.copy_cast_fix")
casts = lazy_import("advisor.runtime.detect.casts")
ops = lazy_import("advisor.runtime.detect.op_kinds")


# a cast to float16 or bfloat16 is no upcast: under CUDA autocast softmax without dtype= runs in float32 and
# returns float32, with dtype= in the dtype given (breaker round 30: 2.4e-4 apart on an H100, another output dtype)
UPCASTS = frozenset({"float32", "float64"})


def prove(parsed, call):
    """`softmax(x.float(), dim)` -> `softmax(x, dim, dtype=torch.float32)`: softmax's dtype= casts its input to
    dtype before the operation, so the result is the same tensor of values for any input dtype (under autocast too:
    float32 is what autocast runs softmax in, float64 it leaves alone); on CUDA the kernel
    reads half input and writes float output in one pass instead of writing an upcast copy first."""
    import libcst as cst

    found = _softmax_input(parsed, call)
    if found is None:
        return None
    cast, position = found
    dtype = roles.cast_dtype(parsed, cast)
    code = roles.dtype_code(parsed, cast, dtype) if dtype in UPCASTS else None
    if code is None:
        return None
    source = cast.func.value
    if "#" in parsed.code(cast).replace(parsed.code(source), "", 1):
        return None  # a comment inside the cast the fix removes (`x.float(  # why`): kept by no rewrite
    keyword = cst.Arg(value=cst.parse_expression(code), keyword=cst.Name("dtype"),
                      equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                            whitespace_after=cst.SimpleWhitespace("")))
    args = list(call.args)
    if position is None:
        new = call.with_changes(func=call.func.with_changes(value=source))
    else:
        args[position] = args[position].with_changes(value=source)
        new = call
    if args:  # the new keyword takes the last argument's comma and what follows it (a comment, a newline)
        keyword = keyword.with_changes(comma=args[-1].comma)
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    new = new.with_changes(args=[*args, keyword])
    return roles.Rewrite(call, roles.standalone(parsed.module.code_for_node(new)),
                         f"softmax's dtype= casts its input to {dtype} first, so the values are the same")


def _softmax_input(parsed, call):
    """(input expression, its position in call.args or None for a method's receiver) of a softmax call that
    does not pass dtype= yet."""
    if any((arg.keyword is not None and arg.keyword.value == "dtype") or arg.star for arg in call.args):
        return None  # dtype given already, or maybe inside *args or **kwargs
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    found = roles.method(call)
    if found is not None and found[1] == "softmax" and parsed.imported_name(call.func) not in roles.SOFTMAXES:
        return (found[0], None) if len(positional) <= 1 else None  # x.softmax(dim): dtype is the 2nd parameter
    if parsed.imported_name(call.func) in roles.SOFTMAXES and positional and len(positional) <= 2 \
            and call.args[0] is positional[0]:
        return positional[0].value, 0
    return None


def join(request):
    return engine.proved_on_line(request, prove, "the upcast is not an argument of a softmax call on this line")


def detect(op_graph, device: str) -> list[Detection]:
    """Upcasts of an activation read only by softmax (not softmax's own dtype= cast, which is the fix)."""
    return [Detection(RULE.code, cast.loc, cast.loc.line, frozenset({cast.node}),
                      f"upcast {cast.change} only feeds softmax: pass dtype=torch.{casts.dtype_name(cast.result.dtype)} "
                      "to softmax instead", cast.evidence)
            for cast in casts.dtype_changes(op_graph.graph)
            if cast.source.param is None and not cast.round_trip and cast.users and cast.user_ops <= ops.SOFTMAXES
            and cast.result.dtype.itemsize > cast.source.dtype.itemsize
            and not ops.in_call(op_graph, cast.node, "softmax")]


RULE = CallRule(
    code="ADV304", kind="cast", title="Upcast that only feeds softmax",
    summary="upcast that only feeds softmax", fix="softmax-dtype", fix_safety="safe",
    fix_summary="safe: `softmax(x.float(), dim)` becomes `softmax(x, dim, dtype=torch.float32)` (fused on CUDA for "
                "float16; neutral on CPU); inside an attention block the attention rewrite replaces it",
    what="`softmax(x.float(), dim)` and its spellings: an upcast whose only reader is softmax.",
    why="It writes an upcast copy of the scores and then reads it; `softmax(x, dim, dtype=torch.float32)` asks for "
        "the same result and lets the kernel upcast while it reads (fused on CUDA for float16).",
    fix_doc="Safe, proved from the source: softmax's dtype= casts its input first, whatever its dtype. Elsewhere than "
            "CUDA float16 softmax's dtype= dispatches the same cast itself, so the change is neutral there. Inside a "
            "hand-written attention block the attention rule's rewrite replaces the softmax instead. Only casts to "
            "float32 or float64 count: CUDA autocast runs softmax without dtype= in float32, so `softmax(x.half())` "
            "keeps its cast (breaker round 30: another output dtype, 2.4e-4 apart on an H100).",
    detectors=("static", "runtime"),
    examples=(returned("F.softmax(x.float(), dim=-1)", "F.softmax(x, dim=-1, dtype=torch.float32)"),
              not_returned("F.softmax(x.float(), dim=-1, dtype=torch.float64)"),
              not_returned("F.softmax(x, dim=-1).float()"),
              profiled("h = x.half() * 2\nreturn F.softmax(h.float(), dim=-1)",
                       "h = x.half() * 2\nreturn F.softmax(h, dim=-1, dtype=torch.float32)"),
              not_profiled("u = (x.half() * 2).float()\nreturn F.softmax(u, dim=-1) + u")),
    references=("https://pytorch.org/docs/stable/generated/torch.nn.functional.softmax.html",), threshold_share=0.005,
    tokens=("softmax",), prove=prove,
    methods=("float", "double", "to"),  # the upcast of its input: `x.float()`, `x.to(torch.float32)`
    join=join, graph=detect,
)

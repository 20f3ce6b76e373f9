"""Copies and casts in source, as roles: a `.contiguous()`, a `.clone()`, a pure dtype cast, a softmax; and the
rewrites whose equality follows from torch's own semantics alone (no runtime evidence needed).

Every proof here is about one expression: a `.contiguous()` of a value that is contiguous by construction, two
copies in one chain folded into one, a cast of a value already cast to that dtype, and an upcast that only feeds
softmax (softmax's `dtype=` casts its input first, so the values are the same whatever the input dtype)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.static.module_index import ParsedModule

CAST_METHODS = {"float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64", "long": "int64",
                "int": "int32", "short": "int16", "char": "int8", "byte": "uint8", "bool": "bool"}
DTYPES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
          "float64": "float64", "double": "float64", "int64": "int64", "long": "int64", "int32": "int32",
          "int": "int32", "int16": "int16", "short": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}
FLOATING = frozenset({"float32", "float16", "bfloat16", "float64"})
SOFTMAXES = frozenset({"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"})
CONTIGUOUS_FORMAT = "torch.contiguous_format"


@dataclass(frozen=True)
class Site:
    """One call of interest, with the function it is in."""

    call: cst.Call
    function: str
    function_node: cst.FunctionDef


@dataclass(frozen=True)
class Rewrite:
    """The expression `node` becomes `code`; `proof` says why the values (and, where it matters, aliasing and
    layout) cannot change."""

    node: cst.CSTNode
    code: str
    proof: str


def sites(parsed: ParsedModule) -> list[Site]:
    """Every call in a function body, grouped by function in `parsed.functions` order, in source order within each
    (a call belongs to its innermost enclosing function)."""
    by_function: dict[cst.FunctionDef, list[cst.Call]] = {}
    for call in parsed.calls_and_classes[0]:
        function = parsed.innermost(call, cst.FunctionDef)
        if function is not None:
            by_function.setdefault(function, []).append(call)
    return [Site(call, name, function) for function, _, name in parsed.functions
            for call in by_function.get(function, ())]


def method(call: cst.BaseExpression) -> tuple[cst.BaseExpression, str] | None:
    """(receiver, method name) of `receiver.name(...)`."""
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
        return call.func.value, call.func.attr.value
    return None


def is_contiguous_call(call: cst.BaseExpression) -> bool:
    """`x.contiguous()` with the default memory format."""
    found = method(call)
    return found is not None and found[1] == "contiguous" and not call.args


def is_plain_clone(call: cst.BaseExpression) -> bool:
    found = method(call)
    return found is not None and found[1] == "clone" and not call.args


def cast_dtype(parsed: ParsedModule, call: cst.BaseExpression) -> str | None:
    """The dtype (canonical name) a pure dtype cast converts to: `.float()`, `.half()`, `.to(torch.float32)`,
    `.to(dtype=torch.bfloat16)`; None for anything else (`.to(device)`, `.to(other)`, copy=, memory_format=)."""
    found = method(call)
    if found is None:
        return None
    name = found[1]
    if name in CAST_METHODS:
        return CAST_METHODS[name] if not call.args else None
    if name != "to" or len(call.args) != 1 or call.args[0].star:
        return None
    keyword = call.args[0].keyword
    return dtype_name(parsed, call.args[0].value) if keyword is None or keyword.value == "dtype" else None


def dtype_name(parsed: ParsedModule, expression: cst.BaseExpression) -> str | None:
    dotted = parsed.imported_name(expression)
    if dotted is None or not dotted.startswith("torch."):
        return None
    return DTYPES.get(dotted[len("torch."):])


def dtype_code(parsed: ParsedModule, call: cst.Call, dtype: str) -> str | None:
    """Source for `dtype` next to this cast: the cast's own argument when it has one, else torch.<dtype> through
    the file's torch alias (None when torch is not imported as a module)."""
    if call.args:
        return parsed.code(call.args[0].value)
    torch = torch_alias(parsed)
    return f"{torch}.{dtype}" if torch else None


def torch_alias(parsed: ParsedModule) -> str | None:
    return parsed.module_aliases.get("torch")


def assigned_value(parsed: ParsedModule, expression: cst.BaseExpression) -> cst.BaseExpression | None:
    """The value a plain name holds where it is read, when nothing can have changed it since: the right-hand side of
    its only assignment, made by the statement right before the one that reads it, with no call in the reading
    statement but the chain around the read. Anything in between (a helper's in-place `transpose_`, `y.data = ...`,
    a closure's `nonlocal`) could change the object's layout or dtype behind the name, so it is never looked past."""
    if not isinstance(expression, cst.Name):
        return None
    reading = parsed.innermost(expression, cst.SimpleStatementLine)
    function = parsed.innermost(expression, cst.FunctionDef)
    if reading is None or function is None:
        return None
    flow = parsed.flow(function)
    definitions = flow.definitions_of(expression)
    if len(definitions) != 1 or flow.sees_undefined(expression) or definitions[0].kind != "assign" or \
            definitions[0].index is not None:
        return None
    assigning = parsed.parents.get(definitions[0].statement)
    body = parsed.parents.get(reading)
    siblings = list(getattr(body, "body", ()))
    if not isinstance(assigning, cst.SimpleStatementLine) or len(assigning.body) != 1 or assigning not in siblings \
            or siblings.index(assigning) + 1 != siblings.index(reading):
        return None
    chain = set()
    node = parsed.parents.get(expression)
    while node is not None and node is not reading:
        chain.add(node)
        node = parsed.parents.get(node)
    if any(call not in chain for call in _calls_in(reading)):
        return None
    return definitions[0].value


def _calls_in(node: cst.CSTNode) -> list[cst.Call]:
    collector = _CallCollector()
    node.visit(collector)
    return collector.calls


class _CallCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)


def produces_contiguous(parsed: ParsedModule, expression: cst.BaseExpression | None) -> str | None:
    """Why `expression` is contiguous by construction, or None: `.contiguous()` returns a contiguous tensor, and so
    does `.clone(memory_format=torch.contiguous_format)` (not `.to(..., memory_format=...)`, which returns a strided
    input unchanged when it already has the dtype); a pure dtype cast of a contiguous tensor returns it or a copy in
    its (contiguous) layout; a name assigned one of these holds it."""
    if expression is None:
        return None
    if is_contiguous_call(expression):
        return "its input is the result of `.contiguous()`"
    if cast_dtype(parsed, expression) is not None and produces_contiguous(parsed, expression.func.value):
        return "its input is a dtype cast of a contiguous tensor"
    value = assigned_value(parsed, expression)
    if value is not None and produces_contiguous(parsed, value):
        return f"`{expression.value}` was assigned a contiguous tensor at line {parsed.line(value)}"
    if isinstance(expression, cst.Call):
        for arg in expression.args:
            if arg.keyword is not None and arg.keyword.value == "memory_format" and \
                    parsed.imported_name(arg.value) == CONTIGUOUS_FORMAT and method(expression) is not None and \
                    method(expression)[1] == "clone":
                return "its input was cloned with memory_format=torch.contiguous_format"
    return None


def removed_call(parsed: ParsedModule, call: cst.Call) -> str:
    """`receiver.name(...)` without the call: the receiver's code."""
    return standalone(parsed.code(call.func.value))


def standalone(code: str) -> str:
    """Code taken from inside brackets, where a chain may run over lines (`(x\n .float()\n .float())`), made an
    expression that parses on its own: parenthesised when it spans lines."""
    return f"({code})" if "\n" in code else code


def contiguous_of_contiguous(parsed: ParsedModule, call: cst.Call) -> Rewrite | None:
    """ADV201 proved statically: `.contiguous()` of a contiguous value returns that same object."""
    if not is_contiguous_call(call):
        return None
    why = produces_contiguous(parsed, call.func.value)
    if why is None:
        return None
    return Rewrite(call, removed_call(parsed, call), f"`.contiguous()` returns its input unchanged: {why}")


def folded_copies(parsed: ParsedModule, call: cst.Call) -> Rewrite | None:
    """ADV204 proved statically: `x.contiguous().clone()` and `x.clone().contiguous()` each give a fresh contiguous
    tensor with x's values; `x.clone(memory_format=torch.contiguous_format)` gives the same with one copy."""
    torch = torch_alias(parsed)
    found = method(call)
    if torch is None or found is None:
        return None
    inner, _ = found
    fmt = f"memory_format={torch}.contiguous_format"
    if is_contiguous_call(call) and is_plain_clone(inner):  # x.clone().contiguous(): the clone is already fresh
        source = standalone(parsed.code(inner.func.value))
        return Rewrite(call, f"{source}.clone({fmt})", "one contiguous clone: fresh, contiguous, same values")
    if not is_contiguous_call(inner):
        return None
    if is_plain_clone(call):
        source = standalone(parsed.code(inner.func.value))
        return Rewrite(call, f"{source}.clone({fmt})", "one contiguous clone: fresh, contiguous, same values")
    return None  # `.contiguous().to(D)` has no one-copy twin: `.to(D, memory_format=...)` may return a strided alias


def cast_of_same_cast(parsed: ParsedModule, call: cst.Call) -> Rewrite | None:
    """ADV301 proved statically: a cast of a value just cast to that same dtype returns it unchanged."""
    if same_argument_to(call):
        return Rewrite(call, removed_call(parsed, call),
                       "its input was just moved with `.to()` of the same argument (a dtype, device or tensor), "
                       "so it already matches and `.to()` returns it")
    dtype = cast_dtype(parsed, call)
    if dtype is None:
        return None
    receiver = call.func.value
    if cast_dtype(parsed, receiver) == dtype:
        return Rewrite(call, removed_call(parsed, call), f"its input was just cast to {dtype}, so the cast returns it")
    value = assigned_value(parsed, receiver)
    if value is not None and cast_dtype(parsed, value) == dtype:
        return Rewrite(call, removed_call(parsed, call), f"`{receiver.value}` was cast to {dtype} at line "
                                                         f"{parsed.line(value)}, so the cast returns it")
    return None


def same_argument_to(call: cst.Call) -> bool:
    """`x.to(a).to(a)`: the same single name passed to both, nothing evaluated between the two reads of it."""
    found = method(call)
    inner = method(found[0]) if found else None
    if not (found and inner and found[1] == inner[1] == "to"):
        return False
    args = [call.args, found[0].args]
    return all(len(a) == 1 and a[0].keyword is None and not a[0].star and isinstance(a[0].value, cst.Name)
               for a in args) and args[0][0].value.value == args[1][0].value.value


def softmax_input(parsed: ParsedModule, call: cst.Call) -> tuple[cst.BaseExpression, int | None] | None:
    """(input expression, its position in call.args or None for a method's receiver) of a softmax call that
    does not pass dtype= yet."""
    if any((arg.keyword is not None and arg.keyword.value == "dtype") or arg.star == "**" for arg in call.args):
        return None  # dtype given already, or maybe inside **kwargs
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    found = method(call)
    if found is not None and found[1] == "softmax" and parsed.imported_name(call.func) not in SOFTMAXES:
        return (found[0], None) if len(positional) <= 1 else None  # x.softmax(dim): dtype is the 2nd parameter
    if parsed.imported_name(call.func) in SOFTMAXES and positional and len(positional) <= 2 \
            and call.args[0] is positional[0]:
        return positional[0].value, 0
    return None


def softmax_with_dtype(parsed: ParsedModule, call: cst.Call) -> Rewrite | None:
    """ADV304: `softmax(x.float(), dim)` -> `softmax(x, dim, dtype=torch.float32)`. softmax's dtype= casts its
    input to dtype before the operation, so the result is the same tensor of values for any input dtype; on CUDA
    the kernel reads half input and writes float output in one pass instead of writing an upcast copy first."""
    found = softmax_input(parsed, call)
    if found is None:
        return None
    cast, position = found
    dtype = cast_dtype(parsed, cast)
    code = dtype_code(parsed, cast, dtype) if dtype in FLOATING else None
    if code is None:
        return None
    source = cast.func.value
    keyword = cst.Arg(value=cst.parse_expression(code), keyword=cst.Name("dtype"),
                      equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                            whitespace_after=cst.SimpleWhitespace("")))
    args = list(call.args)
    if position is None:
        new = call.with_changes(func=call.func.with_changes(value=source))
    else:
        args[position] = args[position].with_changes(value=source)
        new = call
    if args:
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    new = new.with_changes(args=[*args, keyword])
    return Rewrite(call, standalone(parsed.module.code_for_node(new)),
                   f"softmax's dtype= casts its input to {dtype} first, so the values are the same")

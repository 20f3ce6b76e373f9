"""Copies and casts in source, as roles: a `.contiguous()`, a `.clone()`, a pure dtype cast, a softmax, a value
contiguous by construction, and the value a name holds where it is read. The copy/cast rules
(advisor.rules.copies_casts) build their proofs from these; each proof is about one expression."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.static.module_index import ParsedModule
from advisor.static.walk import descendants

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
    layout) cannot change, `assumes` what it leaves unproved (an unsafe fix)."""

    node: cst.CSTNode
    code: str
    proof: str
    assumes: tuple[tuple[str, str, str], ...] = ()  # (name, statement, why) of each fact the rewrite cannot prove


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
    if any(call not in chain for call in calls_in(reading)) or \
            any(isinstance(node, (cst.Lambda, cst.GeneratorExp)) for node in chain):
        return None  # a lambda or a generator reads the name when it runs, after a later rebinding (breaker round 17)
    if descendants(reading, (cst.NamedExpr, cst.Yield, cst.Await)) or any(
            attribute not in chain and parsed.imported_name(attribute) is None
            for attribute in descendants(reading, (cst.Attribute,))):
        return None  # `(y := y.mT, y.contiguous())`, a property's getter, a `yield` (breaker round 26)
    return definitions[0].value


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call in `node`, nested ones included."""
    return descendants(node, (cst.Call,))


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

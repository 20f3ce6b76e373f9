"""A helper read as an optional additive mask: timm's `maybe_add_mask(scores, attn_mask=None)`, whose body returns
`scores if attn_mask is None else scores + attn_mask` (either polarity of the test, as a conditional expression or
as `if`/`return`s). Applied to the scores, it is a mask term that may be absent, which SDPA expresses exactly:
`attn_mask=None` is "no mask", a tensor is added to the scores.

Decorators could replace the function, so each must be known to return it unchanged:
- `torch.fx.wrap`, whose source records the function's name for symbolic tracing and returns its argument;
- a function of the same package whose body (after a docstring) is simple statements ending in `return p` for its
  one parameter p, with no other `return`, no compound statement, no assignment to p or its attributes and no
  `setattr` (timm's `register_notrace_function`, which adds the function to a set). What it does beside returning
  p runs once, at import, in the original and the patched program alike.
Any other decorator (a call, `torch.no_grad`, an unresolved name) leaves the helper unread.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns.helper_bodies import branches, parameters, return_value
from advisor.static.walk import descendants

IDENTITY_DECORATORS = frozenset({"torch.fx.wrap"})
MAX_REEXPORTS = 3
# statements that could rebind the argument or change its attributes
WRITES = (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Del, cst.Global, cst.Nonlocal)


def optional_add(home, helper: cst.FunctionDef) -> tuple[str, str] | None:
    """(scores parameter, mask parameter) when `helper` (a module-level function of `home`) returns the scores as
    they are where the mask is None and their sum with the mask otherwise, behind identity decorators only."""
    if not all(_keeps_function(home, decorator.decorator) for decorator in helper.decorators):
        return None
    shape = branches(helper)
    if shape is None:
        return None
    test, values = shape
    if test is None and isinstance(values[0], cst.IfExp):
        test, values = values[0].test, [values[0].body, values[0].orelse]
    names = parameters(helper)
    tested = _none_test(test, names) if test is not None else None
    if tested is None:
        return None
    mask, when_none = tested
    absent, present = values if when_none else values[::-1]
    if not isinstance(absent, cst.Name) or absent.value not in names or absent.value == mask:
        return None
    added = _stripped(present)
    if not isinstance(added, cst.BinaryOperation) or not isinstance(added.operator, cst.Add):
        return None
    operands = {_name(_stripped(added.left)), _name(_stripped(added.right))}
    return (absent.value, mask) if operands == {absent.value, mask} else None


def _none_test(test: cst.BaseExpression, names: set[str]) -> tuple[str, bool] | None:
    """(the parameter, True for `p is None` / False for `p is not None`)."""
    test = _stripped(test)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    left = _stripped(test.left)
    if not isinstance(left, cst.Name) or left.value not in names or _name(target.comparator) != "None" or \
            not isinstance(target.operator, (cst.Is, cst.IsNot)):
        return None
    return left.value, isinstance(target.operator, cst.Is)


def _keeps_function(home, decorator: cst.BaseExpression) -> bool:
    """The decorator is known to return the function it decorates (see the module docstring)."""
    if home.imported_name(decorator) in IDENTITY_DECORATORS:
        return True
    if not isinstance(decorator, cst.Name):
        return False
    found = package_function(home, decorator.value)
    return found is not None and _returns_its_argument(found[1])


def package_function(home, name: str) -> tuple[object, cst.FunctionDef] | None:
    """(the module that defines it, the module-level function) that `name` refers to in `home`: its own, or one
    imported from (or re-exported by) another file of the package (`from .attention import maybe_add_mask` in a
    package's `__init__`)."""
    return package_definition(home, name, lambda module: module.module_functions)


def package_definition(home, name: str, defined) -> tuple[object, object] | None:
    """(the module, what `defined(module)` holds under the name) for the definition `name` refers to in `home`,
    as `package_function` finds a function (`defined`: a module's functions, or its top-level classes)."""
    for _ in range(MAX_REEXPORTS):
        if name in home.bound_names:
            return None
        if name in defined(home):
            return home, defined(home)[name]
        dotted = home.imports.get(name)
        if dotted is None or "." not in dotted.lstrip("."):
            return None
        module, name = dotted.rsplit(".", 1)
        home = home.package_module(module)
        if home is None:
            return None
    return None


def _returns_its_argument(function: cst.FunctionDef) -> bool:
    params = function.params
    if len(params.params) != 1 or isinstance(params.star_arg, cst.Param) or params.kwonly_params or \
            params.star_kwarg or params.posonly_params:
        return False
    argument = params.params[0].name.value
    body = list(function.body.body)
    last = return_value(body[-1]) if body else None
    if _name(last) != argument:
        return False
    for statement in body[:-1]:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        for small in statement.body:
            if isinstance(small, cst.Return) or isinstance(small, WRITES) and \
                    any(name.value == argument for name in descendants(small, (cst.Name,))):
                return False
        if any(_name(call.func) == "setattr" for call in descendants(statement, (cst.Call,))):
            return False
    return True


def _stripped(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=(), rpar=()) if getattr(node, "lpar", None) else node


def _name(node: cst.BaseExpression | None) -> str | None:
    return node.value if isinstance(node, cst.Name) else None

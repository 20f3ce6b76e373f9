"""A helper read as an optional additive mask: timm's `maybe_add_mask(scores, attn_mask=None)`, whose body returns
`scores if attn_mask is None else scores + attn_mask` (either polarity of the test, as a conditional expression or
as `if`/`return`s). Applied to the scores, it is a mask term that may be absent, which SDPA expresses exactly:
`attn_mask=None` is "no mask", a tensor is added to the scores.

Decorators could replace the function, so each must be known to return it unchanged
(static.package_functions.keeps_function).
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns.helper_bodies import branches, parameters
from advisor.static.package_functions import keeps_function



def optional_add(home, helper: cst.FunctionDef) -> tuple[str, str] | None:
    """(scores parameter, mask parameter) when `helper` (a module-level function of `home`) returns the scores as
    they are where the mask is None and their sum with the mask otherwise, behind identity decorators only."""
    if not all(keeps_function(home, decorator.decorator) for decorator in helper.decorators):
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


def _stripped(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=(), rpar=()) if getattr(node, "lpar", None) else node


def _name(node: cst.BaseExpression | None) -> str | None:
    return node.value if isinstance(node, cst.Name) else None

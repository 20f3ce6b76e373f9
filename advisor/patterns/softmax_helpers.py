"""A helper read as the softmax of one of its parameters, in this file or another file of the package: fairseq's
`utils.softmax(x, dim, onnx_trace=False)` and ESM's `utils_softmax`, whose two branches (`if onnx_trace:`) are
softmaxes of the same parameter over the same dim, one upcasting with `x.float()`, the other with
`dtype=torch.float32`. Such a helper computes one softmax whichever branch runs, in at most one dtype other than
its input's; that dtype is the softmax's, so the precision fact judges it as for an inline upcast.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.patterns.copy_cast_roles import cast_dtype, dtype_name
from advisor.patterns.helper_bodies import branches, parameters

NARROWING = ("bfloat16", "float16")


@dataclass(frozen=True)
class SoftmaxSummary:
    param: str  # the parameter whose softmax the helper returns
    dim: cst.BaseExpression  # a parameter of the helper, or an integer literal
    dtype: str | None  # the canonical dtype a branch computes in ('float32'); None when no branch casts


def summarise(parsed, helper: cst.FunctionDef, reader) -> SoftmaxSummary | None:
    """The softmax every return of `helper` computes (`reader` reads ops in the helper's own file), or None when a
    return computes anything else, the branches differ in operand or dim, or the test reads more than parameters."""
    shape = branches(helper)
    if shape is None or shape[0] is not None and not _plain_test(shape[0], parameters(helper)):
        return None
    sides = [_side(parsed, reader, value, parameters(helper)) for value in shape[1]]
    if None in sides or len({(side.param, _dim_key(side.dim)) for side in sides}) != 1:
        return None
    dtypes = {side.dtype for side in sides} - {None}
    narrowing = sorted(dtypes & set(NARROWING))
    dtype = narrowing[0] if narrowing else (sorted(dtypes)[0] if dtypes else None)
    return SoftmaxSummary(sides[0].param, sides[0].dim, dtype)


def _plain_test(test: cst.BaseExpression, parameters: set[str]) -> bool:
    """`onnx_trace`, `not onnx_trace`: a test that reads a parameter and calls nothing (so it raises nothing)."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test = test.expression
    return isinstance(test, cst.Name) and test.value in parameters


def _side(parsed, reader, value: cst.BaseExpression, parameters: set[str]) -> SoftmaxSummary | None:
    """One return: `F.softmax(x, dim=dim, dtype=...)` or `F.softmax(x.float(), dim=dim)` of a parameter x."""
    op = reader.read(value)
    if op is None or op.name != "softmax" or op.params.get("dim") is None:
        return None
    operand, dtype = op.operands[0], None
    inner = reader.read(operand)
    if inner is not None and inner.name == "cast":
        dtype, operand = cast_dtype(parsed, inner.node), inner.operands[0]
        if dtype is None:
            return None
    if op.params.get("dtype") is not None:
        if dtype is not None:
            return None
        dtype = dtype_name(parsed, op.params["dtype"])
        if dtype is None:
            return None
    dim = op.params["dim"]
    if not isinstance(operand, cst.Name) or operand.value not in parameters or _dim_key(dim) is None or \
            (isinstance(dim, cst.Name) and dim.value not in parameters):
        return None
    return SoftmaxSummary(operand.value, dim, dtype)


def _dim_key(dim: cst.BaseExpression) -> str | int | None:
    if isinstance(dim, cst.Name):
        return dim.value
    if isinstance(dim, cst.Integer):
        return int(dim.evaluated_value)
    if isinstance(dim, cst.UnaryOperation) and isinstance(dim.operator, cst.Minus) and \
            isinstance(dim.expression, cst.Integer):
        return -int(dim.expression.evaluated_value)
    return None

"""A Python number added to the scores is not a mask but a shift of every score, which softmax ignores
(softmax(s + c) = softmax(s) for finite c): it drops out of the rewrite. Adding 0 is exact (`s + 0 == s`, -inf
included); a nonzero c rounds `s + c` in the scores' dtype, so dropping it is assumed (`constant-shift`). An inf
or NaN is not a shift (it makes every weight NaN) and stays an added value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import libcst as cst

from advisor.patterns.attention.candidate import Candidate
from advisor.patterns.ops import number_value


@dataclass
class Addend:
    """What an added operand may hold at the add: finite Python numbers, and whether anything else (a tensor)."""

    numbers: list[float]
    other: bool


def addend(c: Candidate, node: cst.BaseExpression) -> Addend:
    """A literal, or a local name whose reaching bindings are literals (`bias = 0.0`) or something else
    (`bias = mask * -1e9` under an `if`; a parameter's literal default, which a caller may override)."""
    value = _finite(number_value(node))
    if value is not None or not isinstance(node, cst.Name):
        return Addend([value] if value is not None else [], value is None)
    definitions = c.flow.definitions_of(node)
    numbers, other = [], c.flow.sees_undefined(node) or not definitions
    for definition in definitions:
        literal = definition.value if definition.kind == "assign" and definition.index is None else \
            definition.default if definition.kind == "param" else None
        value = _finite(number_value(literal))
        if value is not None:
            numbers.append(value)
        other = other or value is None or definition.kind == "param"
    return Addend(numbers, other)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def drop_shift(c: Candidate, node: cst.BaseExpression, numbers: list[float]) -> None:
    """Record why dropping the constant(s) `node` may hold is exact, or what it assumes."""
    text = c.parsed.code(node)
    statement = f"shifting every score by `{text}` leaves the weights unchanged"
    nonzero = [value for value in numbers if value != 0]
    if nonzero:
        c.match.facts.assumed("constant-shift", statement,
                              "softmax is shift-invariant, but the shifted scores are rounded in their dtype (and "
                              "a half-precision score near its range overflows)")
    else:
        c.match.facts.proved("constant-shift", statement, "adding 0 leaves every score as it is")

"""A mask as a function of the query and key positions alone, for FlexAttention's `mask_mod`.

The (L, S) masks models build from positions: `arange` vectors turned into a column (`[:, None]`, `.unsqueeze(-1)`,
`.view(-1, 1)`: the query position) or a row (`[None, :]`, `.unsqueeze(0)`, `.view(1, -1)`: the key position),
combined by arithmetic, comparisons and `&`/`|`/`~` with Python numbers (causal, sliding window, prefix of a
constant length), and `tril`/`triu` of a matrix of ones. Local names are followed to their one definition. The
result is the same expression of `q_idx` and `kv_idx` (broadcast over b and h, as a 2-D mask broadcasts against
the scores); anything else (a tensor read, an unknown call) is None, and the mask is then read from a captured
tensor instead (`score_mods`).

A column is the query position only where the arange spans the query axis: `arange(1)[:, None]` broadcasts
position 0 over every row, and another length raises in the original (or grows the scores where they have one
row). So each form comes with its extents, (n, axis) for every arange placed and for the sides of a triangle's
ones: the expression is the mask exactly where each n equals the scores' size on that axis, which the patch checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.patterns.attention.candidate import Candidate
from advisor.patterns.ops import int_value
from advisor.static.codegen import atomic
from advisor.static.dataflow import Definition, loaded_names

MAX_DEPTH = 24
_POSITION = "__position"  # the placeholder of an arange vector not yet turned into a column or a row
_BINARY = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Modulo, cst.BitAnd, cst.BitOr, cst.BitXor)
_SAME_VALUES = ("bool", "long", "int")  # `.bool()` of a 0/1 mask; integer casts of integer positions


@dataclass(frozen=True)
class _Vector:
    """An arange (positions 0, 1, ...) or arithmetic of one with numbers, before it becomes a column or a row."""

    expression: cst.BaseExpression
    length: cst.BaseExpression  # how many positions: the extent it must have on the axis it is placed on


Extent = tuple[cst.BaseExpression, str]  # (a length, "q" or "kv"): the scores' size it must equal


def index_form(c: Candidate, node: cst.BaseExpression
               ) -> tuple[cst.BaseExpression, list[Definition], list[cst.BaseExpression], list[Extent]] | None:
    """`node` as an expression of q_idx and kv_idx (and Python numbers), with the local definitions it was read
    through (they compute nothing else: the patch may drop those only the mask reads), the Python numbers it
    reads by name (`self.window`: a cached BlockMask is keyed by their values) and the extents the expression
    assumes (see the module docstring), or None."""
    forms = _Forms(c)
    form = forms.of(node, 0)
    return None if form is None or isinstance(form, _Vector) else (form, forms.followed, forms.scalars,
                                                                   forms.extents)


class _Forms:
    def __init__(self, c: Candidate) -> None:
        self.c = c
        self.followed: list[Definition] = []
        self.scalars: list[cst.BaseExpression] = []
        self.extents: list[Extent] = []

    def of(self, node: cst.BaseExpression, depth: int):
        if depth > MAX_DEPTH:
            return None
        depth += 1
        if node.lpar:
            node = node.with_changes(lpar=[], rpar=[])
        if isinstance(node, (cst.Integer, cst.Float)):
            return node
        if isinstance(node, cst.Name):
            return self._name(node, depth)
        if isinstance(node, cst.Attribute):
            return self._scalar(node)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.BitInvert, cst.Minus)):
            inner = self.of(node.expression, depth)
            return None if inner is None else _lift(inner, lambda e: node.with_changes(expression=atomic(e)))
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, _BINARY):
            return self._binary(node, self.of(node.left, depth), self.of(node.right, depth))
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            target = node.comparisons[0]
            left, right = self.of(node.left, depth), self.of(target.comparator, depth)
            if left is None or right is None or isinstance(left, _Vector) or isinstance(right, _Vector):
                return None
            return cst.Comparison(atomic(left), [target.with_changes(comparator=atomic(right))])
        if isinstance(node, cst.Subscript):
            return self._subscript(node, depth)
        if isinstance(node, cst.Call):
            return self._call(node, depth)
        return None

    def _name(self, node: cst.Name, depth: int):
        ids = self.c.flow.reaching.get(node, frozenset())
        definitions = [self.c.flow.definitions.get(i) for i in ids]
        if len(definitions) == 1 and definitions[0] is not None and definitions[0].kind == "assign" \
                and definitions[0].index is None and not definitions[0].guards:
            self.followed.append(definitions[0])
            return self.of(definitions[0].value, depth)
        return self._scalar(node)

    def _scalar(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        if not self.c.values.is_scalar(node):
            return None
        self.scalars.append(node)
        return node

    @staticmethod
    def _binary(node: cst.BinaryOperation, left, right):
        if left is None or right is None or (isinstance(left, _Vector) and isinstance(right, _Vector)):
            return None
        if isinstance(left, _Vector) or isinstance(right, _Vector):  # arithmetic of a vector with a number
            if not isinstance(node.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)):
                return None
            vector, other = (left, right) if isinstance(left, _Vector) else (right, left)
            if _mentions_index(other):  # a vector against a matrix: not one position
                return None
            parts = (vector.expression, other) if isinstance(left, _Vector) else (other, vector.expression)
            return _Vector(cst.BinaryOperation(atomic(parts[0]), node.operator, atomic(parts[1])), vector.length)
        return cst.BinaryOperation(atomic(left), node.operator, atomic(right))

    def _subscript(self, node: cst.Subscript, depth: int):
        """`v[:, None]` (column: the query position), `v[None, :]` / `v[None]` (row: the key position), and
        `m[None, None]` / `m[None, None, :, :]` (at most 4-D: leading axes a 2-D mask broadcasts over anyway)."""
        inner = self.of(node.value, depth)
        items = [_slice_kind(element) for element in node.slice]
        if inner is None or None in items:
            return None
        if isinstance(inner, _Vector):
            if items == ["full", "new"]:
                return self._placed(inner, "q_idx")
            if items in (["new", "full"], ["new"]):
                return self._placed(inner, "kv_idx")
            return None
        trailing = items[len(items) - 2:] if items[-2:] == ["full", "full"] else []
        leading = items[:len(items) - len(trailing)]
        return inner if 0 < len(leading) <= 2 and all(item == "new" for item in leading) else None

    def _call(self, node: cst.Call, depth: int):
        dotted = self.c.parsed.imported_name(node.func)
        positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value: arg.value for arg in node.args if arg.keyword is not None}
        if dotted == "torch.arange" and _arange_from_zero(positional) and set(keywords) <= {"device", "dtype"}:
            return _Vector(cst.Name(_POSITION), positional[-1])
        if dotted in ("torch.tril", "torch.triu") and positional:
            return self._triangle(dotted.rsplit(".", 1)[1], positional[0], positional[1:], keywords)
        if dotted == "torch.abs" and len(positional) == 1 and not keywords:
            inner = self.of(positional[0], depth)
            return None if inner is None else _lift(inner, lambda e: _method(e, "abs"))
        if not isinstance(node.func, cst.Attribute) or dotted is not None:
            return None
        method, receiver = node.func.attr.value, node.func.value
        if method in ("tril", "triu"):
            return self._triangle(method, receiver, positional, keywords)
        inner = self.of(receiver, depth)
        if inner is None:
            return None
        if method in _SAME_VALUES and not node.args:
            return inner
        if method == "abs" and not node.args:
            return _lift(inner, lambda e: _method(e, "abs"))
        if method == "logical_not" and not node.args:
            return _lift(inner, lambda e: cst.UnaryOperation(cst.BitInvert(), atomic(e)))
        numbers = [int_value(arg) for arg in positional]
        if keywords or None in numbers:
            return None
        if isinstance(inner, _Vector):
            if (method == "unsqueeze" and numbers in ([-1], [1])) or (method in ("view", "reshape")
                                                                       and numbers == [-1, 1]):
                return self._placed(inner, "q_idx")
            if (method == "unsqueeze" and numbers == [0]) or (method in ("view", "reshape") and numbers == [1, -1]):
                return self._placed(inner, "kv_idx")
        return None

    def _triangle(self, which: str, ones: cst.BaseExpression, rest: list, keywords: dict):
        """`tril(ones(L, S), d)`: key at most d after the query; `triu(ones, d)`: at least d after it."""
        sides = self._ones_sides(ones)
        if set(keywords) - {"diagonal"} or len(rest) > 1 or sides is None:
            return None
        self.extents.extend(zip(sides, ("q", "kv")))
        diagonal = keywords.get("diagonal", rest[0] if rest else cst.Integer("0"))
        if int_value(diagonal) is None and self._scalar(diagonal) is None:
            return None
        shifted = cst.Name("q_idx") if int_value(diagonal) == 0 else \
            cst.BinaryOperation(cst.Name("q_idx"), cst.Add(), atomic(diagonal))
        operator = cst.LessThanEqual() if which == "tril" else cst.GreaterThanEqual()
        return cst.Comparison(cst.Name("kv_idx"), [cst.ComparisonTarget(operator, shifted)])

    def _placed(self, vector: _Vector, index: str) -> cst.BaseExpression:
        self.extents.append((vector.length, "q" if index == "q_idx" else "kv"))
        return _substituted(vector.expression, cst.Name(index))

    def _ones_sides(self, node: cst.BaseExpression) -> list[cst.BaseExpression] | None:
        """(L, S) of `torch.ones(L, S, ...)` or `torch.ones((L, S), ...)`, followed through one local name."""
        if isinstance(node, cst.Name):
            ids = self.c.flow.reaching.get(node, frozenset())
            definitions = [self.c.flow.definitions.get(i) for i in ids]
            if len(definitions) != 1 or definitions[0] is None or definitions[0].kind != "assign" \
                    or definitions[0].index is not None:
                return None
            self.followed.append(definitions[0])
            node = definitions[0].value
        if not isinstance(node, cst.Call) or self.c.parsed.imported_name(node.func) != "torch.ones":
            return None
        positional = [arg.value for arg in node.args if arg.keyword is None]
        if len(positional) == 1 and isinstance(positional[0], (cst.Tuple, cst.List)):
            positional = [element.value for element in positional[0].elements]
        return positional if len(positional) == 2 else None


def _arange_from_zero(positional: list[cst.BaseExpression]) -> bool:
    """`arange(n)` or `arange(0, n)`: positions 0, 1, ..., n - 1."""
    return len(positional) == 1 or (len(positional) == 2 and int_value(positional[0]) == 0)


def _substituted(node: cst.BaseExpression, index: cst.Name) -> cst.BaseExpression:
    class _Place(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            return index if updated.value == _POSITION else updated

    return node.visit(_Place())


def _lift(inner, build):
    """`build` applied to a form, or inside a vector (it stays a vector)."""
    return _Vector(build(inner.expression), inner.length) if isinstance(inner, _Vector) else build(inner)


def _mentions_index(node: cst.BaseExpression) -> bool:
    return any(name.value in ("q_idx", "kv_idx", _POSITION) for name in loaded_names(node))


def _method(node: cst.BaseExpression, name: str) -> cst.Call:
    return cst.Call(cst.Attribute(atomic(node), cst.Name(name)))


def _slice_kind(element: cst.SubscriptElement) -> str | None:
    """"full" for `:`, "new" for `None`, else None."""
    part = element.slice
    if isinstance(part, cst.Slice) and part.lower is None and part.upper is None and part.step is None:
        return "full"
    if isinstance(part, cst.Index) and isinstance(part.value, cst.Name) and part.value.value == "None":
        return "new"
    return None

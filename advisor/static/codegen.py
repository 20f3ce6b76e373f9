"""New code built as libcst nodes around the user's own expression nodes.

A rewrite quotes user expressions as the parsed nodes and wraps them in new calls, operators and statements; it
never renders them to text and parses the text back. The helpers write new code exactly as the project's text
templates always read (`x.transpose(-2, -1)`, `attn_mask=m`, `a + b`), so patches keep their shape.
"""

from __future__ import annotations

import libcst as cst

# (method name, integer arguments): `("transpose", (-2, -1))` is `.transpose(-2, -1)` on whatever it follows
MethodStep = tuple[str, tuple["int | cst.Arg", ...]]  # a method's name and its arguments: numbers, or Args as given


def is_atomic(node: cst.CSTNode) -> bool:
    """A suffix (`.attr`, a call, a subscript) binds to the whole of this node without parentheses."""
    return isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)) or \
        bool(getattr(node, "lpar", ()))


def atomic(node: cst.BaseExpression) -> cst.BaseExpression:
    """The node, parenthesised unless it is a name, attribute, call, subscript, number or already parenthesised."""
    return node if is_atomic(node) else node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def nonzero(node: cst.BaseExpression) -> cst.Comparison:
    """`node != 0`: what `node.bool()` computes (NaN is nonzero too), in a spelling TorchScript compiles."""
    return cst.Comparison(atomic(node), [cst.ComparisonTarget(cst.NotEqual(), cst.Integer("0"))])


def number(value: int | float) -> cst.BaseExpression:
    """A literal: `2`, `-1`, `0.5`."""
    literal = cst.Integer(str(abs(value))) if isinstance(value, int) else cst.Float(repr(abs(value)))
    return cst.UnaryOperation(cst.Minus(), literal) if value < 0 else literal


def dotted(name: str) -> cst.Name | cst.Attribute:
    """`torch.nn.functional` as a Name or Attribute chain."""
    first, *rest = name.split(".")
    node: cst.Name | cst.Attribute = cst.Name(first)
    for part in rest:
        node = cst.Attribute(node, cst.Name(part))
    return node


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, without spaces around `=` (libcst's default writes `name = value`)."""
    return cst.Arg(value, keyword=cst.Name(name), equal=cst.AssignEqual(cst.SimpleWhitespace(""),
                                                                          cst.SimpleWhitespace("")))


def method(receiver: cst.BaseExpression, name: str, *args: cst.BaseExpression | cst.Arg) -> cst.Call:
    """`receiver.name(args)`, the receiver parenthesised when a suffix would bind to only part of it."""
    return cst.Call(cst.Attribute(atomic(receiver), cst.Name(name)),
                    [arg if isinstance(arg, cst.Arg) else cst.Arg(arg) for arg in args])


def attribute(receiver: cst.BaseExpression, name: str) -> cst.Attribute:
    return cst.Attribute(atomic(receiver), cst.Name(name))


def with_methods(node: cst.BaseExpression, steps: list[MethodStep] | tuple[MethodStep, ...]) -> cst.BaseExpression:
    """`node.m1(...).m2(...)` for each step in order; the node itself when there is none."""
    for name, args in steps:
        node = method(node, name, *(arg if isinstance(arg, cst.Arg) else number(arg) for arg in args))
    return node


def joined(operator: type[cst.BaseBinaryOp], operands: list[cst.BaseExpression]) -> cst.BaseExpression:
    """`a op b op c`, grouped from the left as Python reads it."""
    node = operands[0]
    for operand in operands[1:]:
        node = cst.BinaryOperation(node, operator(), operand)
    return node


def assignment(name: str, value: cst.BaseExpression) -> cst.Assign:
    """`name = value` as a small statement."""
    return cst.Assign([cst.AssignTarget(cst.Name(name))], value)


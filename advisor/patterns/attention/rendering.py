"""User expressions as the SDPA call quotes them, and as refusal messages quote them.

Roles are proved on nodes where the source has them, but the call is written at the block's home: an expression
taken from an inlined helper must read the caller's arguments instead of the helper's parameters, and a compound
expression gains parentheses before a method is called on it. Messages quote the source shortened to one line.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns.attention.candidate import Candidate, function_of
from advisor.patterns.attention.result import Refusal
from advisor.static.codegen import MethodStep, atomic, with_methods
from advisor.static.dataflow import contains_call, loaded_names
from advisor.static.module_index import ParsedModule


def at_home(c: Candidate, node: cst.BaseExpression, steps: list[MethodStep] | tuple[MethodStep, ...] = ()
            ) -> cst.BaseExpression:
    """`node` as the call site reads it, with `steps` (`.transpose(-2, -1)`, ...) called on it."""
    return with_methods(as_home_expression(c, node), steps)


def as_home_expression(c: Candidate, node: cst.BaseExpression) -> cst.BaseExpression:
    """An expression of an inlined helper, with its parameters replaced by the call's arguments."""
    function = function_of(c.parsed, node)
    if function not in c.inlined:
        return node
    _, arguments = c.inlined[function]
    replaced = {}
    for name in loaded_names(node):
        definitions = c.flow.definitions_of(name)
        if any(d.kind != "param" for d in definitions):
            raise Refusal(f"`{name.value}`, local to `{function.name.value}`, is needed at the call site")
        if not definitions and name.value in _bound_in(c, c.home):  # a global the caller's own local shadows
            raise Refusal(f"`{name.value}`, which `{function.name.value}` reads from the module, is a local of "
                          f"`{c.home.name.value}`, where the SDPA call would read it")
        if definitions:
            if name.value not in arguments:
                raise Refusal(f"`{function.name.value}` is called without `{name.value}`")
            argument = arguments[name.value]
            if contains_call(argument):  # the original ran it once, at the call; the SDPA call would run it
                raise Refusal(f"`{short(c.parsed, argument)}`, passed to `{function.name.value}`, calls code, "
                              f"which the SDPA call would run at another point or more than once")
            replaced[name] = atomic(argument)
    return node.visit(Replace(replaced)) if replaced else node


def _bound_in(c: Candidate, function: cst.FunctionDef) -> set[str]:
    return {d.name for d in c.parsed.flow(function).definitions.values()}


def short(parsed: ParsedModule, node: cst.CSTNode) -> str:
    """The source of `node` on one line, cut to 60 characters, for a message."""
    text = " ".join(parsed.code(node).split())
    return text if len(text) <= 60 else text[:57] + "..."


class Replace(cst.CSTTransformer):
    """Replace given nodes (by identity; names, or whole reads like `s.device`) with other expressions, all in
    one pass (a transformer rebuilds the tree, so a second pass would no longer find the originals)."""

    def __init__(self, replacements: dict[cst.CSTNode, cst.BaseExpression]) -> None:
        self.replacements = replacements

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        return self.replacements.get(original_node, updated_node)

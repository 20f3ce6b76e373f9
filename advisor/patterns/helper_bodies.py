"""The shapes of small helper bodies that the helper readers (`softmax_helpers`, `mask_helpers`) summarise: after a
docstring, `return A`, `if t: return A else: return B`, or `if t: return A` then `return B`."""

from __future__ import annotations

import libcst as cst

from advisor.static.package_functions import return_value


def parameters(function: cst.FunctionDef) -> set[str]:
    params = function.params
    return {p.name.value for p in list(params.params) + list(params.kwonly_params) + list(params.posonly_params)}


def branches(helper: cst.FunctionDef) -> tuple[cst.BaseExpression | None, list[cst.BaseExpression]] | None:
    """(None, [A]) for `return A`; (t, [A, B]) for the two `if t:` forms, A returned where t is true; None for any
    other body. The test is the caller's to judge."""
    body = list(helper.body.body)
    if body and _is_docstring(body[0]):
        body = body[1:]
    if len(body) == 1 and return_value(body[0]) is not None:
        return None, [return_value(body[0])]
    if not body or not isinstance(body[0], cst.If):
        return None
    guard = body[0]
    first = _only_return(guard.body.body)
    if isinstance(guard.orelse, cst.Else) and len(body) == 1:
        second = _only_return(guard.orelse.body.body)
    elif guard.orelse is None and len(body) == 2:
        second = return_value(body[1])
    else:
        return None
    return None if first is None or second is None else (guard.test, [first, second])


def _only_return(statements) -> cst.BaseExpression | None:
    return return_value(statements[0]) if len(statements) == 1 else None


def _is_docstring(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and \
        isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.SimpleString)


def reads_only_metadata(function: cst.FunctionDef, parameter: str, attributes: frozenset[str]) -> bool:
    """Every use of `parameter` in the body reads one of `attributes` of it (`p.dtype`, `p.new_full(...)`): never the
    value itself, never rebinding it."""
    finder = _Uses(parameter)
    function.body.visit(finder)
    return all(isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value in attributes
               for name, parent in finder.uses)


class _Uses(cst.CSTVisitor):
    """Every Name node spelling `name`, with its parent (an attribute read `p.dtype` has the Attribute)."""

    def __init__(self, name: str) -> None:
        self.name, self.stack, self.uses = name, [], []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Name) and node.value == self.name:
            self.uses.append((node, self.stack[-1] if self.stack else None))
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()

"""A read-only walk of a libcst tree that calls a CSTVisitor's visit_/leave_ methods as `node.visit(visitor)` does,
in the same order, without rebuilding the tree: libcst's own visit constructs (and validates) a new copy of every
node it passes, even for a visitor that changes nothing, and that was most of a scan's time."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from functools import lru_cache

import libcst as cst


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a visitor that only reads: visit_X(node) returning False skips the children, and
    leave_X(node) follows them. Attribute-level hooks (visit_X_field) are not called."""
    _walk(node, visitor, _handler_table(type(visitor)))


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor, table: dict) -> None:
    kind = type(node)
    handlers = table.get(kind)
    if handlers is None:
        handlers = table[kind] = _handlers(type(visitor), kind)
    visit, leave = handlers
    if visit is None or visit(visitor, node) is not False:
        for child in children(node):
            _walk(child, visitor, table)
    if leave is not None:
        leave(visitor, node)


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node.children` (its child nodes in libcst's visiting order), without libcst's copy of the node."""
    found = []
    kind = type(node)
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = _FIELDS[kind] = child_fields(kind)
    for name in fields:
        value = getattr(node, name)
        if type(value) in _SEQUENCES:
            found.extend(child for child in value if is_node(child))
        elif is_node(value):
            found.append(value)
    return found


_SEQUENCES = (list, tuple)
_NODE_TYPES: dict[type, bool] = {}


def is_node(value) -> bool:
    """isinstance(value, cst.CSTNode), remembered by type: libcst's node classes are ABCs, whose isinstance check
    is slow enough to matter over every field of every node."""
    kind = type(value)
    known = _NODE_TYPES.get(kind)
    if known is None:
        known = _NODE_TYPES[kind] = isinstance(value, cst.CSTNode)
    return known


_FIELDS: dict[type, tuple[str, ...]] = {}  # child_fields by node type, read without lru_cache's call per node


@lru_cache(maxsize=None)
def _handler_table(visitor_type: type) -> dict:
    """Node type -> its (visit, leave) handlers for one visitor type, filled as the walks meet node types."""
    return {}


@lru_cache(maxsize=None)
def _handlers(visitor_type: type, node_type: type):
    if visitor_type.on_visit is not cst.CSTVisitor.on_visit or visitor_type.on_leave is not cst.CSTVisitor.on_leave:
        raise TypeError(f"{visitor_type.__name__} overrides on_visit/on_leave: walk it with node.visit")
    name = node_type.__name__
    return getattr(visitor_type, f"visit_{name}", None), getattr(visitor_type, f"leave_{name}", None)


@lru_cache(maxsize=None)
def child_fields(node_type: type) -> tuple[str, ...]:
    """The fields libcst's visit goes through, in its order (source order, which is not always the dataclass's
    field order: a def's decorators come before its name), read from the node type's `_visit_and_replace_children`,
    where each child is visited by one `visit_*(self, "field", ...)` call."""
    source = textwrap.dedent(inspect.getsource(node_type._visit_and_replace_children))
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id.startswith("visit_") and len(node.args) >= 2
             and isinstance(node.args[1], ast.Constant)]
    names = [call.args[1].value for call in sorted(calls, key=lambda call: (call.lineno, call.col_offset))]
    fields = {field.name for field in dataclasses.fields(node_type)}
    if not set(names) <= fields:
        raise RuntimeError(f"cannot read libcst's visiting order of {node_type.__name__}")
    return tuple(dict.fromkeys(names))

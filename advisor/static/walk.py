"""A read-only walk of a libcst tree that calls a CSTVisitor's visit_/leave_ methods as `node.visit(visitor)` does,
in the same order, without rebuilding the tree: libcst's own visit constructs (and validates) a new copy of every
node it passes, even for a visitor that changes nothing, and that was most of a scan's time."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
import typing
from functools import lru_cache

import libcst as cst
from libcst import MaybeSentinel


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a visitor that only reads: visit_X(node) returning False skips the children, and
    leave_X(node) follows them. Attribute-level hooks (visit_X_field) are not called. The layout nodes the visitor
    has no method for (`unseen_layout`) are not entered: nothing in them could call one."""
    plan = _plan(type(visitor))
    _walk(node, visitor, plan.handlers, plan.skip, fields_holding(plan.skip))


def descendants(node: cst.CSTNode, kinds: tuple[type, ...]) -> list[cst.CSTNode]:
    """The nodes of the (concrete) types `kinds` in `node`'s tree, `node` itself too, in the order libcst's visit
    meets them: `m.findall(node, m.Call())` without libcst's visitor, which was a sixth of a cold scan. Layout
    nodes (whitespace, comments, operator tokens) are not entered."""
    fields = fields_holding(LAYOUT)
    found: list[cst.CSTNode] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if type(current) in kinds:
            found.append(current)
        stack.extend(reversed(children(current, LAYOUT, fields)))
    return found


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor, table: dict, skip: frozenset[type], fields: dict) -> None:
    kind = type(node)
    handlers = table.get(kind)
    if handlers is None:
        handlers = table[kind] = _handlers(type(visitor), kind)
    visit, leave = handlers
    if visit is None or visit(visitor, node) is not False:
        for child in children(node, skip, fields):
            _walk(child, visitor, table, skip, fields)
    if leave is not None:
        leave(visitor, node)


def children(node: cst.CSTNode, skip: frozenset[type] = frozenset(), fields_of: dict | None = None) \
        -> list[cst.CSTNode]:
    """`node.children` (its child nodes in libcst's visiting order), without libcst's copy of the node, less those
    whose type is in `skip` (`fields_of`: `fields_holding(skip)`, so that fields that hold nothing else are not
    even read)."""
    found = []
    kind = type(node)
    table = _FIELDS if fields_of is None else fields_of
    fields = table.get(kind)
    if fields is None:
        fields = table[kind] = child_fields(kind) if fields_of is None else fields_not_only(kind, skip)
    for name in fields:
        value = getattr(node, name)
        if type(value) in _SEQUENCES:
            found.extend(child for child in value if is_node(child) and type(child) not in skip)
        elif is_node(value) and type(value) not in skip:
            found.append(value)
    return found


# Layout: whitespace and comments, which hold only each other, and the tokens (operators, punctuation), which hold
# only whitespace. Over half of a file's nodes; no analysis reads them.
WHITESPACE = frozenset({cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
                        cst.Comment, cst.Newline})
TOKENS = frozenset(kind for kind in vars(cst).values() if isinstance(kind, type) and issubclass(kind, cst.CSTNode)
                   and kind.__module__ == "libcst._nodes.op" and not kind.__name__.startswith(("Base", "_"))) | \
    {cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
     cst.RightCurlyBrace}
LAYOUT = WHITESPACE | TOKENS  # what no question about code is asked of


@lru_cache(maxsize=None)
def fields_holding(skip: frozenset[type]) -> dict[type, tuple[str, ...]]:
    """Node type -> the fields of `child_fields` that can hold a node whose type is not in `skip`, as libcst declares
    the field's type (a whitespace field, `leading_lines`, a `Comma`): filled as walks meet node types."""
    return {}


def fields_not_only(kind: type, skip: frozenset[type]) -> tuple[str, ...]:
    """The fields of `child_fields(kind)` that can hold a node whose type is not in `skip`."""
    hints = typing.get_type_hints(kind)
    return tuple(name for name in child_fields(kind) if not _holds_only(hints[name], skip))


def _holds_only(declared, skip: frozenset[type]) -> bool:
    """Whether a field declared `declared` (a class, Optional, Union, Sequence, Literal) holds no node but those of
    `skip`: every concrete node class it admits is in `skip`."""
    origin = typing.get_origin(declared)
    if origin is typing.Literal:
        return True
    if origin is not None:
        return all(_holds_only(argument, skip) for argument in typing.get_args(declared))
    if declared in (type(None), str, bool, int) or declared is MaybeSentinel:
        return True
    if isinstance(declared, type) and issubclass(declared, cst.CSTNode):
        return all(kind in skip for kind in _concrete(declared))
    return False


@lru_cache(maxsize=None)
def _concrete(base: type) -> tuple[type, ...]:
    """`base` and its subclasses that the parser builds: not libcst's bases (`BaseExpression`, `_BaseOneTokenOp`),
    nor a class with an abstract method left, nor the class a decorator replaced (libcst's `add_slots` makes each
    node class anew; the first stays among the subclasses)."""
    found, pending = [], [base]
    while pending:
        kind = pending.pop()
        if not kind.__name__.startswith(("Base", "_")) and not getattr(kind, "__abstractmethods__", None) and \
                getattr(sys.modules.get(kind.__module__), kind.__qualname__, None) is kind:
            found.append(kind)
        pending.extend(kind.__subclasses__())
    return tuple(found)


@dataclasses.dataclass
class _Plan:
    """How one visitor class walks: the layout types it need not enter, and its (visit, leave) handlers by node
    type, filled as its walks meet node types."""

    skip: frozenset[type]
    handlers: dict[type, tuple]


def _plan(visitor_type: type) -> _Plan:
    """The class's plan, kept on the class itself: a visitor class defined inside a function is made anew by each
    call, and a cache keyed on the class kept every one of them (and its tables) alive for the whole process."""
    plan = visitor_type.__dict__.get("_walk_plan")
    if plan is None:
        plan = _Plan(unseen_layout(visitor_type), {})
        visitor_type._walk_plan = plan
    return plan


def unseen_layout(visitor_type: type) -> frozenset[type]:
    """The layout node types a walk with this visitor need not enter: none when it reads some whitespace node,
    else every token type it has no method for, and the whitespace."""
    methods = {name for klass in visitor_type.__mro__ if not klass.__module__.startswith("libcst.")
               for name in vars(klass) if name.startswith(("visit_", "leave_"))}  # libcst's are its stubs

    def seen(kind: type) -> bool:
        return f"visit_{kind.__name__}" in methods or f"leave_{kind.__name__}" in methods

    if any(seen(kind) for kind in WHITESPACE):
        return frozenset()
    return WHITESPACE | {kind for kind in TOKENS if not seen(kind)}


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


def _handlers(visitor_type: type, node_type: type):
    if visitor_type.on_visit is not cst.CSTVisitor.on_visit or visitor_type.on_leave is not cst.CSTVisitor.on_leave:
        raise TypeError(f"{visitor_type.__name__} overrides on_visit/on_leave: walk it with node.visit")
    name = node_type.__name__
    return _own(getattr(visitor_type, f"visit_{name}", None)), _own(getattr(visitor_type, f"leave_{name}", None))


def _own(method):
    """The method, or None for libcst's empty stub (marked `_is_no_op`, as libcst's batched visitor skips them):
    calling it for every node of the walk does nothing."""
    return None if method is None or getattr(method, "_is_no_op", False) else method


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

"""CPython's `ast` tree of a file, parsed once for the readers of the file being analysed: the syntax check, each
top-level statement's first line (positions.py) and the writes on other objects (outside_writes.py) each parsed
the same text before."""

from __future__ import annotations

import ast

_last: tuple[str, ast.Module] | None = None  # the text parsed last and its tree (read only by every reader)
_last_nodes: tuple[ast.AST, list[ast.AST]] | None = None  # that tree and its `nodes`, once asked for


def python_tree(text: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(text): the tree of the last text asked for is kept, so a file's readers share one parse. The
    tree is shared, so no reader may change it. Errors are raised as ast.parse raises them, and never kept;
    `filename` only names the file in a SyntaxError."""
    global _last
    if _last is not None and _last[0] == text:
        return _last[1]
    tree = ast.parse(text, filename)
    _last = (text, tree)
    return tree


_NO_NODES = {"ctx", "id", "attr", "arg", "name", "asname", "module", "level", "kind", "type_comment", "conversion",
             "is_async"}  # fields that hold a str, an int or an expression context, never a node to visit
_FIELDS: dict[type, tuple[str, ...]] = {}


def nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` but the expression contexts (`Load`, `Store`: read them as `node.ctx`), in no
    particular order: what `ast.walk` yields, at a third of its cost (no generator per node, no context nodes).
    The list of the tree `python_tree` gave last is kept, as that tree is: the tree-wide pass read one file's whole
    tree six times (a tenth of a cold scan). No reader may change the list."""
    global _last_nodes
    if _last is None or tree is not _last[1]:
        return _all_nodes(tree)
    if _last_nodes is None or _last_nodes[0] is not tree:
        _last_nodes = (tree, _all_nodes(tree))
    return _last_nodes[1]


def _all_nodes(tree: ast.AST) -> list[ast.AST]:
    found, pending = [], [tree]
    while pending:  # `_children` inlined: this walk reads every file of a scan, and the call costs a sixth of it
        node = pending.pop()
        found.append(node)
        for name in _fields(type(node)):
            value = getattr(node, name)
            if type(value) is list:
                pending.extend([child for child in value if isinstance(child, ast.AST)])
            elif isinstance(value, ast.AST):
                pending.append(value)
    return found


def parent_map(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    """Each node of `tree` but the root and the expression contexts -> its parent, walked as `nodes` walks."""
    found: dict[ast.AST, ast.AST] = {}
    pending = [tree]
    while pending:
        node = pending.pop()
        for child in _children(node):
            found[child] = node
            pending.append(child)
    return found


def _children(node: ast.AST) -> list[ast.AST]:
    children: list[ast.AST] = []
    for name in _fields(type(node)):
        value = getattr(node, name)
        if type(value) is list:
            children.extend([child for child in value if isinstance(child, ast.AST)])
        elif isinstance(value, ast.AST):
            children.append(value)
    return children


def _fields(kind: type) -> tuple[str, ...]:
    """The fields of a node class that may hold nodes (once per class)."""
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = _FIELDS[kind] = tuple(name for name in kind._fields if name not in _NO_NODES)
    return fields

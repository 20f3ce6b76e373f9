"""CPython's `ast` tree of a file, parsed once for the readers of the file being analysed: the syntax check, each
top-level statement's first line (positions.py) and the writes on other objects (outside_writes.py) each parsed
the same text before."""

from __future__ import annotations

import ast

_last: tuple[str, ast.Module] | None = None  # the text parsed last and its tree (read only by every reader)


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
    particular order: what `ast.walk` yields, at a third of its cost (no generator per node, no context nodes)."""
    found, pending = [], [tree]
    while pending:
        node = pending.pop()
        found.append(node)
        kind = type(node)
        fields = _FIELDS.get(kind)
        if fields is None:
            fields = _FIELDS[kind] = tuple(name for name in kind._fields if name not in _NO_NODES)
        for name in fields:
            value = getattr(node, name)
            if type(value) is list:
                pending.extend([child for child in value if isinstance(child, ast.AST)])
            elif isinstance(value, ast.AST):
                pending.append(value)
    return found

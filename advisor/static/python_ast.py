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

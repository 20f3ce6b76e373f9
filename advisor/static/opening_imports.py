"""Where the imports that open a module end: the rewrite adds its imports there, and a star import after that point
may rebind the names they bind."""

from __future__ import annotations

import libcst as cst

from advisor.static.notebook import READ_MASK_CALL


def import_position(body) -> int:
    """Index for a new import: after the imports that open the module (and its docstring), before any other
    statement. Not after its last import: a module-level call of the fixed function above a late import (a
    script's `# noqa: E402`, a notebook importing in a later cell) ran before the added name was bound (breaker
    round 16). A notebook's masked IPython lines there count as imports: a `%%capture` cell's magic stays first."""
    position = 0
    for index, item in enumerate(body):
        docstring = index == 0 and isinstance(item, cst.SimpleStatementLine) and \
            isinstance(item.body[0], cst.Expr) and isinstance(item.body[0].value, (cst.SimpleString,
                                                                                  cst.ConcatenatedString))
        if not (docstring or isinstance(item, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom, cst.Pass)) or ipython_mask(s) for s in item.body)):
            break
        position = index + 1
    # a `from __future__` import must stay first even on a line with other statements (`...; x = 1`)
    return max([position] + [index + 1 for index, item in enumerate(body) if _has_future_import(item)])


def _has_future_import(item: cst.CSTNode) -> bool:
    return isinstance(item, cst.SimpleStatementLine) and any(
        isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
        for s in item.body)


def opening_imports_end(parsed) -> int:
    """`import_position` of the module as read (a ParsedModule), computed once per file."""
    return parsed.derived(import_position, lambda p: import_position(p.module.body))


def ipython_mask(statement: cst.BaseSmallStatement) -> bool:
    """`_advisor_ipython(names)`: a notebook's IPython line as the scan reads it (advisor.static.notebook)."""
    return isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call) and \
        isinstance(statement.value.func, cst.Name) and statement.value.func.value == READ_MASK_CALL

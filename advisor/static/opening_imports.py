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


def first_code_run(parsed) -> int:
    """Index of the first module-level statement that may run code of the module as it is defined: one holding a
    call or a decorator outside a function's body (`WARM = model(x)`, `TABLE = probs(t)`, a class body's calls).
    An import below it binds its name after that code may have run, so emitted code never reuses it (breaker round
    24: `import torch` under a module-level warm-up, NameError in the patched function). Computed once per file."""
    def first(p) -> int:
        defined = {node.name.value for node in p.nodes_of(cst.FunctionDef, cst.ClassDef)} | set(p.bindings)
        return next((index for index, statement in enumerate(p.module.body) if _may_run_code(statement, defined)),
                    len(p.module.body))

    return parsed.derived(first_code_run, first)


def _may_run_code(node: cst.CSTNode, defined: set[str]) -> bool:
    """A decorator, or a call naming something the module defines (`model(x)`, `MODEL.eval()`, `map(attend, xs)`,
    a notebook's `%timeit attend(x)`, masked as a call of the names it spells), outside a function's body. A call of
    torch's, a builtin's or another module's function alone (`torch.manual_seed(0)`, `range(2)`,
    `logging.getLogger(__name__)`, `%matplotlib inline`) runs none of the module's code."""
    if isinstance(node, cst.Call):
        return _names_defined(node, defined)
    if isinstance(node, cst.Decorator):
        return True
    if isinstance(node, cst.FunctionDef):  # its body runs when called; defaults and annotations run now
        return any(_may_run_code(part, defined) for part in (*node.decorators, node.params, node.returns)
                   if part is not None)
    if isinstance(node, cst.Lambda):
        return _may_run_code(node.params, defined)
    return any(_may_run_code(child, defined) for child in node.children)


def _names_defined(node: cst.CSTNode, defined: set[str]) -> bool:
    if isinstance(node, cst.Name):
        return node.value in defined
    return any(_names_defined(child, defined) for child in node.children)


def _is_ipython_mask(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value == READ_MASK_CALL


def opening_imports_end(parsed) -> int:
    """`import_position` of the module as read (a ParsedModule), computed once per file."""
    return parsed.derived(import_position, lambda p: import_position(p.module.body))


def ipython_mask(statement: cst.BaseSmallStatement) -> bool:
    """`_advisor_ipython(names)`: a notebook's IPython line as the scan reads it (advisor.static.notebook)."""
    return isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call) and \
        _is_ipython_mask(statement.value)

"""Where the imports that open a module end: the rewrite adds its imports there, and a star import after that point
may rebind the names they bind."""

from __future__ import annotations

import libcst as cst

from advisor.static.notebook import READ_MASK_CALL
from advisor.static.walk import LAYOUT, children


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
    """Index of the first module-level statement that may run code of the module as it is defined (see
    `_may_run_code`). An import below it binds its name after that code may have run, so emitted code never reuses
    it (breaker round 24: `import torch` under a module-level warm-up, NameError in the patched function). Computed
    once per file."""
    def first(p) -> int:
        defined = {node.name.value for node in p.nodes_of(cst.FunctionDef, cst.ClassDef)} | set(p.bindings)
        targets = {id(name) for names in p.bindings.values() for name in names}
        return next((index for index, statement in enumerate(p.module.body)
                     if _may_run_code(p, statement, defined, targets)), len(p.module.body))

    return parsed.derived(first_code_run, first)


# builtins that run code given as text, or reach the module's names by strings (`globals()["attend"](x)`)
CODE_RUNNERS = frozenset({"exec", "eval", "globals", "vars", "locals", "getattr", "__import__"})
# classes whose creation runs nothing of the class's own body but what it defines for instances
PLAIN_BASES = ("torch.", "object")
# where a `Name` node names something without reading it: (parent type, field)
NOT_READS = ((cst.Attribute, "attr"), (cst.Arg, "keyword"), (cst.FunctionDef, "name"), (cst.ClassDef, "name"),
             (cst.Param, "name"), (cst.ImportAlias, "name"), (cst.AsName, "name"), (cst.NameItem, "name"))


def _may_run_code(parsed, node: cst.CSTNode, defined: set[str], targets: set[int]) -> bool:
    """A decorator, `exec`/`eval`, or a read of a name the module defines, outside a function's body: a call
    (`WARM = model(x)`, `map(attend, xs)`, a notebook's `%timeit attend(x)`, masked as a call of the names it spells),
    a base class (`class Warm(Base)`, which runs `Base.__init_subclass__`), a metaclass, an index (`Table[4]`, which
    runs `__class_getitem__`), an attribute (a property). Names only bound there (`X = 1`, a loop's target) and
    torch's, builtins' or other modules' names alone (`torch.manual_seed(0)`, `range(2)`, `%matplotlib inline`) run
    none of the module's code (breaker round 25 found the base class, the metaclass, `exec` and the index)."""
    if isinstance(node, cst.Decorator):
        return True
    if isinstance(node, cst.Name):
        parent = parsed.parents.get(node)
        return node.value in defined and id(node) not in targets and \
            not any(isinstance(parent, kind) and getattr(parent, field) is node for kind, field in NOT_READS)
    if isinstance(node, cst.Call) and _called_name(parsed, node.func) in CODE_RUNNERS:
        return True  # `exec(...)`, `builtins.exec(...)`, `globals()[...]` (breaker round 26)
    if isinstance(node, cst.ClassDef) and node.body.body and any(  # an Enum's members call its `__init__`
            not (parsed.imported_name(arg.value) or "").startswith(PLAIN_BASES) for arg in (*node.bases,
                                                                                           *node.keywords)):
        return True
    if isinstance(node, cst.FunctionDef):  # its body runs when called; defaults and annotations run now
        return any(_may_run_code(parsed, part, defined, targets) for part in (*node.decorators, node.params,
                                                                              node.returns) if part is not None)
    # a lambda's parameters and body alike: `(lambda: attend(x))()` (breaker round 26)
    return any(_may_run_code(parsed, child, defined, targets) for child in children(node, LAYOUT))


def _called_name(parsed, func: cst.BaseExpression) -> str:
    """The last part of what a call calls: a bare name as spelled (a builtin unless the module binds it), else the
    imported name's (`builtins.exec` -> `exec`)."""
    if isinstance(func, cst.Name):
        return func.value
    return (parsed.imported_name(func) or "").rpartition(".")[2]


def opening_imports_end(parsed) -> int:
    """`import_position` of the module as read (a ParsedModule), computed once per file."""
    return parsed.derived(import_position, lambda p: import_position(p.module.body))


def ipython_mask(statement: cst.BaseSmallStatement) -> bool:
    """`_advisor_ipython(names)`: a notebook's IPython line as the scan reads it (advisor.static.notebook)."""
    return isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call) and \
        isinstance(statement.value.func, cst.Name) and statement.value.func.value == READ_MASK_CALL

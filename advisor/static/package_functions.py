"""Module-level functions a call runs: this file's own, or one of another file of its package, imported or re-exported
(`from .attention import maybe_add_mask` in a package's `__init__`), and whether the body read is what the call runs.

Decorators could replace the function, so each must be known to return it unchanged:
- `torch.fx.wrap`, whose source records the function's name for symbolic tracing and returns its argument;
- a function of the same package whose body (after a docstring) adds its one parameter p to a set or list the module
  binds empty at its top level and then returns p (timm's `register_notrace_function`). Any other statement there
  may change the function it returns (breaker round 28: a helper setting `fn.__code__`).
Any other decorator (a call, `torch.no_grad`, `staticmethod`, an unresolved name) may run other code around the body
or bind the arguments otherwise (a wrapper writing its argument in place: found in review at stop 46), and the
scanned tree may assign the name over the function (`mod.helper = f` in another file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst


if TYPE_CHECKING:
    from advisor.static.module_index import ParsedModule

IDENTITY_DECORATORS = frozenset({"torch.fx.wrap"})
MAX_REEXPORTS = 3
# what a registering decorator may call on its container with the function
REGISTERING_METHODS = frozenset({"add", "append"})


def decorators_keep(home: "ParsedModule", function: cst.FunctionDef) -> bool:
    """Each decorator of `function` (of `home`) returns it unchanged (`keeps_function`): a call runs its body."""
    return all(keeps_function(home, decorator.decorator) for decorator in function.decorators)


def called_function(parsed: "ParsedModule", func: cst.BaseExpression,
                    writes: frozenset[str]) -> tuple["ParsedModule", cst.FunctionDef] | None:
    """(its module, the module-level function) a call of `helper(...)` or `module.helper(...)` in `parsed` runs, in
    this file or in another file of its package, where the body is what runs: its decorators keep it
    (`package_function`) and no file assigns the name over it; None otherwise. `writes`: the attribute names the
    scanned tree assigns on objects (a file read as a package module sees only its own)."""
    if isinstance(func, cst.Name):
        name, found = func.value, package_function(parsed, func.value)
    else:
        dotted = parsed.imported_name(func) if isinstance(func, cst.Attribute) else None
        if dotted is None or "." not in dotted:
            return None
        module, name = dotted.rsplit(".", 1)
        home = parsed.package_module(module)
        found = package_function(home, name) if home is not None else None
    if found is None or {name, found[1].name.value} & (writes | found[0].own_outside_writes[0]):
        return None  # `mod.helper = f` in a file of the tree, or in the defining file
    spelled = (parsed.global_rebound_by_computed_name(name, spelled=True) or
               found[0].global_rebound_by_computed_name(found[1].name.value, spelled=True))
    return found if spelled is None else None


def keeps_function(home, decorator: cst.BaseExpression) -> bool:
    """The decorator is known to return the function it decorates (see the module docstring)."""
    if home.imported_name(decorator) in IDENTITY_DECORATORS:
        return True
    if not isinstance(decorator, cst.Name):
        return False
    found = package_definition(home, decorator.value, lambda module: module.module_functions)
    return found is not None and _returns_its_argument(*found)


def package_function(home, name: str) -> tuple[object, cst.FunctionDef] | None:
    """(the module that defines it, the module-level function) that `name` refers to in `home`: its own, or one
    imported from (or re-exported by) another file of the package (`from .attention import maybe_add_mask` in a
    package's `__init__`), where its decorators keep it (`ParsedModule.plain_functions`)."""
    return package_definition(home, name, lambda module: module.plain_functions)


def package_definition(home, name: str, defined) -> tuple[object, object] | None:
    """(the module, what `defined(module)` holds under the name) for the definition `name` refers to in `home`,
    as `package_function` finds a function (`defined`: a module's functions, or its top-level classes)."""
    for _ in range(MAX_REEXPORTS):
        if name in home.bound_names:
            return None
        if name in defined(home):
            return home, defined(home)[name]
        dotted = home.imports.get(name)
        if dotted is None or "." not in dotted.lstrip("."):
            return None
        module, name = dotted.rsplit(".", 1)
        home = home.package_module(module)
        if home is None:
            return None
    return None


def _returns_its_argument(home: "ParsedModule", function: cst.FunctionDef) -> bool:
    """`def register(fn): _registry.add(fn); return fn`: before its one `return p` for its one parameter p, the body
    only adds p to a container the module binds at its top level (a docstring aside). Any other statement may change
    the function it returns (breaker round 28: a helper call setting `fn.__code__`, `object.__setattr__`)."""
    params = function.params
    if len(params.params) != 1 or isinstance(params.star_arg, cst.Param) or params.kwonly_params or \
            params.star_kwarg or params.posonly_params:
        return False
    argument = params.params[0].name.value
    body = list(function.body.body)
    last = return_value(body[-1]) if body else None
    if not (isinstance(last, cst.Name) and last.value == argument):
        return False
    return all(isinstance(statement, cst.SimpleStatementLine) and
               all(_docstring(small) or _registers(home, small, argument) for small in statement.body)
               for statement in body[:-1])


def _docstring(small: cst.BaseSmallStatement) -> bool:
    return isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString)


def _registers(home: "ParsedModule", small: cst.BaseSmallStatement, argument: str) -> bool:
    """`_registry.add(fn)`, `_leaves.append(fn)`: a set's or list's method given the argument alone, on a name the
    module binds once, at its top level, to an empty set, list or dict."""
    call = small.value if isinstance(small, cst.Expr) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and
            call.func.attr.value in REGISTERING_METHODS and isinstance(call.func.value, cst.Name) and
            len(call.args) == 1 and isinstance(call.args[0].value, cst.Name) and
            call.args[0].value.value == argument and not call.args[0].star):
        return False
    bindings = home.bindings.get(call.func.value.value, [])
    assign = home.parents.get(home.parents.get(bindings[0])) if len(bindings) == 1 else None
    value = assign.value if isinstance(assign, cst.Assign) and home.parents.get(assign) in home.module.body else None
    return isinstance(value, (cst.List, cst.Set, cst.Dict)) and not getattr(value, "elements", None) or \
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("set", "list") and \
        not value.args


def return_value(statement: cst.CSTNode) -> cst.BaseExpression | None:
    """A statement that is one `return X`: X (None for a bare return, or any other statement)."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and \
            isinstance(statement.body[0], cst.Return):
        return statement.body[0].value
    return None

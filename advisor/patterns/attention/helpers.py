"""Attention split across functions: scores computed by a helper, or weights returned to a caller.

The walks continue through a helper of this file whose body ends in its only `return` (its parameters read as
the call's arguments), and out of a function whose weights are returned to its one call site, which becomes the
block's home. Helpers are read, never edited.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns.attention.candidate import Candidate, function_of, merge_flow
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import Refusal
from advisor.patterns.scope import ClassTable
from advisor.static.module_index import ClassInfo, ParsedModule
from advisor.static.walk import walk

LOOKUP_HOOKS = ("__getattribute__", "__getattr__")  # a class's attribute lookup of its own making


def helper_named(c: Candidate, func: cst.BaseExpression) -> cst.FunctionDef | None:
    """The function `self.name` (a method of this class) or `name` (a function of this file) calls; None where the
    name may hold something else when the call runs: a method the file also sets on an instance by that name
    (`m.scores = lambda q, k: ...`), a function it rebinds (`scores = torch.no_grad()(scores)`)."""
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self" \
            and c.owner is not None:
        name = func.attr.value
        method = c.owner.methods.get(name)
        if method is None or c.owner.method_shadowed(name) is not None or _class_body_binds(c.owner.node, name) or \
                dispatch_unplain(c.parsed, c.owner.node, c.function):
            return None
        return method
    if not isinstance(func, cst.Name) or func.value in c.parsed.bound_names:
        return None
    return c.parsed.plain_functions.get(func.value)


def dispatch_unplain(parsed: ParsedModule, cls: cst.ClassDef, method: cst.FunctionDef) -> bool:
    """Whether `self.name` in `method` may not be the class's own method `name` for reasons other than a binding
    of that name (breaker round 19): a metaclass or a class decorator (which may wrap or subclass it), attribute
    lookup customised by a class of the file (`__getattribute__`, `__getattr__`), a `del` in the class body, or
    `method` reached as a plain function by another class (`forward = Attn.forward`, `Attn.forward(self, ...)`),
    whose `self` is not this class's."""
    if cls.decorators or any(arg.keyword is not None and arg.keyword.value == "metaclass"
                             for arg in (*cls.bases, *cls.keywords)):
        return True
    if parsed.derived(LOOKUP_HOOKS, _customises_lookup):
        return True
    if any(isinstance(small, cst.Del) for statement in cls.body.body
           for small in (statement.body if isinstance(statement, cst.SimpleStatementLine) else ())):
        return True
    return any(isinstance(use.value, cst.Name) and use.value.value == cls.name.value
               for use in parsed.attributes_named(method.name.value))


def _customises_lookup(parsed: ParsedModule) -> bool:
    """A class of the file defines `__getattribute__` or `__getattr__` (computed once per file)."""
    return any(function.name.value in LOOKUP_HOOKS and parsed.innermost(parsed.parents[function], cst.ClassDef)
               is not None for function in parsed.nodes_of(cst.FunctionDef))


def _class_body_binds(cls: cst.ClassDef, name: str) -> bool:
    """The class body assigns the name besides its `def` (`scores = twice(scores)`: a wrapper applied by a call)."""
    for statement in cls.body.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
                [small.target] if isinstance(small, (cst.AugAssign, cst.AnnAssign)) else []
            if any(isinstance(target, cst.Name) and target.value == name for target in targets):
                return True
    return False


def callee(c: Candidate, node: cst.CSTNode) -> cst.FunctionDef | None:
    """`self.scores(q, k)` (a method of this class) or `scores(q, k)` (a function of this file) whose
    body ends in its only `return`; None for anything else."""
    if not isinstance(node, cst.Call) or any(a.star for a in node.args):
        return None
    function = helper_named(c, node.func)
    if function is None or function is c.function or function in c.inlined or single_return(function) is None:
        return None
    if any(not (isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod"))
           for d in function.decorators):
        return None  # another decorator may change what the call computes
    return function


def bind_arguments(c: Candidate, function: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression]:
    params = [p.name.value for p in function.params.params]
    keyword_only = [p.name.value for p in function.params.kwonly_params]
    bound: dict[str, cst.BaseExpression] = {}
    kind = _method_kind(function)
    if isinstance(call.func, cst.Attribute) and kind != "static":  # self.method(...): self (or its class)
        if not params:
            raise Refusal(f"`{function.name.value}` takes no `self`")
        # the caller's own `self` (helper_named takes `self.method` only), a read the caller's flow knows
        bound[params[0]] = call.func.value if kind == "instance" else cst.parse_expression("type(self)")
        params = params[1:]
    for position, arg in enumerate(call.args):
        name = params[position] if arg.keyword is None and position < len(params) else \
            arg.keyword.value if arg.keyword is not None else None
        if name is None or name in bound or name not in params + keyword_only:  # the original raises TypeError
            raise Refusal(f"the call `{short(c.parsed, call)}` does not match `{function.name.value}`'s parameters")
        bound[name] = arg.value
    for param in function.params.params:
        if param.name.value not in bound and param.default is not None:
            if not _constant(param.default):  # evaluated once, where the `def` ran: not what it reads now
                raise Refusal(f"`{function.name.value}` is called without `{param.name.value}`, whose default "
                              f"`{short(c.parsed, param.default)}` was computed when the `def` ran")
            bound[param.name.value] = param.default
    return bound


def _constant(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)) or \
        isinstance(node, cst.Name) and node.value in ("None", "True", "False")


def enter_callee(c: Candidate, call: cst.Call) -> cst.BaseExpression:
    """Continue the score walk inside the helper that returns the scores; its parameters are read as
    the caller's arguments."""
    function = callee(c, call)
    c.inlined[function] = (call, bind_arguments(c, function, call))
    merge_flow(c, function)
    return single_return(function).value


def leave_to_caller(c: Candidate, returned: cst.Return) -> cst.Call:
    """The weights are returned by this function: continue at its one call site in the file, which
    becomes the home of the SDPA call."""
    sites = [call for call in calls_to(c.parsed, c.function, c.owner)]
    through = calls_through_objects(c.parsed, c.function, c.owner)
    if not sites and through:
        raise Refusal(f"the attention weights are returned to `{short(c.parsed, through[0])}`, a call through "
                      f"another object, which the rewrite does not follow (SDPA must replace the caller's "
                      f"value product)")
    if len(sites) != 1:
        raise Refusal("the attention weights are returned to the caller" if not sites else
                      "the attention weights are returned by a function called from several places")
    call = sites[0]
    caller = function_of(c.parsed, call)
    if caller is None or single_return(c.function) is not returned:
        raise Refusal("the attention weights are returned to the caller")
    c.inlined[c.function] = (call, bind_arguments(c, c.function, call))
    c.home = caller
    merge_flow(c, caller)
    return call


def argument_of(c: Candidate, name: cst.Name) -> cst.BaseExpression | None:
    """The caller's argument for a parameter of an inlined helper."""
    function = function_of(c.parsed, name)
    if function not in c.inlined or not any(d.kind == "param" for d in c.flow.definitions_of(name)):
        return None
    return c.inlined[function][1].get(name.value)


def returned_by(c: Candidate, call: cst.CSTNode) -> cst.BaseExpression | None:
    """What an inlined helper returns, at its call."""
    return next((single_return(function).value for function, (site, _) in c.inlined.items()
                 if site is call and single_return(function) is not None), None)


def helper_return(c: Candidate, call: cst.Call) -> cst.BaseExpression | None:
    function = callee(c, call)
    return single_return(function).value if function is not None else None


def helper_at(c: Candidate, call: cst.Call):
    """(what the helper called here returns, the helper, its parameters bound to this call's arguments);
    an inlined helper's parameters are already read as the caller's arguments."""
    returned = returned_by(c, call)
    if returned is not None:
        return returned, function_of(c.parsed, returned), {}
    function = callee(c, call)
    if function is None:
        return None
    try:
        bound = bind_arguments(c, function, call)
    except Refusal:
        return None
    return single_return(function).value, function, bound


def dotted_name(c: Candidate, function: cst.FunctionDef) -> str:
    return c.parsed.function_names.get(function, c.scope.name)


def single_return(function: cst.FunctionDef) -> cst.Return | None:
    """The function's only `return`, when it is the last statement and returns a value."""
    body = function.body.body
    if not body or not isinstance(body[-1], cst.SimpleStatementLine) or not isinstance(body[-1].body[-1], cst.Return):
        return None
    last = body[-1].body[-1]
    returns = returns_of(function)
    return last if returns == [last] and last.value is not None else None


def returns_of(function: cst.FunctionDef) -> list[cst.Return]:
    """Every `return` of the function itself (not of a function or lambda nested in it)."""
    finder = _ReturnFinder(function)
    walk(function, finder)
    return finder.returns


def calls_to(parsed: ParsedModule, function: cst.FunctionDef, owner: ClassInfo | None) -> list[cst.Call]:
    """Call sites of a method (`self.name(...)` in its class) or of a module-level function (`name(...)`)."""
    name = function.name.value
    is_method = owner is not None and owner.methods.get(name) is function
    if not is_method and parsed.module_functions.get(name) is not function:
        return []
    return [call for call in parsed.calls_by_name.get(name, ())
            if _is_call_site(call, name, is_method, through_object=False) and (not is_method or
                                                                              parsed.within(call, owner.node))]


def calls_in_subclasses(parsed: ParsedModule, classes: ClassTable, method: cst.FunctionDef,
                        owner: ClassInfo | None) -> list[cst.Call]:
    """`self.name(...)` in a class of this file deriving from the method's class without redefining it (NeMo's
    relative-position attention computes the scores its base's `forward_attention` takes): calls of the method as
    much as `calls_to`'s in its own class."""
    name = method.name.value
    if owner is None or owner.methods.get(name) is not method:
        return []
    return [call for sub in classes.subclasses(owner) if name not in sub.methods
            for call in parsed.calls_by_name.get(name, ())
            if parsed.within(call, sub.node) and _is_call_site(call, name, True, through_object=False)]


def calls_through_objects(parsed: ParsedModule, method: cst.FunctionDef, owner: ClassInfo | None) -> list[cst.Call]:
    """`attn.get_attention_scores(q, k)` or `self.attn.scores(q, k)` anywhere in the file, for a method no other
    class of the file defines: calls of this method through an object of its class, as far as names tell."""
    name = method.name.value
    if owner is None or owner.methods.get(name) is not method or \
            parsed.method_name_counts.get(name) != 1:
        return []
    return [call for call in parsed.calls_by_name.get(name, ()) if _is_call_site(call, name, False, through_object=True)]


class _ReturnFinder(cst.CSTVisitor):
    def __init__(self, root: cst.FunctionDef) -> None:
        self.root, self.returns = root, []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.root

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        self.returns.append(node)


def _is_call_site(call: cst.Call, name: str, is_method: bool, through_object: bool) -> bool:
    """`self.name(...)` (a method), `obj.name(...)` with obj not `self` (through an object), or `name(...)`. The
    calls come from the file's call index by name (ParsedModule.calls_by_name)."""
    func = call.func
    if through_object:
        return isinstance(func, cst.Attribute) and func.attr.value == name and \
            not (isinstance(func.value, cst.Name) and func.value.value == "self")
    if is_method:
        return isinstance(func, cst.Attribute) and func.attr.value == name and \
            isinstance(func.value, cst.Name) and func.value.value == "self"
    return isinstance(func, cst.Name) and func.value == name


def _method_kind(function: cst.FunctionDef) -> str:
    """'static', 'class' or 'instance': what a call through `self.` binds to the first parameter."""
    names = {dec.decorator.value for dec in function.decorators if isinstance(dec.decorator, cst.Name)}
    return "static" if "staticmethod" in names else ("class" if "classmethod" in names else "instance")

"""Whether a call writes in place the tensors it is given, where its result is used (`s = stat(q)`,
`bias = resolve_mask(n, attn, mask)`): a torch function or tensor method by its name (a trailing underscore, `out=`,
`inplace=`), a torch.nn layer by how the class builds it, this file's or its package's function by its body.

A function's body writes an argument where, through the parameter or a name bound from it (a view, an alias: what
`storage_aliases.may_alias` says may share its storage), it assigns into it (`t[0] = 1`, `t.data = ...`), updates it
(`t += 1`, `t.mul_(2)`, `out=t`), or hands it to a call that does (followed into the file's and the package's
functions, two deep; anything not read counts). Returning it is no write: the caller's name bound to the result is
an alias the caller's own checks follow (breaker round 27: a call whose result was assigned was not checked at all,
and checking it as a call made for its effect refused every helper that returns what it is given).
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns.storage_aliases import FRESH_TENSOR_OPS, METADATA_READS, binding_origins, may_alias
from advisor.static.inplace_args import inplace_argument
from advisor.static.dataflow import FunctionFlow, is_self_attribute, loaded_names
from advisor.static.module_index import ClassInfo, ParsedModule
from advisor.static.outside_writes import NOT_WRITES, REBINDS_TENSORS_GIVEN, SWAPS, in_place_name
from advisor.static.package_functions import called_function
from advisor.static.tensor_reads import HARMLESS_BUILTINS
from advisor.static.tensor_views import tensor_method_names
from advisor.static.walk import descendants

MAX_DEPTH = 2
HOLDERS = (cst.Element, cst.StarredElement, cst.List, cst.Tuple, cst.Set, cst.DictElement, cst.StarredDictElement,
           cst.Dict, cst.BooleanOperation, cst.IfExp)  # what holds or passes on the value itself


def argument_call(parsed: ParsedModule, node: cst.Name) -> cst.Call | None:
    """The call that `node`'s tensor, a container holding it, or a view or method result of it is an argument of:
    `stat(q)`, `list(map(f, (q, k)))`, `norm(q[0])`, `zero_(q.T)`, `torch._foreach_zero_([q])`. None where the name
    is read into an index, arithmetic or metadata (`bias[:T]`, `q * 2`, `q.shape`), which hands on no storage of it."""
    current = node
    while True:
        parent = parsed.parents.get(current)
        if isinstance(parent, cst.Arg):
            call = parsed.parents.get(parent)
            return call if parent.value is current and isinstance(call, cst.Call) else None
        if isinstance(parent, cst.Attribute) and parent.attr.value in METADATA_READS:
            return None  # `q.shape`, `q.size(-1)`: a size, a dtype or a device
        if not (isinstance(parent, HOLDERS) or isinstance(parent, (cst.Subscript, cst.Attribute)) and
                parent.value is current or isinstance(parent, cst.Call) and parent.func is current):
            return None
        current = parent


def writes_arguments(parsed: ParsedModule, call: cst.Call, argument: cst.CSTNode, owner: ClassInfo | None,
                     layers_trusted: bool, depth: int = 0) -> bool:
    """Whether `call` may write in place the tensor `argument` (inside one of its arguments) holds."""
    if any(arg.keyword is not None and arg.keyword.value in ("out", "inplace") for arg in call.args) or \
            inplace_argument(parsed, call):  # `F.relu(qkv, True)`: by position (breaker round 33)
        return True
    func = call.func
    if isinstance(func, cst.Name) and func.value in HARMLESS_BUILTINS and func.value not in parsed.bound_names and \
            func.value not in parsed.imports:
        return False  # `len(q)`, `print(q)`
    dotted = parsed.imported_name(func) or ""
    if dotted in SWAPS or dotted in REBINDS_TENSORS_GIVEN or dotted.startswith("torch.ops."):
        return True  # `torch.utils.swap_tensors(t, u)`, `torch.ops.aten.mul_.Tensor(t, 2)` (breaker round 28)
    if dotted:
        name = dotted.rsplit(".", 1)[-1]
        if dotted.startswith(("torch.", "einops.", "math.")):
            return in_place_name(name) and name not in NOT_WRITES
    method = func.attr.value if isinstance(func, cst.Attribute) else ""
    if is_self_attribute(func) and owner is not None and method in owner.methods:
        return _method_writes(parsed, owner, method, call, argument, layers_trusted, depth)
    if is_self_attribute(func) and owner is not None:
        built = owner.only_value(method)
        return not (layers_trusted and isinstance(built, cst.Call) and
                    (parsed.imported_name(built.func) or "").startswith("torch.nn.") and
                    not any(arg.keyword is not None and arg.keyword.value == "inplace" for arg in built.args))
    if method in tensor_method_names() and not is_self_attribute(func) and not dotted:
        return in_place_name(method) and method not in NOT_WRITES
    followed = called_function(parsed, func, parsed.outside_attribute_writes[0]) if depth < MAX_DEPTH else None
    if followed is None:
        return True  # code not read here: a builtin running what it is given (`map`), a method, a callback
    home, function = followed
    bound = _bound(function, call, argument)
    return bound is None or any(_writes_parameter(home, function, name, layers_trusted, depth + 1) for name in bound)


def _method_writes(parsed: ParsedModule, owner: ClassInfo, method: str, call: cst.Call, argument: cst.CSTNode,
                   layers_trusted: bool, depth: int) -> bool:
    """`self.get_rel_pos(q, ...)`: every method of that name the file's classes define (a subclass may override it)
    is read, behind no decorator (`staticmethod` binds no `self`), where nothing assigns the name over it."""
    methods = parsed.methods_named(method)
    if depth >= MAX_DEPTH or method in parsed.outside_attribute_writes[0] or owner.method_shadowed(method) or \
            any(function.decorators for function in methods):
        return True
    for function in methods:
        bound = _bound(function, call, argument, skip=1)
        if bound is None or any(_writes_parameter(parsed, function, name, layers_trusted, depth + 1) for name in bound):
            return True
    return False


def _bound(function: cst.FunctionDef, call: cst.Call, argument: cst.CSTNode, skip: int = 0) -> list[str] | None:
    """The parameters the argument holding `argument` binds to (`skip`: leading parameters the call does not pass,
    a method's `self`); None where the binding is not plain (a star, more arguments than parameters)."""
    params = function.params
    if isinstance(params.star_arg, cst.Param) or params.star_kwarg or any(arg.star for arg in call.args):
        return None
    positional = (list(params.posonly_params) + list(params.params))[skip:]
    names = []
    for position, arg in enumerate(call.args):
        if not any(node is argument for node in _within(arg)):
            continue
        if arg.keyword is not None:
            names.append(arg.keyword.value)
        elif position < len(positional):
            names.append(positional[position].name.value)
        else:
            return None
    return names


def _within(node: cst.CSTNode):
    yield node
    yield from descendants(node, (cst.Name,))


def _writes_parameter(home: ParsedModule, function: cst.FunctionDef, parameter: str, layers_trusted: bool,
                      depth: int) -> bool:
    """Whether the function's body may write, in place, the tensor its `parameter` receives (see the module
    docstring)."""
    flow = home.flow(function)
    derived = {d.id for d in flow.definitions.values() if d.kind == "param" and d.name == parameter}
    grown = True
    while grown:  # the definitions holding the parameter's storage: it, and names bound from a view of it
        grown = False
        for definition in flow.definitions.values():
            if definition.id not in derived and definition.kind in ("assign", "other") and any(
                    _sees(flow, name, derived) for origin in binding_origins(definition)
                    for name in may_alias(home, origin)):  # `x = t[0]`, `for x in (t,)`, `match t: case b:`
                derived.add(definition.id)
                grown = True
    if any(d.kind in ("aug", "inplace") and d.previous & derived for d in flow.definitions.values()):
        return True  # `t += 1`, `t.mul_(2)`
    if _comprehension_writes(home, flow, function, derived, layers_trusted, depth):
        return True
    for node in loaded_names(function.body):
        if not _sees(flow, node, derived):
            continue
        if _written_through(home, node):
            return True
        call = argument_call(home, node)
        if call is not None and writes_arguments(home, call, node, None, layers_trusted, depth):
            return True
    return False


def _comprehension_writes(home: ParsedModule, flow: FunctionFlow, function: cst.FunctionDef, derived: set[int],
                          layers_trusted: bool, depth: int) -> bool:
    """`[y.mul_(2) for y in (t,)]`: a comprehension's variables over the parameter's storage, written in it."""
    for loop in descendants(function, (cst.CompFor,)):
        if not any(_sees(flow, name, derived) for name in may_alias(home, loop.iter)):
            continue
        target = loop.target
        names = {target.value} if isinstance(target, cst.Name) else {n.value for n in descendants(target, (cst.Name,))}
        comprehension = home.parents.get(loop)
        while comprehension is not None and not isinstance(comprehension, (cst.ListComp, cst.SetComp,
                                                                           cst.DictComp, cst.GeneratorExp)):
            comprehension = home.parents.get(comprehension)
        for node in descendants(comprehension, (cst.Name,)) if comprehension is not None else ():
            call = argument_call(home, node) if node.value in names else None
            if node.value in names and (_written_through(home, node) or call is not None and
                                        writes_arguments(home, call, node, None, layers_trusted, depth)):
                return True
    return False


def _sees(flow: FunctionFlow, name: cst.Name, derived: set[int]) -> bool:
    return bool(flow.reaching.get(name, frozenset()) & derived)


def _written_through(parsed: ParsedModule, node: cst.Name) -> bool:
    """`t[0] = v`, `t.data = v`, `t.view(-1)[0] = v`, `t.view(-1).fill_(1)`: a store or an in-place method through
    the name, its indexing, attributes and method results."""
    current = node
    while True:
        parent = parsed.parents.get(current)
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) and parent.target is current and current is not node:
            return True
        if isinstance(parent, cst.Attribute) and parent.value is current:
            called = parsed.parents.get(parent)
            if isinstance(called, cst.Call) and called.func is parent:
                name = parent.attr.value
                if in_place_name(name) and name not in NOT_WRITES:
                    return True
                if name in FRESH_TENSOR_OPS or name in METADATA_READS:
                    return False  # `t.new_full(...).triu_(1)` writes a new tensor
                current = called
                continue
        if not (isinstance(parent, (cst.Subscript, cst.Attribute)) and parent.value is current or
                isinstance(parent, HOLDERS)):  # `(t if c else None).mul_(2)`, `(t,)[0].mul_(2)` (round 28)
            return False
        current = parent

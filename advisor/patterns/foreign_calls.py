"""Calls that may run code no analysis of this file sees: a callback, another file's helper, an object's method.
A proof that reads what happens between two points of a function (k's and v's constructions, the scores and the
value product) holds only where nothing between them runs such code: it may resize a tensor in place, or write it
(breaker rounds 21 and 22)."""

from __future__ import annotations

import builtins
from dataclasses import dataclass

import libcst as cst

from advisor.patterns import scope
from advisor.patterns.dtypes import layer_class
from advisor.patterns.storage_aliases import METADATA_READS
from advisor.static.package_functions import called_function, keeps_function
from advisor.static.dataflow import is_self
from advisor.static.module_index import ClassInfo, ParsedModule
from advisor.static.outside_writes import REGISTRATION_HOOKS
from advisor.static.project import global_hook_calls
from advisor.static.tensor_views import tensor_method_names
from advisor.static.walk import descendants

KNOWN_BUILTINS = frozenset({"range", "len", "int", "float", "bool", "isinstance", "tuple", "list", "zip", "enumerate",
                            "min", "max", "abs", "round", "pow", "map", "sum", "any", "all", "str", "type", "print"})
KNOWN_MODULES = ("torch", "einops", "math")
# nn.Module's own methods on `self`, where the class does not define them (then they are followed)
MODULE_METHODS = frozenset({"register_buffer", "register_parameter", "add_module", "register_module", "parameters",
                            "buffers", "modules", "children", "named_parameters", "named_buffers", "named_modules",
                            "named_children", "get_buffer", "get_parameter", "get_submodule"})
# builtins of KNOWN_BUILTINS that call a function they are given (the argument's position, or its keyword), and those
# that iterate their positional arguments: iterating a generator runs its body (`list(map(draw, range(2)))` drew
# between the dropout and the value product: review of breaker round 28)
CALLBACK_ARGUMENTS = {"map": 0, "min": "key", "max": "key"}
ITERATING_BUILTINS = frozenset({"list", "tuple", "zip", "enumerate", "min", "max", "map", "sum", "any", "all"})
LAZY_BUILTINS = frozenset({"zip", "enumerate", "map"})  # they iterate what they are given as they are iterated
# nodes that run code without a call of their own: iterating (a loop, a comprehension, unpacking, `*g`, `x in g`,
# `yield from g`) or entering a context (`with s:` runs `s.__enter__`: breaker round 30)
IMPLICIT_RUNNERS = (cst.For, cst.CompFor, cst.Assign, cst.StarredElement, cst.Arg, cst.Comparison, cst.From,
                    cst.With)
BINDING_DECORATORS = frozenset({"staticmethod", "classmethod"})
CONTAINER_METHODS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "get", "keys", "values",
                               "items", "copy", "clear"})


@dataclass(frozen=True)
class _Trust:
    """What a search may take as given: `modules`, that torch.nn layers and nn.Module's own methods run torch's code
    (`modules_untrusted`); `writes`, the attribute names the scanned tree writes on objects (`mod.helper = f`
    replaces a module's function), read from the file the search started in, whose project sees the whole tree."""
    modules: bool
    writes: frozenset[str]


def foreign_call(parsed: ParsedModule, owner: ClassInfo | None, node: cst.CSTNode,
                 modules_trusted: bool = True) -> cst.BaseExpression | None:
    """A call in `node` (and in the functions of this file and of its package that it calls, followed) that may run
    code of another file or of a caller: anything but torch's, einops' and math's names, builtins, tensor methods on
    a receiver other than `self`, and `self.layer(x)` of a torch.nn class built in this class; or what a loop or a
    builtin iterates, where that may run such code (`_iteration_foreign`). None where there is none."""
    return _search(parsed, owner, node, _trust(parsed, modules_trusted), [])[0]


def foreign(parsed: ParsedModule, owner: ClassInfo | None, call: cst.Call, modules_trusted: bool = True) -> bool:
    """Whether this one call may run code of another file or of a caller (see `foreign_call`). Without
    `modules_trusted` (a hook registered, a torch class replaced: `modules_untrusted`), a torch.nn layer's call and
    nn.Module's own methods may run user code too."""
    return _foreign(parsed, owner, call, _trust(parsed, modules_trusted), [])[0]


def foreign_sources(parsed: ParsedModule, owner: ClassInfo | None, sources: list[cst.CSTNode],
                    modules_trusted: bool = True) -> bool:
    """Whether the code an iteration runs (`iteration_sources`'s list) may run code of another file or of a caller."""
    return _sources_foreign(parsed, owner, sources, _trust(parsed, modules_trusted), [])[0]


def implicit_runs(parsed: ParsedModule, node: cst.CSTNode) -> list[cst.BaseExpression]:
    """What a node of IMPLICIT_RUNNERS iterates or enters (`iteration_sources` reads what that runs): a loop's or a
    comprehension's iterable, an unpacked value (`a, b = g`), a starred element or argument outside a target, the
    container of `in`, `yield from`'s value, a `with` statement's context managers."""
    if isinstance(node, (cst.For, cst.CompFor)):
        return [node.iter]
    if isinstance(node, cst.Assign):
        return [node.value] if any(isinstance(t.target, (cst.Tuple, cst.List)) for t in node.targets) else []
    if isinstance(node, cst.StarredElement):
        holder = parsed.parents.get(parsed.parents.get(node))
        return [] if isinstance(holder, (cst.AssignTarget, cst.For, cst.CompFor, cst.StarredElement)) or \
            isinstance(parsed.parents.get(node), (cst.AssignTarget, cst.For, cst.CompFor)) else [node.value]
    if isinstance(node, cst.Arg):
        return [node.value] if node.star else []
    if isinstance(node, cst.Comparison):
        return [target.comparator for target in node.comparisons if isinstance(target.operator, (cst.In, cst.NotIn))]
    if isinstance(node, cst.From):  # `yield from g` (not `raise e from cause`)
        return [node.item] if isinstance(parsed.parents.get(node), cst.Yield) else []
    if isinstance(node, cst.With):
        return [item.item for item in node.items]
    return []


def _trust(parsed: ParsedModule, modules_trusted: bool) -> _Trust:
    return _Trust(modules_trusted, parsed.outside_attribute_writes[0])


def _search(parsed: ParsedModule, owner: ClassInfo | None, node: cst.CSTNode, trust: _Trust,
            path: list[cst.CSTNode]) -> tuple[cst.Call | None, bool]:
    """(the first foreign call in `node`, whether the search met a function of `path`, the functions being
    followed). A function's answer is remembered per file unless it met one of those: its calls are checked where
    that function was entered, so it is complete only for the outermost search."""
    memo = parsed.derived(_search, lambda _: {})
    key = (node, trust)
    if key in memo:
        return memo[key], False
    if node in path:
        return None, True
    path.append(node)
    found, met = None, False
    for inner in descendants(node, (cst.Call,) + IMPLICIT_RUNNERS):
        if isinstance(inner, cst.Call):
            verdict, reached = _foreign(parsed, owner, inner, trust, path)
            culprit = inner
        else:
            verdict, reached, culprit = False, False, None
            for run in implicit_runs(parsed, inner):
                verdict, more = _iteration_foreign(parsed, owner, run, trust, path)
                reached |= more
                culprit = run
                if verdict:
                    break
        met |= reached
        if verdict:
            found = culprit
            break
    path.pop()
    if found is not None or not met or not path:
        memo[key] = found
    return found, met


def _foreign(parsed: ParsedModule, owner: ClassInfo | None, call: cst.Call, trust: _Trust,
             path: list[cst.CSTNode]) -> tuple[bool, bool]:
    """(whether `call` may run foreign code, whether following it met a function of `path`)."""
    func = call.func
    dotted = parsed.imported_name(func) or ""
    if dotted.split(".")[0] in KNOWN_MODULES:
        return False, False
    if dotted in KNOWN_BUILTINS or _builtin(parsed, func):
        return _given_code_foreign(parsed, owner, call, trust, path)
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        own = owner.methods.get(func.attr.value) if owner is not None else None
        if own is not None:
            if func.attr.value in parsed.outside_attribute_writes[0] or not _method_as_written(parsed, own):
                return True, False  # `Attn.note = f` in another file (round 23), or a decorator's wrapper runs
            found, met = _search(parsed, owner, own, trust, path)
            return found is not None, met
        layer = _own_layer(parsed, owner, func.attr.value)
        if layer is not None:  # `self.rel_pos(attn)` of a class of this file: its forward, followed
            if not _method_as_written(parsed, layer.methods["forward"]):
                return True, False
            found, met = _search(parsed, layer, layer.methods["forward"], trust, path)
            return found is not None, met
        return not trust.modules or not (func.attr.value in MODULE_METHODS and _plain_module(parsed, owner) or
                                         (layer_class(parsed, owner, call) or "").startswith("torch.nn.")), False
    followed = called_function(parsed, func, trust.writes)
    if followed is not None:
        home, function = followed
        found, met = _search(home, None, function, trust, path)
        return found is not None, met
    if isinstance(func, cst.Attribute) and func.attr.value in CONTAINER_METHODS and _builtin_container(owner,
                                                                                                       func.value):
        return False, False
    return not (isinstance(func, cst.Attribute) and func.attr.value in tensor_method_names()), False


def _given_code_foreign(parsed: ParsedModule, owner: ClassInfo | None, call: cst.Call, trust: _Trust,
                        path: list[cst.CSTNode]) -> tuple[bool, bool]:
    """(whether a builtin's call runs foreign code through what it is given, whether following it met a function of
    `path`): the function `map` calls (a lambda's body is the search's already), what it iterates."""
    met = False
    for callback in callbacks(call):
        if not isinstance(callback, cst.Lambda):
            verdict, reached = _foreign(parsed, owner, call_of(callback), trust, path)
            met |= reached
            if verdict:
                return True, met
    for iterable in iterated_arguments(call):
        verdict, reached = _iteration_foreign(parsed, owner, iterable, trust, path)
        met |= reached
        if verdict:
            return True, met
    return False, met


def callbacks(call: cst.Call) -> list[cst.BaseExpression]:
    """The functions a builtin of CALLBACK_ARGUMENTS is given to call (`map(f, xs)`, `max(xs, key=f)`)."""
    where = CALLBACK_ARGUMENTS.get(call.func.value) if isinstance(call.func, cst.Name) else None
    if isinstance(where, int):
        return [arg.value for arg in call.args[where:where + 1] if arg.keyword is None and arg.star == ""]
    return [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == where]


def call_of(callback: cst.BaseExpression) -> cst.Call:
    """The call a builtin makes of a function it is given (with one argument; made up, not in the file's tree)."""
    return cst.Call(func=callback, args=(cst.Arg(cst.Name("_")),))


def iterated_arguments(call: cst.Call) -> list[cst.BaseExpression]:
    """What a builtin of ITERATING_BUILTINS iterates: `zip`'s positional arguments, `map`'s after the function, the
    first of the others (`min` and `max` only where it is the one: `max(a, b)` compares its arguments)."""
    name = call.func.value if isinstance(call.func, cst.Name) else None
    if name not in ITERATING_BUILTINS:
        return []
    positional = [arg.value for arg in call.args if arg.keyword is None]
    if name in ("zip", "map"):
        return positional[1:] if name == "map" else positional
    return positional[:1] if name not in ("min", "max") or len(positional) == 1 else []


def _iteration_foreign(parsed: ParsedModule, owner: ClassInfo | None, iterable: cst.BaseExpression, trust: _Trust,
                       path: list[cst.CSTNode]) -> tuple[bool, bool]:
    """(whether iterating `iterable` may run foreign code, whether following it met a function of `path`)."""
    sources = iteration_sources(parsed, owner, iterable)
    return (True, False) if sources is None else _sources_foreign(parsed, owner, sources, trust, path)


def _sources_foreign(parsed: ParsedModule, owner: ClassInfo | None, sources: list[cst.CSTNode], trust: _Trust,
                     path: list[cst.CSTNode]) -> tuple[bool, bool]:
    """(whether one of the calls or generator expressions an iteration runs may run foreign code, whether following
    them met a function of `path`)."""
    met = False
    for source in sources:
        found, reached = _search(parsed, owner, source, trust, path)
        met |= reached
        if found is not None:
            return True, met
    return False, met


def iteration_sources(parsed: ParsedModule, owner: ClassInfo | None, iterable: cst.BaseExpression,
                      seen: frozenset[int] = frozenset()) -> list[cst.CSTNode] | None:
    """The code iterating `iterable` may run: the calls and generator expressions it was made by (a generator runs
    its body as it is iterated, however long ago it was made; a name is followed to what it was assigned). None
    where it may be anything: a parameter, `self`, a global or another binding may be a caller's generator.
    Displays, comprehensions, arithmetic, tensors' metadata and `self.` containers built as literals or torch.nn
    classes run nothing."""
    if isinstance(iterable, (cst.List, cst.Tuple, cst.Set, cst.Dict, cst.ListComp, cst.SetComp, cst.DictComp,
                             cst.BaseString, cst.BinaryOperation, cst.UnaryOperation)):
        return []
    if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name) and \
            iterable.func.value in LAZY_BUILTINS and _builtin(parsed, iterable.func):  # `zip(g, h)` iterates later
        inner = [iteration_sources(parsed, owner, argument, seen) for argument in iterated_arguments(iterable)]
        return None if None in inner else [iterable] + [source for found in inner for source in found]
    if isinstance(iterable, (cst.Call, cst.GeneratorExp)):
        return [iterable]
    if isinstance(iterable, cst.Subscript):  # `i, j = sim.shape[-2:]`: a part of a size, or of a tensor's sizes
        base = iterable
        while isinstance(base, cst.Subscript):
            base = base.value
        sized = isinstance(base, cst.Attribute) and base.attr.value in METADATA_READS or isinstance(base, cst.Call) \
            and isinstance(base.func, cst.Attribute) and base.func.attr.value in METADATA_READS
        return [base] if isinstance(base, cst.Call) and sized else [] if sized else None
    if isinstance(iterable, cst.Attribute):
        value = owner.only_value(iterable.attr.value) if owner is not None and is_self(iterable.value) else None
        built = isinstance(value, (cst.List, cst.Tuple, cst.Dict)) or isinstance(value, cst.Call) and \
            (parsed.imported_name(value.func) or "").startswith("torch.nn.")
        return [] if built or iterable.attr.value in METADATA_READS else None
    function = parsed.innermost(iterable, cst.FunctionDef) if isinstance(iterable, cst.Name) else None
    if function is None or is_self(iterable):
        return None
    flow = parsed.flow(function)
    definitions = flow.definitions_of(iterable)
    if not definitions or flow.sees_undefined(iterable):
        return None
    sources: list[cst.CSTNode] = []
    for definition in definitions:
        if definition.id in seen:
            continue
        if definition.kind == "param" and _packed_parameter(function, definition.name):
            continue  # `*args` is a tuple and `**kwargs` a dict, which Python makes: iterating them runs nothing
        if definition.kind != "assign" or definition.value is None or definition.index is not None:
            return None
        more = iteration_sources(parsed, owner, definition.value, seen | {definition.id})
        if more is None:
            return None
        sources += more
    return sources


def _packed_parameter(function: cst.FunctionDef, name: str) -> bool:
    packed = (function.params.star_arg, function.params.star_kwarg)
    return any(isinstance(param, cst.Param) and param.name.value == name for param in packed)


def runs_known_code(parsed: ParsedModule, source: cst.CSTNode) -> bool:
    """What a call made earlier returns runs only torch's or Python's code when iterated or entered: the call is to
    a name of torch, einops or math, a builtin of the list, or a tensor method (`x.chunk(2)`). A generator
    expression runs its body; a function's or a class's result may be a generator or a context manager of its own."""
    if not isinstance(source, cst.Call):
        return False
    func = source.func
    dotted = parsed.imported_name(func) or ""
    return dotted.split(".")[0] in KNOWN_MODULES or _builtin(parsed, func) or \
        isinstance(func, cst.Attribute) and not dotted and not is_self(func.value) and \
        func.attr.value in tensor_method_names()


def _method_as_written(parsed: ParsedModule, method: cst.FunctionDef) -> bool:
    """A method's decorators run no code around its body: each keeps the function, or is `staticmethod` or
    `classmethod` (which change only how the arguments bind, which a search for calls does not read)."""
    return all(keeps_function(parsed, decorator.decorator) or _binding_decorator(parsed, decorator.decorator)
               for decorator in method.decorators)


def _binding_decorator(parsed: ParsedModule, decorator: cst.BaseExpression) -> bool:
    return isinstance(decorator, cst.Name) and decorator.value in BINDING_DECORATORS and \
        decorator.value not in parsed.bound_names and decorator.value not in parsed.imports


def _plain_module(parsed: ParsedModule, owner: ClassInfo | None) -> bool:
    """The class derives from torch.nn classes only: nn.Module's own methods are torch's (a base of another file
    may override `register_buffer`: breaker round 23)."""
    return owner is not None and bool(owner.node.bases) and all(
        (parsed.imported_name(base.value) or "").startswith("torch.nn.") for base in owner.node.bases)


def _own_layer(parsed: ParsedModule, owner: ClassInfo | None, attribute: str) -> ClassInfo | None:
    """The class of this file (defined once, at module level, with its own `forward` and no `__call__`) that every
    instance's `self.<attribute>` is built as (`self.rel_pos = RelPos(...)`)."""
    value = owner.only_value(attribute) if owner is not None else None
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return None
    info = parsed.top_level_classes.get(value.func.value)
    return info if info is not None and "forward" in info.methods and "__call__" not in info.methods else None


def _builtin(parsed: ParsedModule, func: cst.BaseExpression) -> bool:
    """`range(n)`, `ValueError(...)`: a builtin of KNOWN_BUILTINS or an exception class, which the file does not
    rebind (an exception's message is built by the call's arguments, which are calls of their own)."""
    if not isinstance(func, cst.Name) or func.value in parsed.bound_names or func.value in parsed.imports:
        return False
    value = getattr(builtins, func.value, None)
    return func.value in KNOWN_BUILTINS or isinstance(value, type) and issubclass(value, BaseException)


def _builtin_container(owner: ClassInfo | None, receiver: cst.BaseExpression) -> bool:
    """`self.maps` that every instance holds as a list, dict or set literal (`self.maps = []` in `__init__`)."""
    if not (isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name) and
            receiver.value.value == "self" and owner is not None):
        return False
    value = owner.only_value(receiver.attr.value)
    return isinstance(value, (cst.List, cst.Dict, cst.Set)) or isinstance(value, cst.Call) and \
        isinstance(value.func, cst.Name) and value.func.value in ("list", "dict", "set") and not value.args


def modules_untrusted(parsed: ParsedModule) -> str | None:
    """Why a torch.nn layer's call may run user code (None: nothing in the scanned tree shows it): a hook registered
    (on a module, on every module, on buffer registration) or a torch function or class replaced (`nn.Identity =
    Writer` before the model is built: breaker round 23). Read once per file."""
    return parsed.derived(modules_untrusted, _modules_untrusted)


def _modules_untrusted(parsed: ParsedModule) -> str | None:
    replaced = sorted(name for name in parsed.outside_attribute_writes[0]
                      if name.startswith("torch.") and name not in scope.INTRODUCED)  # SDPA's own: scope refuses
    if replaced:
        return f"`{replaced[0]}` is assigned in {parsed.outside_writer(replaced[0])}"
    if parsed.project is not None and parsed.project.registration_hooks or \
            global_hook_calls(parsed, REGISTRATION_HOOKS):
        return "the tree registers a module, parameter or buffer registration hook"
    return scope.hook_registration(parsed)

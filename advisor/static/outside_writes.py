"""What one file writes on objects other than a method's own `self`, read with CPython's parser: the analysed file's
own writes (`ParsedModule.own_outside_writes`) and the tree-wide part of the run-time identity facts
(static.project), for every file of a scan (a libcst walk of the analysed file for them cost 15% of a cold scan).
Names resolve as `ParsedModule.imported_name` resolves them. It reads `m.a = v`, `m.a.data = v` (both `a` and
`data`), `m.a[i] = v` (into the elements), in-place methods (`m.a.fill_(1)`; `set_`/`resize_`... reshape),
bindings by name (`setattr`, `register_buffer`, `add_module`, attribute tables: a computed name is `*`, or
`*identity` where it binds only a fresh `nn.Identity()`), state-dict loaders, and a torch function replaced
(`F.softmax = f`: its dotted name). In-place functions write their first argument (`nn.init.ones_(m.bias)`,
`torch.fill_(m.bias, 1)`, timm's `trunc_normal_(m.table)`), `vector_to_parameters` the tensors it is given; a
torch.nn.init draw with moderate arguments is `name~drawn` (FINITE_DRAW: a learned table stays finite). A write on
an object an enclosing `if isinstance(m, nn.Linear):` narrows to a torch.nn class is `name@torch.nn.Linear`
(NARROWED): it reaches only instances of that class (nanoGPT's `_init_weights` zeroes Linear biases, not the
attention's causal `bias`). A computed binding that bypasses `nn.Module.__setattr__` adds ANY_RAW."""

from __future__ import annotations

import ast
import fnmatch
import glob
import importlib
import re
from dataclasses import dataclass
from functools import cache

from advisor.static.python_ast import nodes, python_tree

ANY_ATTRIBUTE = "*"  # in `outside`: the file writes attributes whose names it computes (`setattr(m, name, v)`)
ANY_TO_IDENTITY = "*identity"  # ... and binds nothing but a fresh `nn.Identity()` that way (dropout stripped)
# ... and some such write bypasses `nn.Module.__setattr__` (an attribute table, `object.__setattr__`, a state-dict
# loader): only then may a registered parameter hold anything but an `nn.Parameter` (or None)
ANY_RAW = "*raw"
# ... on an object that may be a class (`setattr(Attn, name, f)`, `type.__setattr__(cls, name, f)`), or a function
# on any object (`setattr(m, name, types.MethodType(f, m))`): any method of any class may then be another function
ANY_ON_CLASS = "*class"
# ... and, read in another file of the tree, any tensor a class builds may be handed on or replaced there: `m._apply(f)`
# stores what `f` returns, `getattr(m, name)` reads by a computed name (static.escaping_reads)
ANY_TENSOR = "*tensor"
# ... a module's tensors listed whole are handed on (`m.state_dict()`, `next(m.buffers())`): what is done to them
# there writes their elements, or changes a shape or dtype only by what the tree's `shape_changes` names
ANY_LISTED = "*listed"
# the module a write goes to where it is looked up by a computed name (`sys.modules[name]`, `importlib.import_module(
# name)`, `__import__(name)`): any module, torch's among them
ANY_MODULE = "?"
# torch's modules whose names user code reads: a write by a computed name on a module of unknown name may rebind any
# of their names (each such name is then written as `torch.nn.functional.softmax` is by `F.softmax = f`)
READ_TORCH_MODULES = ("torch", "torch.nn", "torch.nn.functional")
# modules whose functions the proofs read as computing numbers (a scale's `math.sqrt(d)`): a write of one of their
# names (`math.sqrt = f` in a helper, breaker round 48) is recorded as torch's are, dotted
NUMBER_MODULES = ("math", "numpy")
REPLACEABLE_ROOTS = ("torch", *NUMBER_MODULES)  # the top-level modules whose names a write is recorded dotted for
# `module:PATTERN`: a module's globals whose names the glob PATTERN matches, bound by a computed name on a module the
# import machinery gives (`setattr(sys.modules[name], cls.__name__ + "Fast", cls)`): a module's attributes are its
# globals, no instance's, so such a write is no ANY_ATTRIBUTE
MODULE_GLOBALS = "module:"
MODULE_LOOKUPS = {"importlib.import_module", "__import__"}
IDENTITY = {"torch.nn.Identity", "torch.nn.modules.linear.Identity"}
# methods that bind an attribute of their receiver by the name given first (and `setattr(obj, name, value)`)
NAMED_BINDERS = {"__setattr__", "register_buffer", "register_parameter", "add_module", "register_module"}
# the binders and unbinders whose reads `_binders_unshown` checks
UNSHOWN_BINDERS = NAMED_BINDERS | {"__delattr__"}
# ... those a class may define for itself (`def add_module(self, name, m)`): a call of one may then bind anything, by
# any route (`__setattr__` is left to the class's own reading: configuration classes define it everywhere)
DEFINABLE_BINDERS = frozenset({"add_module", "register_module", "register_buffer", "register_parameter"})
# classes whose unbound `__setattr__` takes the object first and bypasses `nn.Module.__setattr__`:
# `object.__setattr__(m, name, v)` on an instance, `type.__setattr__(Attn, "norm", f)` on a class
RAW_SETTERS = ("object", "type")
# methods that return a module's submodule, buffer or parameter by its dotted name (a write through them writes it)
GETTERS = {"get_submodule", "get_buffer", "get_parameter"}
# dictionaries that hold a module's attributes: a store into one binds the attribute its key names
ATTRIBUTE_TABLES = {"_modules", "_buffers", "_parameters", "__dict__"}
# methods giving an object's state, its attribute tables among it (`m.__reduce_ex__(2)[2]["_modules"]`)
STATE_GETTERS = {"__getstate__", "__reduce__", "__reduce_ex__"}
# methods of an object's namespace (`m.__dict__`, `vars(m)`) that bind nothing; any other (`update`, `setdefault`,
# `pop`) binds or unbinds the attributes its keywords name, or any attribute
# builtins that only read a namespace they are given (`dict(vars(m))` copies it)
NAMESPACE_READERS = frozenset({"dict", "list", "len", "print", "repr", "str", "sorted", "set", "tuple", "iter",
                               "any", "all", "isinstance", "id", "hash", "bool"})
NAMESPACE_READS = {"get", "keys", "values", "items", "copy", "__getitem__", "__contains__", "__len__", "__iter__"}
KEYED_NAMESPACE_METHODS = {"pop", "setdefault", "__setitem__", "__delitem__"}  # their first argument is the key
# a module's hook tables (`_forward_hooks`, `_forward_pre_hooks_with_kwargs`): a method of one that is no read
# (`update`, `setdefault`) stores into it as `m._forward_hooks[k] = f` does (breaker round 33)
HOOK_TABLE = re.compile(r"_\w*hooks\w*")
# process-wide hooks that may replace any submodule, parameter or buffer as it is assigned (see static.project)
REGISTRATION_HOOKS = {"register_module_module_registration_hook", "register_module_buffer_registration_hook",
                      "register_module_parameter_registration_hook"}
# what rewrites any buffer or parameter of a module when a state dict is loaded into it
STATE_LOADERS = {"_register_load_state_dict_pre_hook", "register_load_state_dict_pre_hook",
                 "register_load_state_dict_post_hook", "_load_from_state_dict"}
NARROWED = "@"  # `name@torch.nn.Linear`: written only on objects an `isinstance` test narrows to that torch.nn class
FINITE_DRAW = "~drawn"  # `name~drawn`: its elements drawn by torch.nn.init with moderate arguments (finite values)
# torch functions that write the data of every tensor in their second argument (`param.data = ...`)
REBINDS_TENSORS_GIVEN = {"torch.nn.utils.vector_to_parameters",
                         "torch.nn.utils.convert_parameters.vector_to_parameters"}
# methods giving a module's tensors themselves, each of which a function mapped over them may write
TENSOR_LISTS = frozenset({"buffers", "named_buffers", "parameters", "named_parameters", "state_dict", "values"})
# functions that rebind the tensors they are given (`torch.utils.swap_tensors(m.bias, t)`)
SWAPS = {"torch.utils.swap_tensors", "torch.utils._python_dispatch.swap_tensors"}
# modules whose functions turn a module's tensor, named by their second argument ("weight" by default), into a
# property computed at each read (`register_parametrization(m, "bias", Band())`, `weight_norm(m)`)
PARAMETRIZERS = ("torch.nn.utils.parametrize.", "torch.nn.utils.parametrizations.", "torch.nn.utils.weight_norm",
                 "torch.nn.utils.spectral_norm")
# operator methods that write their receiver (`t.__setitem__(i, v)`, `t.__iadd__(1)`)
IN_PLACE_DUNDERS = {"__setitem__", "__delitem__"} | {f"__i{op}__" for op in (
    "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift")}
# in-place methods that change their receiver's shape or dtype; every other one writes its elements only
RESHAPING_IN_PLACE = {"resize_", "resize_as_", "set_", "squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_",
                      "swapaxes_", "as_strided_"}


def outside_writes_of_source(text: str, own: bool = False) -> tuple[set[str], set[str]]:
    """(names written on other objects, those written otherwise than into their elements); empty for source
    CPython cannot parse (the scan reports it). `own`: the file read is the one analysed, where `setattr(self, "x",
    v)` counts too (a class's attribute bound by a name the analysis of that class does not pair with a value)."""
    collector = _collected(text, own)
    return (collector.names, collector.reshaped) if collector is not None else (set(), set())


@dataclass(frozen=True)
class FileWrites:
    """What one file of the tree writes on other objects, and what another file's functions may: its functions
    that write a parameter in place (name, position), and the attributes it hands to an imported function (that
    function's dotted name as imported, position, the attribute's name): `util.w(attn.CAUSAL)` writes `CAUSAL` where
    `util`'s `w` writes its first parameter."""

    names: frozenset[str]
    reshaped: frozenset[str]
    writers: frozenset[tuple[str, int]]
    handed: frozenset[tuple[str, int, str]]
    escaping: frozenset[str] = frozenset()  # attributes read where their tensors may be handed on


def file_writes(text: str, handed_on=None) -> FileWrites:
    """A file's writes on other objects as another file of the tree sees them, with the attributes
    `handed_on(tree, dotted, narrowing)` names (static.escaping_reads: read where they may be handed on, and then
    written unseen; it reads the file's names as this module resolves them)."""
    collector = _collected(text, False)
    if collector is None:
        return FileWrites(frozenset(), frozenset(), frozenset(), frozenset())
    writers = frozenset((name, position) for name, positions in collector.writers.items() if isinstance(name, str)
                        for position in positions)
    escaping = handed_on(python_tree(text), collector.resolve.dotted, collector.narrowing) if handed_on else set()
    return FileWrites(frozenset(collector.names), frozenset(collector.reshaped), writers, frozenset(collector.handed),
                      frozenset(escaping))


def _collected(text: str, own: bool) -> "_Writes | None":
    try:
        tree = python_tree(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    imports: list[ast.Import | ast.ImportFrom] = []
    bound: list[str] = []
    writes: list[ast.AST] = []
    tests: list[ast.If] = []
    bindings: list[tuple[ast.AST, ast.AST]] = []  # (target, value) pairs that may alias an attribute
    functions: list[ast.FunctionDef] = []
    binders: list[ast.AST] = []  # binding and unbinding methods read, named or defined (`_binders_unshown`)
    for node in nodes(tree):  # one pass over the tree, in no particular order
        kind = type(node)
        if kind is ast.Attribute and node.attr in UNSHOWN_BINDERS or \
                kind is ast.Constant and node.value in UNSHOWN_BINDERS or \
                kind is ast.FunctionDef and node.name in DEFINABLE_BINDERS or \
                kind is ast.Name and node.id == "delattr" or \
                kind is ast.Call and type(node.func) is ast.Attribute and node.func.attr == "__new__":
            binders.append(node)
        if kind in _WRITES:
            writes.append(node)
            if kind is ast.Assign:
                bindings.extend((target, node.value) for target in node.targets)
        elif kind is ast.NamedExpr or kind is ast.For or kind is ast.AsyncFor or kind is ast.comprehension:
            bindings.append((node.target, node.value if kind is ast.NamedExpr else node.iter))
            if kind is not ast.NamedExpr and not isinstance(node.target, ast.Name):  # `for m.sm in [...]` (round 18)
                writes.append(ast.Assign(targets=[node.target], value=node.iter))
        elif kind is ast.withitem and node.optional_vars is not None and not isinstance(node.optional_vars, ast.Name):
            writes.append(ast.Assign(targets=[node.optional_vars], value=node.context_expr))
        elif kind is ast.Delete:  # `del Attn._mix`: the attribute no longer holds what it held (breaker round 19)
            writes.extend(ast.Assign(targets=[target], value=ast.Constant(None)) for target in node.targets
                          if not isinstance(target, ast.Name))
        elif kind is ast.FunctionDef or kind is ast.Lambda:
            functions.append(node)
        elif kind is ast.Import or kind is ast.ImportFrom:
            imports.append(node)
        elif kind is ast.Name and type(node.ctx) is ast.Store or kind is ast.arg or kind is ast.ExceptHandler:
            bound.extend(_bound(node))
        elif kind is ast.If and type(node.test) is ast.Call and getattr(node.test.func, "id", None) == "isinstance":
            tests.append(node)
    imports.sort(key=lambda node: (node.lineno, node.col_offset))  # source order: the first binding wins
    names = _Names(tree.body, imports, bound, bindings)
    collector = _Writes(names, own, _narrowings(tests, names), _aliases(bindings, names.imports))
    collector.writers = _parameter_writers(functions, writes, bindings)
    for node in writes:
        collector.read(node)
    for module in _handed_on_modules(tree, names, functions, bindings):
        collector.write(module)  # each of its names may be replaced where it arrives
    if any(_holds_a_namespace(value) for _, value in bindings):
        collector.write(ANY_ATTRIBUTE)  # `mods = m._modules`, `for d in [vars(m)]`: writes through it go unseen
    if _binders_unshown(binders, writes):
        collector.write(ANY_ATTRIBUTE)
    return collector


def _binders_unshown(binders: list[ast.AST], writes: list[ast.AST]) -> bool:
    """Whether the file binds or unbinds attributes where `call` cannot read which, or bypasses what torch's
    `__setattr__` lets a registered parameter hold (ANY_RAW follows ANY_ATTRIBUTE): a binding method read otherwise
    than as the callee of a call whose arguments are all shown (`reg = m.register_buffer; reg("mask", t)`,
    `partial(m.add_module, name)`, `m.register_buffer(**kw)`, `getattr(m, "register_buffer")`; a class's own
    `self.add_module(*stage)` is its own computed binding, ClassInfo's); a function of its own named as one of
    torch's binders (which may bind anything, by any route); `delattr` with a computed name or handed on, and any
    `__delattr__` but a class's own (an attribute unbound, torch's checks of what a name already holds are void:
    `add_module`, `setattr` of a plain tensor over a parameter); an instance made by `__new__` (`Attn.__new__(Attn)`:
    its `__init__` never ran, so none of its attributes is what the class binds)."""
    shown = {id(node.func) for node in writes if type(node) is ast.Call and (
        not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords) or
        type(node.func) is ast.Attribute and _is_self(node.func.value))}  # `self.add_module(*s)`: the class's own
    return any(_unshown(node, shown) for node in binders)


def _unshown(node: ast.AST, shown: set[int]) -> bool:
    if type(node) is ast.Call:  # `X.__new__(X)`; a class's own `super().__new__(cls)` runs `__init__` after it
        receiver = node.func.value
        return not (type(receiver) is ast.Call and getattr(receiver.func, "id", None) == "super")
    if type(node) is ast.Name:  # `delattr(m, "bias")` is read as a write of `bias` (call); any other `delattr`
        return id(node) not in shown
    if type(node) is ast.Attribute and node.attr == "__delattr__":
        return not (_is_self(node.value) and id(node) in shown)
    return type(node) is not ast.Attribute or id(node) not in shown


# torch's modules and class and the number modules whose functions a proof reads: one of them handed to a function
# of the file or to `setattr` under another name (`patch(F, "softmax")`, `S = setattr; S(math, "sqrt", f)`), or
# iterated from a literal (`for mod in [torch]: mod.matmul = f`), may have any of its names replaced there (breaker
# round 49); such a module is written whole
HANDED_MODULES = frozenset({"torch", "torch.nn", "torch.nn.functional", "torch.Tensor", *NUMBER_MODULES})


def _handed_on_modules(tree: ast.AST, names: "_Names", functions: list, bindings: list) -> set[str]:
    """The HANDED_MODULES the file hands to a `setattr` alias or to a parameter of one of its functions that sets
    attributes of it, or iterates from a literal in a loop that does."""
    setters = {target.id for target, value in bindings if isinstance(target, ast.Name) and
               isinstance(value, ast.Name) and value.id == "setattr"}
    defined: dict[str, list[ast.FunctionDef]] = {}
    for function in functions:
        if isinstance(function, ast.FunctionDef):
            defined.setdefault(function.name, []).append(function)
    handed: list[ast.AST] = []
    for node in nodes(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in setters:
            handed += node.args
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined:
            handed += [arg for function in defined[node.func.id] for arg in _given_to_setters(function, node)]
        elif isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.iter, (ast.List, ast.Tuple, ast.Set)) \
                and isinstance(node.target, ast.Name) and _sets_attributes_of(node, node.target.id):
            handed += node.iter.elts
    return {dotted for value in handed
            if (dotted := names.dotted(value.value if isinstance(value, ast.Starred) else value)) in HANDED_MODULES}


def _given_to_setters(function: ast.FunctionDef, call: ast.Call) -> list[ast.AST]:
    """The call's arguments whose parameter of `function` has its attributes set there (`_sets_attributes_of`)."""
    parameters = [a.arg for a in function.args.posonlyargs + function.args.args]
    given = [(parameters[i], arg) for i, arg in enumerate(call.args[:len(parameters)])
             if not isinstance(arg, ast.Starred)]
    given += [(keyword.arg, keyword.value) for keyword in call.keywords if keyword.arg is not None]
    return [arg for parameter, arg in given if _sets_attributes_of(function, parameter)]


def _sets_attributes_of(scope: ast.AST, name: str) -> bool:
    """Whether a loop's or a function's body binds an attribute of `name` (`name.x = v`, `setattr(name, ...)`, or
    by any other call given `name`)."""
    for node in nodes(scope):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == name
                   for t in targets):
                return True
        elif isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id == name for a in node.args) and \
                not (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "isinstance")):
            return True
    return False


def _holds_a_namespace(value: ast.AST) -> bool:
    """`value` is an object's table of attributes (`m._modules`, `vars(m)`), or a literal holding one."""
    if isinstance(value, ast.Starred):
        value = value.value
    return _namespace_owner(value) is not None or \
        isinstance(value, (ast.Tuple, ast.List, ast.Set)) and any(map(_holds_a_namespace, value.elts))


class _Names:
    """How the file's names resolve, as module_index.ParsedModule.imported_name resolves them: its imports (in source
    order, the first binding winning; relative ones with their dots), the names it binds otherwise (which hide an
    import), and its module-level aliases of imported objects (`matmul = torch.matmul`, bound once)."""

    def __init__(self, body: list[ast.stmt], imports: list[ast.Import | ast.ImportFrom], bound: list[str],
                 bindings: list[tuple[ast.AST, ast.AST]] = ()) -> None:
        self.imports: dict[str, str] = {}
        for node in imports:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    head = alias.name.split(".")[0]
                    self.imports.setdefault(alias.asname or head, alias.name if alias.asname else head)
            elif isinstance(node, ast.ImportFrom) and node.names[0].name != "*":
                base = "." * node.level + (node.module or "")
                for alias in node.names:
                    self.imports.setdefault(alias.asname or alias.name,
                                            f"{base}{alias.name}" if base.endswith(".") else f"{base}.{alias.name}")
        counts: dict[str, int] = {}
        for name in bound:
            counts[name] = counts.get(name, 0) + 1
        self.bound = frozenset(counts)
        self.aliases: dict[str, str] = {}
        for index, statement in enumerate(body):
            alone = (index == 0 or body[index - 1].end_lineno != statement.lineno) and \
                (index + 1 == len(body) or body[index + 1].lineno != statement.end_lineno)  # no `a = b; c = d`
            if alone and isinstance(statement, ast.Assign) and len(statement.targets) == 1 and \
                    isinstance(statement.targets[0], ast.Name):
                name, dotted = statement.targets[0].id, self.through_imports(statement.value)
                if dotted is not None and counts.get(name) == 1 and name not in self.imports:
                    self.aliases[name] = dotted
        module_level = {id(target) for statement in body if isinstance(statement, ast.Assign)
                        for target in statement.targets}  # read above, one statement a line
        for target, value in bindings:  # `nnf = torch.nn.functional` in a function, then `nnf.softmax = f` (round 18)
            dotted = self.through_imports(value) if isinstance(target, ast.Name) and \
                id(target) not in module_level else None
            if dotted is not None and dotted.split(".")[0] == "torch" and counts.get(target.id) == 1 and \
                    target.id not in self.imports:
                self.aliases.setdefault(target.id, dotted)
        # names bound anywhere (scope-blind) to a module the import machinery gives: `mod = sys.modules[name]`
        self.module_names: dict[str, str] = {}
        lookups: dict[str, int] = {}
        for target, value in bindings:
            module = self.module_lookup(value) if isinstance(target, ast.Name) else None
            if module is not None:
                known = self.module_names.setdefault(target.id, module)
                self.module_names[target.id] = known if known == module else ANY_MODULE
                lookups[target.id] = lookups.get(target.id, 0) + 1
        # the names bound to nothing else in the file
        self.only_lookups = {name: counts.get(name, 0) == bound for name, bound in lookups.items()}

    def module_lookup(self, node: ast.AST) -> str | None:
        """The module a lookup by name gives (`sys.modules["torch.nn.functional"]`, `importlib.import_module(...)`):
        its literal name, ANY_MODULE for a computed one, None where `node` is no such lookup (`sys.modules[__name__]`:
        the file's own module, never torch's)."""
        if isinstance(node, ast.Subscript) and self.dotted(node.value) == "sys.modules":
            key = node.slice
        elif isinstance(node, ast.Call) and (self.dotted(node.func) in MODULE_LOOKUPS or
                                             isinstance(node.func, ast.Name) and node.func.id == "__import__"):
            key = node.args[0] if node.args else None
        else:
            return None
        if isinstance(key, ast.Name) and key.id == "__name__":
            return None
        return _literal(key) or ANY_MODULE

    def through_imports(self, node: ast.AST) -> str | None:
        """`torch.matmul` -> 'torch.matmul' through the import statements alone."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.imports or node.id in self.bound:
            return None
        return ".".join([self.imports[node.id], *parts[::-1]])

    def dotted(self, node: ast.AST) -> str | None:
        """The dotted name an expression refers to through imports and aliases (None for anything else)."""
        parts: list[str] = []
        root = node
        while isinstance(root, ast.Attribute):
            parts.append(root.attr)
            root = root.value
        if isinstance(root, ast.Name) and root.id not in self.imports and root.id in self.aliases:
            return ".".join([self.aliases[root.id], *parts[::-1]])
        return self.through_imports(node)


CODE_RUNNERS = frozenset({"exec", "eval"})  # builtins that run the code in a string given them
# names that hold a class by convention (`for cls in classes: setattr(cls, name, f)`)
CLASS_NAMES = frozenset({"cls", "klass", "kls", "class_", "owner_class"})


# calls that make a function or a bound method: bound by a computed name, one may replace a method of an instance
FUNCTION_MAKERS = frozenset({"MethodType", "partial", "partialmethod", "wraps"})


def _function_like(value: ast.AST | None) -> bool:
    """A value that is a function: a lambda, `types.MethodType(f, m)`, `functools.partial(f, ...)`."""
    if isinstance(value, ast.Lambda):
        return True
    if not isinstance(value, ast.Call):
        return False
    func = value.func.func if isinstance(value.func, ast.Call) else value.func  # `wraps(f)(g)`
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in FUNCTION_MAKERS


def _may_be_class(node: ast.AST, imports: dict[str, str]) -> bool:
    """Whether the receiver of a binding by a computed name may be a class rather than an instance: `type(m)`,
    `m.__class__`, a name spelled as a class is (`Attn`, `attn.Attn`, `cls`), or imported as one. Instances are
    written through names like `model` or `m`, whose computed bindings stay instance attributes."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "type"
    if isinstance(node, ast.Attribute):
        return node.attr == "__class__" or node.attr[:1].isupper()
    if isinstance(node, ast.Name):
        imported = imports.get(node.id, "").rsplit(".", 1)[-1]
        return node.id[:1].isupper() or node.id in CLASS_NAMES or imported[:1].isupper()
    return False


def _narrowings(tests: list[ast.If], names: _Names) -> list[tuple[str, str, int, int]]:
    """(name, the torch.nn classes it is narrowed to, first and last line of the body) for each `if isinstance(name,
    C):` whose classes are all torch.nn classes but Module, and whose body does not rebind the name."""
    found = []
    for test in tests:
        args = test.test.args
        if len(args) != 2 or test.test.keywords or not isinstance(args[0], ast.Name):
            continue
        classes = args[1].elts if isinstance(args[1], ast.Tuple) else [args[1]]
        dotted = [names.dotted(c) for c in classes]
        if not all(d and d.startswith("torch.nn.") and d.rsplit(".", 1)[-1] != "Module" for d in dotted):
            continue
        name = args[0].id
        if any(isinstance(n, ast.Name) and n.id == name and type(n.ctx) is ast.Store or
               isinstance(n, (ast.arg, ast.ExceptHandler)) and name in _bound(n)
               for statement in test.body for n in nodes(statement)):
            continue
        found.append((name, "|".join(sorted(dotted)), test.body[0].lineno, test.body[-1].end_lineno))
    return found


def _may_be(node: ast.AST) -> list[ast.AST] | None:
    """The expressions whose object `node` itself may be (a conditional's branches, a boolean operation's operands,
    `+t`, which is `t`, a walrus's value); None for anything else."""
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return [node.operand]
    if isinstance(node, ast.NamedExpr):
        return [node.value]
    return None


def _aliases(bindings: list[tuple[ast.AST, ast.AST]], imports: dict[str, str]) -> dict[str, set[str]]:
    """Local names that may hold (a view of) another object's attribute, and the attributes: `b = m.bias`,
    `(x := m.bias)`, `for row in m.bias:`, `(x,) = (m.bias,)`,
    `ts = [m.bias]`, anywhere in the file (scope-blind: a write through
    such a name may write those attributes)."""
    found: dict[str, set[str]] = {}
    pending = list(bindings)
    while pending:
        target, value = pending.pop()
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and \
                len(target.elts) == len(value.elts):
            pending.extend(zip(target.elts, value.elts))
            continue
        elements = value.elts if isinstance(value, (ast.Tuple, ast.List, ast.Set)) else [value]  # `ts = [m.bias]`
        attributes = [name for element in elements for name in _attributes_on_the_way(element, imports)]
        if not attributes or not isinstance(target, (ast.Name, ast.Tuple, ast.List, ast.Starred)):
            continue  # `self.matmul = torch.matmul` binds no local name
        for name in (n.id for n in nodes(target) if isinstance(n, ast.Name)):
            found.setdefault(name, set()).update(attributes)
    return found


def _parameter_writers(functions: list[ast.FunctionDef | ast.Lambda], writes: list[ast.AST],
                       bindings: list[tuple[ast.AST, ast.AST]]) -> dict[str | ast.Lambda, set[int]]:
    """The file's functions by name (a lambda by itself, and by each name it is bound to), with the positions of
    the parameters each writes into (`def w(t): t.fill_(1)`, `t[...] = 1`, `lambda t: t.zero_()`): a call
    `w(m.bias)` writes `m.bias`. Scope-blind, like the aliases. Only functions with a parameter named like the root
    of one of the file's `writes` are walked."""
    found: dict[str | ast.Lambda, set[int]] = {}
    rooted = {root.id for root in map(_root_name, filter(None, map(_write_receiver, writes))) if root is not None}
    for function in functions:
        parameters = [arg.arg for arg in function.args.posonlyargs + function.args.args]
        if rooted.isdisjoint(parameters):
            continue
        for node in nodes(function):
            written = _write_receiver(node)
            root = _root_name(written) if written is not None else None
            if root is not None and root.id in parameters:
                key = function if isinstance(function, ast.Lambda) else function.name
                found.setdefault(key, set()).add(parameters.index(root.id))
    for target, value in bindings:  # `w = lambda t: t.fill_(1)`
        if isinstance(target, ast.Name) and value in found:
            found.setdefault(target.id, set()).update(found[value])
    return found


def stores_into_hook_table(func: ast.AST) -> bool:
    """`m._forward_hooks.update` (a method of a module's hook table that is no read): a store into the table."""
    return isinstance(func, ast.Attribute) and func.attr not in NAMESPACE_READS and \
        isinstance(func.value, ast.Attribute) and HOOK_TABLE.fullmatch(func.value.attr) is not None


def _write_receiver(node: ast.AST) -> ast.AST | None:
    """What `node` writes into: the receiver of an in-place method (`t.fill_(1)`), a subscripted target, a hook
    table stored into (`m._forward_hooks.update(h)`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and writes_its_receiver(node.func.attr):
        return node.func.value
    if isinstance(node, ast.Call) and stores_into_hook_table(node.func):
        return node.func.value
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return next((t for t in targets if isinstance(t, ast.Subscript)), None)
    return None


def _attributes_on_the_way(node: ast.AST, imports: dict[str, str]) -> list[str]:
    """The attributes of other objects than `self` an expression reads its value through, down views and
    indexing (`m.bias`, `m.bias.view(-1)`, `getattr(m, "bias")[0]`, `attn.CAUSAL` of an imported module); [] for
    anything else, and for torch's (`torch.nn.functional`)."""
    found = []
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Call):
            getter = _literal_getattr(node)
            if getter is not None:
                found.append(getter[1])
                node = getter[0]
                continue
            if not isinstance(node.func, ast.Attribute):
                return []
            node = node.func.value  # a method of the value: a view of it, maybe
            continue
        if isinstance(node, ast.Attribute):
            if _is_self(node.value):
                return []
            found.append(node.attr)
        node = node.value
    return found if isinstance(node, ast.Name) and not imports.get(node.id, "").startswith("torch") else []


def _literal_getattr(call: ast.Call) -> tuple[ast.AST, str] | None:
    """(`m`, "bias") of `getattr(m, "bias")`."""
    if isinstance(call.func, ast.Name) and call.func.id == "getattr" and len(call.args) >= 2 and \
            _literal(call.args[1]):
        return call.args[0], _literal(call.args[1])
    return None


def _root_name(node: ast.AST) -> ast.Name | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node if isinstance(node, ast.Name) else None


def _bound(node: ast.AST) -> list[str]:
    """The names `node` binds other than by an import, a `def` or a `class` (module_index._assigned_names)."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return [node.id]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    return []


def _is_self(node: ast.AST) -> bool:
    """`self`, or `super()` in a method (`super()._load_from_state_dict(...)` acts on the instance itself)."""
    return isinstance(node, ast.Name) and node.id == "self" or \
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super" and not node.args


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def name_pattern(node: ast.AST | None) -> str:
    """The names an attribute name computed by `node` may spell, as a glob keeping its literal parts
    (`x + "Fast"` and `f"{x}Fast"` spell `*Fast`; anything else `*`)."""
    literal = _literal(node)
    if literal is not None:
        return glob.escape(literal)
    if isinstance(node, ast.JoinedStr):
        return "".join(glob.escape(part.value) if isinstance(part, ast.Constant) else "*" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return name_pattern(node.left) + name_pattern(node.right)
    return "*"


def _is_glob(name: str) -> bool:
    return any(character in name for character in "*?[")


# Not read as replacing torch's names: a name computed whole (no literal part) on a module looked up by a computed
# name, timm's model registry (`setattr(sys.modules[module_name], deprecated, fn)`) among them. It may spell any name
# of any module, torch's too; counting it would refuse every attention block of such a package (timm's 66 zoo
# models: 48 safe to 0). It still binds module globals (`module:*`) for the proofs of module-level values.
UNSPELLED_MODULE_WRITES = "module:*"
# a module's attributes that decide every lookup of its names
WHOLE_MODULE_NAMES = frozenset({"__class__", "__dict__", "__getattr__", "__getattribute__"})


def _torch_object(dotted: str) -> tuple[object, bool] | None:
    """(what `dotted` names in torch, whether it is a module), or None where torch has nothing of that name (torch
    imported only here)."""
    import importlib

    try:
        return importlib.import_module(dotted), True
    except ImportError:
        pass
    head, _, tail = dotted.rpartition(".")
    try:
        owner = importlib.import_module(head)
    except (ImportError, ValueError):
        return None
    return (getattr(owner, tail), False) if hasattr(owner, tail) else None


@cache
def torch_object_kind(dotted: str) -> str | None:
    """"module" where `dotted` names one of torch's modules, "object" where it names something in one (a function,
    a class), None where torch has nothing of that name."""
    found = _torch_object(dotted)
    return None if found is None else "module" if found[1] else "object"


@cache
def torch_names_spelled(module: str, pattern: str) -> tuple[str, ...]:
    """The dotted names of torch a write of `pattern` on `module` may rebind: the names of that object of torch's
    (every module of READ_TORCH_MODULES where `module` is ANY_MODULE, whose name is not shown) that the glob
    matches, or `module.pattern` itself where it matches none and holds no glob (torch imported only here)."""
    unknown = module.split(".")[0] == ANY_MODULE
    modules = tuple(read + module[len(ANY_MODULE):] for read in READ_TORCH_MODULES) if unknown else (module,)
    found: list[str] = []
    for dotted in modules:
        target = _torch_object(dotted)  # a module, or a class (`torch.nn.Dropout`)
        names = dir(target[0]) if target is not None else []
        found.extend(f"{dotted}.{name}" for name in names if fnmatch.fnmatchcase(name, pattern))
    if not found and not _is_glob(pattern) and not unknown:
        found.append(f"{module}.{pattern}")
    return tuple(sorted(found))


@cache
def number_names_spelled(pattern: str) -> tuple[str, ...]:
    """The dotted names of NUMBER_MODULES (those importable here) that a write of `pattern` on a module of unknown
    name may rebind (`*Fast` spells none of math's)."""
    found: list[str] = []
    for module in NUMBER_MODULES:
        try:
            names = dir(importlib.import_module(module))
        except ImportError:
            continue
        found.extend(f"{module}.{name}" for name in names if fnmatch.fnmatchcase(name, pattern))
    return tuple(sorted(found))


class _Writes:
    def __init__(self, names: _Names, own: bool, narrowings: list[tuple[str, str, int, int]],
                 aliases: dict[str, set[str]]) -> None:
        self.resolve, self.own, self.narrowings, self.aliases = names, own, narrowings, aliases
        self.imports = names.imports
        self.names: set[str] = set()
        self.reshaped: set[str] = set()
        self.narrowed = ""  # NARROWED and the classes, while the write read is on a narrowed object
        self.writers: dict[str | ast.Lambda, set[int]] = {}  # functions writing their parameters (positions)
        self.finite = False  # while the write read is a torch.nn.init draw of moderate values (FINITE_DRAW)
        self.through_setattr = False  # while the binding read goes through nn.Module.__setattr__ (not ANY_RAW)
        self.handed: set[tuple[str, int, str]] = set()  # FileWrites.handed

    def write(self, name: str, elements_only: bool = False) -> None:
        if name == "__class__":  # `sub.__class__ = nn.Dropout`: an object of any class (a module reached by any
            self.write(ANY_ATTRIBUTE)  # name, `get_submodule`) becomes another, its methods and attributes too
        if name in (ANY_ATTRIBUTE, ANY_TO_IDENTITY) and not self.through_setattr:
            self.write(ANY_RAW, elements_only)
        name += (FINITE_DRAW if self.finite and elements_only else "") + self.narrowed
        self.names.add(name)
        if not elements_only:
            self.reshaped.add(name)

    def bind_through_setattr(self, name: str) -> None:
        """A binding by `nn.Module.__setattr__` (`setattr`, `register_buffer`, `add_module`, `set_submodule`):
        torch lets it put only an `nn.Parameter` or None where a parameter is registered."""
        self.through_setattr = True
        try:
            self.write(name)
        finally:
            self.through_setattr = False

    def narrowing(self, node: ast.AST | None) -> str:
        """NARROWED and the torch.nn classes an enclosing `isinstance` test narrows every object `node` reaches
        from to (the elements of a tuple target too); "" where none does."""
        if node is None or not self.narrowings:
            return ""
        if isinstance(node, (ast.Tuple, ast.List)):
            found = {self.narrowing(element) for element in node.elts}
            return found.pop() if len(found) == 1 else ""
        root = _root_name(node)
        if root is None:
            return ""
        return next((NARROWED + classes for name, classes, first, last in self.narrowings
                     if name == root.id and first <= root.lineno <= last), "")

    def read(self, node: ast.AST) -> None:
        """Reads one write node, noting whether it writes on a narrowed object."""
        if isinstance(node, ast.Assign) and len(node.targets) > 1:  # `a.x = b.y = v`: each on its own
            for target in node.targets:
                self.read(ast.Assign(targets=[target], value=node.value))
            return
        self.narrowed = self.narrowing(self._written_object(node))
        try:
            _WRITES[type(node)](self, node)
        finally:
            self.narrowed = ""

    def _written_object(self, node: ast.AST) -> ast.AST | None:
        """What a write node writes on: an assignment's target, the receiver of a method (`m.bias.fill_(1)`,
        `m.register_buffer(..)`), the object `setattr` is given, the tensors a torch function writes."""
        if isinstance(node, ast.Assign):
            return node.targets[0]
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            return node.target
        args = [a for a in node.args if not isinstance(a, ast.Starred)]
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" or \
                isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in RAW_SETTERS:
            return args[0] if args else None
        dotted = self.resolve.dotted(func)
        if dotted is not None or isinstance(func, ast.Name):  # a function: it writes what it is passed
            return args[1] if dotted in REBINDS_TENSORS_GIVEN and len(args) >= 2 else args[0] if args else None
        return func.value if isinstance(func, ast.Attribute) else None

    def torch_function(self, node: ast.AST, name: str | None = None) -> None:
        """A write of torch's `name` on `node` (`F.softmax = f`: `torch.nn.functional.softmax`). `name` may be a
        glob (`*Fast` for `setattr(F, x + "Fast", f)`), and `node` a module of unknown name: each torch name it may
        spell is written."""
        dotted = self.module_path(node)
        if dotted is None or dotted.split(".")[0] not in (*REPLACEABLE_ROOTS, ANY_MODULE):
            return
        if name is None:
            dotted, _, name = dotted.rpartition(".")  # `F.softmax = f`, `mod.softmax = f`
            if not dotted:
                return
        kind = torch_object_kind(dotted)
        if kind == "module" and name in WHOLE_MODULE_NAMES:  # `F.__class__ = M`: each of its names may be another
            self.write(dotted)
        elif kind == "object":  # `F.softmax.__code__ = g`, `F.softmax.__defaults__ = (...)`: the function changes
            self.write(dotted)
        if dotted.split(".")[0] == ANY_MODULE and name == "*":
            return  # a name computed whole on a module looked up by a computed name: see UNSPELLED_MODULE_WRITES
        if _is_glob(name) or dotted.split(".")[0] == ANY_MODULE:
            for written in torch_names_spelled(dotted, name):
                self.write(written)
            if dotted == ANY_MODULE:  # `__import__("ma" + "th").sqrt = f`: a number module's too
                for written in number_names_spelled(name):
                    self.write(written)
        else:
            self.write(f"{dotted}.{name}")

    def module_path(self, node: ast.AST) -> str | None:
        """The dotted name `node` refers to through imports, or through the module objects the import machinery
        gives by a literal name (`sys.modules["torch.nn.functional"].softmax`, `importlib.import_module(...)`)."""
        parts: list[str] = []
        root = node
        while isinstance(root, ast.Attribute):
            parts.append(root.attr)
            root = root.value
        base = self.resolve.module_lookup(root)
        if base is None and isinstance(root, ast.Name) and root.id not in self.imports:
            base = self.resolve.module_names.get(root.id)  # `mod = sys.modules[...]`, then `mod.softmax = f`
        return ".".join([base, *parts[::-1]]) if base else self.resolve.dotted(node)

    def looked_up_module(self, node: ast.AST) -> bool:
        """Whether `node` is a module the import machinery gives (`sys.modules[name]`, `importlib.import_module(
        name)`), or a name bound only to such lookups (an object placed in `sys.modules` is read as a module)."""
        if self.resolve.module_lookup(node) is not None:
            return True
        return isinstance(node, ast.Name) and node.id in self.resolve.module_names and \
            node.id not in self.imports and self.resolve.only_lookups.get(node.id, False)

    def any_name(self, value: ast.AST | None) -> str:
        """What a binding under a computed name may put anywhere: a fresh `nn.Identity()`, or anything."""
        identity = isinstance(value, ast.Call) and not value.args and \
            self.resolve.dotted(value.func) in IDENTITY
        return ANY_TO_IDENTITY if identity else ANY_ATTRIBUTE

    def target(self, node: ast.AST, elements_only: bool = False, value: ast.AST | None = None,
               rebinding: bool = False) -> None:
        """`rebinding`: an assignment's target, where a bare name binds a new value (not a write through it)."""
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                self.target(element, rebinding=rebinding)
            return
        alternatives = _may_be(node)
        if alternatives is not None:  # `(m.bias if c else t).fill_(1)`, `(None or m.bias)`, `+m.bias` (round 18)
            for part in alternatives:
                self.target(part, elements_only, value, rebinding)
            return
        if isinstance(node, ast.Subscript) and self.resolve.dotted(node.value) == "sys.modules" and \
                (_literal(node.slice) or "").split(".")[0] in REPLACEABLE_ROOTS:
            self.write(_literal(node.slice))  # `sys.modules["torch.nn.functional"] = shim`: each of its names
        owner = _namespace_owner(node.value) if isinstance(node, ast.Subscript) and \
            not isinstance(node.slice, (ast.Slice, ast.Tuple)) else None
        table = owner is not None
        if table and not _is_self(owner):
            self.write(_literal(node.slice) or self.any_name(value))
            self.torch_function(owner, name_pattern(node.slice))  # `vars(F)["softmax"] = f`
        into = elements_only or not table and isinstance(node, ast.Subscript)  # `m._modules[n] = v` rebinds
        self.chain(node, into)
        if isinstance(node, ast.Attribute):  # `matmul = torch.matmul` binds a name of this file, not torch's
            self.torch_function(node)
        root = node
        while isinstance(root, ast.Subscript) or isinstance(root, ast.Attribute) and root.attr == "data":
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.imports:  # `from m import MASK; MASK[0] = v`
            self.write(self.imports[root.id].rsplit(".", 1)[-1], into)
        for root in self._viewed_roots(root):  # `b = m.bias; b.view(-1)[0] = 1`, `torch.narrow(b, 0, 0, 1).fill_(1)`
            if root.id in self.aliases and not (rebinding and root is node):
                for name in self.aliases[root.id]:
                    self.write(name, elements_only=True)

    def _viewed_roots(self, node: ast.AST) -> list[ast.Name]:
        """The names whose tensors a write through `node` may write: down indexing, attributes and methods, and into
        the arguments of a function, whose result may view them."""
        while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
            if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Attribute) or
                                               self.resolve.dotted(node.func) is not None):
                return [root for argument in node.args for root in self._viewed_roots(argument)]
            node = node.func.value if isinstance(node, ast.Call) else node.value
        return [node] if isinstance(node, ast.Name) else []

    def chain(self, node: ast.AST, into: bool = False) -> None:
        """The attributes a write through `node` changes: each one it goes through (`x.a.b = v` changes what `x.a`
        holds), and those a getter names (`m.get_submodule("attn.softmax").dim = v`, `m.get_buffer("bias")[0] = 1`)."""
        walked = node
        while isinstance(walked, (ast.Subscript, ast.Attribute, ast.Call, ast.NamedExpr)):
            if isinstance(walked, ast.NamedExpr):  # `(x := m.bias).fill_(1)`
                walked = walked.value
                continue
            if isinstance(walked, ast.Attribute) and not _is_self(walked.value):
                self.write(walked.attr, into)
            if isinstance(walked, ast.Call) and _literal_getattr(walked) is not None:  # `getattr(m, "bias")`
                receiver, name = _literal_getattr(walked)
                if not _is_self(receiver):
                    self.write(name, into)
                walked = receiver
                continue
            if isinstance(walked, ast.Call):
                if not isinstance(walked.func, ast.Attribute) or self.resolve.dotted(walked.func) is not None:
                    for argument in walked.args:  # a function's result may view what it is given
                        self.chain(argument, True)  # (`torch.narrow(m.bias, -1, 0, 2)`, `rearrange(m.bias, ...)`)
                    return
                if walked.func.attr not in GETTERS:  # a method's result may be a view (`m.bias.diagonal(1)`):
                    walked, into = walked.func.value, True  # a write into it writes the elements it views
                    continue
                target = _literal(walked.args[0]) if walked.args else None
                if target is None and walked.func.attr == "get_submodule":
                    self.bind_through_setattr(ANY_ATTRIBUTE)  # a module, whose attributes are written by name
                computed = [] if walked.func.attr == "get_submodule" else [ANY_ATTRIBUTE]  # a tensor's values
                names = target.split(".") if target else computed
                for name in names:  # into the elements of the last one only (the others hold what changed)
                    self.write(name, into and target is not None and name == names[-1])
                walked = walked.func
            walked = walked.value

    def assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.target(target, value=node.value, rebinding=True)

    def augmented(self, node: ast.AugAssign | ast.AnnAssign) -> None:
        owner = _namespace_owner(node.target)
        if isinstance(node, ast.AugAssign) and owner is not None and not _is_self(owner):
            self.write(ANY_ATTRIBUTE)  # `m.__dict__ |= {...}`: any of m's attributes
        self.target(node.target)

    def call(self, node: ast.Call) -> None:
        func, args = node.func, [a for a in node.args if not isinstance(a, ast.Starred)]
        if isinstance(func, ast.Name) and func.id in CODE_RUNNERS and func.id not in self.imports:
            self._code_run(args[0] if args else None)
        self._state_handed_on(node, func)
        self._patched(func, args)
        for keyword in node.keywords:  # `torch.add(a, b, out=m.bias)`: written, maybe resized
            if keyword.arg == "out":
                self.target(keyword.value)
        if isinstance(func, ast.Attribute) and func.attr == "__set__" and args:  # a descriptor's setter called on
            self.target(args[0])  # its object: `torch.Tensor.data.__set__(m.mask, t)` is `m.mask.data = t`
        if isinstance(func, ast.Attribute) and func.attr in STATE_GETTERS and not _is_self(func.value) or \
                any(isinstance(a, ast.Constant) and a.value in ATTRIBUTE_TABLES for a in args):
            self.write(ANY_ATTRIBUTE)  # `m.__getstate__()["_modules"]`, `object.__getattribute__(m, "_modules")`,
            # `attrgetter("_modules")(m)`, `inspect.getattr_static(m, "__dict__")`: a table of m's attributes
        binding = None
        if isinstance(func, ast.Name) and func.id == "setattr" and len(args) >= 2:
            binding = (args[0], args[1], args[2] if len(args) > 2 else None)
        elif isinstance(func, ast.Attribute) and func.attr in NAMED_BINDERS:
            if isinstance(func.value, ast.Name) and func.value.id in RAW_SETTERS and len(args) >= 2 or \
                    func.attr == "__setattr__" and len(args) == 3:  # `type(math).__setattr__(math, "sqrt", f)`
                binding = (args[0], args[1], args[2] if len(args) > 2 else None)
            else:
                keyword = next((k.value for k in node.keywords if k.arg == "name"), None)
                name = args[0] if args else keyword
                binding = (func.value, name, args[1] if len(args) > 1 else None) if name is not None else None
        if isinstance(func, ast.Name) and func.id == "delattr" and func.id not in self.imports and len(args) >= 2 \
                and not _is_self(args[0]):  # unbound, the name holds whatever is bound next, by any route
            self.write(_literal(args[1]) or ANY_ATTRIBUTE)
        if isinstance(func, ast.Attribute) and func.attr == "set_submodule" and args:  # `m.set_submodule("a.b", x)`
            target = _literal(args[0])
            for name in target.split(".") if target else [self.any_name(args[1] if len(args) > 1 else None)]:
                self.bind_through_setattr(name)
        if binding is not None and not _is_self(binding[0]):
            receiver, name, value = binding
            literal = _literal(name)
            if literal:
                self.write(literal)
                self.torch_function(receiver, literal)
            elif self.looked_up_module(receiver):
                self.write(MODULE_GLOBALS + name_pattern(name))
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in RAW_SETTERS:
                self.write(self.any_name(value))  # `object.__setattr__(m, name, v)` bypasses the module's
            else:
                self.bind_through_setattr(self.any_name(value))
            if not literal:
                self.torch_function(receiver, name_pattern(name))  # `setattr(F, "soft" + "max", f)`
            on_type = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "type"
            if not literal and not self.looked_up_module(receiver) and \
                    (on_type or _may_be_class(receiver, self.imports) or _function_like(value)):
                self.write(ANY_ON_CLASS)
            self.chain(receiver)  # `setattr(m.softmax, "dim", v)` changes what `m.softmax` holds
        elif binding is not None:
            if self.own and isinstance(func, ast.Name) and _literal(binding[1]):  # `setattr(self, "x", v)`
                self.write(_literal(binding[1]))
        elif isinstance(func, ast.Attribute) and func.attr not in NAMESPACE_READS and \
                _namespace_owner(func.value) is not None:  # `m.__dict__.update(scale=t)`, `vars(m).update(kw)`
            if not _is_self(_namespace_owner(func.value)):
                for name in _namespace_keys(func.attr, node):
                    self.write(name)
                    self.torch_function(_namespace_owner(func.value),  # `F.__dict__.update(softmax=f)`
                                        "*" if name == ANY_ATTRIBUTE else glob.escape(name))
                self.chain(_namespace_owner(func.value))  # `m.to_v.__dict__.update(forward=f)` changes `m.to_v`
        elif stores_into_hook_table(func):
            self.target(func.value, elements_only=True)  # `m.drop._forward_hooks.update({0: f})`, as `[0] = f`
        elif self._function_call(node, args):
            return
        elif isinstance(func, ast.Attribute) and writes_its_receiver(func.attr):
            self.target(func.value, elements_only=func.attr not in RESHAPING_IN_PLACE)
            if args and _a_class(func.value):  # `t.__class__.copy_(m.bias, src)`: the method unbound
                self.target(args[0], elements_only=func.attr not in RESHAPING_IN_PLACE)
        elif isinstance(func, ast.Attribute) and func.attr in STATE_LOADERS and not _is_self(func.value):
            self.bind_through_setattr(ANY_ATTRIBUTE)  # a loaded state dict is copied into the registered tensors
        elif (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in REGISTRATION_HOOKS:
            self.write(ANY_ATTRIBUTE)

    def _code_run(self, code: ast.AST | None) -> None:
        """`exec("m.bias[0] = 1")` writes what the code in the string writes; code computed at run time may write
        anything."""
        written = _collected(code.value, self.own) if _literal(code) else None
        if written is None:
            self.write(ANY_ATTRIBUTE)
            return
        for name in written.names:
            self.write(name, elements_only=name not in written.reshaped)

    def _patched(self, func: ast.AST, args: list[ast.AST]) -> None:
        """unittest.mock's and pytest's patches of a named attribute: `patch("attn.NEG_INF", 0.0)`,
        `patch.object(attn, "NEG_INF", 0.0)`, `monkeypatch.setattr(attn, "NEG_INF", 0.0)` or
        `monkeypatch.setattr("attn.NEG_INF", 0.0)`: the attribute (a module's global among them) is written."""
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in ("patch", "object", "setattr", "delattr", "setitem") or not args:
            return
        target = _literal(args[0])
        if target and "." in target:  # a dotted path to the attribute
            self.write(target.rsplit(".", 1)[1])
            if target.split(".")[0] in REPLACEABLE_ROOTS:  # `patch("torch.nn.functional.softmax", f)`
                self.write(target)
        elif len(args) >= 2 and _literal(args[1]) and isinstance(func, ast.Attribute):  # (object, "name", value)
            self.write(_literal(args[1]))
            self.torch_function(args[0], glob.escape(_literal(args[1])))  # `monkeypatch.setattr(F, "softmax", f)`

    def _state_handed_on(self, node: ast.Call, func: ast.AST) -> None:
        """Any attribute of another object may be written where its namespace is handed to a call that may write it
        (`dict.update(m.__dict__, scale=t)`, `operator.setitem(vars(m), "scale", t)`), where its state is set
        (`m.__setstate__(d)`), wherever `setattr` is passed on as a value (`map(setattr, [m], names, values)`) or
        given its arguments unpacked (`setattr(o, *kv)`)."""
        values = [*node.args, *(keyword.value for keyword in node.keywords)]
        if isinstance(func, ast.Attribute) and func.attr == "__setstate__" and not _is_self(func.value) and \
                not (isinstance(func.value, ast.Call) and getattr(func.value.func, "id", None) == "super"):
            self.write(ANY_ATTRIBUTE)  # not a class's own `super().__setstate__(state)`
        reader = isinstance(func, ast.Name) and func.id in NAMESPACE_READERS
        setter_handed = False
        for value in values:
            value = value.value if isinstance(value, ast.Starred) else value
            owner = _namespace_owner(value)
            if owner is not None and not _is_self(owner) and not reader:
                self.write(ANY_ATTRIBUTE)
                self._modules_whole([owner])  # `operator.setitem(vars(F), "softmax", f)` (breaker round 50)
            if isinstance(value, ast.Name) and value.id == "setattr":
                self.write(ANY_ATTRIBUTE)
                setter_handed = True
        fetched_setter = isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and \
            func.func.id == "getattr" and len(func.args) >= 2 and _literal(func.args[1]) == "setattr"
        starred = isinstance(func, ast.Name) and func.id == "setattr" and \
            any(isinstance(a, ast.Starred) for a in node.args)
        if starred:
            self.write(ANY_ATTRIBUTE)  # `setattr(o, *kv)`: what it binds, and on what, is not shown
        if setter_handed or fetched_setter or starred:  # `map(setattr, [math], ...)`, `partial(setattr, F)`,
            self._modules_whole(values)  # `getattr(builtins, "setattr")(math, ...)`: the modules given, whole

    def _modules_whole(self, values: list[ast.AST]) -> None:
        """Writes whole each HANDED_MODULES object among `values` (inside literals and starred ones too)."""
        for value in values:
            value = value.value if isinstance(value, ast.Starred) else value
            if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
                self._modules_whole(value.elts)
            elif self.resolve.dotted(value) in HANDED_MODULES:
                self.write(self.resolve.dotted(value))

    def _writer_passed_on(self, args: list[ast.AST]) -> None:
        """A function writing its parameters given to another call (`map(lambda t: t.fill_(1), [m.bias])`): it may
        be called on each tensor the call is given beside it (an attribute, listed or not, or a name aliasing one),
        or on any of a module's tensors where it is given them (`map(fill, m.buffers())`)."""
        if not any(arg in self.writers or isinstance(arg, ast.Name) and arg.id in self.writers for arg in args):
            return
        for given in args:
            if given in self.writers or isinstance(given, ast.Name) and given.id in self.writers:
                continue
            for tensor in given.elts if isinstance(given, (ast.List, ast.Tuple)) else [given]:
                if isinstance(tensor, (ast.Attribute, ast.Subscript, ast.Name)):
                    self.target(tensor, elements_only=True)
                elif isinstance(tensor, ast.Call) and isinstance(tensor.func, ast.Attribute) and \
                        tensor.func.attr in TENSOR_LISTS:
                    self.write(ANY_ATTRIBUTE, elements_only=True)

    def _function_call(self, node: ast.Call, args: list[ast.AST]) -> bool:
        """Reads a call of a function (not a method: an imported or a local name) that writes tensors it is
        passed: in place, by the `_` convention, on its first argument (`torch.nn.init.ones_(m.bias)`,
        `torch.Tensor.fill_(m.bias, 1)`, timm's `trunc_normal_(m.table)`), or the data of each tensor of its second
        (`vector_to_parameters(v, [m.bias])`; any attribute where they are not listed). False: not such a call."""
        func = node.func
        self._writer_passed_on(args + [keyword.value for keyword in node.keywords])
        if isinstance(func, ast.Lambda) and func in self.writers:  # `(lambda t: t.fill_(1))(m.bias)`
            for position in self.writers[func]:
                if position < len(args):
                    self.target(args[position], elements_only=True)
            return True
        dotted = self.resolve.dotted(func)
        if dotted is None and not isinstance(func, ast.Name):
            return False
        if dotted is not None and not dotted.startswith(("torch.", "operator.")):  # maybe a writer of another file
            self.handed.update((dotted, position, name) for position, arg in enumerate(args)
                               for name in _attributes_on_the_way(arg, self.imports))
        if isinstance(func, ast.Name) and func.id in self.writers:  # a function of this file writing a parameter
            for position in self.writers[func.id]:
                if position < len(args):
                    self.target(args[position], elements_only=True)
        if dotted in REBINDS_TENSORS_GIVEN and len(args) >= 2:
            given = args[1]
            for tensor in given.elts if isinstance(given, (ast.List, ast.Tuple)) else [given]:
                if isinstance(tensor, (ast.Attribute, ast.Subscript)):
                    self.target(tensor)
                else:
                    self.write(ANY_ATTRIBUTE)
            return True
        if dotted in SWAPS:
            for tensor in args[:2]:
                self.target(tensor)
            return True
        if dotted is not None and dotted.startswith(PARAMETRIZERS):
            named = args[1] if len(args) > 1 else next((k.value for k in node.keywords if k.arg in ("name",
                                                                                               "tensor_name")), None)
            self.write(_literal(named) or (self.any_name(None) if named is not None else "weight"))
            return True
        function = (dotted or func.id).rsplit(".", 1)[-1]
        if dotted is not None and dotted.startswith("operator.") and args and \
                (f"__{function.strip('_')}__" in IN_PLACE_DUNDERS):  # `operator.iadd(m.bias, 1)`, `setitem`
            self.target(args[0], elements_only=True)
            return True
        if not (in_place_name(function) and args):
            return False
        drawn = dotted is not None and dotted.startswith("torch.nn.init.") and \
            all(_moderate_number(value) for value in [*args[1:], *(k.value for k in node.keywords)])
        self.finite = drawn
        try:
            self.target(args[0], elements_only=function not in RESHAPING_IN_PLACE)
        finally:
            self.finite = False
        if isinstance(func, ast.Attribute) and not dotted.startswith("torch."):
            # `program.MASK.fill_(v)` may be a method of a module-level tensor: the receiver rule reads it too
            self.narrowed = self.narrowing(func.value)
            return False
        return True


def in_place_name(name: str) -> bool:
    """torch's naming for what writes in place: a trailing underscore (`fill_`, `nn.init.ones_`, `_foreach_add_`,
    timm's `_trunc_normal_`), not a dunder's (`__init__`). NOT_WRITES are named so and keep the values."""
    return name.endswith("_") and not name.endswith("__")


NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad"})  # in-place by name, values untouched


def writes_its_receiver(method: str) -> bool:
    """An in-place method, or an operator method that writes its receiver (`__setitem__`, `__iadd__`)."""
    return in_place_name(method) or method in IN_PLACE_DUNDERS


def _moderate_number(node: ast.AST) -> bool:
    """A numeric literal below 1000 in magnitude (an init's `std=0.02`, `a=-2.0`): no mask value (-inf, -1e9)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and abs(node.value) < 1000


def _a_class(node: ast.AST) -> bool:
    """`x.__class__` or `type(x)`: a method read on it is unbound, and its first argument is the receiver."""
    return isinstance(node, ast.Attribute) and node.attr == "__class__" or \
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"


def _namespace_keys(method: str, call: ast.Call) -> list[str]:
    """The attribute names a namespace method binds or unbinds: its literal key (`pop("x")`, `setdefault("x", v)`),
    its keywords (`update(x=v)`), else any."""
    if method in KEYED_NAMESPACE_METHODS and call.args and _literal(call.args[0]):
        return [_literal(call.args[0])]
    names = [keyword.arg for keyword in call.keywords]
    return names if names and None not in names and not call.args else [ANY_ATTRIBUTE]


def _namespace_owner(node: ast.AST) -> ast.AST | None:
    """`m` of `m.__dict__` or `vars(m)` (the dictionary that holds m's attributes), or of one of its attribute
    tables (`m._modules`, `m.__dict__["_buffers"]`), whose keys are m's attribute names too."""
    if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTE_TABLES:  # `__dict__` among them
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "vars" and \
            len(node.args) == 1 and not node.keywords:
        return node.args[0]
    if isinstance(node, ast.Subscript) and _literal(node.slice) in ATTRIBUTE_TABLES:  # `vars(m)["_modules"]`
        return _namespace_owner(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and \
            len(node.args) >= 2 and _literal(node.args[1]) in ATTRIBUTE_TABLES:  # `getattr(m, "_modules")`
        return node.args[0]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and \
            node.args and _literal(node.args[0]) in ATTRIBUTE_TABLES:  # `m.__dict__.get("_buffers")`
        return _namespace_owner(node.func.value)
    return None


_WRITES = {ast.Assign: _Writes.assign, ast.AugAssign: _Writes.augmented, ast.AnnAssign: _Writes.augmented,
           ast.Call: _Writes.call}

"""Every call of a function inside the scanned tree, or None when some use of it is not a call this index sees.

A fact the function's body cannot prove (a mask's rank, a scale's type) may still hold at every call: the tree
is read for them, in the function's own file and in the files that import it (`from pkg.mod import f`, `import
pkg.mod as m; m.f(...)`, relative imports). A module's `forward` is reached from its parent: `self.attn = Attention(
...)` assigned once in a class, and `self.attn(x, mask)` its only use; its `__init__` from every `Attention(...)`.
Any other use (the function passed on, stored, called through `*args`, a subclass, `nn.ModuleList`, an attribute
of that name read elsewhere) leaves the calls unknown, and then nothing is proved from them. The tree is read afresh for every scan: no call site is cached
across runs here; the scan cache (static.scan_cache) keeps a file's result only with the files its analysis read
through the `Tree` (`recording`), so an edit of a caller is always seen.
"""

from __future__ import annotations

import ast
import os
import re
import uuid
from dataclasses import dataclass, field
from functools import lru_cache

import libcst as cst

from advisor.contracts.finding import display_path
from advisor.static.class_sites import class_sites
from advisor.static.dataflow import is_self_attribute
from advisor.static.module_index import ClassInfo, ParsedModule, _assigned_names
from advisor.static.module_methods import SELF_RETURNING, compiled_instance, drops_state_method_result, \
    returns_itself
from advisor.static.python_ast import nodes, python_tree
from advisor.static.spread_arguments import spread_keywords, spread_positionals
from advisor.static.walk import descendants
from advisor.static.text_screens import on_line_after, then_on_line


@dataclass(frozen=True)
class CallSite:
    """One call: the file it is in, the call, and the argument bound to the parameter asked about (the default's
    expression when the call leaves it out, None when it has neither)."""

    parsed: ParsedModule
    call: cst.Call
    argument: cst.BaseExpression | None
    scope: ParsedModule  # the file the argument's expression is in (the function's own, for a default)
    method: bool = False  # the call binds `self` (a method called on its instance)

    @property
    def where(self) -> str:
        return f"{display_path(self.parsed.path)}:{self.parsed.line(self.call)}"


CODE_RUNNERS = frozenset({"eval", "exec"})  # builtins that run code from a string, where any call may hide
# a pre-hook may replace what forward receives: registered, or written into a module's (or torch's) hook table, or
# registered through a name the file computes (breaker round 15: `operator.methodcaller("register_forward_" + kind +
# "hook", hook, with_kwargs=True)(m)`): `methodcaller`, a string that starts a `register_` name and is added to or
# formatted, one that ends a hook's name after a `+`, an f-string that names either, a `getattr` whose name is
# computed and mentions hooks. Not a literal name (`getattr(self, "fine_acoustics_hook")`), nor a state-dict hook.
PRE_HOOKS = re.compile(r"""register_(module_)?forward_pre_hook|_forward_pre_hooks|methodcaller|"""
                       r"""["']register_\w*["']\s*(?:[+%]|\.format)|\+\s*["']\w*hooks?["']|"""
                       r"""\bf["'](?:(?!register_)[^"'\n])*register_[^"'\n]*\{|\bf["'][^"'\n}]*\}[^"'\n]*hooks?["']|"""
                       + then_on_line(r"getattr\(", r"""\bf["'][^"'\n]*hook""") + "|" +
                       on_line_after(r"getattr\(", r"\+", "hook"))
# what a class defines to run its own code between a module call and forward (breaker round 14: a `__call__`
# turning the caller's 0/1 keep mask into an additive one before `super().__call__`)
CALL_OVERRIDES = frozenset({"__call__", "_call_impl", "_wrapped_call_impl"})
MAY_OVERRIDE_CALL = re.compile(r"\b(?:__call__|_call_impl|_wrapped_call_impl)\b")
# ... assigned on an object or a class, or named as a string (`nn.Module.__call__ = f`, `setattr(C, "__call__", f)`)
# (an instance's own `__call__` is never looked up: `criteria.__call__ = f` in transformers changes no call; its
# `_call_impl` is, by nn.Module's `__call__`)
CALL_ASSIGNED = re.compile(r"(?:\b[A-Z]\w*|\bcls|\bklass|\))\s*\.\s*__call__\s*=[^=]|"
                           r"\.\s*(?:_call_impl|_wrapped_call_impl)\s*=[^=]|"
                           + then_on_line(r"setattr\(", r"[\"'](?:__call__|_call_impl|_wrapped_call_impl)[\"']",
                                          r")\n"))
# scan token -> (texts, parsed modules, words, real paths, attribute words, tree-wide indexes, words of notebooks'
# masked lines): this process's caches for the current scan
_CACHES: dict[str, tuple[dict, dict, dict, dict, dict, dict, dict]] = {}
WORD = re.compile(r"\w+")
STAR_IMPORT = re.compile(r"\bimport\s*\*")
PACKAGE_IMPORT = re.compile(r"\bfrom\s+\.+\s+import\b")  # `from . import f`: names of a package's `__init__`
# a lookup on an object by a name the code computes: `getattr(attention, f"{impl}_attention")`, `vars(m)[k]`,
# `m.__dict__[k]`, with the object's root name; a name that is one string literal is no computed one, but one
# the code joins to a literal is (`"attend_" + kind`, `"attend_%s" % kind`: breaker round 35). Written so that no
# quantifier gives back what the next part cannot take (`++`, `*+`) and a `.__dict__` or `.__getattr__(` chain is
# tried only where its dotted run starts (`(?<![\w.])`), with the word after `vars(m.` or after a run's last
# `.__dict__` read as the earlier form's restart there read it: the same roots, in linear time, where `(\w+)[\w.]*`
# tried at every position of a long word backtracked in cubic time (a 50 KB string literal: 20 s; breaker round 52)
_LOOKUP_BY_GETATTR_DUNDER = r"[\w.]*\.__getattr(?:ibute)?__\s*\((?!\s*(?:'[^'\n]*'|\"[^\"\n]*\")\s*\))"
_LOOKUP_BY_DICT = r"[\w.]*\.__dict__(?:\.*+(\w++)" + _LOOKUP_BY_GETATTR_DUNDER + ")?"
COMPUTED_LOOKUP = re.compile(r"\bgetattr\s*\(\s*(\w++)[\w.]*+\s*,(?!\s*(?:'[^'\n]*'|\"[^\"\n]*\")\s*[,)])|"
                             r"\bvars\s*\(\s*(\w++)(?:\.++(?:(\w++)" + _LOOKUP_BY_DICT + r"|(\w++)" +
                             _LOOKUP_BY_GETATTR_DUNDER + "))?|"
                             r"(?<![\w.])\.*+(\w++)" + _LOOKUP_BY_DICT + "|"
                             r"(?<![\w.])\.*+(\w++)" + _LOOKUP_BY_GETATTR_DUNDER)
# the same by a callable made from the name, whose object the text does not pair with it
# (`operator.attrgetter("attend_" + kind)(impls)`: breaker round 36): any module may be the one looked up
NAME_GETTERS = ("attrgetter", "methodcaller")
# ... and by enumerating an object's or a class's attributes (`inspect.getmembers(m)`, `type(m).__dict__.items()`:
# breaker round 38), whatever they are given; by `getattr` passed as a value (`g = getattr`, `reduce(getattr, names,
# m)`, `map(getattr, ...)`), `inspect.getattr_static`, or code run from a string (`eval("m.att" + "end")`: round 40)
COMPUTED_GETTER = re.compile(r"\b(?:%s)\s*\((?!\s*(?:'[^'\n]*'|\"[^\"\n]*\")\s*[,)])|\bgetmembers\b|\)\s*\.__dict__\b|"
                             r"\bgetattr\b(?!\s*\()|\bgetattr_static\b|\b(?:eval|exec)\s*\("
                             % "|".join(NAME_GETTERS))
# the modules of libraries whose functions a lookup on them reaches (`getattr(F, activation)(x)`), not the tree's
LIBRARY_IMPORT = re.compile(r"^[ \t]*(?:from|import)[ \t]+(?:torch|numpy|math|einops)\b")
ANY_ROOT = "*"  # a root every module name matches
IMPORT_LINE = re.compile(r"^[ \t]*(?:from|import)\b[^\n]*", re.M)


def _may_look_up_by_computed_name(text: str, stem: str) -> bool:
    """Whether the text may look a name up by computing it on a module named `stem`: a lookup whose object's root
    is a name an import statement mentioning `stem` binds (a cheap screen before the parse `_computed_lookup_on`
    decides)."""
    roots = _computed_lookup_roots(text)
    if not roots:
        return False
    if ANY_ROOT in roots:
        return True
    bound = {word for line in _import_lines(text) if re.search(rf"\b{re.escape(stem)}\b", line)
             for word in WORD.findall(line)}
    return bool(roots & bound)


@lru_cache(maxsize=4096)
def _computed_lookup_roots(text: str) -> frozenset[str]:
    """The root names of a text's lookups by computed names, read once per text (of a tree's files: each is asked
    for every function of every module it mentions, and transformers' "Copied from" comments mention a model's
    module in hundreds of files; searched each time, this took 33 of the 358 s of a profiled cold scan)."""
    found = frozenset(root for match in COMPUTED_LOOKUP.finditer(text) for root in match.groups() if root)
    return found | {ANY_ROOT} if COMPUTED_GETTER.search(text) else found


def looks_up_objects_by_computed_name(text: str) -> bool:
    """Whether the text looks an attribute up by a name it computes on an object no import binds
    (`getattr(m, "att" + "end")(q, k, v)[1]`, `getattr(m, name)` with `name` from `dir(m)`): any method of any
    instance may be called there, with arguments no call site shows (breaker round 37); so may a class's, where
    the tree's own class is looked up (`vars(Attn)[name]`, round 38). On a library's module (`getattr(F,
    activation)(x)`) it reaches that module's functions, none of the tree's."""
    roots = _computed_lookup_roots(text)
    if not roots:
        return False
    bound = {word for line in _import_lines(text) if LIBRARY_IMPORT.match(line) for word in WORD.findall(line)}
    return ANY_ROOT in roots or bool(roots - bound)


@lru_cache(maxsize=4096)
def _import_lines(text: str) -> tuple[str, ...]:
    return tuple(IMPORT_LINE.findall(text))
# an instance built through another's class (`type(m.attn)(8, s)`, `m.attn.__class__(8, s)`), or initialised again
# (`m.__init__(t)`, `type(m).__init__(m, t)`, `getattr(m, "__init__")`; not `super().__init__`, `nn.Module.__init__`):
# a construction no use of the class's name shows
CLASS_OF_CALL = re.compile(r"__class__\s*\(|\btype\s*\([^()]*\)\s*\(|['\"]__init__['\"]")
INIT_READ = re.compile(r"\.__init__\b")
BASE_INIT = re.compile(r"(?:super\([^()]*\)|Module)$")  # what `.__init__` is read from in a base's initialisation


# submodules reached by enumeration: `for layer in self.children():`, `for name, m in model.named_modules():`
ENUMERATED = re.compile(r"\bfor\s+([\w \t,()\[\]]+?)\s+in\s+[^\n]*\.(?:named_)?(?:children|modules)\(\)")
# ... spread into a container that calls them (`nn.Sequential(*model.children())`), indexed, or mapped over
ENUMERATED_USE = re.compile(r"\*\s*(?:list\s*\()?[\w.()\[\]]*\.(?:named_)?(?:children|modules)\(\)|"
                            r"\.(?:named_)?(?:children|modules)\(\)\s*\)?\s*\[|" +
                            then_on_line(r"\bmap\s*\(", r"\.(?:named_)?(?:children|modules)\(\)") + "|" +
                            # `next(self.children())`
                            then_on_line(r"\bnext\s*\(", r"\.(?:named_)?(?:children|modules)\(\)") +
                            r"|=\s*[\w.(]*\.(?:named_)?(?:children|modules)\(\)")  # `attn, = self.children()`
# a lookup by a name the code computes (not a string literal), called at once (`getattr(self, f"attn{i}")(x, m)`)
# or bound to a name (`layer = getattr(self, f"layer{i}")`)
_COMPUTED_GETATTR = r"\bgetattr\s*\(\s*[\w.]+\s*,(?!\s*(?:'[^'\n]*'|\"[^\"\n]*\")\s*[,)])"
CALLED_BY_COMPUTED_NAME = re.compile(_COMPUTED_GETATTR + r"[^()\n]*\)\s*\(")
BOUND_BY_COMPUTED_NAME = re.compile(r"(?<!\w)(\w+)\s*=\s*" + _COMPUTED_GETATTR)  # a match starts a word


def calls_by_computed_name(text: str) -> bool:
    """Whether the text may call an attribute it looked up by a computed name: a submodule called so is a call of
    its `forward` that no use of its class shows."""
    return CALLED_BY_COMPUTED_NAME.search(text) is not None or _called_after(BOUND_BY_COMPUTED_NAME, text)


def _called_after(binding: re.Pattern, text: str) -> bool:
    """Whether a name `binding` binds (its first group) is called later in the text (`name(`)."""
    return any(re.search(rf"\b{re.escape(name)}\s*\(", text[bound.end():]) is not None
               for bound in binding.finditer(text) for name in re.findall(r"\w+", bound.group(1)))


ENUMERATIONS = frozenset({"children", "modules", "named_children", "named_modules"})


LOOP_HEADER = re.compile(r"^[ \t]*(?:async[ \t]+)?for\b[^\n]*$", re.M)


def _without_loop_headers(text: str) -> str:
    """The text less its `for` lines: an enumeration a loop iterates (`for s in list(self.children())[1:-1]:`) is
    read as the loop's (`enumerated_calls`), not as a spread or an indexing."""
    return LOOP_HEADER.sub("", text)


ENUMERATION_CALL = re.compile(r"\.(?:named_)?(?:children|modules)\s*\(")


def calls_enumerated_modules(text: str) -> bool:
    """Whether the text may call a submodule it reached by enumeration (a loop over `.children()` or `.modules()`,
    those spread into `nn.Sequential(*...)`, indexed or mapped, or enumerated anywhere but a `for` statement's
    header): a module's `forward` then may have calls no use of its class shows. Every such loop is read
    (`enumerated_calls`): its targets may be called, or handed on in its body (`run(layer)`) or after it."""
    without_loops = _without_loop_headers(text)
    return ENUMERATED_USE.search(without_loops) is not None or ENUMERATED.search(text) is not None or \
        ENUMERATION_CALL.search(without_loops) is not None


def enumerated_calls(parsed: ParsedModule) -> list[cst.Call] | None:
    """The calls of a loop's variables over `.children()`, `.modules()` or their named forms (`enumerate` of them
    too) wherever the loop's function reads them (`_target_calls`); None where the file spreads, indexes or maps such
    an enumeration (calls no node shows: `nn.Sequential(*model.children())`), or a loop's variable is handed on."""
    if ENUMERATED_USE.search(_without_loop_headers(parsed.source)) is not None or _enumerated_out_of_loops(parsed):
        return None
    found = []
    for loop in parsed.nodes_of(cst.For):
        if not any(node.attr.value in ENUMERATIONS and isinstance(parsed.parents.get(node), cst.Call) and
                   parsed.within(node, loop.iter) for node in parsed.nodes_of(cst.Attribute)):
            continue
        targets = {name.value for name in _target_names(loop.target)}  # every one: `zip(m.children(), masks)`
        calls = _target_calls(parsed, loop, targets) if targets else None
        if calls is None:
            return None
        found += [call for call in calls if call not in found]
    return found


def _target_calls(parsed: ParsedModule, loop: cst.For, targets: set[str]) -> list[cst.Call] | None:
    """The calls of the loop's `targets` anywhere in the function that holds the loop (in the file, for a loop at
    module level or a target declared `global` or `nonlocal`): a target keeps the last module after the loop, and a
    closure may call it later. None where any read of them there neither is called nor `_inspects` the module: a
    module handed on (`run(layer)`, `fns.append(layer)`, `layer.forward(x, mask)`) is called with arguments no
    node shows (a hole until this check: only the loop body's direct calls counted)."""
    scope = parsed.frame(loop)
    if scope is None or any(item.name.value in targets for node in parsed.nodes_of(cst.Global, cst.Nonlocal)
                            for item in node.names):
        scope = parsed.module
    bound = {id(name) for target in targets for name in parsed.bindings.get(target, [])}
    calls = []
    for target in sorted(targets):
        for read in parsed.names_spelled(target):
            if id(read) in bound or not _reads_value(parsed, read) or not parsed.within(read, scope):
                continue
            parent = parsed.parents.get(read)
            if isinstance(parent, cst.Call) and parent.func is read:
                calls.append(parent)
            elif not _inspects(parsed, read):
                return None
    return calls


def _reads_value(parsed: ParsedModule, name: cst.Name) -> bool:
    """Whether the `Name` node reads a variable: not an attribute's name (`x.layer`), a keyword (`f(layer=1)`), a
    definition's, import's, parameter's or declaration's name, nor a `del` target."""
    parent = parsed.parents.get(name)
    if isinstance(parent, cst.Attribute):
        return parent.attr is not name
    if isinstance(parent, cst.Arg):
        return parent.keyword is not name
    return not isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param, cst.ImportAlias, cst.AsName,
                                   cst.NameItem, cst.Del))


# calls that reach a module's submodules, or call a module, with arguments no node of the call shows
REACHES_MODULES = re.compile(r"\bfunctional_call\b|\.apply\s*\(|\bget_submodule\s*\(|\battrgetter\s*\(|\b_modules\b|"
                             r"(?<![\w.])(?:eval|exec)\s*\(")
INSPECTING = frozenset({"isinstance", "hasattr", "getattr", "type", "id", "print", "repr", "str", "len"})
MODULE_CALLERS = frozenset({"forward", "__call__", "_call_impl", "_wrapped_call_impl"})


def reaches_modules_unseen(parsed: ParsedModule) -> bool:
    """`m._modules` read at all, `torch.func.functional_call(module, params, args, kwargs)` (a call of its `forward`
    with those arguments),
    `get_submodule` or `attrgetter` of a path computed at run time, or `module.apply(f)` where `f` may call the
    modules it is handed (`m.apply(lambda mod: mod(x, attention_mask=bad))`; breaker round 58). `apply` of an
    initialiser that reads attributes and tests types (`self.apply(self._init_weights)`) calls nothing. Code run
    from a string (`eval("model.attn(x, bad)")`, breaker round 60) may call any module."""
    if parsed.attributes_named("_modules"):
        return True  # `m._modules.values()`, `m._modules[key]`: the submodules' table, handed on
    for call in parsed.nodes_of(cst.Call):
        func = call.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
            else None
        if name == "functional_call" or \
                isinstance(func, cst.Name) and name in CODE_RUNNERS and name not in parsed.bound_names:
            return True
        if name in ("get_submodule", "attrgetter") and \
                not (call.args and all(isinstance(arg.value, cst.SimpleString) for arg in call.args)):
            return True
        if name == "apply" and isinstance(func, cst.Attribute) and len(call.args) == 1 and \
                call.args[0].keyword is None and not call.args[0].star and \
                _may_call_what_it_is_given(parsed, call.args[0].value):
            return True
    return False


def _may_call_what_it_is_given(parsed: ParsedModule, function: cst.BaseExpression) -> bool:
    """Whether the callable `apply` is given may call the module it gets, or hand it on: a lambda, or a function
    or method of the file, whose parameter is read otherwise than for an attribute or by INSPECTING builtins; a
    callable the file does not define may."""
    if isinstance(function, cst.Lambda):
        return _hands_on(parsed, function.params.params, function.body)
    name = function.attr.value if isinstance(function, cst.Attribute) else \
        function.value if isinstance(function, cst.Name) else None
    defined = [node for node in parsed.nodes_of(cst.FunctionDef) if node.name.value == name]  # any class's
    return not defined or any(_hands_on(parsed, node.params.params[isinstance(function, cst.Attribute):], node.body)
                              for node in defined)


def _hands_on(parsed: ParsedModule, params, body: cst.CSTNode) -> bool:
    """Whether the first of `params` is read in `body` otherwise than `_inspects` reads it."""
    if not params:
        return True
    given = params[0].name.value
    return not all(_inspects(parsed, read) for read in descendants(body, (cst.Name,)) if read.value == given)


def _inspects(parsed: ParsedModule, read: cst.Name) -> bool:
    """The read of a module takes one of its attributes (not one that calls it: `module.forward(x, mask)`), or gives
    it to an INSPECTING builtin (`isinstance(module, nn.Linear)`): it neither calls the module nor hands it on."""
    parent = parsed.parents.get(read)
    if isinstance(parent, cst.Attribute) and parent.value is read:
        return parent.attr.value not in MODULE_CALLERS
    call = parsed.parents.get(parent) if isinstance(parent, cst.Arg) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in INSPECTING and
            call.func.value not in parsed.bound_names):
        return False
    if call.func.value != "getattr":
        return True
    name = call.args[1].value if len(call.args) > 1 and call.args[0].value is read else None
    return isinstance(name, cst.SimpleString) and name.evaluated_value not in MODULE_CALLERS  # not `"forward"`


def _enumerated_out_of_loops(parsed: ParsedModule) -> bool:
    """An enumeration of submodules that is not a `for` statement's iterable, nor a comprehension's whose element
    reads attributes of the module or tests it (`any(isinstance(m, nn.Dropout) for m in self.modules())`) without
    calling it: `dict(m.named_children())[...]`, `[mod for _, mod in m.named_children()][0](x, mask)`, `list(...)`
    or `next(...)` hand the modules on, to calls no node shows (breaker round 58)."""
    for node in (node for attribute in ENUMERATIONS for node in parsed.attributes_named(attribute)):
        call = parsed.parents.get(node)
        if not isinstance(call, cst.Call) or call.func is not node:
            continue
        holder = parsed.parents.get(call)
        if isinstance(holder, cst.CompFor) and holder.iter is call:
            if _inspects_only(parsed, holder):
                continue
            return True
        if any(parsed.within(call, loop.iter) for loop in parsed.nodes_of(cst.For)) and \
                not any(parsed.within(call, comprehension) for comprehension in parsed.nodes_of(*COMPREHENSIONS)):
            continue  # a `for` statement's iterable (`zip(m.children(), masks)`): its targets' calls are read
        return True
    return False


COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _inspects_only(parsed: ParsedModule, comp_for: cst.CompFor) -> bool:
    """Every read of the comprehension's targets (in its element, a dict comprehension's key, its conditions)
    `_inspects` the module: none is called, handed to a function or collected."""
    targets = {name.value for name in _target_names(comp_for.target)}
    comprehension = parsed.parents.get(comp_for)
    bindings = {id(name) for clause in descendants(comprehension, (cst.CompFor,))
                for name in _target_names(clause.target)}
    return all(_inspects(parsed, read) for read in descendants(comprehension, (cst.Name,))
               if read.value in targets and id(read) not in bindings)


def _target_names(target: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _target_names(element.value)]
    return []


def computed_lookup_calls(parsed: ParsedModule) -> list[cst.Call]:
    """The calls of what `getattr(obj, <not a string literal>)` returns: at once (`getattr(self, f"attn{i}")(x)`),
    or through a name bound to it in the same function (`layer = getattr(self, name)`, then `layer(x)`)."""
    def computed(node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "getattr" and \
            "getattr" not in parsed.bound_names and len(node.args) >= 2 and \
            not isinstance(node.args[1].value, cst.SimpleString)

    found = [call for call in parsed.nodes_of(cst.Call) if computed(call.func)]
    bound = {(parsed.innermost(assign, cst.FunctionDef), target.target.value)
             for assign in parsed.nodes_of(cst.Assign) if computed(assign.value)
             for target in assign.targets if isinstance(target.target, cst.Name)}
    found += [call for call in parsed.nodes_of(cst.Call) if isinstance(call.func, cst.Name) and
              (parsed.innermost(call, cst.FunctionDef), call.func.value) in bound]
    return found


def builds_unseen(text: str) -> bool:
    """Whether the text builds or initialises an instance as CLASS_OF_CALL says, or reads `.__init__` from anything
    but `super()` or `nn.Module`."""
    return CLASS_OF_CALL.search(text) is not None or any(
        BASE_INIT.search(text[max(0, read.start() - 40):read.start()]) is None for read in INIT_READ.finditer(text))
PARSED_KEPT = 32  # parsed files a process holds between two analyses
ACCESSED = re.compile(r"\.\s*(\w+)")  # `.name`: an attribute read or written


@dataclass(eq=False)
class Tree:
    """The scanned files; each is read and parsed at most once per scan and process, when a question needs it. A
    worker process runs many chunks of one scan: they share what was read through the scan's token (a new scan has
    a new token and drops the old one's, so nothing is reused across runs)."""

    paths: list[str]
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    _read: set[str] | None = field(default=None, init=False, repr=False)  # while recording: the files consulted

    def recording(self) -> set[str]:
        """Start noting every file (real path) a question reads, from now until `recording` is called again;
        returns the set that fills. The scan cache keeps a file's result with the digests of these files."""
        self._read = set()
        return self._read

    def _note(self, key: str) -> None:
        if self._read is not None:
            self._read.add(key)

    def _caches(self) -> tuple[dict, dict, dict, dict, dict, dict, dict]:
        if self.token not in _CACHES:
            _CACHES.clear()
            _CACHES[self.token] = ({}, {}, {}, {}, {}, {}, {})
        return _CACHES[self.token]

    def _note_all(self, keys: list[str]) -> None:
        if self._read is not None:
            self._read.update(keys)

    def _indexed(self, name: str, build):
        """A tree-wide index, built once per scan and process by `build()`: asking every file the same question
        for every name (or every method) grew with the files times the questions."""
        indexes = self._caches()[5]
        if name not in indexes:
            indexes[name] = build()
        return indexes[name]

    @property
    def _texts(self) -> dict[str, str | None]:
        return self._caches()[0]

    @property
    def _parsed(self) -> dict[str, ParsedModule | None]:
        return self._caches()[1]

    def _real(self, path: str) -> str:
        """`os.path.realpath(path)`, once per path and scan: `mentioning` asks it of every file for every name, and
        each call stats the path's folders (a third of a 600-file scan's time before)."""
        reals = self._caches()[3]
        if path not in reals:
            reals[path] = os.path.realpath(path)
        return reals[path]

    def adopt(self, parsed: ParsedModule) -> None:
        """The file being analysed: its own nodes are the ones the matcher holds. The files parsed for earlier
        analyses are let go once PARSED_KEPT are held (between two analyses, so no analysis sees a file parsed
        twice): keeping every analysed file's tree grew the process by its nodes, and the collector's work with
        them, as the scan went on."""
        if len(self._parsed) >= PARSED_KEPT:
            self._parsed.clear()
        self._parsed[self._real(parsed.path)] = parsed

    def text(self, path: str) -> str | None:
        key = self._real(path)
        self._note(key)
        if key in self._parsed and self._parsed[key] is not None:
            return self._parsed[key].source
        if key not in self._texts:
            from advisor.static.discover import read_source

            source = read_source(path)
            self._texts[key] = getattr(source, "text", None)
            notebook = getattr(source, "notebook", None)
            if notebook is not None:  # IPython's lines, masked out of the code (`%%time` cells hide whole calls)
                self._caches()[6][key] = frozenset(WORD.findall("\n".join(
                    line for lines in notebook.magics for line in lines)))
        return self._texts[key]

    def any_file_matches(self, key: str, pattern: re.Pattern) -> bool:
        """Whether `pattern` matches in some file of the tree (asked once per scan and process under `key`)."""
        found, consulted = self._indexed(key, lambda: self._first_file_matching(pattern.search))
        self._note_all(consulted)
        return found

    def hidden(self, word: str) -> bool:
        """Whether a notebook of the tree says `word` in a line the scan masks as IPython's (a `%%time` cell, a
        `%time f(x)` line): a use there is a call no parse shows. The notebooks' masked words are joined once per
        scan and process."""
        words, consulted = self._indexed("masked words", self._masked_words)
        self._note_all(consulted)
        return word in words

    def _masked_words(self) -> tuple[frozenset[str], list[str]]:
        notebooks = [path for path in self.paths if path.endswith(".ipynb")]
        for path in notebooks:
            self.text(path)
        keys = [self._real(path) for path in notebooks]
        return frozenset().union(*(self._caches()[6].get(key, ()) for key in keys)), keys

    def parsed(self, path: str) -> ParsedModule | None:
        key = self._real(path)
        self._note(key)
        if key not in self._parsed:
            text = self.text(path)
            try:
                self._parsed[key] = ParsedModule(text, path) if text is not None else None
            except (cst.ParserSyntaxError, RecursionError):
                self._parsed[key] = None
        return self._parsed[key]

    def mentioning(self, word: str) -> list[str]:
        """The files where `word` occurs as a whole word (`\\bword\\b`), each noted as read. A name made of word
        characters is looked up in each file's set of words, built once per scan and process: searching every
        file's text for every name asked about grew with the files times the names."""
        if not WORD.fullmatch(word):  # a combining mark in the name: not one word of the index
            return [path for path in self.paths if self.says(path, word)]
        index, keys = self._indexed("words", self._word_index)
        self._note_all(keys)  # every file was asked, as the search of each file's words did
        return list(index.get(word, ()))

    def _word_index(self) -> tuple[dict[str, list[str]], list[str]]:
        """Each word -> the files holding it (in `paths`' order), and every file's real path."""
        index: dict[str, list[str]] = {}
        for path in self.paths:
            for word in self._words_of(path):
                index.setdefault(word, []).append(path)
        return index, [self._real(path) for path in self.paths]

    def star_importer_spelling(self, parsed: ParsedModule, name: str) -> str | None:
        """A file of the tree that runs `from <parsed's module> import *` and spells `name`: a module-level name
        added to `parsed` (with no `__all__`) would be bound in that file too, over its own (breaker round 19)."""
        module = module_stem(parsed.path)
        for path in self.mentioning(module):
            if self._real(path) == self._real(parsed.path) or not self.says(path, name) or \
                    STAR_IMPORT.search(self.text(path) or "") is None:
                continue
            other = self.parsed(path)
            if other is None or any(node.module is not None and module_matches(
                    other.code(node.module).split("."), parsed.path) for _, node in other.star_imports):
                return path
        return None

    def star_bound_names(self, parsed: ParsedModule, star: cst.ImportFrom) -> frozenset[str] | None:
        """The names `from X import *` in `parsed` binds, where X is one file of the tree (read as it says:
        `ParsedModule.names_a_star_import_takes`); None where it is none, or several."""
        parts = parsed.code(star.module).split(".")
        if star.relative:
            base = self._real(parsed.path)
            for _ in range(len(star.relative)):
                base = os.path.dirname(base)
            stem = os.path.join(base, *parts)
            files = (stem + ".py", os.path.join(stem, "__init__.py"))
            found = [path for path in self.paths if self._real(path) in files]
        else:
            found = [path for path in self.paths if module_matches(parts, path)]
        other = self.parsed(found[0]) if len(found) == 1 else None
        return other.names_a_star_import_takes if other is not None else None

    def says(self, path: str, word: str) -> bool:
        """Whether `word` occurs in the file as a whole word (noted as read), from its set of words where it can."""
        if not WORD.fullmatch(word):
            return re.search(rf"\b{re.escape(word)}\b", self.text(path) or "") is not None
        return word in self._words_of(path)

    def _words_of(self, path: str) -> frozenset[str]:
        text = self.text(path)  # noted as read, whether or not its words are known already
        words = self._caches()[2]
        key = self._real(path)
        if key not in words:
            words[key] = frozenset(WORD.findall(text or ""))
        return words[key]

    def sites(self, parsed: ParsedModule, function: cst.FunctionDef, parameter: str) -> list[CallSite] | None:
        """Every call of `function` (a module-level function or a method of `parsed`) in the tree, each with the
        argument bound to `parameter`; None when a use of it is not such a call, or it has no call at all."""
        owner = parsed.owner_of(function)
        if owner is None and parsed.module_functions.get(function.name.value) is not function:
            return None  # a nested function: reachable only through its enclosing one
        if self.hidden(function.name.value) or owner is not None and self.hidden(owner.node.name.value):
            return None
        if _is_decorated(function):
            return None  # staticmethod, classmethod, a wrapper: the call does not bind as written
        calls = self._function_calls(parsed, function) if owner is None else self._method_calls(parsed, owner,
                                                                                                function)
        if not calls:
            return None
        sites = []
        for site_parsed, call in calls:
            bound = bound_argument(function, call, parameter, skip_self=owner is not None, caller=site_parsed,
                                   tree=self)
            if bound is False:
                return None
            argument, is_default = bound
            if is_default and (self.mentioning("__defaults__") or self.mentioning("__kwdefaults__")):
                return None  # `attend.__defaults__ = (other,)`: the default is not what the def shows
            scope = parsed if is_default else site_parsed
            sites.append(CallSite(site_parsed, call, argument, scope, owner is not None))
        return sites

    # -- module-level functions ----------------------------------------------------------------------------
    def _function_calls(self, parsed: ParsedModule, function: cst.FunctionDef) -> list | None:
        if function.name.value in parsed.bound_names:
            return None
        return self._uses(parsed, function.name, lambda other, use: _function_use_calls(self, other, use))

    def _uses(self, parsed: ParsedModule, defined: cst.Name, calls_of) -> list | None:
        """`calls_of(file, use)` for every use of the name `defined` (a def or class statement's) in the tree (its
        own file, or imported elsewhere), joined; None when one gives None or a file imports the module's `*`."""
        name, calls, module = defined.value, [], module_stem(parsed.path)
        for path in self.mentioning(module):
            text = self.text(path) or ""
            if STAR_IMPORT.search(text) is not None and not self.says(path, name) or \
                    _may_look_up_by_computed_name(text, module):
                other = self.parsed(path)  # `from attn import *` in a package's `__init__.py`, never naming it;
                # `getattr(attention, f"{impl}_attention")`, a name no text spells
                if other is None or _imported_uses(other, parsed, name) is None or \
                        _computed_lookup_on(other, parsed):
                    return None
        for path in self.mentioning(name):
            if self._real(path) != self._real(parsed.path) and not self.says(path, module) and \
                    not self._imports_package_names(path, parsed):
                continue  # another file that never names the module cannot import from it (but `from . import f`
                # of a package's `__init__.py` does not name it)
            other = self.parsed(path)
            if other is None or _named_in_a_string(other, name) or _reached_unseen(other, name):
                return None  # `getattr(sys.modules[__name__], "attention")(...)`: a call no use shows
            uses = other.names_spelled(name) if other is parsed else _imported_uses(other, parsed, name)
            if uses is None or other is not parsed and (_module_reads_unresolved(other, parsed, name, uses) or
                                                       self._reexported(other, parsed, name)):
                return None
            for use in uses:
                if use is defined or _is_import_name(other, use):
                    continue
                found = calls_of(other, use)
                if found is None:
                    return None
                calls.extend(found)
        return calls

    def _imports_package_names(self, path: str, target: ParsedModule) -> bool:
        """Whether the file may import names of `target` without spelling its module: `target` is a package's
        `__init__.py` and the file says `from . import` (or `from .. import`)."""
        return os.path.basename(target.path) == "__init__.py" and \
            PACKAGE_IMPORT.search(self.text(path) or "") is not None

    def _reexported(self, other: ParsedModule, target: ParsedModule, name: str) -> bool:
        """Whether `other` binds `target`'s `name` by an import that a third file of the tree imports from it
        (`layers.py`: `from .attention import Attention`; `main.py`: `from .layers import Attention`): that file's
        calls are the function's too, under a module no text of it names."""
        locals_ = _bound_by_import(other, target, name)
        for local in locals_:
            for path in self.mentioning(local):
                if self._real(path) in (self._real(other.path), self._real(target.path)):
                    continue
                if not self.says(path, module_stem(other.path)) and not self._imports_package_names(path, other):
                    continue
                third = self.parsed(path)
                if third is None or _imported_uses(third, other, local) != []:
                    return True
        return False

    # -- methods ---------------------------------------------------------------------------------------------
    def _method_calls(self, parsed: ParsedModule, owner: ClassInfo, method: cst.FunctionDef) -> list | None:
        if _subclassed(self, owner.node.name.value):
            return None
        name = method.name.value
        if owner.node.decorators:
            return None  # a class decorator may store the class (a registry) and build it out of sight
        if name == "__init__":
            built_by_class, consulted = self._indexed("class-of calls",
                                                      lambda: self._first_file_matching(builds_unseen))
            self._note_all(consulted)
            return None if built_by_class else self._uses(parsed, owner.node.name, _direct_call)
        if name != "forward":  # `forward`'s calls by computed names are `_unnamed_module_calls`
            looked_up, consulted = self._indexed("lookups by computed names",
                                                 lambda: self._first_file_matching(looks_up_objects_by_computed_name))
            self._note_all(consulted)
            if looked_up:
                return None
        own = self._self_calls(parsed, name)
        if own is None:
            return None
        if name != "forward":
            return own
        hooked, consulted = self._indexed("pre-hooks", lambda: self._first_file_matching(PRE_HOOKS.search))
        self._note_all(consulted)
        if hooked or self._call_overridden(parsed, owner):
            return None
        enumerated, consulted = self._indexed("unnamed module calls", self._unnamed_module_calls)
        self._note_all(consulted)
        parents = self._parent_calls(parsed, owner)
        if parents is None or enumerated is None or not own + parents:
            return None  # enumerated calls reach any module, but never stand for a class no visible call builds
        return own + parents + enumerated

    def _call_overridden(self, parsed: ParsedModule, owner: ClassInfo) -> bool:
        """Whether the class, a class it derives from or one deriving from it (by name, through the classes of the
        tree) defines or assigns one of CALL_OVERRIDES: a module call of it may hand forward other arguments."""
        overriders, consulted = self._indexed("call overrides", self._call_overriders)
        self._note_all(consulted)
        if not overriders:
            return False
        if ANY_ROOT in overriders:
            return True  # `nn.Module.__call__ = patched`: every module's call
        sites = parsed.project.classes if parsed.project is not None else class_sites(parsed.path, parsed.source)
        bases: dict[str, set[str]] = {}
        for site in sites:
            bases.setdefault(site.name, set()).update(site.bases)
        for node in parsed.calls_and_classes[1]:
            bases.setdefault(node.name.value, set()).update(
                base.value.attr.value if isinstance(base.value, cst.Attribute) else getattr(base.value, "value", "?")
                for base in node.bases)
        related, pending = set(), [owner.node.name.value]
        while pending:  # the ancestors
            name = pending.pop()
            if name not in related:
                related.add(name)
                pending.extend(bases.get(name, ()))
        descendants = {owner.node.name.value}
        grown = True
        while grown:
            found = {name for name, names in bases.items() if names & descendants} - descendants
            descendants |= found
            grown = bool(found)
        return bool((related | descendants) & overriders)

    def _call_overriders(self) -> tuple[frozenset[str], list[str]]:
        """The names of the tree's classes whose body defines or assigns one of CALL_OVERRIDES, and the files
        read."""
        names: set[str] = set()
        keys = []
        for path in self.paths:
            keys.append(self._real(path))
            text = self.text(path) or ""
            if MAY_OVERRIDE_CALL.search(text) is None:
                continue
            try:
                tree = python_tree(text)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
            if CALL_ASSIGNED.search(text) is not None:
                names.add(ANY_ROOT)  # assigned outside a class body (breaker round 41)
            names.update(node.name for node in nodes(tree) if type(node) is ast.ClassDef and any(
                type(statement) in (ast.FunctionDef, ast.AsyncFunctionDef) and statement.name in CALL_OVERRIDES or
                type(statement) is ast.Assign and any(getattr(t, "id", None) in CALL_OVERRIDES
                                                      for t in statement.targets)
                for statement in node.body))
        return frozenset(names), keys

    def _unnamed_module_calls(self) -> tuple[list | None, list[str]]:
        """Every call in the tree of a submodule no name shows: reached by enumeration (`for layer in
        self.children(): x = layer(x, mask=m)`) or looked up by a computed name (`getattr(self, f"attn{i}")(x, m)`,
        `layer = getattr(self, name)` then `layer(x)`). Each is a call of any module's `forward`, with the arguments
        it shows (None where a file reaches modules so in a way whose calls are not shown); and the files read."""
        found: list = []
        consulted = []
        for path in self.paths:
            consulted.append(self._real(path))
            text = self.text(path) or ""
            enumerates, looks_up = calls_enumerated_modules(text), calls_by_computed_name(text)
            reaches = REACHES_MODULES.search(text) is not None
            if not (enumerates or looks_up or reaches):
                continue
            other = self.parsed(path)
            if reaches and (other is None or reaches_modules_unseen(other)):
                return None, consulted
            calls = None if other is None else enumerated_calls(other) if enumerates else []
            if calls is None:
                return None, consulted
            found += [(other, call) for call in calls + (computed_lookup_calls(other) if looks_up else [])]
        return found, consulted

    def _first_file_matching(self, matches) -> tuple[bool, list[str]]:
        """Whether `matches(text)` holds for a file of the tree, and the files read to know it (up to the first)."""
        consulted = []
        for path in self.paths:
            consulted.append(self._real(path))
            if matches(self.text(path) or ""):
                return True, consulted
        return False, consulted

    def accesses(self, path: str, name: str) -> bool:
        """Whether the file reads or writes an attribute `name` (`.name`, `. name`), from its set of such names
        (built once per scan and process) when `name` is one word."""
        text = self.text(path) or ""
        if not WORD.fullmatch(name):
            return re.search(rf"\.\s*{re.escape(name)}\b", text) is not None
        accessed = self._caches()[4]
        key = self._real(path)
        if key not in accessed:
            accessed[key] = frozenset(ACCESSED.findall(text))
        return name in accessed[key]

    def _self_calls(self, parsed: ParsedModule, name: str, assigned_ok: bool = False,
                    plain: frozenset[str] = frozenset()) -> list | None:
        """`self.name(...)` in the function's file; any other read of `.name` in the tree is a use not seen
        (`assigned_ok`: `self.name = ...` is the instance's construction, not a use), but for reads of one of its
        `plain` attributes (`_plain_attributes`), in any file."""
        calls = []
        for path in self.mentioning(name):
            if re.search(rf"""(['"])(?:[\w.]*\.)?{re.escape(name)}(?:\.[\w.]*)?\1""", self.text(path) or "") \
                    is not None and not self._only_tested_by_hasattr(path, name):
                return None  # `getattr(blk, "attn")`, `blk.get_submodule("attn")`, `blk._modules["attn"]`, a
                # dotted path through it (`get_submodule("blk.attn")`, `attrgetter("blk.attn")`)
            if self._real(path) != self._real(parsed.path):
                if self.accesses(path, name) and not self._only_plain_reads(path, name, plain):
                    return None  # `.name` read in another file: not a call this index follows
                continue
            other = parsed
            for node in other.attributes_named(name):
                if assigned_ok and isinstance(other.parents.get(node), cst.AssignTarget):
                    continue  # `self.X = C(...)`: the only value, checked by the caller
                if _reads_plain_attribute(other, node, plain):
                    continue
                found = [(other, _called(other, node))] if _called(other, node) is not None else \
                    _element_calls(other, node) if assigned_ok else None
                if other is not parsed or not is_self_attribute(node) or found is None:
                    if not _is_definition_name(other, node):
                        return None
                    continue
                calls.extend(found)
        return calls

    def _only_tested_by_hasattr(self, path: str, name: str) -> bool:
        """Every string of the file that names the attribute (alone or as a dotted path's part) is the name
        `hasattr(obj, "attn")` tests, which reads the submodule and hands it nowhere (breaker round 60: one such
        test anywhere in the file held back the proof)."""
        other = self.parsed(path)
        if other is None or "hasattr" in other.bound_names:
            return False
        named = re.compile(rf"(?:[\w.]*\.)?{re.escape(name)}(?:\.[\w.]*)?")
        for string in other.nodes_of(cst.SimpleString):
            if not (isinstance(string.evaluated_value, str) and named.fullmatch(string.evaluated_value)):
                continue
            arg = other.parents.get(string)
            call = other.parents.get(arg)
            if not (isinstance(arg, cst.Arg) and isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and
                    call.func.value == "hasattr" and len(call.args) == 2 and call.args[1] is arg):
                return False
        return True

    def _only_plain_reads(self, path: str, name: str, plain: frozenset[str]) -> bool:
        """Every `.name` in the file is read only for one of the `plain` attributes (`blk.attn.in_proj_weight`)."""
        other = self.parsed(path) if plain else None
        return other is not None and all(_reads_plain_attribute(other, node, plain)
                                         for node in other.attributes_named(name))

    def _parent_calls(self, parsed: ParsedModule, owner: ClassInfo) -> list | None:
        """The class's instances, each built once into `self.X` of a parent class and only ever called: the calls
        `self.X(...)` reach `forward`; so do the calls of an instance bound to a name (`model = Net(); model(x, m)`),
    or called as it is built. Any other use of the class (a list, a base class, `isinstance`) is not followed."""
        plain = _plain_attributes(parsed, owner)

        def instance_calls(other: ParsedModule, use: cst.CSTNode) -> list | None:
            attribute = _built_into(other, use) or _list_built_into(other, use)
            if attribute is not None:
                return self._self_calls(other, attribute, assigned_ok=True, plain=plain)
            return _named_instance_calls(self, other, use)

        return self._uses(parsed, owner.node.name, instance_calls)


def _named_in_a_string(parsed: ParsedModule, name: str) -> bool:
    """A string literal spelling the name (`getattr(module, "attention")`, `globals()["attention"]`), or a call of it
    given to a call (`get_ipython().run_line_magic("time", "w = attention(q, k, v)[1]")`, a notebook exported as a
    script; `timeit("attention(q, k, v)")`): the function may be reached by it, at a call site no use shows."""
    called = re.compile(rf"\b{re.escape(name)}\s*\(")
    return any(isinstance(node.evaluated_value, str) and (
        node.evaluated_value == name and not _in_all(parsed, node) or
        called.search(node.evaluated_value) is not None and isinstance(parsed.parents.get(node), cst.Arg))
        for node in parsed.nodes_of(cst.SimpleString))


def _reached_unseen(parsed: ParsedModule, name: str) -> bool:
    """`.name` read from something that is neither `self`, `cls`, `super()` nor an imported name
    (`importlib.import_module("attn").attend(...)`, `sys.modules["attn"].attend`, `m.attend` for a module bound at
    run time), or code run from a string (`eval`, `exec`): a call of the function no import shows."""
    for access in parsed.attributes_named(name):
        receiver = access.value
        if isinstance(receiver, cst.Name) and receiver.value in ("self", "cls"):
            continue
        if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name) and receiver.func.value == "super":
            continue
        if parsed.imported_name(receiver) is None:
            return True
    return any(isinstance(call.func, cst.Name) and call.func.value in CODE_RUNNERS and
               call.func.value not in parsed.bound_names for call in parsed.nodes_of(cst.Call))


def _module_reads_unresolved(other: ParsedModule, target: ParsedModule, name: str, uses: list) -> bool:
    """A `.name` read on an expression that names `target`'s module through imports, that the import bindings
    did not resolve (`from . import layers`, then `layers.attention.f(...)` through the package's own import)."""
    resolved = {id(use) for use in uses}
    return any(id(access) not in resolved and _names_module(other, access.value, target)
               for access in other.attributes_named(name))


def _names_module(other: ParsedModule, node: cst.BaseExpression, target: ParsedModule) -> bool:
    """Whether `node` names `target`'s module through `other`'s imports."""
    dotted = other.imported_name(node)
    return dotted is not None and module_matches(dotted.split("."), target.path)


def _computed_lookup_on(other: ParsedModule, target: ParsedModule) -> bool:
    """`getattr(m, <not a literal>)`, `vars(m)[...]` or `m.__dict__[...]` where `m` names `target`'s module: any of
    its functions may be reached there."""
    for call in other.nodes_of(cst.Call):
        func, args = call.func, [a.value for a in call.args]
        if other.imported_name(func) in (f"operator.{getter}" for getter in NAME_GETTERS) and args and \
                not all(isinstance(arg, cst.SimpleString) for arg in args):
            return True  # `attrgetter("attend_" + kind)(impls)`: whatever it is applied to
        if isinstance(func, cst.Attribute) and func.attr.value in ("__getattribute__", "__getattr__") and args and \
                not isinstance(args[0], cst.SimpleString) and _names_module(other, func.value, target):
            return True
        if not (isinstance(func, cst.Name) and func.value in ("getattr", "vars") and args) or \
                func.value in other.bound_names:
            continue
        if func.value == "getattr" and len(args) >= 2 and isinstance(args[1], cst.SimpleString):
            continue
        if _names_module(other, args[0], target):
            return True
    return any(_names_module(other, node.value, target) for node in other.attributes_named("__dict__"))


def _bound_by_import(other: ParsedModule, target: ParsedModule, name: str) -> list[str]:
    """The names under which `other` binds `target`'s `name` by `from <target> import name [as local]`."""
    found = []
    for node in other.nodes_of(cst.ImportFrom):
        if _resolves(other, node, target) and not isinstance(node.names, cst.ImportStar):
            found += [other.code(a.asname.name) if a.asname else name for a in node.names if other.code(a.name) == name]
    return found


def _in_all(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    """An entry of `__all__ = [...]` (or `+=`): it exports the name, which importers then spell as a name."""
    while node is not None and not isinstance(node, (cst.Assign, cst.AugAssign, cst.SimpleStatementLine)):
        node = parsed.parents.get(node)
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else \
        [node.target] if isinstance(node, cst.AugAssign) else []
    return any(isinstance(target, cst.Name) and target.value == "__all__" for target in targets)


def _is_decorated(function: cst.FunctionDef) -> bool:
    return bool(function.decorators)


def _called(parsed: ParsedModule, node: cst.BaseExpression) -> cst.Call | None:
    """The call `node(...)` when `node` is what is called."""
    parent = parsed.parents.get(node)
    return parent if isinstance(parent, cst.Call) and parent.func is node else None


def _function_use_calls(tree: Tree, parsed: ParsedModule, use: cst.CSTNode) -> list | None:
    """`use(...)`, or the calls of `torch.compile(use)` (a compiled function runs with the arguments it is given)."""
    compiled = _compiled(parsed, use)
    return _calls_of_instance(tree, parsed, compiled, 0) if compiled is not None else _direct_call(parsed, use)


def _direct_call(parsed: ParsedModule, use: cst.CSTNode) -> list[tuple[ParsedModule, cst.Call]] | None:
    """`use(...)`: the one call this use is; None when it is not called."""
    call = _called(parsed, use)
    return [(parsed, call)] if call is not None else None


def _reads_plain_attribute(parsed: ParsedModule, node: cst.CSTNode, plain: frozenset[str]) -> bool:
    """`node` (`block.attn`) is only the object one of the `plain` attributes is read from (`block.attn.scale`,
    `nn.init.normal_(block.attn.in_proj_weight)`): no call of the module, whatever is done with what is read."""
    parent = parsed.parents.get(node)
    return isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in plain


def _plain_attributes(parsed: ParsedModule, owner: ClassInfo) -> frozenset[str]:
    """The attributes a class binds to values that cannot lead back to its instance, and that are not its methods
    (nor `forward`, `__call__` and their kin): `self.in_proj_weight = nn.Parameter(...)`, `self.scale = d ** -0.5`;
    not `self.fn = self.forward`, `Helper(self)`, or `self.me = self.other` where `other` holds one of those. Reading
    one on an instance (open_clip's init: `nn.init.normal_(block.attn.in_proj_weight)`) never calls the module."""
    holding = set(owner.methods) | CALL_OVERRIDES | {"forward"}
    grown = True
    while grown:
        before = len(holding)
        holding |= {name for name, values in owner.attributes.items() if name not in holding and
                    any(_may_hold_instance(parsed, value, holding) for value in values)}
        grown = len(holding) > before
    return frozenset(name for name in owner.attributes if name not in holding and not name.startswith("__")) - \
        owner.unfollowed - owner.mutated


def _may_hold_instance(parsed: ParsedModule, value: cst.BaseExpression, holding: set[str]) -> bool:
    """`value` reads `self` other than as `self.x` for an `x` outside `holding`."""
    names = [value] if isinstance(value, cst.Name) else descendants(value, (cst.Name,))
    for name in names:
        if name.value != "self":
            continue
        parent = parsed.parents.get(name)
        if not (isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value not in holding):
            return True
    return False


def _is_definition_name(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    return isinstance(parsed.parents.get(node), (cst.FunctionDef, cst.ClassDef))


def _is_import_name(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    return parsed.innermost(node, (cst.Import, cst.ImportFrom)) is not None


def _subclassed(tree: Tree, cls: str) -> bool:
    pattern = re.compile(rf"class\s+\w+\s*\([^)]*\b{re.escape(cls)}\b")
    return any(pattern.search(tree.text(path) or "") for path in tree.mentioning(cls))


def _built_into(parsed: ParsedModule, use: cst.CSTNode, call: cst.Call | None = None) -> str | None:
    """X when `use(...)` is assigned to `self.X` and nothing else is ever assigned to it (its class's only value)."""
    call = call or _called(parsed, use)
    assign = parsed.parents.get(call) if call is not None else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 or assign.value is not call:
        return None
    target = assign.targets[0].target
    if not (isinstance(target, cst.Attribute) and is_self_attribute(target)):
        return None
    method = parsed.innermost(assign, cst.FunctionDef)
    owner = parsed.owner_of(method) if method is not None else None
    return target.attr.value if owner is not None and owner.held_module(target.attr.value) is call else None


def _element_calls(parsed: ParsedModule, node: cst.Attribute) -> list | None:
    """The calls of the elements of a module list read as `node` (`self.layers`): `for layer in self.layers:` (or
    `enumerate(self.layers)`) whose loop variable is only called, `self.layers[i](...)`, `len(self.layers)`."""
    parent = parsed.parents.get(node)
    if isinstance(parent, cst.Subscript) and _called(parsed, parent) is not None:
        return [(parsed, _called(parsed, parent))]
    call = parsed.parents.get(parent) if isinstance(parent, cst.Arg) else None
    if isinstance(call, cst.Call) and len(call.args) == 1 and parsed.imported_name(call.func) == "len":
        return []
    loop, element = parent, 0
    if isinstance(call, cst.Call) and len(call.args) == 1 and isinstance(call.func, cst.Name) and \
            call.func.value == "enumerate" and "enumerate" not in parsed.bound_names and \
            "enumerate" not in parsed.imports:
        loop, element = parsed.parents.get(call), 1
    if not isinstance(loop, cst.For) or loop.iter is not (node if element == 0 else call):
        return None
    target = loop.target
    if element == 1:
        target = target.elements[1].value if isinstance(target, cst.Tuple) and len(target.elements) == 2 else None
    function = parsed.innermost(loop, cst.FunctionDef)
    if not isinstance(target, cst.Name) or function is None:
        return None
    flow = parsed.flow(function)
    reads = [read for d in flow.definitions.values() if d.statement is loop and d.name == target.value
             for read in flow.reads_of(d)]
    calls = []
    for read in reads:
        if _called(parsed, read) is not None:
            calls.append((parsed, _called(parsed, read)))
        elif not drops_state_method_result(parsed, read):
            return None
    return calls


def _list_built_into(parsed: ParsedModule, use: cst.CSTNode) -> str | None:
    """X when `use(...)` builds the elements of `self.X = nn.ModuleList([...])` (a list or a comprehension)."""
    built = _called(parsed, use)
    holder = parsed.parents.get(built) if built is not None else None
    if isinstance(holder, cst.Element):
        holder = parsed.parents.get(holder)
    if not (isinstance(holder, cst.ListComp) and holder.elt is built or isinstance(holder, cst.List)):
        return None
    arg = parsed.parents.get(holder)
    module_list = parsed.parents.get(arg) if isinstance(arg, cst.Arg) else None
    if not isinstance(module_list, cst.Call) or len(module_list.args) != 1 or \
            parsed.imported_name(module_list.func) != "torch.nn.ModuleList":
        return None
    return _built_into(parsed, module_list.func, module_list)


def _named_instance_calls(tree: Tree, parsed: ParsedModule, use: cst.CSTNode) -> list | None:
    """The calls of an instance built by `use(...)`: called at once (`Net()(x)`), or bound once to a name (local or
    module-level) every read of which calls it, or calls a method other than `forward` and drops its result
    (`model.eval()`; a kept result may be the module itself), or is compiled (`torch.compile(model)`, whose calls
    are the instance's, with the same arguments), the compiled module read so in turn. None for any other read
    (passed on, stored)."""
    built = _called(parsed, use)
    if built is None:
        return None
    if returns_itself(parsed, parsed.top_level_classes.get(getattr(use, "value", None))):
        built = _through_self_returning_calls(parsed, built)
    return _calls_of_instance(tree, parsed, _compiled(parsed, built) or built, 0)


MAX_COMPILED = 4  # `torch.compile` of a compiled module, followed so deep


def _compiled(parsed: ParsedModule, node: cst.BaseExpression) -> cst.Call | None:
    """`torch.compile(node)` when `node` is what it compiles (`module_methods.compiled_instance`): a module, or a
    function (`torch.compile(attention)(q, k, v, mask)`), whose calls are then the compiled one's."""
    arg = parsed.parents.get(node)
    call = parsed.parents.get(arg) if isinstance(arg, cst.Arg) else None
    return call if compiled_instance(parsed, call) is node else None


def _calls_of_instance(tree: Tree, parsed: ParsedModule, built: cst.BaseExpression, depth: int) -> list | None:
    """The calls of the module (or compiled function) `built` evaluates to (see `_named_instance_calls`)."""
    outer = _called(parsed, built)
    if outer is not None:
        return [(parsed, outer)]
    assign = parsed.parents.get(built)
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 or \
            not isinstance(assign.targets[0].target, cst.Name):
        return None
    reads = _reads_of_binding(parsed, assign, assign.targets[0].target)
    module_level = parsed.innermost(assign, cst.FunctionDef) is None
    if reads is None or module_level and any(tree._real(path) != tree._real(parsed.path)
                                              for path in tree.mentioning(assign.targets[0].target.value)):
        return None  # a module-level instance another file may import
    calls = []
    for read in reads:
        call = _called(parsed, read)
        compiled = _compiled(parsed, read) if call is None and depth < MAX_COMPILED else None
        if call is not None:
            calls.append((parsed, call))
        elif compiled is not None:
            found = _calls_of_instance(tree, parsed, compiled, depth + 1)
            if found is None:
                return None
            calls.extend(found)
        elif not drops_state_method_result(parsed, read):
            return None
    return calls


def _through_self_returning_calls(parsed: ParsedModule, call: cst.Call) -> cst.Call:
    """`Net().eval().to(device)`: the outermost call of methods that return the instance `call` built."""
    while True:
        attribute = parsed.parents.get(call)
        outer = _called(parsed, attribute) if isinstance(attribute, cst.Attribute) and attribute.value is call and \
            attribute.attr.value in SELF_RETURNING else None
        if outer is None:
            return call
        call = outer


def _reads_of_binding(parsed: ParsedModule, assign: cst.Assign, target: cst.Name) -> list[cst.Name] | None:
    """Every read of the name `assign` binds: its reads in the function, or for a module-level name bound only
    there, every use of the name in the file; None when the name is bound anywhere else too."""
    function = parsed.innermost(assign, cst.FunctionDef)
    if function is not None:
        flow = parsed.flow(function)
        found = [d for d in flow.definitions.values() if d.statement is assign and d.name == target.value]
        return flow.reads_of(found[0]) if len(found) == 1 else None
    if parsed.innermost(assign, cst.ClassDef) is not None or \
            [n.value for n in _assigned_names(parsed.parents.items())].count(target.value) != 1:
        return None
    return [n for n in parsed.parents if isinstance(n, cst.Name) and n.value == target.value and n is not target]


def bound_argument(function: cst.FunctionDef, call: cst.Call, parameter: str, skip_self: bool,
                   caller: ParsedModule, tree=None) -> tuple[cst.BaseExpression | None, bool] | bool:
    """(the expression the call binds to `parameter`, whether it is the parameter's default); False when the call
    spreads `*args`/`**kwargs` whose elements are not visible (a fixed display's are, read in `caller`, the call's
    file: static.spread_arguments) or binds nothing to it."""
    given, keywords = spread_positionals(caller, call, tree), spread_keywords(caller, call, tree)
    if given is None or keywords is None:
        return False
    params = function.params
    positional = list(params.posonly_params) + list(params.params)
    if skip_self:
        positional = positional[1:]
    names = [p.name.value for p in positional]
    keyword_ok = parameter not in {p.name.value for p in params.posonly_params}  # else `mask=` goes to **kwargs
    if keyword_ok and parameter in keywords:
        return keywords[parameter], False
    position = names.index(parameter) if parameter in names else None
    if position is not None and position < len(given):
        return given[position], False
    param = next((p for p in positional + list(params.kwonly_params) if p.name.value == parameter), None)
    return (param.default, True) if param is not None and param.default is not None else False


# -- imports -------------------------------------------------------------------------------------------------
def _imported_uses(other: ParsedModule, target: ParsedModule, name: str) -> list[cst.CSTNode] | None:
    """The expressions of `other` that name `target`'s `name` through an import (`g` after `from mod import f as
    g`, `m.f` after `import mod as m`); None when `other` imports all of `target`'s names (`import *`)."""
    uses: list[cst.CSTNode] = []
    for node in other.nodes_of(cst.Import, cst.ImportFrom):
        if isinstance(node, cst.ImportFrom) and _resolves(other, node, target):
            if isinstance(node.names, cst.ImportStar):
                return None
            for alias in node.names:
                if other.code(alias.name) == name:
                    if os.path.basename(other.path) == "__init__.py":
                        return None  # a package re-exports it: its importers name the package, not the module
                    local = other.code(alias.asname.name) if alias.asname else name
                    uses.extend(_name_reads(other, local))
        else:
            for local in _module_aliases(other, node, target):
                uses.extend(a for a in other.attributes_named(name) if other.code(a.value) == local)
    return uses


def _name_reads(parsed: ParsedModule, local: str) -> list[cst.Name]:
    return [n for n in parsed.names_spelled(local) if not _is_import_name(parsed, n)]


def _module_aliases(other: ParsedModule, node: cst.Import | cst.ImportFrom, target: ParsedModule) -> list[str]:
    """The local names under which `node` binds `target` itself as a module."""
    found = []
    if isinstance(node, cst.Import):
        for alias in node.names:
            dotted = other.code(alias.name)
            if module_matches(dotted.split("."), target.path) and alias.asname is not None:
                found.append(other.code(alias.asname.name))
            elif module_matches(dotted.split("."), target.path):
                found.append(dotted)
    elif not isinstance(node.names, cst.ImportStar):
        base = base_parts(other, node)
        for alias in node.names:
            if base is not None and module_matches(base + [other.code(alias.name)], target.path):
                found.append(other.code(alias.asname.name) if alias.asname else other.code(alias.name))
    return found


def base_parts(other: ParsedModule, node: cst.ImportFrom) -> list[str] | None:
    """The module an ImportFrom reads from, as path parts (relative imports resolved against `other`'s folder)."""
    parts = other.code(node.module).split(".") if node.module is not None else []
    if not node.relative:
        return parts
    folder = os.path.dirname(os.path.realpath(other.path))
    for _ in range(len(node.relative) - 1):
        folder = os.path.dirname(folder)
    return folder.split(os.sep) + parts


def _resolves(other: ParsedModule, node: cst.ImportFrom, target: ParsedModule) -> bool:
    base = base_parts(other, node)
    return base is not None and bool(base) and module_matches(base, target.path)


def module_stem(path: str) -> str:
    """The name an import of the file's module ends with: `b` for `a/b.py` and for `a/b/__init__.py`."""
    real = os.path.realpath(path)
    stem = os.path.splitext(os.path.basename(real))[0]
    return os.path.basename(os.path.dirname(real)) if stem == "__init__" else stem


def module_matches(parts: list[str], path: str) -> bool:
    """Whether the dotted module `parts` can be the file `path` (`a.b` is `.../a/b.py` or `.../a/b/__init__.py`)."""
    real = os.path.realpath(path)
    stem = real[:-3] if real.endswith(".py") else real
    if stem.endswith(os.sep + "__init__"):
        stem = stem[: -len(os.sep + "__init__")]
    file_parts = stem.split(os.sep)
    parts = [p for p in parts if p]
    return bool(parts) and file_parts[-len(parts):] == parts

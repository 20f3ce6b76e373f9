"""The classes of a file as the rest of the tree sees them: what each derives from and what it defines.

A rewrite inlines a class's helper methods and reads its attributes as the class binds them. A subclass anywhere in
the scanned tree that redefines one (`class Sub(Attn): def norm(...)` in another file, `type("S", (Attn,), {...})`,
a `__getattribute__`) runs the rewritten base with another meaning. Every file is read with CPython's parser (the
parse outside_writes shares), and its classes travel with the tree-wide facts (static.project.ProjectFacts).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from advisor.static.outside_writes import ATTRIBUTE_TABLES, writes_its_receiver
from advisor.static.python_ast import nodes, python_tree
from advisor.static.text_screens import then_on_line

ANY_NAME = "*"  # what a class whose namespace is computed may define
UNNAMED_BASE = "?"  # a base no name gives (`type(name, bases, ns)` with computed bases): may be any class
# a class statement's bases (up to the first closing parenthesis; none without), and the bases that derive from no
# class of a tree; a file with a class statement not so read (`class S\` continued on the next line) is parsed
CLASS_BASES = re.compile(r"^[ \t]*class[ \t]+\w+[ \t]*(?:\(([^)]*)\))?[ \t]*:", re.MULTILINE)
CLASS_LINE = re.compile(r"^[ \t]*class\b", re.MULTILINE)
PLAIN_BASES = re.compile(r"\s*(?:(?:torch\.)?nn\.Module|object)?\s*,?\s*")
PLAIN_BASE_NAMES = frozenset({"Module", "object"})  # `nn.Module`, `torch.nn.Module`, `object` by their last names
# `type(name, bases, namespace)` (not `type(x)`), or a name and bases given to any other class factory
# (`types.new_class("S", (Attn,))`, a metaclass `M("S", (Attn,), {})`, `type.__new__(type, "S", (Attn,), {})`)
MAY_BUILD_CLASS = re.compile(then_on_line(r"\btype\s*\(", ",") + r"|[\"']\s*,\s*\(")
IMPORT_ALIAS = re.compile(r"^[ \t]*from[ \t]+\S+[ \t]+import\b(?:[^\n(]*|[ \t]*\([^)]*)\bas\b", re.MULTILINE)
REGISTRARS = frozenset({"register_buffer", "register_parameter", "add_module", "register_module"})


@dataclass(frozen=True)
class ClassSite:
    """A class statement with bases, or a three-argument `type(...)` call: the last name of each base, and the names
    it defines (methods, class attributes, `self.` attributes its methods bind; ANY_NAME for a computed one). A name
    bound to a base (`Base = attn.Attn`) is one too, deriving from what it names and defining nothing."""

    path: str
    line: int
    name: str
    bases: tuple[str, ...]
    defines: frozenset[str]


def class_sites(path: str, text: str) -> list[ClassSite]:
    """The file's classes that derive from something other than `nn.Module` or `object` ([] for source CPython
    cannot parse: the scan reports it). A file whose classes all derive from those alone, and that builds none
    with `type`, is not parsed: none of its classes derives from a class of the tree."""
    builds = MAY_BUILD_CLASS.search(text) is not None
    headers = CLASS_BASES.findall(text)
    if not builds and all(PLAIN_BASES.fullmatch(bases) for bases in headers) and \
            len(headers) == len(CLASS_LINE.findall(text)) and IMPORT_ALIAS.search(text) is None:
        return []
    try:
        tree = python_tree(text, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    statements = _statements(tree.body)
    found = [ClassSite(path, node.lineno, node.name, bases, _defined(node)) for node in statements
             if type(node) is ast.ClassDef for bases in [tuple(_base_name(base) for base in node.bases)]
             if bases and not set(bases) <= PLAIN_BASE_NAMES]
    found += _base_bindings(path, tree, statements, {base for site in found for base in site.bases})
    for node in nodes(tree) if builds else ():
        if type(node) is not ast.Call:
            continue
        if type(node.func) is ast.Name and node.func.id == "type" and len(node.args) == 3 and not node.keywords:
            name, bases, namespace = node.args
            found.append(ClassSite(path, node.lineno, name.value if _string(name) else UNNAMED_BASE,
                                   tuple(_base_name(base) for base in bases.elts) if type(bases) is ast.Tuple
                                   else (UNNAMED_BASE,), _namespace_keys(namespace)))
            continue
        for name, bases in zip(node.args, node.args[1:]):  # a name, then bases: any other factory, any namespace
            if _string(name) and type(bases) is ast.Tuple and bases.elts and \
                    all(type(base) in (ast.Name, ast.Attribute) for base in bases.elts):  # not `("k", (0, 1))`
                found.append(ClassSite(path, node.lineno, name.value, tuple(_base_name(b) for b in bases.elts),
                                       frozenset({ANY_NAME})))
    return found


def _base_bindings(path: str, tree: ast.Module, statements: list[ast.stmt], named: set[str]) -> list[ClassSite]:
    """The names the bases in `named` are bound through, as sites defining nothing: a name bound to another
    (`Base = attn.Attn`, `A: type = m.Attn`, `A2 = A`, a walrus) or given by an aliased import (`from .m import Attn
    as Core` in a package's `__init__`) derives from what it names; one bound any other way (`A, B = m.Attn, None`,
    `A = getattr(m, "Attn")`, `for A in ...`) may be any class (breaker round 19)."""
    aliases, others = [], []
    for node in nodes(tree):
        if type(node) in (ast.Assign, ast.AnnAssign, ast.NamedExpr) and node.value is not None:
            for target in node.targets if type(node) is ast.Assign else [node.target]:
                plain = type(target) is ast.Name and type(node.value) in (ast.Name, ast.Attribute)
                (aliases if plain else others).append((node, target))
        elif type(node) is ast.For:
            others.append((node, node.target))
    while True:  # a chain of names: each derives from the one it names
        more = {_base_name(node.value) for node, target in aliases if target.id in named} - named
        if not more:
            break
        named = named | more
    found = [ClassSite(path, node.lineno, target.id, (_base_name(node.value),), frozenset())
             for node, target in aliases if target.id in named]
    found += [ClassSite(path, node.lineno, alias.asname, (alias.name.split(".")[-1],), frozenset())
              for node in statements if type(node) is ast.ImportFrom for alias in node.names
              if alias.asname and alias.asname != alias.name]
    return found + [ClassSite(path, node.lineno, name.id, (UNNAMED_BASE,), frozenset()) for node, target in others
                    for name in ast.walk(target) if type(name) is ast.Name and name.id in named]


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of `body` and those nested in it (under `if`, `try`, in functions and classes): a walk of
    statements alone, not of every expression."""
    found, pending = [], list(body)
    while pending:
        statement = pending.pop()
        found.append(statement)
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(statement, name, None)
            if type(inner) is list:
                pending.extend(inner)
    return found


def _base_name(node: ast.AST) -> str:
    """`Attn`, `mod.Attn` -> 'Attn'; `Generic[T]`, `Sampler[int]` -> 'Generic', 'Sampler' (a class's own
    `__class_getitem__` returning another class is not followed); anything else (a call's result,
    `with_metaclass(Meta, Attn)`, `bases()[0]`) may be any class."""
    if type(node) is ast.Subscript:
        node = node.value
    return node.id if type(node) is ast.Name else node.attr if type(node) is ast.Attribute else UNNAMED_BASE


def _string(node: ast.AST) -> bool:
    return type(node) is ast.Constant and isinstance(node.value, str)


def _namespace_keys(node: ast.AST) -> frozenset[str]:
    """The names a `type(...)` namespace defines: a dict display's string keys; any name for anything else."""
    if type(node) is ast.Dict and all(key is not None and _string(key) for key in node.keys):
        return frozenset(key.value for key in node.keys)
    if type(node) is ast.Call and type(node.func) is ast.Name and node.func.id == "dict" and not node.args and \
            all(keyword.arg is not None for keyword in node.keywords):
        return frozenset(keyword.arg for keyword in node.keywords)
    return frozenset({ANY_NAME})


def _defined(node: ast.ClassDef) -> frozenset[str]:
    """What the class body binds, and what its methods bind on `self` (assigned, set by a literal name, registered);
    ANY_NAME where a method sets one by a computed name."""
    found: set[str] = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(statement.name)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            found.update(name.id for target in targets for name in ast.walk(target) if type(name) is ast.Name)
    for inner in nodes(node):
        kind = type(inner)
        if kind is ast.Attribute and type(inner.ctx) is not ast.Load:
            found.update([inner.attr] if _is_self(inner.value) else _self_attributes_under(inner.value))
        elif kind is ast.Subscript and type(inner.ctx) is not ast.Load:  # `self.bias[...] = 1`
            found.update(_self_attributes_under(inner))
        elif kind is ast.Call and type(inner.func) in (ast.Attribute, ast.Name) and \
                writes_its_receiver(_function_name(inner.func)):
            # `self.bias.fill_(1)`, `self.bias.data.copy_(t)`; unbound, `torch.fill_(self.bias, 1)`, `nn.init.ones_`
            through_receiver = _self_attributes_under(inner.func.value) if type(inner.func) is ast.Attribute else []
            found.update(through_receiver or [name for arg in inner.args[:1] for name in _self_attributes_under(arg)])
        elif kind is ast.Call and inner.args and _binds_on_self(inner):
            found.add(inner.args[1].value if inner.args[1:] and _string(inner.args[1]) and _setattr(inner) else
                      inner.args[0].value if not _setattr(inner) and _string(inner.args[0]) else ANY_NAME)
    return frozenset(found)


def _self_attributes_under(node: ast.AST) -> list[str]:
    """`bias` of `self.bias`, `self.bias.data`, `self.bias[0]`, `self.bias.view(-1)`, `self._buffers["bias"]`,
    `vars(self)["_buffers"]["bias"]`: the attribute of `self` a write through `node` changes (the key given to the
    attribute table where it goes through one)."""
    keys: list[str | None] = []  # string keys, outermost first
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if type(node) is ast.Call:
            if type(node.func) is ast.Name and node.func.id == "vars" and node.args and _is_self(node.args[0]):
                keys = keys[:-1] if keys and keys[-1] in ATTRIBUTE_TABLES else keys  # `vars(self)["_buffers"]`
                return [keys[-1]] if keys and keys[-1] else []
            node = node.func
        elif type(node) is ast.Subscript:
            keys.append(node.slice.value if _string(node.slice) else None)
            node = node.value
        elif _is_self(node.value):
            return ([keys[-1]] if keys and keys[-1] else []) if node.attr in ATTRIBUTE_TABLES else [node.attr]
        else:
            node = node.value
    return []


def _function_name(func: ast.AST) -> str:
    return func.attr if type(func) is ast.Attribute else func.id


def _is_self(node: ast.AST) -> bool:
    return type(node) is ast.Name and node.id == "self"


def _setattr(call: ast.Call) -> bool:
    return type(call.func) is ast.Name and call.func.id == "setattr"


def _binds_on_self(call: ast.Call) -> bool:
    """`setattr(self, ...)`, `self.register_buffer(...)` and the like."""
    if _setattr(call):
        return _is_self(call.args[0])
    return type(call.func) is ast.Attribute and call.func.attr in REGISTRARS and _is_self(call.func.value)

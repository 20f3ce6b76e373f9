"""Whether a file's writes of a torch function's attribute put another function there, or only put back the one
they took.

`sdpa = F.__dict__.pop("scaled_dot_product_attention")` ... `setattr(F, "scaled_dot_product_attention", sdpa)` hides
torch's function for a while and restores it (a fixture forcing a module's manual path): the restored value is
torch's own. `F.scaled_dot_product_attention = sharpened` is a replacement (breaker round 15: the patched block then
called it). Read with CPython's parser; a value the file does not show to be a read of the same attribute is another
function.
"""

from __future__ import annotations

import ast
from collections import Counter

from advisor.static.python_ast import nodes, python_tree

NAMESPACE_READS = frozenset({"pop", "get", "__getitem__"})  # `F.__dict__.pop(name)`, `vars(F).get(name)`


def replaces(text: str, leaf: str) -> bool:
    """Whether `text` writes an attribute named `leaf` (`x.leaf = v`, `setattr(x, "leaf", v)`, `x.__dict__["leaf"] =
    v`, `vars(x).update(leaf=v)`, a computed name) with a value other than a read of that same attribute. True for
    source CPython cannot parse."""
    try:
        tree = python_tree(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True
    stores = Counter(node.id for node in nodes(tree) if type(node) is ast.Name and type(node.ctx) is ast.Store)
    taken = {target.id for node in nodes(tree) if type(node) is ast.Assign and _reads(node.value, leaf)
             for target in node.targets if type(target) is ast.Name and stores[target.id] == 1}
    for node in nodes(tree):
        value = _written_value(node, leaf)
        if value is not None and not (_reads(value, leaf) or type(value) is ast.Name and value.id in taken):
            return True
    return False


def _written_value(node: ast.AST, leaf: str) -> ast.AST | None:
    """The value `node` binds to an attribute named `leaf` (or may: an update or a computed name), if any."""
    if type(node) in (ast.Assign, ast.AnnAssign, ast.AugAssign):
        targets = node.targets if type(node) is ast.Assign else [node.target]
        if any(type(t) is ast.Attribute and t.attr == leaf or type(t) is ast.Subscript and _names(t.slice, leaf)
               for t in targets):
            return node.value if type(node) is not ast.AugAssign else node
    if type(node) is ast.Call:
        func = node.func
        name = func.attr if type(func) is ast.Attribute else func.id if type(func) is ast.Name else None
        if name in ("setattr", "__setattr__") and len(node.args) >= 3 and not _literal_other(node.args[1], leaf):
            return node.args[2]
        if name in ("update", "setdefault") and (any(k.arg in (leaf, None) for k in node.keywords) or node.args and
                                                 not (name == "setdefault" and _literal_other(node.args[0], leaf))):
            return node  # a namespace updated: the value is not read here
    return None


def _reads(value: ast.AST, leaf: str) -> bool:
    """`F.leaf`, `getattr(F, "leaf")`, `F.__dict__.pop("leaf")`, `vars(F)["leaf"]`: a read of the attribute."""
    if type(value) is ast.Attribute:
        return value.attr == leaf
    if type(value) is ast.Subscript:
        return _names(value.slice, leaf)
    if type(value) is ast.Call:
        func = value.func
        name = func.attr if type(func) is ast.Attribute else func.id if type(func) is ast.Name else None
        position = 1 if name == "getattr" else 0 if name in NAMESPACE_READS else None
        return position is not None and len(value.args) > position and _names(value.args[position], leaf)
    return False


def _names(node: ast.AST, leaf: str) -> bool:
    return type(node) is ast.Constant and node.value == leaf


def _literal_other(node: ast.AST, leaf: str) -> bool:
    """A literal string naming another attribute (a computed name may be this one)."""
    return type(node) is ast.Constant and node.value != leaf

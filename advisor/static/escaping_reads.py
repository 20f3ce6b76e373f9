"""Reads of an attribute on another object that may hand its tensor on, in the other files of a scanned tree
(CPython's `ast`, in the tree-wide pass; the analysed file's own reads are static/attribute_escapes.py's, with libcst).

`reg.add(model.bias)`, `rows += model.bias`, `get(model).fill_(1)` with `def get(m): return m.bias`,
`next(model.buffers())`, `model._buffers.get("bias")`, `operator.attrgetter("bias")(model)` (a thirteenth breaker's
round): what a file does to the tensor after handing it on is no write on `.bias` that static/outside_writes.py can
see. So a read of `.bias` on anything but `self`, or of the name `"bias"` through `getattr`-like access, counts
unless what encloses it only computes a new value from it or reads its metadata: arithmetic, a comparison, a torch
function that is not in place and returns no view, a harmless builtin, a metadata attribute, a fresh method, or a
view of it that is itself read so. Anything else (an alias, a container, a return, a call of a function of the
file or of a library, iteration, a view handed on) hands it on. A module's tensors listed whole (`buffers()`,
`state_dict()`) and handed on count as every attribute (`*listed`), and `_apply` or a lookup by a computed name as
any tensor (`*tensor`). Conservative by design: a read this cannot classify counts.
"""

from __future__ import annotations

import ast

from advisor.static.outside_writes import ANY_LISTED, ANY_TENSOR, in_place_name
from advisor.static.python_ast import parent_map
from advisor.static.tensor_reads import FRESH_METHODS, HARMLESS_BUILTINS, METADATA, SHARING_METHODS, TORCH_SHARING

# methods whose result is the tensor's own data or a view of it: followed to what encloses them
VIEWING = SHARING_METHODS | {"data", "T", "mT", "H", "mH", "real", "imag"}
# access by a string: (`getattr(m, "bias")`, `m.__getattr__("bias")`, `m._buffers.get("bias")`)
# (not `get_submodule`: a module handed on is written by the names of its attributes, which outside_writes reads)
NAMED_GETTERS = frozenset({"__getattr__", "__getattribute__", "get", "pop", "get_buffer", "get_parameter",
                           "__getitem__"})
# a module's tensors listed whole (its parameters are trained: their values are no proof's)
TENSOR_LISTINGS = ("buffers", "named_buffers", "state_dict")
NAMESPACES = ("_buffers", "_parameters", "__dict__", "_modules")
TABLE_LISTINGS = ("values", "items")  # a namespace's tensors listed whole
PLAIN_BUILTINS = HARMLESS_BUILTINS | {"hasattr", "id", "type", "callable"}
MAX_DEPTH = 8


def escaping_reads(tree: ast.Module, dotted, narrowing) -> set[str]:
    """The attribute names (`*` for any) the file reads on other objects in ways that may hand their tensors on,
    each with the `isinstance` narrowing of the object read (`narrowing(node)`: outside_writes' suffix, "" for
    none). `dotted(node)`: the dotted name an expression refers to through the file's imports, or None."""
    parents = parent_map(tree)
    reader = _Reader(parents, dotted)
    found: set[str] = set()
    for node in parents:
        name = reader.accessed(node)
        reader.by_name = not isinstance(node, ast.Attribute)  # writes through it are no write on `.name` either
        if name == ANY_TENSOR and reader.stores(node) or name is not None and not reader.plain(node, 0):
            found.add(name + narrowing(node))
    return found


class _Reader:
    def __init__(self, parents: dict[ast.AST, ast.AST], dotted) -> None:
        self.parents, self.dotted = parents, dotted
        self.by_name = False  # the read names the attribute by a string: outside_writes reads no write through it

    def accessed(self, node: ast.AST) -> str | None:
        """The attribute `node` reads the value of on an object other than `self`, if it reads one: `m.bias`,
        `getattr(m, "bias")`, `m._buffers["bias"]`, `m.get_buffer("attn.bias")` (its last name), `m.buffers()`
        (any)."""
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and not _on_self(node.value):
            parent = self.parents.get(node)
            if isinstance(parent, ast.Call) and parent.func is node or self.dotted(node) is not None:
                return None  # a method called (its result is read as the call's), a module's or torch's name
            return node.attr
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2 and \
                    not _on_self(node.args[0]):
                return _name(node.args[1]) or ANY_TENSOR
            if isinstance(func, ast.Attribute) and func.attr in NAMED_GETTERS and node.args and \
                    (func.attr.startswith(("get_", "__get")) or _namespace(func.value)) and \
                    not _on_self(_owner(func.value)):
                return _name(node.args[0]) or ANY_TENSOR
            if isinstance(func, ast.Attribute) and func.attr == "_apply" and not _on_self(func.value):
                return ANY_TENSOR
            if isinstance(func, ast.Attribute) and func.attr in TENSOR_LISTINGS and not _on_self(func.value):
                return ANY_LISTED
            if isinstance(func, ast.Attribute) and func.attr in TABLE_LISTINGS and _namespace(func.value) and \
                    not _on_self(_owner(func.value)):  # `for b in m._buffers.values(): b.fill_(1)` (round 18)
                return ANY_LISTED
            if any(isinstance(arg, ast.Name) and arg.id == "getattr" or self.dotted(arg) == "operator.attrgetter"
                   for arg in node.args):  # `reduce(getattr, ["bias"], m)`: names as data
                return ANY_TENSOR
            if self.dotted(func) == "operator.attrgetter" or isinstance(func, ast.Call) and \
                    self.dotted(func.func) == "operator.attrgetter":
                return ANY_TENSOR if not isinstance(func, ast.Call) else \
                    next((_name(arg) for arg in func.args if _name(arg)), ANY_TENSOR)
            if isinstance(func, ast.Attribute) and not _on_self(func.value) and self.dotted(func) is None:
                return f"{func.attr}()"  # a method's result (`model.causal_mask().fill_(1)`): what it returns
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _namespace(node.value) and \
                not _on_self(_owner(node.value)):
            return _name(node.slice) or ANY_TENSOR
        return None

    def stores(self, node: ast.AST) -> bool:
        """`m._apply(f)` stores what `f` returns for each tensor, whatever encloses the call."""
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_apply" or \
            not self.plain(node, 0)

    def plain(self, node: ast.AST, depth: int) -> bool:
        """What encloses `node` only reads the tensor it holds (see the module docstring)."""
        parent = self.parents.get(node)
        if depth > MAX_DEPTH or parent is None:
            return False
        if isinstance(parent, (ast.BinOp, ast.Compare, ast.UnaryOp, ast.Expr, ast.FormattedValue, ast.Assert)):
            return True
        if isinstance(parent, (ast.If, ast.While)) or isinstance(parent, ast.IfExp) and parent.test is node:
            return True
        if isinstance(parent, (ast.BoolOp, ast.IfExp)):
            return self.plain(parent, depth + 1)  # `m.bias or t` is `m.bias` itself
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return isinstance(parent.ctx, ast.Load) and self.plain(parent, depth + 1)  # basic indexing: a view
        if isinstance(parent, ast.Attribute) and parent.value is node:
            called = self.parents.get(parent)
            if isinstance(called, ast.Call) and called.func is parent:
                return self._method(parent.attr, called, depth)
            if parent.attr in VIEWING:
                return self.plain(parent, depth + 1)
            return True  # metadata, or an attribute of a module (`m.attn.bias` is read as `.bias`)
        if isinstance(parent, ast.Call) and node in parent.args:
            return self._argument(parent, depth)
        if isinstance(parent, ast.keyword) and isinstance(self.parents.get(parent), ast.Call):
            return parent.arg != "out" and self._argument(self.parents[parent], depth)
        return False  # an alias, a container, a return, iteration, a lambda's body, ...

    def _method(self, method: str, call: ast.Call, depth: int) -> bool:
        if method in FRESH_METHODS or method in METADATA or method == "keys":
            return True  # `m.state_dict().keys()`: the names alone
        if method in SHARING_METHODS:
            return self.plain(call, depth + 1)
        return in_place_name(method) and not self.by_name  # a write outside_writes reads

    def _argument(self, call: ast.Call, depth: int) -> bool:
        dotted = self.dotted(call.func) or ""
        if isinstance(call.func, ast.Name) and call.func.id in PLAIN_BUILTINS and dotted == "":
            return True
        if dotted.startswith("torch."):
            function = dotted.rsplit(".", 1)[-1]
            if in_place_name(function):
                return not self.by_name  # a write outside_writes reads
            return self.plain(call, depth + 1) if dotted in TORCH_SHARING else True
        return False


def _on_self(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls") or \
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _namespace(node: ast.AST) -> bool:
    """A module's table of attributes: `m._buffers`, `m.__dict__`, `vars(m)`, `m.state_dict()`."""
    return isinstance(node, ast.Attribute) and node.attr in NAMESPACES or isinstance(node, ast.Call) and (
        isinstance(node.func, ast.Name) and node.func.id == "vars" or
        isinstance(node.func, ast.Attribute) and node.func.attr == "state_dict")


def _owner(node: ast.AST) -> ast.AST:
    """`m` of `m._buffers`, `vars(m)`, `m.state_dict()` (the object a table belongs to), or the node itself."""
    if isinstance(node, ast.Attribute) and node.attr in NAMESPACES:
        return node.value
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name):
        return node.args[0]
    return node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else node


def _name(node: ast.AST) -> str | None:
    """The attribute a string names: `"bias"`, `"attn.bias"`'s last name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
        last = node.value.rsplit(".", 1)[-1]
        return last if last.isidentifier() else None
    return None

"""Whether another file of the scanned tree may write a module-level tensor of this one (`BIAS = torch.randn(...)`).

A proof that reads such a tensor's one definition (patterns/module_values.py) holds only where no other module
changes it. Another file reaches it through an import: `from pkg.attn import BIAS` (or `*`), `import pkg.attn as
a` then `a.BIAS`, or a module that re-exports it that way (`from .attn import *` in the package's `__init__`, then
`from pkg import BIAS`). Each read there is held to what a read here is held to (static/tensor_reads.py: it only
computes new tensors from it or reads its metadata), and may be passed to a function of another file of the tree
that holds its parameter to the same. A module object used whole (`vars(a)`, `getattr(a, name)`),
`__globals__` anywhere, or the import machinery (`sys.modules[...]`, `importlib.import_module`) in a file that names
the module reaches any of its globals. Files are found through the tree's word index (every import names the
module's stem); the analysis notes them as read, so a cached result is dropped when any of them changes.
"""

from __future__ import annotations

import os

import libcst as cst

from advisor.static.call_sites import Tree, module_stem
from advisor.static.module_index import ParsedModule
from advisor.static.tensor_reads import leaves_alone, local_reads_leave_alone

MODULE_OBJECT_SOURCES = {"sys.modules", "importlib.import_module", "importlib.reload"}
REBINDING_PARENTS = (cst.AssignTarget, cst.Param, cst.ImportAlias, cst.AsName, cst.Del, cst.NameItem,
                     cst.FunctionDef, cst.ClassDef)


def written_elsewhere(parsed: ParsedModule, tree: Tree, name: str) -> str | None:
    """The first other file of `tree` that may write (or let escape) the module-level tensor `name` of `parsed`,
    as a path; None where every file importing it only reads it."""
    here = os.path.realpath(parsed.path)
    through_globals = [path for path in tree.mentioning("__globals__") if os.path.realpath(path) != here]
    if through_globals:  # `f.__globals__["BIAS"]` of any function of the module
        return through_globals[0]
    stems, done = [module_stem(parsed.path)], {here}
    while stems:  # the module, then each module that re-exports the name
        stem = stems.pop()
        for path in tree.mentioning(stem):
            real = os.path.realpath(path)
            other = tree.parsed(path) if real not in done else None
            if other is None:
                continue
            reaches, exports = _reads_of(other, stem, name)
            if reaches is None or not all(leaves_alone(other, node, 0) or _handed_to_reader(other, tree, node)
                                          for node in reaches):
                return path
            if exports:
                done.add(real)
                stems.append(module_stem(path))
    return None


def _reads_of(other: ParsedModule, stem: str, name: str) -> tuple[list[cst.BaseExpression] | None, bool]:
    """The reads in `other` of the global `name` of a module whose import ends with `stem`, and whether `other`
    binds the name at its module level by importing it (it re-exports it); None for the reads where `other` may
    reach any global of that module (the module object used whole, the import machinery)."""
    locals_, modules, exports = set(), set(), False
    for node in other.nodes_of(cst.ImportFrom, cst.Import):
        if isinstance(node, cst.ImportFrom):
            source = other.code(node.module).strip() if node.module is not None else ""
            if isinstance(node.names, cst.ImportStar):
                if source.split(".")[-1] == stem:
                    locals_.add(name)
                    exports = True
                continue
            for alias in node.names:
                imported, bound = other.code(alias.name).strip(), _bound(other, alias)
                if imported == stem:  # `from pkg import attn`: the module itself
                    modules.add(bound)
                elif imported == name and source.split(".")[-1] == stem:
                    locals_.add(bound)
                    exports = exports or other.innermost(node, (cst.FunctionDef, cst.ClassDef)) is None
        else:
            for alias in node.names:
                dotted = other.code(alias.name).strip()
                if dotted.split(".")[-1] == stem:
                    modules.add(_bound(other, alias) if alias.asname is not None else dotted)
    reads: list[cst.BaseExpression] = []
    roots = {module.split(".")[0] for module in modules}
    for node in other.nodes_of(cst.Name, cst.Attribute):
        parent = other.parents.get(node)
        if isinstance(node, cst.Attribute):
            if other.imported_name(node) in MODULE_OBJECT_SOURCES and not _own_module(other, node):
                return None, exports
            if _root(node) not in roots:
                continue  # no module alias of it: generating the attribute's code costs more than this
            if other.code(node).strip() in modules and not (isinstance(parent, cst.Attribute) and
                                                            parent.value is node):
                return None, exports  # `vars(pkg.attn)`
            if other.code(node.value).strip() in modules:
                if node.attr.value == name:
                    reads.append(node)
                elif node.attr.value.startswith("__"):  # `a.__dict__`, `a.__getattribute__`
                    return None, exports
            continue
        if isinstance(parent, cst.Attribute) and parent.attr is node or isinstance(parent, REBINDING_PARENTS):
            continue  # an attribute's name, or a binding of the other file's own name
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            continue
        if node.value in modules and not (isinstance(parent, cst.Attribute) and parent.value is node):
            return None, exports  # `vars(a)`, `getattr(a, "BIAS")`, `f(a)`
        if node.value in locals_:
            reads.append(node)
    return reads, exports


def _handed_to_reader(other: ParsedModule, tree: Tree, node: cst.BaseExpression) -> bool:
    """`util.r(program.MASK)`: passed by position to a module-level function of another file of the tree (found by
    the import's last name and the function's), every read of whose parameter there leaves the tensor alone."""
    arg, call = other.parents.get(node), other.parents.get(other.parents.get(node))
    if not (isinstance(arg, cst.Arg) and isinstance(call, cst.Call) and arg.keyword is None and not arg.star):
        return False
    module, _, function = (other.imported_name(call.func) or "").rpartition(".")
    position = call.args.index(arg)
    if not module or any(a.keyword is not None or a.star for a in call.args[:position]):
        return False
    for path in tree.mentioning(function):
        callee = tree.parsed(path) if module_stem(path) == module.split(".")[-1] else None
        definition = callee.module_functions.get(function) if callee is not None else None
        if definition is not None:
            params = [*definition.params.posonly_params, *definition.params.params]
            return position < len(params) and local_reads_leave_alone(callee, definition, params[position].name.value)
    return False


def _root(node: cst.Attribute) -> str | None:
    """`a` of `a.b.c`."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def _bound(other: ParsedModule, alias: cst.ImportAlias) -> str:
    """The name an import alias binds."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return other.code(alias.name).strip().split(".")[0]


def _own_module(other: ParsedModule, node: cst.Attribute) -> bool:
    """`sys.modules[__name__]`: the file's own module object (a lazy package's `__init__` replaces it)."""
    subscript = other.parents.get(node)
    return isinstance(subscript, cst.Subscript) and subscript.value is node and len(subscript.slice) == 1 and \
        isinstance(subscript.slice[0].slice, cst.Index) and \
        isinstance(subscript.slice[0].slice.value, cst.Name) and subscript.slice[0].slice.value.value == "__name__"

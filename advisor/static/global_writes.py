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

from advisor.static.call_sites import Tree, base_parts, module_matches, module_stem
from advisor.static.global_reach import MODULE_OBJECT_SOURCES, reached_by_name
from advisor.static.module_index import ParsedModule
from advisor.static.tensor_reads import leaves_alone, local_reads_leave_alone



def written_elsewhere(parsed: ParsedModule, tree: Tree, name: str) -> str | None:
    """The first other file of `tree` that may write (or let escape) the module-level tensor `name` of `parsed`,
    as a path; None where every file importing it only reads it."""
    here = os.path.realpath(parsed.path)
    through = through_globals(parsed, tree)
    if through is not None:
        return through
    pending = [(parsed.path, {name} | _module_level_aliases(parsed, {name}))]
    done = {here}
    while pending:  # the module, then each module that re-exports the tensor, under each name it has there
        module, names = pending.pop()
        stem = module_stem(module)
        for path in _importers(tree, module):
            real = os.path.realpath(path)
            other = tree.parsed(path) if real not in done else None
            if other is None:
                continue
            reaches, exports = _reads_of(other, stem, names)
            if reaches is None or not all(leaves_alone(other, node, 0) or _handed_to_reader(other, tree, node)
                                          for node in reaches):
                return path
            if exports:
                done.add(real)
                pending.append((path, exports))
    return None


def _importers(tree: Tree, module: str) -> list[str]:
    """The files of the tree that may import `module`: those naming its stem and, for a package's `__init__`, every
    file inside the package (`from . import *` names nothing)."""
    found = tree.mentioning(module_stem(module))
    if os.path.basename(module) == "__init__.py":
        folder = os.path.dirname(os.path.realpath(module)) + os.sep
        found = found + [path for path in tree.paths if os.path.realpath(path).startswith(folder) and path not in found]
    return found


def through_globals(parsed: ParsedModule, tree: Tree) -> str | None:
    """Another file of the tree that reads a function's `__globals__`, which rebinds any global of its module, a
    number's too (`attention.__globals__["NEG"] = 0.0`), whatever names it uses to reach the function."""
    here = os.path.realpath(parsed.path)
    return next((path for path in tree.mentioning("__globals__") if os.path.realpath(path) != here), None)


def _reads_of(other: ParsedModule, stem: str, names: set[str]) -> tuple[list[cst.BaseExpression] | None, set[str]]:
    """The reads in `other` of the globals `names` of a module whose import ends with `stem`, and the names `other`
    binds them to at its module level (by importing them, `from .attn import MASK as PAD`, or assigning them, `PAD =
    MASK`): it re-exports them. None for the reads where `other` may reach any global of that module (the module
    object used whole, the import machinery)."""
    locals_, modules, exports = set(), set(), set()
    for node in other.nodes_of(cst.ImportFrom, cst.Import):
        at_module_level = other.innermost(node, (cst.FunctionDef, cst.ClassDef)) is None
        if isinstance(node, cst.ImportFrom):
            source = (base_parts(other, node) or [""])[-1]  # the last name of the module it imports from
            if isinstance(node.names, cst.ImportStar):
                if source == stem:
                    locals_ |= names
                    exports |= names
                continue
            for alias in node.names:
                imported, bound = other.code(alias.name).strip(), _bound(other, alias)
                if imported == stem:  # `from pkg import attn`: the module itself
                    modules.add(bound)
                elif imported in names and source == stem:
                    locals_.add(bound)
                    exports |= {bound} if at_module_level else set()
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
                if node.attr.value in names:
                    reads.append(node)
                elif node.attr.value.startswith("__"):  # `a.__dict__`, `a.__getattribute__`
                    return None, exports
            continue
        if isinstance(parent, cst.Attribute) and parent.attr is node or _binds(parent, node):
            continue  # an attribute's name, or a binding of the other file's own name
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            continue
        if node.value in modules and not (isinstance(parent, cst.Attribute) and parent.value is node):
            return None, exports  # `vars(a)`, `getattr(a, "BIAS")`, `f(a)`
        if node.value in locals_:
            reads.append(node)
    if (locals_ or modules) and any(reached_by_name(other, name, star=False) for name in names | {stem}):
        return None, exports  # `globals()["MASK"]`, `exec("MASK[1] = 0")`, `__import__("pkg.attn")`
    return reads, exports | _module_level_aliases(other, locals_ | {f"{m}.{n}" for m in modules for n in names})


def _module_level_aliases(parsed: ParsedModule, names: set[str]) -> set[str]:
    """The module-level names assigned a value that reads one of `names` (`PAD = MASK`, `M2 = MASK[None]`,
    `P = attn.MASK`): another module may import the tensor, or a view of it, under them."""
    found: set[str] = set()
    for assign in parsed.nodes_of(cst.Assign, cst.AnnAssign, cst.AugAssign):
        if assign.value is None or parsed.innermost(assign, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) is not None:
            continue
        read = {parsed.code(node).strip() for node in _under(assign.value)
                if isinstance(node, (cst.Name, cst.Attribute))}
        if read & names:
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            found |= {node.value for target in targets for node in _under(target) if isinstance(node, cst.Name)}
    return found


def _handed_to_reader(other: ParsedModule, tree: Tree, node: cst.BaseExpression) -> bool:
    """`util.r(program.MASK)`: passed by position to an undecorated module-level function of the one file of the
    tree the import can name, every read of whose parameter there leaves the tensor alone."""
    arg, call = other.parents.get(node), other.parents.get(other.parents.get(node))
    if not (isinstance(arg, cst.Arg) and isinstance(call, cst.Call) and arg.keyword is None and not arg.star):
        return False
    module, _, function = (other.imported_name(call.func) or "").rpartition(".")
    position = call.args.index(arg)
    if not module or any(a.keyword is not None or a.star for a in call.args[:position]):
        return False
    parts = [part for part in module.split(".") if part]
    files = [path for path in tree.mentioning(function) if module_matches(parts, path)]
    callee = tree.parsed(files[0]) if len(files) == 1 else None  # two files it may be: neither is read
    definition = callee.module_functions.get(function) if callee is not None else None
    if definition is None or definition.decorators:  # a decorator's wrapper runs, not the body read
        return False
    params = [*definition.params.posonly_params, *definition.params.params]
    return position < len(params) and local_reads_leave_alone(callee, definition, params[position].name.value)


def _under(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node` and every node below it."""
    found, pending = [], [node]
    while pending:
        found.append(current := pending.pop())
        pending.extend(current.children)
    return found


def _binds(parent: cst.CSTNode | None, node: cst.Name) -> bool:
    """`node` is the name a binding binds (not a parameter's default, nor a value deleted by subscript)."""
    if isinstance(parent, (cst.AssignTarget, cst.Del)):
        return parent.target is node
    if isinstance(parent, (cst.Param, cst.AsName, cst.FunctionDef, cst.ClassDef, cst.NameItem)):
        return parent.name is node
    return isinstance(parent, cst.ImportAlias)


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

"""What one file writes on objects other than a method's own `self`, read with CPython's parser: the tree-wide part
of the run-time identity facts (static.project), for every file of a scan.

`ParsedModule.outside_attribute_writes` reads the analysed file itself with libcst; the other files of the tree
are read here instead, since most files of a real tree write some attribute (`module.weight.data.normal_()` in
weight init) and a libcst parse of each costs about 13x `ast.parse` (100 files of transformers: 38 s against
2.8 s). It reads the same writes, with the same names: `m.a = v`, `m.a.data = v` (both `a` and `data`), `m.a[i] = v`
(into the elements), in-place methods (`m.a.fill_(1)`; `set_`/`resize_`... reshape), bindings by name (`setattr`,
`register_buffer`, `add_module`, attribute tables: a computed name is `*`, or `*identity` where it binds only a
fresh `nn.Identity()`), state-dict loaders, and a torch function replaced (`F.softmax = f`: its dotted name).
"""

from __future__ import annotations

import ast

from advisor.static.module_index import (ANY_ATTRIBUTE, ANY_TO_IDENTITY, ATTRIBUTE_TABLES, IDENTITY, NAMED_BINDERS,
                                         REGISTRATION_HOOKS, RESHAPING_IN_PLACE, STATE_LOADERS)


def outside_writes_of_source(text: str) -> tuple[set[str], set[str]]:
    """(names written on other objects, those written otherwise than into their elements); empty for source
    CPython cannot parse (the scan reports it)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set(), set()
    collector = _Writes(_imports(tree))
    collector.visit(tree)
    return collector.names, collector.reshaped


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted module or object (the first binding wins), as module_index reads them."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.asname or alias.name.split(".")[0],
                                 alias.name if alias.asname else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                found.setdefault(alias.asname or alias.name, f"{node.module}.{alias.name}")
    return found


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _Writes(ast.NodeVisitor):
    def __init__(self, imports: dict[str, str]) -> None:
        self.imports = imports
        self.names: set[str] = set()
        self.reshaped: set[str] = set()

    def write(self, name: str, elements_only: bool = False) -> None:
        self.names.add(name)
        if not elements_only:
            self.reshaped.add(name)

    def dotted(self, node: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.imports:
            return None
        return ".".join([self.imports[node.id], *parts[::-1]])

    def torch_function(self, node: ast.AST, name: str | None = None) -> None:
        dotted = self.dotted(node)
        if dotted is not None and (dotted == "torch" or dotted.startswith("torch.")):
            self.write(f"{dotted}.{name}" if name else dotted)

    def any_name(self, value: ast.AST | None) -> str:
        """What a binding under a computed name may put anywhere: a fresh `nn.Identity()`, or anything."""
        identity = isinstance(value, ast.Call) and not value.args and \
            self.dotted(value.func) in IDENTITY
        return ANY_TO_IDENTITY if identity else ANY_ATTRIBUTE

    def target(self, node: ast.AST, elements_only: bool = False, value: ast.AST | None = None) -> None:
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                self.target(element)
            return
        table = isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and \
            node.value.attr in ATTRIBUTE_TABLES
        if table and not _is_self(node.value.value):
            self.write(_literal(node.slice) or self.any_name(value))
        into = elements_only or not table and isinstance(node, ast.Subscript)  # `m._modules[n] = v` rebinds
        walked = node
        while isinstance(walked, (ast.Subscript, ast.Attribute)):
            if isinstance(walked, ast.Attribute) and not _is_self(walked.value):
                self.write(walked.attr, into)
            walked = walked.value
        if isinstance(node, ast.Attribute):  # `matmul = torch.matmul` binds a name of this file, not torch's
            self.torch_function(node)
        root = node
        while isinstance(root, ast.Subscript) or isinstance(root, ast.Attribute) and root.attr == "data":
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.imports:  # `from m import MASK; MASK[0] = v`
            self.write(self.imports[root.id].rsplit(".", 1)[-1], into)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.target(target, value=node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.target(node.target)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, [a for a in node.args if not isinstance(a, ast.Starred)]
        binding = None
        if isinstance(func, ast.Name) and func.id == "setattr" and len(args) >= 2:
            binding = (args[0], args[1], args[2] if len(args) > 2 else None)
        elif isinstance(func, ast.Attribute) and func.attr in NAMED_BINDERS:
            if isinstance(func.value, ast.Name) and func.value.id == "object" and len(args) >= 2:
                binding = (args[0], args[1], args[2] if len(args) > 2 else None)
            else:
                keyword = next((k.value for k in node.keywords if k.arg == "name"), None)
                name = args[0] if args else keyword
                binding = (func.value, name, args[1] if len(args) > 1 else None) if name is not None else None
        if binding is not None and not _is_self(binding[0]):
            receiver, name, value = binding
            literal = _literal(name)
            if literal:
                self.write(literal)
                self.torch_function(receiver, literal)
            else:
                self.write(self.any_name(value))
        elif isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_"):
            self.target(func.value, elements_only=func.attr not in RESHAPING_IN_PLACE)
        elif isinstance(func, ast.Attribute) and func.attr in STATE_LOADERS and not _is_self(func.value):
            self.write(ANY_ATTRIBUTE)
        elif (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in REGISTRATION_HOOKS:
            self.write(ANY_ATTRIBUTE)
        self.generic_visit(node)

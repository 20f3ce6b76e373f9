"""One parsed file: libcst metadata (qualified names, parents, positions) and what each class binds on self."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from advisor.rewrite.splice import LineIndex
from advisor.static.dataflow import FunctionFlow, build_flow, is_inplace_method


@dataclass(eq=False)
class ClassInfo:
    """`self.x = ...` and `self.register_buffer("x", ...)` seen in any method of a class."""

    node: cst.ClassDef
    methods: dict[str, cst.FunctionDef] = field(default_factory=dict)
    outside: frozenset[str] = frozenset()  # attribute names the file writes on objects other than `self`

    @cached_property
    def _collected(self) -> "_SelfAttributeCollector":
        collector = _SelfAttributeCollector()
        for method in self.methods.values():
            method.visit(collector)
        return collector

    @property
    def attributes(self) -> dict[str, list[cst.BaseExpression]]:
        return self._collected.attributes

    @property
    def mutated(self) -> set[str]:
        """Attributes some method writes in place (`self.x[i] = v`, `self.x += v`, `self.x.fill_(v)`, `out=`):
        their value is not the one expression assigned to them."""
        return self._collected.mutated

    @property
    def unfollowed(self) -> set[str]:
        return self._collected.unfollowed

    def only_value(self, attribute: str) -> cst.BaseExpression | None:
        values = self.attributes.get(attribute, [])
        single = len(values) == 1 and attribute not in self.mutated and attribute not in self.unfollowed \
            and attribute not in self.outside
        return values[0] if single else None


class ParsedModule:
    """A file parsed once; every analysis of it shares this metadata."""

    def __init__(self, source: str, path: str) -> None:
        self.source = source
        self.path = path
        self.wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        self.module = self.wrapper.module
        self._flows: dict[cst.FunctionDef, FunctionFlow] = {}

    @cached_property
    def parents(self) -> dict[cst.CSTNode, cst.CSTNode]:
        """Node -> parent, the map libcst's ParentNodeProvider gives, built by reading the node dataclasses' fields
        directly (7x faster than the provider's visitor on a large file; tests/test_module_index checks equality).
        Its keys come depth first, each node before its children, fields in declaration order."""
        parents: dict[cst.CSTNode, cst.CSTNode] = {}
        pending: list[tuple[cst.CSTNode, cst.CSTNode | None]] = [(self.module, None)]
        while pending:
            node, parent = pending.pop()
            if parent is not None:
                parents[node] = parent  # on the way down, so the keys come in libcst's visiting order
            children = [child for name in _child_fields(type(node))
                        for child in _as_sequence(getattr(node, name)) if isinstance(child, cst.CSTNode)]
            pending.extend((child, node) for child in reversed(children))
        return parents

    @cached_property
    def positions(self):
        """Resolved only when a finding needs a line number: it regenerates the whole file's code."""
        return self.wrapper.resolve(PositionProvider)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    @cached_property
    def statement_spans(self) -> dict[cst.CSTNode, tuple[int, int]] | None:
        """Where each top-level statement's code (leading comments and blank lines included) lies in the source,
        so a rewrite can regenerate only the statements it changes. Checked, not assumed: each statement must
        render to exactly its slice of the source; None when any does not (then rewrites render the module)."""
        header = "".join(self.code(line) for line in self.module.header)
        if not self.source.startswith(header):
            return None
        spans, cursor = {}, len(header)
        for statement in self.module.body:
            code = self.code(statement)
            if not self.source.startswith(code, cursor):
                return None
            spans[statement] = (cursor, cursor + len(code))
            cursor += len(code)
        return spans

    @cached_property
    def lines(self) -> LineIndex:
        return LineIndex(self.source)

    @cached_property
    def words(self) -> frozenset[str]:
        """Whitespace-separated tokens of the source (computed once; rewrites ask per finding)."""
        return frozenset(self.source.split())

    def innermost(self, node: cst.CSTNode, kind: type | tuple[type, ...]) -> cst.CSTNode | None:
        """`node` itself when it is a `kind`, else its nearest ancestor that is one (None at the module)."""
        while node is not None and not isinstance(node, kind):
            node = self.parents.get(node)
        return node

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def end_line(self, node: cst.CSTNode) -> int:
        return self.positions[node].end.line

    def imported_name(self, node: cst.CSTNode) -> str | None:
        """The dotted name an expression refers to through imports ('torch.nn.functional.softmax'), or a
        builtin's name ('float'); None for anything else. Imports are resolved from the file's import
        statements (libcst's scope-based QualifiedNameProvider costs ~2x the whole analysis)."""
        parts: list[str] = []
        while isinstance(node, cst.Attribute):
            parts.append(node.attr.value)
            node = node.value
        if not isinstance(node, cst.Name):
            return None
        base = self.imports.get(node.value)
        if base is not None and node.value in self.bound_names:
            return None  # the import's name is rebound somewhere in the file: which object it is here is not seen
        if base is None:
            return node.value if not parts and node.value in BUILTINS and node.value not in self.bound_names else None
        return ".".join([base] + parts[::-1])

    @cached_property
    def imports(self) -> dict[str, str]:
        """Local name -> dotted module or object, from every import statement in the file."""
        return _imports(self)

    @cached_property
    def module_functions(self) -> dict[str, cst.FunctionDef]:
        return {s.name.value: s for s in self.module.body if isinstance(s, cst.FunctionDef)}

    @cached_property
    def bindings(self) -> dict[str, list[cst.Name]]:
        """Every binding target in the file other than imports, by name."""
        found: dict[str, list[cst.Name]] = {}
        for name in _assigned_names(self.parents.items()):
            found.setdefault(name.value, []).append(name)
        return found

    @property
    def bound_names(self) -> set[str]:
        """Names bound anywhere in the file other than by imports (so a local `max = ...` is not taken for the
        builtin, nor a local `F = ...` for the imported module)."""
        return set(self.bindings)

    @cached_property
    def module_aliases(self) -> dict[str, str]:
        """Dotted module -> the local name it is bound to at module level: {'torch.nn.functional': 'F'}. A name
        also bound otherwise (`F = ...`, `for torch in ...`) is left out: code emitted with it could mean another
        object."""
        aliases: dict[str, str] = {}
        for local, dotted in self.imports.items():
            if local not in self.bound_names:
                aliases.setdefault(dotted, local)
        return aliases

    @cached_property
    def calls_and_classes(self) -> tuple[list[cst.Call], list[cst.ClassDef]]:
        """Every call and every class statement of the file, in one walk (for file-wide questions: hooks
        registered, modules scripted, subclasses)."""
        nodes = self.parents  # in visiting order
        return [n for n in nodes if isinstance(n, cst.Call)], [n for n in nodes if isinstance(n, cst.ClassDef)]

    def flow(self, function: cst.FunctionDef) -> FunctionFlow:
        if function not in self._flows:
            first_id = 1_000_000 * len(self._flows)  # file-unique ids: flows of two functions can merge
            self._flows[function] = build_flow(function, first_id)
        return self._flows[function]

    @cached_property
    def functions(self) -> list[tuple[cst.FunctionDef, ClassInfo | None, str]]:
        """Every function with its enclosing class (if a method) and its dotted name."""
        collector = _FunctionCollector()
        self.module.visit(collector)
        outside = self.outside_attribute_writes
        for info in {id(owner): owner for _, owner, _ in collector.found if owner is not None}.values():
            info.outside = outside
        return collector.found

    @cached_property
    def outside_attribute_writes(self) -> frozenset[str]:
        """Names of attributes this file writes on some object other than a method's own `self`
        (`model.attn.scale = ...`, `block.bias[:, :2] = 1`, `setattr(m, "softmax", ...)`, `m.bias.fill_(1)`).
        Any instance's attribute of that name may then hold another value than its class assigns, so no proof
        may read the class's own assignment as the value. Writes from other files are not seen."""
        collector = _OutsideWriteCollector()
        self.module.visit(collector)
        return frozenset(collector.names)



BUILTINS = {"float", "int", "len", "max", "min", "abs", "round", "pow", "map", "bool"}


def _imports(parsed: "ParsedModule") -> dict[str, str]:
    """Local name -> dotted module or object, from the file's import statements in source order (the first binding
    of a name wins)."""
    imports: dict[str, str] = {}
    for node in parsed.parents:
        if isinstance(node, cst.Import):
            for alias in node.names:
                dotted = parsed.code(alias.name)
                if alias.asname is not None:
                    imports.setdefault(parsed.code(alias.asname.name), dotted)
                else:
                    head = dotted.split(".")[0]
                    imports.setdefault(head, head)
        elif isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative and \
                not isinstance(node.names, cst.ImportStar):
            base = parsed.code(node.module)
            for alias in node.names:
                local = alias.asname.name if alias.asname else alias.name
                imports.setdefault(parsed.code(local), f"{base}.{parsed.code(alias.name)}")
    return imports


def _as_sequence(value) -> tuple | list:
    return value if isinstance(value, (list, tuple)) else (value,)


@lru_cache(maxsize=None)
def _child_fields(node_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(node_type))


# Where a name is bound, by node type: the field holding the target (`with ... as`/`except ... as` one level down)
_BINDING_FIELDS = {cst.AssignTarget: "target", cst.AnnAssign: "target", cst.AugAssign: "target", cst.For: "target",
                   cst.CompFor: "target", cst.NamedExpr: "target", cst.Param: "name", cst.AsName: "name"}


def _assigned_names(nodes) -> list[cst.Name]:
    """Every name a statement or expression binds among `nodes`: assignment, loop, `with ... as`, `except ... as`,
    walrus and comprehension targets, and parameters. A `def` or `class` statement's own name is a definition, not a
    rebinding (a helper redefined by `f = torch.compile(f)` shows up as the assignment); an import's `as` name is
    the import's."""
    found: list[cst.Name] = []

    def bind(target: cst.CSTNode | None) -> None:
        if isinstance(target, cst.Name):
            found.append(target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                bind(element.value)
        elif isinstance(target, cst.StarredElement):
            bind(target.value)

    for node, parent in nodes:
        field_name = _BINDING_FIELDS.get(type(node))
        if field_name is not None and not (isinstance(node, cst.AsName) and isinstance(parent, cst.ImportAlias)):
            bind(getattr(node, field_name))
    return found


class _FunctionCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[cst.FunctionDef, ClassInfo | None, str]] = []
        self.classes: list[ClassInfo] = []
        self.path: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        info = ClassInfo(node)
        for statement in node.body.body:
            if isinstance(statement, cst.FunctionDef):
                info.methods[statement.name.value] = statement
        self.classes.append(info)
        self.path.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.classes.pop()
        self.path.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        owner = self.classes[-1] if self.classes and node in self.classes[-1].methods.values() else None
        self.found.append((node, owner, ".".join(self.path + [node.name.value])))
        self.path.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.path.pop()

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return False  # no function or class is defined inside a simple statement


class _OutsideWriteCollector(cst.CSTVisitor):
    """Attribute names written through a receiver other than the bare name `self`."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def _target(self, target: cst.BaseExpression) -> None:
        self.names.update(a.attr.value for a in _written_attributes(target) if not _is_self_attribute(a))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._target(target.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._target(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._target(node.target)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name) and func.value == "setattr" and len(node.args) >= 2 and \
                isinstance(node.args[1].value, cst.SimpleString):
            self.names.add(node.args[1].value.evaluated_value)
        elif is_inplace_method(func):
            self._target(func.value)  # `m.bias.fill_(1)`: an in-place method of the attribute


class _SelfAttributeCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.attributes: dict[str, list[cst.BaseExpression]] = {}
        self.mutated: set[str] = set()
        self.unfollowed: set[str] = set()  # bound by an unpacking whose values are not paired with targets

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if _is_self_attribute(target.target):
                self.attributes.setdefault(target.target.attr.value, []).append(node.value)
            elif isinstance(target.target, (cst.Tuple, cst.List)):
                self._unpacked(target.target, node.value)
            else:
                self._written(target.target)

    def _unpacked(self, target: cst.Tuple | cst.List, value: cst.BaseExpression) -> None:
        """`self.a, self.b = x, y` pairs each attribute with its value; another unpacking gives it an unknown one."""
        elements = [element.value for element in target.elements]
        values = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
        paired = values is not None and len(values) == len(elements) and \
            not any(isinstance(v, cst.StarredElement) for v in values)
        for position, element in enumerate(elements):
            if _is_self_attribute(element):
                if paired:
                    self.attributes.setdefault(element.attr.value, []).append(values[position].value)
                else:
                    self.unfollowed.add(element.attr.value)
            else:
                self._written(element)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._written(node.target)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value == "out":
            self._written(node.value)

    def _written(self, target: cst.BaseExpression) -> None:
        self.mutated.update(a.attr.value for a in _written_attributes(target) if _is_self_attribute(a))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and _is_self_attribute(node.target):
            self.attributes.setdefault(node.target.attr.value, []).append(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if is_inplace_method(func):
            self._written(func.value)  # `self.mask.fill_(...)`, `self.bias[0].zero_()`
        if (isinstance(func, cst.Attribute) and func.attr.value == "register_buffer"
                and isinstance(func.value, cst.Name) and func.value.value == "self" and len(node.args) >= 2
                and isinstance(node.args[0].value, cst.SimpleString)):
            name = node.args[0].value.evaluated_value
            self.attributes.setdefault(name, []).append(node.args[1].value)


def _written_attributes(target: cst.BaseExpression) -> list[cst.Attribute]:
    """The attributes a write to `target` changes: `x.a = v`, `x.a[i] = v`, `x.a, y.b = ...`."""
    while isinstance(target, cst.Subscript):
        target = target.value
    if isinstance(target, (cst.Tuple, cst.List)):
        return [a for element in target.elements for a in _written_attributes(element.value)]
    return [target] if isinstance(target, cst.Attribute) else []


def _is_self_attribute(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"

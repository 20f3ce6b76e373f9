"""One parsed file: libcst metadata (qualified names, parents, positions) and what each class binds on self."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import libcst as cst
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from advisor.static.dataflow import FunctionFlow, build_flow


@dataclass(eq=False)
class ClassInfo:
    """`self.x = ...` and `self.register_buffer("x", ...)` seen in any method of a class."""

    node: cst.ClassDef
    attributes: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    methods: dict[str, cst.FunctionDef] = field(default_factory=dict)

    def only_value(self, attribute: str) -> cst.BaseExpression | None:
        values = self.attributes.get(attribute, [])
        return values[0] if len(values) == 1 else None


class ParsedModule:
    """A file parsed once; every analysis of it shares this metadata."""

    def __init__(self, source: str, path: str) -> None:
        self.source = source
        self.path = path
        self.wrapper = MetadataWrapper(cst.parse_module(source))
        self.module = self.wrapper.module
        self.qualified = self.wrapper.resolve(QualifiedNameProvider)
        self.parents = self.wrapper.resolve(ParentNodeProvider)
        self.positions = self.wrapper.resolve(PositionProvider)
        self._flows: dict[cst.FunctionDef, FunctionFlow] = {}

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def end_line(self, node: cst.CSTNode) -> int:
        return self.positions[node].end.line

    def imported_name(self, node: cst.CSTNode) -> str | None:
        """The dotted name an expression refers to through imports ('torch.nn.functional.softmax'), if any."""
        found = self.qualified.get(node, ())
        if callable(found):  # libcst resolves qualified names lazily
            found = found()
        names = {q.name for q in found if q.source in
                 (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN)}
        if len(names) != 1:
            return None
        name = names.pop()
        return name.removeprefix("builtins.")

    def flow(self, function: cst.FunctionDef) -> FunctionFlow:
        if function not in self._flows:
            self._flows[function] = build_flow(function)
        return self._flows[function]

    @cached_property
    def functions(self) -> list[tuple[cst.FunctionDef, ClassInfo | None, str]]:
        """Every function with its enclosing class (if a method) and its dotted name."""
        collector = _FunctionCollector()
        self.module.visit(collector)
        return collector.found

    @cached_property
    def module_aliases(self) -> dict[str, str]:
        """Local names bound to modules: {'torch.nn.functional': 'F', 'torch': 'torch', ...}."""
        aliases: dict[str, str] = {}
        for statement in self.module.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        dotted = self.code(alias.name)
                        if alias.asname is not None:
                            aliases.setdefault(dotted, self.code(alias.asname.name))
                        else:
                            aliases.setdefault(dotted.split(".")[0], dotted.split(".")[0])
                elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
                    base = self.code(small.module)
                    if isinstance(small.names, cst.ImportStar):
                        continue
                    for alias in small.names:
                        local = alias.asname.name if alias.asname else alias.name
                        aliases.setdefault(f"{base}.{self.code(alias.name)}", self.code(local))
        return aliases


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
                statement.visit(_SelfAttributeCollector(info))
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


class _SelfAttributeCollector(cst.CSTVisitor):
    def __init__(self, info: ClassInfo) -> None:
        self.info = info

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if _is_self_attribute(target.target):
                self.info.attributes.setdefault(target.target.attr.value, []).append(node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and _is_self_attribute(node.target):
            self.info.attributes.setdefault(node.target.attr.value, []).append(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (isinstance(func, cst.Attribute) and func.attr.value == "register_buffer"
                and isinstance(func.value, cst.Name) and func.value.value == "self" and len(node.args) >= 2
                and isinstance(node.args[0].value, cst.SimpleString)):
            name = node.args[0].value.evaluated_value
            self.info.attributes.setdefault(name, []).append(node.args[1].value)


def _is_self_attribute(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"

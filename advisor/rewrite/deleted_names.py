"""The rewrite's last check, knowing no rule: a patch must never read a name that only the statements it deleted
bound (a NameError on every call, safe patch or unsafe). A read of such a name in the patched function that some
path reaches unbound, where no read of that name did so in the original function, refuses the patch."""

from __future__ import annotations

import libcst as cst

from advisor.static.dataflow import build_flow, loaded_names, target_names
from advisor.static.walk import walk


def bound_names(nodes) -> set[str]:
    """Names that assignments in the given statements bind (`x = ...`, `a, b = ...`, `x += ...`, `x: T = ...`),
    outside functions and classes defined there; other nodes (expressions) bind none."""
    names: set[str] = set()

    class Walk(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                names.update(name.value for name in target_names(target.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            names.update(name.value for name in target_names(node.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            names.update(name.value for name in target_names(node.target))

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

    for node in nodes:
        if isinstance(node, (cst.BaseSmallStatement, cst.BaseStatement)):
            walk(node, Walk())
    return names


def read_of_deleted(original: cst.CSTNode, patched: cst.CSTNode, deleted: set[str]) -> str | None:
    """The first name of `deleted` that a function of `patched` reads unbound where the same function of
    `original` (found by its nesting of names) never did; None when there is none."""
    if not deleted:
        return None
    before = {path: function for path, function in _functions(original)}
    for path, function in _functions(patched):
        suspects = {name.value for name in loaded_names(function.body)} & deleted
        if not suspects:
            continue
        unbound = _read_unbound(function, suspects)
        if path in before and unbound:
            unbound -= _read_unbound(before[path], unbound)
        if unbound:
            return min(unbound)
    return None


def _read_unbound(function: cst.FunctionDef, names: set[str]) -> set[str]:
    flow = build_flow(function)
    return {read.value for read in flow.reaching if read.value in names and flow.sees_undefined(read)}


def _functions(node: cst.CSTNode) -> list[tuple[tuple[str, ...], cst.FunctionDef]]:
    """Every function under `node` with the names of the classes and functions around it."""
    found: list[tuple[tuple[str, ...], cst.FunctionDef]] = []

    class Walk(cst.CSTVisitor):
        def __init__(self) -> None:
            self.path: list[str] = []

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            self.path.append(node.name.value)
            found.append((tuple(self.path), node))

        def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
            self.path.pop()

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            self.path.append(node.name.value)

        def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
            self.path.pop()

    walk(node, Walk())
    return found

"""The rewrite layer: applies rules' node edits to one module as character edits, knowing no rule. Untouched code
stays byte-identical; only the top-level statements holding a change are rendered and compiled, once for all the
edits of a file. Edits of different findings that touch the same code are reported as a conflict, never merged."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import libcst as cst

from advisor.rewrite.deleted_names import bound_names, read_of_deleted
from advisor.rewrite.splice import Edit
from advisor.static.dataflow import contains_call
from advisor.static.module_index import ParsedModule
from advisor.static.opening_imports import import_position, opening_imports_end
from advisor.static.walk import descendants


class RewriteFailed(Exception):
    """The edited module did not compile; the original is kept."""


@dataclass(eq=False)
class SourceEdit:
    """One expression replaced by new code, and the imports that code needs (the simplest fix a rule returns)."""

    node: cst.CSTNode
    code: str
    imports: tuple[str, ...] = ()

    def as_edits(self) -> NodeEdits:
        return NodeEdits(replace={self.node: cst.parse_expression(self.code)}, imports=self.imports)


@dataclass(eq=False)
class NodeEdits:
    """What one finding's fix changes in its module, node by node. Nodes are those of the parsed module; new code
    is given as parsed nodes. Several findings' edits share what is equal (one import line, one helper)."""

    replace: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)  # an expression keeps its parentheses
    # small statements (`x = ...` of a `a; b` line), or whole statements
    remove: set[cst.CSTNode] = field(default_factory=set)
    insert_before: dict[cst.CSTNode, tuple[cst.BaseStatement, ...]] = field(default_factory=dict)  # new ones above
    wrap: dict[cst.CSTNode, cst.BaseExpression] = field(default_factory=dict)  # statement -> `with <it>:` around it
    unwrap: set[cst.If | cst.IfExp] = field(default_factory=set)  # replaced by their `else` (test known false)
    take: set[cst.If | cst.IfExp] = field(default_factory=set)  # replaced by their body (test known true)
    imports: tuple[str, ...] = ()  # lines, added once after the module's imports
    definitions: tuple[cst.BaseStatement, ...] = ()  # module-level statements added after those imports
    # removed statements inserted elsewhere with the comments above them (a guard's lifted lines): not carried
    moved: set[cst.CSTNode] = field(default_factory=set)

    def targets(self) -> set[cst.CSTNode]:
        """The nodes whose code this fix replaces or deletes: another fix must not touch them or what they hold."""
        return set(self.replace) | self.remove | self.unwrap | self.take


@dataclass
class Conflict:
    """Fix `rejected` (an index into the fixes given to `combine`) touches code that fix `kept` already changes."""

    kept: int
    rejected: int


def combine(parsed: ParsedModule, fixes: list[NodeEdits]) -> tuple[NodeEdits, list[Conflict]]:
    """All fixes as one edit set, in order; a fix that replaces or removes a node another kept fix replaces,
    removes, or holds inside its own change is left out and returned as a conflict (identical edits are shared)."""
    merged = NodeEdits()
    owner: dict[cst.CSTNode, int] = {}  # target node -> the kept fix that changes it
    inside: dict[cst.CSTNode, int] = {}  # every ancestor of a kept target -> that fix
    conflicts: list[Conflict] = []
    for index, fix in enumerate(fixes):
        clash = _clash(parsed, fix, merged, owner, inside)
        if clash is not None:
            conflicts.append(Conflict(clash, index))
            continue
        for node in fix.targets():
            owner[node] = index
            for ancestor in _ancestors(parsed, node):
                inside.setdefault(ancestor, index)
        merged.replace.update(fix.replace)
        merged.remove |= fix.remove
        for statement, new in fix.insert_before.items():
            merged.insert_before[statement] = _union(merged.insert_before.get(statement, ()), new)
        merged.wrap.update(fix.wrap)
        merged.unwrap |= fix.unwrap
        merged.take |= fix.take
        merged.moved |= fix.moved
        merged.imports = tuple(dict.fromkeys(merged.imports + fix.imports))
        merged.definitions = _union(merged.definitions, fix.definitions)
    return merged, conflicts


def _union(kept: tuple[cst.CSTNode, ...], new: tuple[cst.CSTNode, ...]) -> tuple[cst.CSTNode, ...]:
    """`kept` then the nodes of `new` not already there (equal code is one statement: one hoist, one helper)."""
    return kept + tuple(node for node in new if not any(node.deep_equals(other) for other in kept))


def _clash(parsed, fix: NodeEdits, merged: NodeEdits, owner, inside) -> int | None:
    for node in fix.targets():
        if node in owner:
            same = node in fix.remove and node in merged.remove or \
                node in fix.replace and node in merged.replace and fix.replace[node].deep_equals(merged.replace[node])
            if not same:
                return owner[node]
            continue
        if node in inside:
            return inside[node]
        for ancestor in _ancestors(parsed, node):
            if ancestor in owner:
                return owner[ancestor]
    return None


def _ancestors(parsed: ParsedModule, node: cst.CSTNode):
    node = parsed.parents.get(node)
    while node is not None and node is not parsed.module:
        yield node
        node = parsed.parents.get(node)


def _printed_as_source(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    """Whether `node` is inside `f"{expr=}"`, whose output holds the expression's text (breaker round 14), or is a
    statement holding one (a guarded fix rewrites a copy of the whole statement)."""
    if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement, cst.SimpleStatementLine)) and \
            any(part.equal is not None for part in descendants(node, (cst.FormattedStringExpression,))):
        return True
    while node is not None:
        if isinstance(node, cst.FormattedStringExpression) and node.equal is not None:
            return True
        node = parsed.parents.get(node)
    return False


def render(parsed: ParsedModule, edits: NodeEdits) -> list[Edit]:
    """The edits as character edits of the source (splice.apply_edits gives the new text), checked to compile.
    Only the top-level statements holding a change are rendered and compiled, so the cost is that of the changed
    code, not of the module (when those statements do not render back to their exact source, the whole module is
    rendered instead)."""
    added = [cst.parse_statement(line + "\n") for line in edits.imports] + list(edits.definitions)
    touched = [*edits.replace, *edits.remove, *edits.insert_before, *edits.wrap, *edits.unwrap, *edits.take]
    if not touched and not added:
        return []
    printed = next((node for node in touched if _printed_as_source(parsed, node)), None)
    if printed is not None:
        raise RewriteFailed(f"line {parsed.line(printed)} is inside an f-string's `=` specifier, which prints its "
                            "source text: a rewrite there would change what the program prints")
    editor = _Editor(edits, parsed, _on_the_way(parsed, touched))
    statements = _top_level_statements(parsed, touched)
    body = parsed.module.body
    position = opening_imports_end(parsed)
    anchor = ([body[position]] if position < len(body) else body[-1:]) if added else []
    spans = parsed.statement_spans(statements + anchor)
    deleted = bound_names([*edits.remove, *edits.replace])
    if spans is None:
        module = parsed.module.visit(editor)
        _check_reads(parsed.module, module, deleted)
        body = list(module.body)
        body[import_position(body):import_position(body)] = added
        module = module.with_changes(body=body)
        _check_compiles(module.code, parsed.path)
        return [Edit(0, len(parsed.source), _faithful(parsed.source, module.code))]
    changes = []
    for statement in statements:
        result = statement.visit(editor)
        code = _rendered(parsed.module, result)
        _check_compiles(code, parsed.path)
        if not isinstance(result, cst.RemovalSentinel):
            _check_reads(statement, result, deleted)
        changes.append(Edit(*spans[statement], code))
    if added:
        offset = spans[body[position]][0] if position < len(body) else spans[body[-1]][1]
        code = "".join(parsed.module.code_for_node(statement) for statement in added)
        _check_compiles(code, parsed.path)
        changes.append(Edit(offset, offset, code))
    return changes


def _faithful(source: str, rendered: str) -> str:
    """`rendered` (the whole module regenerated by libcst), with what libcst's code generation lost outside the
    edit put back from `source`: libcst does not round-trip every file (a file with CR-only newlines loses its
    final CR), so the edit is located between libcst's own round trip of `source` and `rendered`, and replayed
    on `source` itself."""
    roundtrip = cst.parse_module(source).code
    if roundtrip == source:
        return rendered
    start = len(os.path.commonprefix([roundtrip, rendered]))
    end = len(os.path.commonprefix([roundtrip[start:][::-1], rendered[start:][::-1]]))
    edited_until = len(roundtrip) - end
    if source[:edited_until] != roundtrip[:edited_until]:
        raise RewriteFailed("libcst does not reproduce this file's text before the rewritten block")
    return rendered[:len(rendered) - end] + source[edited_until:]


def _top_level_statements(parsed: ParsedModule, nodes: list[cst.CSTNode]) -> list[cst.CSTNode]:
    """The module-level statements that hold `nodes`, in source order, each once."""
    return [parsed.module.body[index] for index in sorted({parsed.top_statement_index(node) for node in nodes})]


def _rendered(module: cst.Module, result) -> str:
    """Code of a visited top-level statement: a node, several (FlattenSentinel), or none (RemovalSentinel)."""
    if isinstance(result, cst.RemovalSentinel):
        return ""
    nodes = list(result.nodes) if isinstance(result, cst.FlattenSentinel) else [result]
    return "".join(module.code_for_node(node) for node in nodes)


def _check_compiles(code: str, path: str) -> None:
    """A module-level statement compiles on its own exactly when it compiles in its module (no name lookup)."""
    try:
        compile(code, path, "exec")
    except SyntaxError as exc:
        raise RewriteFailed(f"the rewrite produced invalid Python ({exc.msg})") from None


def edited_statements(statements: list[cst.BaseStatement], edits: NodeEdits) -> list[cst.BaseStatement]:
    """Consecutive statements of one block with `edits` applied (for code that places them elsewhere)."""
    return list(cst.IndentedBlock(body=statements).visit(_Editor(edits)).body)


def _check_reads(original: cst.CSTNode, patched, deleted: set[str]) -> None:
    """Every emitted patch reads no name that only the statements it deleted or replaced bound."""
    nodes = list(patched.nodes) if isinstance(patched, cst.FlattenSentinel) else [patched]
    for node in nodes:
        name = read_of_deleted(original, node, deleted)
        if name is not None:
            raise RewriteFailed(f"the rewrite would read `{name}`, which it no longer binds")


def _on_the_way(parsed: ParsedModule, nodes: list[cst.CSTNode]) -> set[cst.CSTNode]:
    """`nodes` and every node above them: where an edit can change anything."""
    found: set[cst.CSTNode] = set()
    for node in nodes:
        while node is not None and node not in found:
            found.add(node)
            node = parsed.parents.get(node)
    return found


def _carried_comments(parsed: ParsedModule, edits: NodeEdits) -> dict[cst.CSTNode, list[cst.EmptyLine]]:
    """The lines above each statement the edits delete, when they hold a comment, keyed by the next statement of
    its block that stays: libcst keeps the comments (and blank lines) above a statement as its `leading_lines`,
    which would leave with it (a license header or a `# scaled dot-product attention` note above the scores)."""
    removed = {node for node in edits.remove if isinstance(node, cst.BaseStatement)} | \
        {line for line in {parsed.parents.get(small) for small in edits.remove}
         if isinstance(line, cst.SimpleStatementLine) and all(small in edits.remove for small in line.body)}
    carried: dict[cst.CSTNode, list[cst.EmptyLine]] = {}
    for statement in sorted(removed - edits.moved, key=parsed.line):
        if not any(line.comment is not None for line in statement.leading_lines):
            continue
        block = parsed.parents.get(statement)
        body = list(getattr(block, "body", ()))
        later = body[body.index(statement) + 1:] if statement in body else []
        target = next((s for s in later if s not in removed), None)
        if target is not None:
            carried.setdefault(target, []).extend(statement.leading_lines)
    return carried


def _with_leading_lines(result, lines: list[cst.EmptyLine]):
    """`result` (a statement, several, or none) with `lines` above its first statement."""
    if isinstance(result, cst.FlattenSentinel) and result.nodes:
        first, *rest = result.nodes
        return cst.FlattenSentinel([_with_leading_lines(first, lines), *rest])
    if hasattr(result, "leading_lines"):
        return result.with_changes(leading_lines=[*lines, *result.leading_lines])
    return result


class _Editor(cst.CSTTransformer):
    """Applies node edits. Given the file (`parsed`) and the nodes on the way to an edit (`enter`), it does not
    enter the file's other nodes: nothing in them changes, and libcst's visit rebuilds every node it enters. It
    enters every node an edit brings (a replacement's new code, and the user nodes it quotes on the way to
    another edit)."""

    def __init__(self, edits: NodeEdits, parsed: ParsedModule | None = None,
                 enter: set[cst.CSTNode] | None = None) -> None:
        self.edits = edits
        self.active: set[cst.CSTNode] = set()
        self.parsed, self.enter = parsed, enter
        self.carried = _carried_comments(parsed, edits) if parsed is not None else {}

    def on_visit(self, node) -> bool:
        if self.enter is not None and node not in self.enter and node in self.parsed.parents:
            return False
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):
        result = self._left(original_node, updated_node)
        lines = self.carried.get(original_node)
        return _with_leading_lines(result, lines) if lines else result

    def _left(self, original_node, updated_node):
        if original_node in self.edits.remove and isinstance(original_node, cst.BaseStatement):
            return cst.RemoveFromParent()  # a whole statement (a guarded fix moves it under an `else:`)
        if original_node in self.edits.replace and original_node not in self.active:
            new = self._replacement(original_node)
            if isinstance(new, cst.BaseExpression) and (getattr(updated_node, "lpar", ()) or
                                                        not isinstance(new, cst.BinaryOperation)):
                new = new.with_changes(lpar=getattr(updated_node, "lpar", ()), rpar=getattr(updated_node, "rpar", ()))
                # else a sum keeps its own: a suffix after the replaced read binds to all of it
            return self._with_insertion(original_node, new) if isinstance(new, cst.BaseStatement) else new
        return super().on_leave(original_node, updated_node)

    def _replacement(self, original_node):
        """The new code for `original_node`, with the edits of the user nodes it quotes applied too (a mask
        expression carried into a new statement still reads `q.dtype` where it read the deleted scores' dtype);
        the node itself, when quoted inside its own replacement (`x` -> `f(x)`), stays as it was."""
        self.active.add(original_node)
        try:
            return self.edits.replace[original_node].visit(self)
        finally:
            self.active.discard(original_node)

    def _kept(self, original_node, updated_node) -> list | None:
        """The small statements of a line or one-line suite the edits keep, the last without its `;` (None:
        the edits remove none)."""
        kept = [small for small, original in zip(updated_node.body, original_node.body)
                if original not in self.edits.remove]
        if len(kept) == len(updated_node.body):
            return None
        return [*kept[:-1], kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)] if kept else []

    def leave_SimpleStatementLine(self, original_node, updated_node):
        kept = self._kept(original_node, updated_node)
        if kept is None:
            if original_node in self.edits.wrap:
                updated_node = self._wrapped(updated_node, self.edits.wrap[original_node])
            return self._with_insertion(original_node, updated_node)
        return updated_node.with_changes(body=kept) if kept else cst.RemoveFromParent()

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        """A body on its block's own line (`def f(q, k, v): s = ...; return p @ v`): its removed statements go
        as on a line of their own; `pass` stays where none is left."""
        kept = self._kept(original_node, updated_node)
        return updated_node if kept is None else updated_node.with_changes(body=kept or [cst.Pass()])

    def leave_IfExp(self, original_node, updated_node):
        kept = updated_node.orelse if original_node in self.edits.unwrap else \
            updated_node.body if original_node in self.edits.take else None
        if kept is None:
            return updated_node
        # `a if flag else b` where the test's value is known: that branch, in the parentheses the expression had
        # (an IfExp binds more loosely than anything in it)
        return kept.with_changes(lpar=[*updated_node.lpar, *kept.lpar], rpar=[*kept.rpar, *updated_node.rpar])

    def leave_If(self, original_node, updated_node):
        if original_node in self.edits.take:  # its test holds where this code runs: its body is what runs
            inserted = list(self.edits.insert_before.get(original_node, ()))
            kept = _statements(updated_node.body)
            return cst.FlattenSentinel(inserted + kept) if inserted + kept else cst.RemoveFromParent()
        if original_node in self.edits.unwrap:  # its test is false where this code runs: its `else:` is what runs
            inserted = list(self.edits.insert_before.get(original_node, ()))
            if isinstance(updated_node.orelse, cst.If):  # `elif`: now the first test
                kept = [updated_node.orelse.with_changes(leading_lines=updated_node.leading_lines)]
            elif isinstance(updated_node.orelse, cst.Else):
                kept = _statements(updated_node.orelse.body)
            else:
                kept = []
            return cst.FlattenSentinel(inserted + kept) if inserted + kept else cst.RemoveFromParent()
        if isinstance(updated_node.orelse, cst.Else) and _is_empty(updated_node.orelse.body):
            updated_node = updated_node.with_changes(orelse=None)  # `else:` left with nothing to do
        if _is_empty(updated_node.body) and updated_node.orelse is None and not contains_call(original_node.test):
            return cst.RemoveFromParent()
        updated_node = updated_node.with_changes(body=_filled(updated_node.body))
        return self._with_insertion(original_node, updated_node)

    @staticmethod
    def _wrapped(statement: cst.SimpleStatementLine, context: cst.BaseExpression) -> cst.With:
        """`with <context>:` around the statement; its leading comments stay above the `with`."""
        inner = statement.with_changes(leading_lines=())
        return cst.With(items=[cst.WithItem(context)], body=cst.IndentedBlock(body=[inner]),
                        leading_lines=statement.leading_lines)

    def _with_insertion(self, original_node, updated_node):
        if original_node in self.edits.insert_before:  # e.g. a hoisted name that must exist when an `if` is not taken
            return cst.FlattenSentinel([*self.edits.insert_before[original_node], updated_node])
        return updated_node

    def _fill_body(self, original_node, updated_node):
        return updated_node.with_changes(body=_filled(updated_node.body))

    leave_For = leave_While = leave_With = leave_Try = leave_FunctionDef = leave_MatchCase = _fill_body


def _is_empty(block) -> bool:
    return isinstance(block, cst.IndentedBlock) and not block.body


def _filled(block):
    if _is_empty(block):
        return block.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
    return block


def _statements(block: cst.BaseSuite) -> list[cst.BaseStatement]:
    """The statements of a block, a one-line suite (`if f: w = None`) as one statement line."""
    if isinstance(block, cst.SimpleStatementSuite):
        return [cst.SimpleStatementLine(body=list(block.body))]
    return list(block.body)

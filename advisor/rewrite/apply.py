"""Apply attention rewrites to one module with a single libcst pass; untouched code stays byte-identical."""

from __future__ import annotations

import libcst as cst

from advisor.patterns.attention import AttentionMatch
from advisor.rewrite.sdpa import functional_name, sdpa_call
from advisor.rewrite.splice import Edit
from advisor.static.dataflow import contains_call
from advisor.static.module_index import ParsedModule


class RewriteFailed(Exception):
    """The edited module did not compile; the original is kept."""


def rewrite_edits(parsed: ParsedModule, matches: list[AttentionMatch], drop_weights: bool) -> list[Edit]:
    """Every match replaced by one SDPA call (`drop_weights` passes None where weights escaped), as character edits
    of the source (splice.apply_edits gives the new text). Only the top-level statements holding a change are
    rendered and compiled, so the cost is that of the changed code, not of the module (when the module's statements
    do not render back to their exact source, the whole module is rendered instead)."""
    if not matches:
        return []
    functional = functional_name(parsed)
    replacements: dict[cst.CSTNode, cst.BaseExpression] = {}
    removed: set[cst.CSTNode] = set()
    nones: set[cst.CSTNode] = set()
    renamed: dict[cst.CSTNode, cst.BaseExpression] = {}
    hoists: dict[cst.CSTNode, object] = {}
    for match in matches:
        statement = _enclosing_statement(parsed, match.output_node)
        indent = parsed.positions[statement.body[0] if isinstance(statement, cst.SimpleStatementLine)
                                  else statement].start.column
        replacements[match.output_node] = cst.parse_expression(sdpa_call(match, functional.prefix, indent))
        removed.update(match.removed)
        renamed.update({read: cst.parse_expression(code) for read, code in match.renamed.items()})
        for statement, code in match.hoisted.items():
            replacements[statement] = cst.parse_statement(code + "\n").body[0]
        if match.hoist_anchor is not None:
            hoists[_enclosing_statement(parsed, match.hoist_anchor)] = cst.parse_statement(match.hoist_init + "\n")
        if drop_weights:
            nones.update(match.escapes)
    replacements.update(renamed)
    editor = _Editor(parsed, replacements, removed, nones, hoists)
    import_line = functional.import_line
    spans = parsed.statement_spans
    if spans is None:
        module = parsed.module.visit(editor)
        if import_line is not None:
            module = _add_import(module, import_line)
        _check_compiles(module.code, parsed.path)
        return [Edit(0, len(parsed.source), module.code)]
    edits = []
    for statement in _top_level_statements(parsed, [*replacements, *removed, *nones, *hoists]):
        code = _rendered(parsed.module, statement.visit(editor))
        _check_compiles(code, parsed.path)
        edits.append(Edit(*spans[statement], code))
    if import_line is not None:
        body = parsed.module.body
        position = _import_position(body)
        offset = spans[body[position]][0] if position < len(body) else spans[body[-1]][1]
        edits.append(Edit(offset, offset, import_line + parsed.module.default_newline))
    return edits


def _top_level_statements(parsed: ParsedModule, nodes: list[cst.CSTNode]) -> list[cst.CSTNode]:
    """The module-level statements that hold `nodes`, in source order, each once."""
    found = set()
    for node in nodes:
        while parsed.parents[node] is not parsed.module:
            node = parsed.parents[node]
        found.add(node)
    return [statement for statement in parsed.module.body if statement in found]


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


def _enclosing_statement(parsed: ParsedModule, node: cst.CSTNode) -> cst.CSTNode:
    while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        node = parsed.parents[node]
    return node


class _Editor(cst.CSTTransformer):
    def __init__(self, parsed, replacements, removed, nones, hoists) -> None:
        self.parsed, self.replacements, self.removed, self.nones = parsed, replacements, removed, nones
        self.hoists = hoists

    def on_leave(self, original_node, updated_node):
        if original_node in self.replacements:
            new = self.replacements[original_node]
            if isinstance(new, cst.BaseExpression):
                new = new.with_changes(lpar=getattr(updated_node, "lpar", ()), rpar=getattr(updated_node, "rpar", ()))
            return new
        if original_node in self.nones:
            return cst.Name("None")
        return super().on_leave(original_node, updated_node)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        kept = [small for small, original in zip(updated_node.body, original_node.body)
                if original not in self.removed]
        if len(kept) == len(updated_node.body):
            return self._with_hoist(original_node, updated_node)
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(body=kept)

    def leave_If(self, original_node, updated_node):
        if isinstance(updated_node.orelse, cst.Else) and _is_empty(updated_node.orelse.body):
            updated_node = updated_node.with_changes(orelse=None)  # `else:` left with nothing to do
        if _is_empty(updated_node.body) and updated_node.orelse is None and not contains_call(original_node.test):
            return cst.RemoveFromParent()
        updated_node = updated_node.with_changes(body=_filled(updated_node.body))
        return self._with_hoist(original_node, updated_node)

    def _with_hoist(self, original_node, updated_node):
        if original_node in self.hoists:  # the mask variable must exist when an `if` is not taken
            return cst.FlattenSentinel([self.hoists[original_node], updated_node])
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


def _add_import(module: cst.Module, line: str) -> cst.Module:
    body = list(module.body)
    body.insert(_import_position(body), cst.parse_statement(line + "\n"))
    return module.with_changes(body=body)


def _import_position(body) -> int:
    """Index for a new import: after the last top-level import (or at the top, after a docstring)."""
    position = 0
    for index, item in enumerate(body):
        if isinstance(item, cst.SimpleStatementLine) and any(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in item.body):
            position = index + 1
        elif index == 0 and isinstance(item, cst.SimpleStatementLine) and isinstance(item.body[0], cst.Expr) \
                and isinstance(item.body[0].value, cst.SimpleString):
            position = 1
    return position

"""Apply attention rewrites (and the configuration rules' expression edits) to one module as character edits:
untouched code stays byte-identical, and only the top-level statements holding a change are rendered."""

from __future__ import annotations

from dataclasses import dataclass

import os

import libcst as cst

from advisor.backends.site import plan_backend
from advisor.patterns.attention import AttentionMatch
from advisor.rewrite.backends import KernelNames, flash_attn_call, flash_attn_helper, helper_name, kernel_names
from advisor.rewrite.sdpa import functional_name, sdpa_call
from advisor.rewrite.splice import Edit
from advisor.static.dataflow import contains_call
from advisor.static.module_index import ParsedModule


class RewriteFailed(Exception):
    """The edited module did not compile; the original is kept."""


@dataclass(eq=False)
class SourceEdit:
    """One expression replaced by new code (the configuration rules' fixes), and the imports that code needs."""

    node: cst.CSTNode
    code: str
    imports: tuple[str, ...] = ()


def rewrite_edits(parsed: ParsedModule, matches: list[AttentionMatch], drop_weights: bool, backend: str = "sdpa",
                  edits: list[SourceEdit] = ()) -> list[Edit]:
    """Every match replaced by one SDPA call (`drop_weights` passes None where weights escaped), and every
    SourceEdit applied, as character edits of the source (splice.apply_edits gives the new text). `backend`
    "flash" / "flash-attn" emits those where the site is eligible (see advisor.backends.site). Only the top-level
    statements holding a change are rendered and compiled, so the cost is that of the changed code, not of the
    module (when the module's statements do not render back to their exact source, the whole module is rendered
    instead)."""
    if not matches and not edits:
        return []
    functional = functional_name(parsed)
    replacements: dict[cst.CSTNode, cst.BaseExpression] = {}
    removed: set[cst.CSTNode] = set()
    nones: set[cst.CSTNode] = set()
    renamed: dict[cst.CSTNode, cst.BaseExpression] = {}
    hoists: dict[cst.CSTNode, object] = {}
    emitted = [plan_backend(parsed, match, backend).emitted if backend != "sdpa" else "sdpa" for match in matches]
    flash = kernel_names(parsed) if "flash" in emitted else None
    if isinstance(flash, str):
        raise RewriteFailed(f"cannot emit the flash kernel context: {flash}")
    helper = helper_name(parsed) if "flash-attn" in emitted else None
    wrapped: set[cst.CSTNode] = set()
    for match, target in zip(matches, emitted):
        statement = _enclosing_statement(parsed, match.output_node)
        indent = parsed.positions[statement.body[0] if isinstance(statement, cst.SimpleStatementLine)
                                  else statement].start.column
        if target == "flash-attn":
            call = flash_attn_call(match, helper, indent)
        else:
            call = sdpa_call(match, functional.prefix, indent + 4 * (target == "flash"))
        replacements[match.output_node] = cst.parse_expression(call)
        if target == "flash":
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                raise RewriteFailed("the flash kernel context needs the SDPA call in a statement of its own")
            wrapped.add(statement)
        removed.update(match.removed)
        renamed.update({read: cst.parse_expression(code) for read, code in match.renamed.items()})
        for statement, code in match.hoisted.items():
            replacements[statement] = cst.parse_statement(code + "\n").body[0]
        if match.hoist_anchor is not None:
            hoists[_enclosing_statement(parsed, match.hoist_anchor)] = cst.parse_statement(match.hoist_init + "\n")
        if drop_weights:
            nones.update(match.escapes)
    replacements.update(renamed)
    imports = [line for edit in edits for line in edit.imports]
    replacements.update({edit.node: cst.parse_expression(edit.code) for edit in edits})
    editor = _Editor(parsed, replacements, removed, nones, hoists)
    if flash is not None:
        editor.wrap(wrapped, flash.flash_context())
    if isinstance(flash, KernelNames) and flash.import_line is not None:
        imports.append(flash.import_line)
    if functional.import_line is not None and matches:
        imports.append(functional.import_line)
    added = [cst.parse_statement(line + "\n") for line in dict.fromkeys(imports)]
    if helper is not None:
        added.append(flash_attn_helper(helper, functional.prefix))
    spans = parsed.statement_spans
    if spans is None:
        module = parsed.module.visit(editor)
        body = list(module.body)
        body[_import_position(body):_import_position(body)] = added
        module = module.with_changes(body=body)
        _check_compiles(module.code, parsed.path)
        return [Edit(0, len(parsed.source), _faithful(parsed.source, module.code))]
    changes = []
    for statement in _top_level_statements(parsed, [*replacements, *removed, *nones, *hoists, *wrapped]):
        code = _rendered(parsed.module, statement.visit(editor))
        _check_compiles(code, parsed.path)
        changes.append(Edit(*spans[statement], code))
    if added:
        body = parsed.module.body
        position = _import_position(body)
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
        self.wrapped: set[cst.CSTNode] = set()
        self.with_item: cst.BaseExpression | None = None

    def wrap(self, statements: set[cst.CSTNode], header: str) -> None:
        """Run these statements inside `with <header>:` (the flash kernel context)."""
        self.wrapped, self.with_item = statements, cst.parse_expression(header)

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
            if original_node in self.wrapped:
                updated_node = self._wrapped(updated_node)
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

    def _wrapped(self, statement: cst.SimpleStatementLine) -> cst.With:
        """`with <item>:` around the statement; its leading comments stay above the `with`."""
        inner = statement.with_changes(leading_lines=())
        return cst.With(items=[cst.WithItem(self.with_item)], body=cst.IndentedBlock(body=[inner]),
                        leading_lines=statement.leading_lines)

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

"""A fix behind a run-time check: the fix's edits inside a run of statements become the `if` branch, and the
`else` branch keeps those statements as they were, so the patch is exact wherever the check fails. Edits outside
the run (a later read renamed, an import) apply on both paths."""

from __future__ import annotations

import libcst as cst

from advisor.rewrite.apply import NodeEdits, edited_statements
from advisor.static.module_index import ParsedModule


def guarded(parsed: ParsedModule, edits: NodeEdits, test: cst.BaseExpression,
            span: list[cst.BaseStatement], lifted: list[cst.BaseStatement] = ()) -> NodeEdits:
    """`edits` with the part inside `span` (consecutive statements of one block) moved under `if test:`, the
    original statements under its `else:`; the statements of `lifted` (in the span, binding what `test` reads)
    run, edited, above the `if`."""
    members = set(span)

    def inside(node: cst.CSTNode) -> bool:
        while node is not None:
            if node in members:
                return True
            node = parsed.parents.get(node)
        return False

    inner = NodeEdits(replace={n: new for n, new in edits.replace.items() if inside(n)},
                      remove={n for n in edits.remove if inside(n)},
                      insert_before={n: new for n, new in edits.insert_before.items() if inside(n)},
                      wrap={n: new for n, new in edits.wrap.items() if inside(n)},
                      unwrap={n for n in edits.unwrap if inside(n)})
    outer = NodeEdits(replace={n: new for n, new in edits.replace.items() if not inside(n)},
                      remove={n for n in edits.remove if not inside(n)} | set(span[1:]),
                      insert_before={n: new for n, new in edits.insert_before.items() if not inside(n)},
                      wrap={n: new for n, new in edits.wrap.items() if not inside(n)},
                      unwrap={n for n in edits.unwrap if not inside(n)}, imports=edits.imports, definitions=edits.definitions)
    rest = [statement for statement in span if statement not in lifted]
    fast = edited_statements(rest, inner)
    original = [statement.deep_clone() for statement in rest]  # new nodes: no edit reaches them
    fast[0], original[0] = (statements[0].with_changes(leading_lines=()) for statements in (fast, original))
    if lifted:
        outer.insert_before[span[0]] = tuple(edited_statements(list(lifted), inner))
    outer.replace[span[0]] = cst.If(test=test, body=cst.IndentedBlock(fast),
                                    orelse=cst.Else(cst.IndentedBlock(original)), leading_lines=span[0].leading_lines)
    return outer

"""The rewrite layer applies the fixes of several findings in one pass: what they share (an import, a helper, a
hoisted statement) is written once, and two fixes that change the same code are a reported conflict, never a merge."""

from __future__ import annotations

import libcst as cst

from advisor.engine.static import analyze_source
from advisor.rewrite.apply import NodeEdits, SourceEdit, combine, render
from advisor.rewrite.splice import apply_edits
from advisor.static.module_index import ParsedModule

SOURCE = "import torch\n\n\ndef f(x):\n    y = x.float() + 1\n    return y\n"


def _parsed():
    parsed = ParsedModule(SOURCE, "m.py")
    calls = [node for node in parsed.parents if isinstance(node, cst.Call)]
    binary = next(node for node in parsed.parents if isinstance(node, cst.BinaryOperation))
    return parsed, calls[0], binary


def test_a_fix_inside_the_code_another_fix_replaces_is_a_conflict():
    parsed, call, binary = _parsed()
    outer = SourceEdit(binary, "x.double()").as_edits()
    inner = SourceEdit(call, "x.half()").as_edits()
    merged, conflicts = combine(parsed, [outer, inner])
    assert [(c.kept, c.rejected) for c in conflicts] == [(0, 1)]
    assert apply_edits(SOURCE, render(parsed, merged)) == SOURCE.replace("x.float() + 1", "x.double()")
    _, conflicts = combine(parsed, [inner, outer])  # the other way round: the outer one is left out
    assert [(c.kept, c.rejected) for c in conflicts] == [(0, 1)]


def test_two_different_replacements_of_one_node_conflict_and_equal_ones_are_shared():
    parsed, call, _ = _parsed()
    _, conflicts = combine(parsed, [SourceEdit(call, "x.half()").as_edits(), SourceEdit(call, "x.double()").as_edits()])
    assert len(conflicts) == 1
    same = [SourceEdit(call, "x.half()", ("import math",)).as_edits() for _ in range(2)]
    merged, conflicts = combine(parsed, same)
    assert conflicts == []
    fixed = apply_edits(SOURCE, render(parsed, merged))
    assert fixed.count("import math") == 1 and "y = x.half() + 1" in fixed


def test_statements_inserted_before_one_statement_by_two_fixes_are_both_kept_once():
    parsed, _, _ = _parsed()
    statement = next(node for node in parsed.parents if isinstance(node, cst.SimpleStatementLine)
                     and parsed.line(node) == 5)
    first = NodeEdits(insert_before={statement: (cst.parse_statement("a = 1\n"),)})
    second = NodeEdits(insert_before={statement: (cst.parse_statement("a = 1\n"), cst.parse_statement("b = 2\n"))})
    merged, conflicts = combine(parsed, [first, second])
    assert conflicts == []
    assert "    a = 1\n    b = 2\n    y = x.float() + 1\n" in apply_edits(SOURCE, render(parsed, merged))


def test_a_verb_applies_the_findings_it_chooses_and_shares_their_import():
    block = ("def attend{n}(q, k, v):\n    w = (q @ k.transpose(-2, -1)).softmax(dim=-1)\n    return w @ v\n")
    source = "import math\n\n\n" + block.format(n=1) + "\n\n" + block.format(n=2)  # no torch import yet
    result = analyze_source(source, "m.py", patches=False)
    first, second = result.findings
    assert first.patch is None and second.patch is None  # nothing asked for diffs
    one = result.fixed_with([second]).text
    assert one.count("scaled_dot_product_attention") == 1 and "def attend1(q, k, v):\n    w = (q @" in one
    both = result.fixed_with([first, second])
    assert both.problems == [] and both.text == result.fixed
    assert both.text.count("import torch.nn.functional as F") == 1
    assert both.text.count("F.scaled_dot_product_attention") == 2


def test_a_file_result_names_the_fix_it_left_out():
    from advisor.contracts.detected import Detected
    from advisor.engine.static import FileResult
    from advisor.contracts.finding import Finding

    parsed, call, binary = _parsed()
    found = []
    for rule, node, code in (("ADV304", binary, "x.double()"), ("ADV301", call, "x.half()")):
        fix = SourceEdit(node, code).as_edits()
        finding = Finding(rule=rule, kind="cast", path="m.py", line=5, end_line=5, function="f", message="m",
                          fixable=True)
        found.append(Detected(finding, fix, render(parsed, fix)))
    result = FileResult("m.py", SOURCE, [d.finding for d in found], detected=found, parsed=parsed)
    applied = result.applied
    assert applied.text == SOURCE.replace("x.float() + 1", "x.double()") and applied.not_applied == 1
    assert applied.problems == ["m.py:5 ADV301: fix not applied, it changes the code of the fix of m.py:5 ADV304"]


def test_an_edit_that_deletes_a_binding_still_read_later_is_refused():
    """Whatever rule asked for it: `y` is read by the return after its only binding is gone."""
    import pytest

    from advisor.rewrite.apply import RewriteFailed
    parsed, _, _ = _parsed()
    assign = next(node for node in parsed.parents if isinstance(node, cst.Assign))
    with pytest.raises(RewriteFailed, match="`y`"):
        render(parsed, NodeEdits(remove={assign}))
    binding_kept = NodeEdits(replace={assign: cst.parse_statement("y = x\n").body[0]})
    assert "    y = x\n" in apply_edits(SOURCE, render(parsed, binding_kept))


def test_code_quoted_into_a_replacement_gets_the_edits_of_the_nodes_it_holds():
    """A statement rewritten around a user expression keeps that expression's own edits (a hoisted mask that
    read the deleted scores' dtype reads the query's instead)."""
    parsed, call, binary = _parsed()
    assign = next(node for node in parsed.parents if isinstance(node, cst.Assign))
    moved = cst.Assign([cst.AssignTarget(cst.Name("y"))], binary)  # quotes `x.float() + 1`
    edits = NodeEdits(replace={assign: moved, call: cst.parse_expression("x.half()")})
    fixed = apply_edits(SOURCE, render(parsed, edits))
    assert "    y = x.half() + 1\n" in fixed

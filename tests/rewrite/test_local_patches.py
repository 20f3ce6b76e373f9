"""Patches built from the changed statements only (advisor/rewrite/splice.py) are the patches a whole-module
rewrite and diff would give, and the work per finding does not grow with the size of the file."""

from __future__ import annotations

import libcst as cst
import pytest

from advisor.fixes.attention_fix import attention_edits
from advisor.patterns.attention import find_attention
from advisor.patterns.attention.guards import settle_guards
from advisor.rewrite.apply import combine, render
from advisor.rewrite.patch import unified_diff
from advisor.rewrite.splice import apply_edits
from advisor.engine.static import analyze_source
from advisor.static.module_index import ParsedModule
from benchmarks.scan_scaling import module_with_blocks
from fixture_models import fixture_paths

POSITIVE = fixture_paths("positive")


def _whole_module_rewrite(source: str, drop_weights: bool = False, pick=None, masks_passed: bool = False) -> str:
    """The reference: render the whole module (what render does when statements do not render back).
    `masks_passed`: as with --unsafe-fixes, optional masks go to SDPA rather than behind their absence."""
    parsed = ParsedModule(source, "m.py")
    parsed.statement_spans = lambda statements: None
    matches = [m for m in find_attention(parsed) if m.output_node is not None]
    for match in matches:  # as the pipeline does: what stays assumed about metadata is guarded where it can be
        settle_guards(match, masks_passed)
    (edit,) = _rewrite_edits(parsed, matches if pick is None else [matches[pick]], drop_weights)
    return edit.text


def _rewrite_edits(parsed, matches, drop_weights):
    """Every match's fix, applied together by the rewrite layer."""
    merged, conflicts = combine(parsed, [attention_edits(parsed, m, drop_weights) for m in matches])
    assert conflicts == []
    return render(parsed, merged)


@pytest.mark.parametrize("fixture", POSITIVE, ids=lambda p: p.stem)
def test_local_patch_equals_the_whole_module_diff(fixture):
    source = fixture.read_text()
    result = analyze_source(source, "m.py", unsafe_fixes=True)  # some positives' patches are unsafe (ASSUMES:)
    (finding,) = result.findings
    assert result.fixed == _whole_module_rewrite(source, masks_passed=True)
    assert finding.patch == unified_diff("m.py", source, result.fixed)


def test_many_blocks_each_patch_and_the_whole_fix_match_the_reference():
    source = module_with_blocks(5) + "\n\ndef tail():\n    return 1\n"
    result = analyze_source(source, "m.py")
    assert len(result.findings) == 5
    assert result.fixed == _whole_module_rewrite(source)
    for index, finding in enumerate(result.findings):
        assert finding.patch == unified_diff("m.py", source, _whole_module_rewrite(source, pick=index))


def test_new_import_and_blocks_close_together_share_hunks():
    body = ("def attend(q, k, v):\n    w = (q @ k.transpose(-2, -1)).softmax(dim=-1)\n    return w @ v\n")
    source = "import torch\n\n" + body + "\n" + body.replace("attend", "attend2")
    parsed = ParsedModule(source, "m.py")
    matches = [m for m in find_attention(parsed) if m.output_node is not None]
    assert len(matches) == 2
    for match in matches:  # as the pipeline does (the keys' and values' lengths are guarded)
        settle_guards(match)
    edits = _rewrite_edits(parsed, matches, drop_weights=False)
    assert apply_edits(source, edits) == _whole_module_rewrite(source)
    from advisor.rewrite.splice import local_diff

    assert local_diff("m.py", parsed.lines, edits) == unified_diff("m.py", source, apply_edits(source, edits))


def test_a_changed_statement_that_does_not_render_back_falls_back_to_the_whole_module():
    source = POSITIVE[0].read_text().split("\n\ndef make")[0].rstrip("\n")  # the class last, no final newline
    parsed = ParsedModule(source, "m.py")
    assert parsed.statement_spans([parsed.module.body[-1]]) is None
    result = analyze_source(source, "m.py")
    assert "scaled_dot_product_attention" in result.fixed and not result.fixed.endswith("\n")
    assert result.fixed == _whole_module_rewrite(source)
    assert result.findings[0].patch == unified_diff("m.py", source, result.fixed)


def test_an_unchanged_statement_that_does_not_render_back_leaves_the_patch_local():
    """Only the statements a fix changes are checked against the source: the last one (no final newline) keeps
    its bytes, and the patch is the whole-module rewrite's."""
    source = POSITIVE[0].read_text().rstrip("\n")
    parsed = ParsedModule(source, "m.py")
    assert parsed.statement_spans([parsed.module.body[-1]]) is None
    assert parsed.statement_spans(list(parsed.module.body[:-1])) is not None
    result = analyze_source(source, "m.py")
    assert "scaled_dot_product_attention" in result.fixed and result.fixed.endswith(source[source.index("\n\ndef make"):])
    assert result.fixed == _whole_module_rewrite(source)
    assert result.findings[0].patch == unified_diff("m.py", source, result.fixed)


def test_rendering_work_per_finding_does_not_grow_with_the_file(monkeypatch):
    """Characters rendered by libcst while scanning: linear in the blocks (the quadratic scan doubled it per block)."""
    rendered = [0]
    original = cst.Module.code_for_node

    def counting(self, node):
        code = original(self, node)
        rendered[0] += len(code)
        return code

    monkeypatch.setattr(cst.Module, "code_for_node", counting)
    cost = {}
    for blocks in (4, 16):
        rendered[0] = 0
        analyze_source(module_with_blocks(blocks), "m.py")
        cost[blocks] = rendered[0]
    assert cost[16] < 4.5 * cost[4]  # linear gives ~4x; rendering the module per finding gave ~16x

"""Tests generated from the rule units (the Fixit pattern): every example a rule declares is run through the
static engine, and every code a detector can emit has a registered rule with all its documentation."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.engine.static import analyze_source
from advisor.registry import DOC_SECTIONS, families, load_rules
from advisor.report.rules_doc import explain, with_table
from advisor.report.rules_doc import main as regenerate_table

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [pytest.param(rule, example, id=f"{rule.code}-{'pos' if example.positive else 'neg'}{index}")
            for rule in load_rules().values() for index, example in enumerate(rule.examples) if not example.workload]
WORKLOADS = [pytest.param(rule, example, id=f"{rule.code}-{'pos' if example.positive else 'neg'}{index}")
             for rule in load_rules().values() for index, example in enumerate(rule.examples) if example.workload]


@pytest.mark.parametrize("rule, example", EXAMPLES)
def test_rule_example(rule, example):
    result = analyze_source(example.source, "example.py", unsafe_fixes=example.unsafe)
    mine = [f for f in result.findings if f.rule == rule.code]
    if example.positive:
        assert len(mine) == 1, [f.rule for f in result.findings]
        if example.fixed is not None:
            assert result.fixed == example.fixed
            assert mine[0].patch  # the finding shows the fix it applies
            assert not [f for f in analyze_source(result.fixed, "example.py").findings if f.rule == rule.code]
        if example.reason is not None:
            assert not mine[0].fixable and example.reason in (mine[0].reason or "")
    elif example.reason is None:
        assert mine == []
    else:
        assert all(not f.fixable and example.reason in (f.reason or "") for f in mine) and mine


@pytest.mark.parametrize("rule, example", WORKLOADS)
def test_rule_workload_example(rule, example, tmp_path):
    """Profiled for real (one step): a positive is measured on its file; its fix through the profile's evidence
    (what `fix --profile` applies) gives exactly `fixed`, or no patch and `reason`; a negative is not measured."""
    from advisor.engine.profiling import evidence_from_report, profile_workload
    from advisor.workload_loader import load_workload

    path = tmp_path / f"example_{rule.code.lower()}.py"
    path.write_text(example.source, encoding="utf-8")
    target = f"{path}:workload"
    report = profile_workload(load_workload(target), target)
    measured = [f for f in report.findings if f.rule == rule.code and Path(f.path).resolve() == path.resolve()]
    if not example.positive:
        assert measured == [], [f.message for f in measured]
        return
    assert measured, [f.rule for f in report.findings]
    if example.fixed is None and example.reason is None:
        return  # a report-only rule: being measured is the whole example
    result = analyze_source(example.source, str(path), unsafe_fixes=example.unsafe,
                            runtime=evidence_from_report(report))
    mine = [f for f in result.findings if f.rule == rule.code]
    assert mine, [f.rule for f in result.findings]
    if example.fixed is not None:
        assert result.fixed == example.fixed
    if example.reason is not None:
        assert all(not f.fixable and example.reason in (f.reason or "") for f in mine)


def test_every_rule_a_profile_detects_has_profiled_examples():
    """Its own op-graph detector, or a runtime rule of a family with a graph hook (not trace-only ones)."""
    for family in families():
        for rule in family.rules:
            if rule.graph is not None or ("runtime" in rule.detectors and family.graph is not None):
                assert {e.positive for e in rule.examples if e.workload} == {True, False}, rule.code


def test_every_rule_with_a_static_detector_has_examples_and_a_fixing_one():
    for rule in load_rules().values():
        if "static" in rule.detectors:
            positives = [e for e in rule.examples if e.positive]
            assert positives, rule.code
            assert rule.fix == "none" or any(e.fixed for e in positives), rule.code


def test_every_rule_has_every_doc_section_and_an_example():
    for rule in load_rules().values():
        for section in DOC_SECTIONS:
            assert len(getattr(rule, section).split()) >= 5, (rule.code, section)
        assert rule.shown_example.strip(), rule.code
        assert set(rule.detectors) <= {"static", "runtime"} and rule.detectors, rule.code


def _codes_in(module_text: str) -> set[str]:
    return set(re.findall(r"\bADV\d{3}\b", module_text))


def test_every_code_a_detector_can_emit_is_a_registered_rule():
    """Detectors name codes only through the units (`<unit>.<RULE>.code`), so every code they can emit is one the
    registry declares; a string literal code anywhere in the package outside rules/ would bypass that."""
    codes = set(load_rules())
    for family in families():
        assert {rule.code for rule in family.rules} <= codes
    literal = {}
    for path in (ROOT / "advisor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"ADV\d{3}", node.value):
                literal[str(path.relative_to(ROOT))] = node.value
    assert literal == {}


def test_the_copy_cast_prefilter_passes_every_cast_the_static_proofs_read():
    from advisor.patterns.copy_cast_roles import CAST_METHODS, DTYPES
    from advisor.rules.copies_casts import FAMILY

    for spelling in [*CAST_METHODS, *DTYPES]:
        assert FAMILY.might_match(f"x.{spelling}()"), spelling
    casts = [f"x.{method}()" for method in CAST_METHODS] + [f"x.to(torch.{dtype})" for dtype in DTYPES]
    for call in casts + ["x.contiguous()", "x.clone()"]:
        for spelling in (call, call.replace(".", " . ", 1).replace("(", " (", 1),  # every gap a call may have
                         call.replace(".", ".\\\n", 1), call.replace(".", ".  # comment\n  ", 1),
                         f"({call.replace('(', ')(', 1)}"):  # (x.float)()
            assert FAMILY.might_find(spelling, spelling.lower(), library_file=False), spelling


def test_every_call_rule_that_proves_names_the_methods_its_screen_looks_for():
    """A static proof is screened by the methods its rule names: one that names none leaves its family unscreened
    (a rule added without them is never skipped)."""
    from advisor.contracts.call_rule import CallRule, method_screen
    from advisor.rules.copies_casts import FAMILY

    assert FAMILY.screen is not None
    for rule in FAMILY.rules:
        assert rule.prove is None or rule.methods, rule.code
    unnamed = CallRule(**{**vars(FAMILY.rules[0]), "code": "ADV299", "methods": ()})
    assert method_screen((*FAMILY.rules, unnamed)) is None


def test_rules_explain_documents_every_code(capsys):
    for code, rule in load_rules().items():
        assert main(["rules", "--explain", code.lower()]) == 0
        out = capsys.readouterr().out
        for heading in ("What it does", "Why is this slow", "Example", "Fix safety"):
            assert heading in out, (code, heading)
        assert rule.title.split()[0].strip("`") in out
    assert main(["rules", "--explain", "ADV999"]) == 2
    assert "unknown rule code" in capsys.readouterr().err
    assert main(["rules", "--explain", "ADV304", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["rule"]["what"] == load_rules()["ADV304"].what
    assert "## Fix safety" in explain(load_rules()["ADV101"])


def test_readme_rule_table_is_the_registry():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert with_table(readme) == readme, "stale: run `python -m advisor.report.rules_doc README.md`"


def test_regenerating_the_table_of_a_file_without_markers_leaves_it_as_it_was(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("# a page without the table\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no rules-table markers"):
        regenerate_table([str(page)])
    assert page.read_text(encoding="utf-8") == "# a page without the table\n"

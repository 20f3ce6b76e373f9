"""Configuration-rule matches as findings, each with its fix (a one-expression edit)."""

from __future__ import annotations

from advisor.contracts.detected import Detected
from advisor.contracts.finding import Finding
from advisor.hf.config_rules import find_config_issues
from advisor.registry import load_rules
from advisor.rewrite.apply import RewriteFailed, render
from advisor.static.module_index import ParsedModule


def config_findings(parsed: ParsedModule, rules, autograd=None) -> list[Detected]:
    """The finding and its fix for every match of `rules` (the attention_config family's SiteRules); `autograd`:
    what the scanned tree asks of autograd (advisor.static.tree_facts.TreeFacts; None: this file alone)."""
    results = []
    for match in find_config_issues(parsed, rules, autograd):
        rule = load_rules()[match.rule]
        fix = match.edit.as_edits() if match.edit is not None else None
        reasons, edits = match.reasons, None
        if fix is not None:
            try:
                edits = render(parsed, fix)
            except RewriteFailed as exc:
                fix, reasons = None, (str(exc),)
        safety = ("unsafe" if match.unsafe else "safe") if fix is not None else rule.fix_safety
        finding = Finding(rule=match.rule, kind=rule.kind, path=parsed.path, line=parsed.line(match.node),
                          end_line=parsed.end_line(match.node), function=match.function,
                          message=match.message or rule.title, fixable=fix is not None, fix_safety=safety,
                          reasons=reasons)
        results.append(Detected(finding, fix, edits))
    return results

"""Configuration-rule matches as findings, each with its own patch (a one-expression edit)."""

from __future__ import annotations

from advisor.findings import Finding
from advisor.hf.config_rules import find_config_issues
from advisor.rewrite.apply import RewriteFailed, SourceEdit, rewrite
from advisor.rewrite.patch import unified_diff
from advisor.registry import load_rules
from advisor.static.module_index import ParsedModule


def config_findings(parsed: ParsedModule) -> list[tuple[Finding, SourceEdit | None, str | None]]:
    """(finding, its edit, the source with only that edit applied) for every configuration match."""
    results = []
    for match in find_config_issues(parsed):
        rule = load_rules()[match.rule]
        edit, reason, patched, patch = match.edit, match.reason, None, None
        if edit is not None:
            try:
                patched = rewrite(parsed, [], drop_weights=False, edits=[edit])
                patch = unified_diff(parsed.path, parsed.source, patched)
            except RewriteFailed as exc:
                edit, reason, patched = None, str(exc), None
        safety = ("unsafe" if match.unsafe else "safe") if edit is not None else rule.fix_safety
        finding = Finding(rule=match.rule, kind=rule.kind, path=parsed.path, line=parsed.line(match.node),
                          end_line=parsed.end_line(match.node), function=match.function,
                          message=match.message or rule.title, fixable=edit is not None, fix_safety=safety,
                          reason=reason, patch=patch)
        results.append((finding, edit, patched))
    return results

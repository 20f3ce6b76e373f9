"""Configuration-rule matches as findings, each with its own patch (a one-expression edit)."""

from __future__ import annotations

from advisor.findings import Finding, display_path
from advisor.hf.config_rules import find_config_issues
from advisor.registry import load_rules
from advisor.rewrite.apply import RewriteFailed, SourceEdit, rewrite_edits
from advisor.rewrite.splice import Edit, local_diff
from advisor.static.module_index import ParsedModule


def config_findings(parsed: ParsedModule) -> list[tuple[Finding, SourceEdit | None, list[Edit] | None]]:
    """(finding, its edit, the character edits of that edit alone) for every configuration match."""
    results = []
    for match in find_config_issues(parsed):
        rule = load_rules()[match.rule]
        edit, reason, edits, patch = match.edit, match.reason, None, None
        if edit is not None:
            try:
                edits = rewrite_edits(parsed, [], drop_weights=False, edits=[edit])
                patch = local_diff(display_path(parsed.path), parsed.lines, edits)
            except RewriteFailed as exc:
                edit, reason, edits = None, str(exc), None
        safety = ("unsafe" if match.unsafe else "safe") if edit is not None else rule.fix_safety
        finding = Finding(rule=match.rule, kind=rule.kind, path=parsed.path, line=parsed.line(match.node),
                          end_line=parsed.end_line(match.node), function=match.function,
                          message=match.message or rule.title, fixable=edit is not None, fix_safety=safety,
                          reason=reason, patch=patch)
        results.append((finding, edit, edits))
    return results

"""SARIF 2.1.0 for code-scanning UIs (GitHub, VS Code)."""

from __future__ import annotations

from advisor.findings import Finding, ScanError, display_path
from advisor.registry import load_rules


def to_sarif(findings: list[Finding], errors: list[ScanError]) -> dict:
    """Findings as results; files that could not be scanned as the invocation's error notifications."""
    rules = load_rules()
    used = sorted({f.rule for f in findings})
    return {
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {"name": "advisor", "rules": [
                {"id": code, "shortDescription": {"text": rules[code].title},
                 "fullDescription": {"text": rules[code].rationale},
                 "helpUri": (rules[code].references or [""])[0]} for code in used if code in rules]}},
            "results": [{
                "ruleId": f.rule,
                "level": "warning",
                "message": {"text": f.message if f.reason is None else f"{f.message} ({f.reason})"},
                "locations": [{"physicalLocation": {
                    "artifactLocation": {"uri": display_path(f.path)},
                    "region": {"startLine": f.line, "endLine": f.end_line}}}],
            } for f in findings],
            "invocations": [{
                "executionSuccessful": not any(e.internal for e in errors),
                "toolExecutionNotifications": [{
                    "level": "error",
                    "message": {"text": e.message},
                    "locations": [{"physicalLocation": {"artifactLocation": {"uri": display_path(e.path)}}}],
                } for e in errors],
            }],
        }],
    }

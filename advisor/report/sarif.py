"""SARIF 2.1.0 for code-scanning UIs (GitHub, VS Code)."""

from __future__ import annotations

import os
from urllib.parse import quote

from advisor.contracts.finding import Finding, ScanError, as_text, located_message, relative_path
from advisor.registry import load_rules


def to_sarif(findings: list[Finding], errors: list[ScanError], files_scanned: int) -> dict:
    """Findings as results; files that could not be scanned as the invocation's error notifications. The run was
    successful when something was scanned and advisor itself failed on no file."""
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
                "message": {"text": located_message(f)},
                "locations": [{"physicalLocation": {
                    "artifactLocation": {"uri": _uri(f.path)},
                    **({} if "cell" in f.extra else {"region": {"startLine": f.line, "endLine": f.end_line}})}}],
            } for f in findings],
            "invocations": [{
                "executionSuccessful": files_scanned > 0 and not any(e.internal for e in errors),
                "toolExecutionNotifications": [{
                    "level": "error",
                    "message": {"text": as_text(e.message)},
                    "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(e.path)}}}],
                } for e in errors],
            }],
        }],
    }


def _uri(path: str) -> str:
    """A URI (RFC 3986) for display_path's choice of path, the name's own bytes percent-encoded (`%20` for a space,
    `%FF` for a byte that is not UTF-8): relative to the current directory, else a file:// URI."""
    shown = relative_path(path)
    encoded = quote(os.fsencode(shown), safe="/")
    return f"file://{encoded}" if os.path.isabs(shown) else encoded

"""Found, not patched: the measured findings of the original's profile that no patch ran for, each with its share
of the measured op time and why (the static rule's refusal, an unsafe fix left unrun, SDPA already on another
branch), so the largest opportunity is never hidden behind "nothing to patch".

A measured finding is covered by a patch whose lines overlap it in the same file; a patch that ran has its verdict
in the patches table instead. Negligible findings (below their rule's threshold) are left out, as in `profile`.
"""

from __future__ import annotations

import os

from advisor.contracts.rule_choice import RuleChoice
from advisor.engine.static import analyze_source, comment_suppressions, might_match, suppressing_line
from advisor.contracts.finding import Finding
from advisor.registry import is_selected
from advisor.static.discover import read_source

NO_RULE = "no rewrite rule matched this code: advisor has no patch for it"


def unpatched(measured: list[dict], candidates: dict, unsafe_fixes: bool, backend: str,
              rules: RuleChoice = RuleChoice()) -> list[dict]:
    """One entry per measured finding that no patch ran for, largest share first. `candidates` are optimize's
    Candidates (pid -> PatchCandidate): a candidate with no patched text (an unsafe fix without --unsafe-fixes) did
    not run. A static finding the configuration (`rules`) deselects or a comment suppresses says so (promise
    breaker round 31: such blocks read "no rewrite rule matched")."""
    static: dict[str, list[Finding]] = {}
    entries = []
    for finding in measured:
        if finding.get("negligible"):
            continue
        path = os.path.realpath(finding["path"])
        covering = [c for c in candidates.values() if _same_file(c.path, path) and _overlaps(c.finding, finding)]
        if any(c.patched is not None for c in covering):
            continue
        if covering:
            first = covering[0]
            cause, static_rule, patch = first.reason, first.finding.rule, first.id
        else:
            if path not in static:
                static[path] = _static_findings(path, unsafe_fixes, backend)
            refusals = [f for f in static[path] if _overlaps(f, finding)]
            cause = "; ".join(_why(f, path, rules) for f in refusals) or NO_RULE
            static_rule, patch = (refusals[0].rule if refusals else None), None
        entries.append({"rule": finding.get("rule"), "path": finding.get("path"), "line": finding.get("line"),
                        "end_line": finding.get("end_line"), "function": finding.get("function"),
                        "message": finding.get("message"), "share": finding.get("share"),
                        "self_us": finding.get("self_us"), "static_rule": static_rule, "patch": patch,
                        "reason": cause})
    return sorted(entries, key=lambda entry: -(entry["share"] or 0.0))


def _static_findings(path: str, unsafe_fixes: bool, backend: str) -> list[Finding]:
    """Every static finding of the file, suppressed ones too (`suppressed` in `extra`: its comment's line)."""
    source = read_source(path)
    if not hasattr(source, "text") or not might_match(source.text):
        return []
    try:
        findings = analyze_source(source.text, path, unsafe_fixes=unsafe_fixes, backend=backend, patches=False,
                                  suppressions=False).findings
    except Exception:  # noqa: BLE001 - a file we cannot analyse offers no reason; the scan verb reports why
        return []
    suppressed = comment_suppressions(source.text)
    for finding in findings:
        line = suppressing_line(suppressed, finding, finding.rule)
        if line is not None:
            finding.extra["suppressed"] = line
    return findings


def _why(finding: Finding, path: str, rules: RuleChoice) -> str:
    select, ignore = rules.codes(path)
    if "suppressed" in finding.extra:
        return f"{finding.rule}: suppressed by the `# advisor: ignore` comment at line {finding.extra['suppressed']}"
    if not is_selected(finding.rule, select, ignore) or rules.excludes(path):
        return f"{finding.rule}: not selected by the configuration ([tool.advisor] select, ignore, exclude or " \
               "per-file-ignores)"
    return f"{finding.rule}: {finding.reason or finding.message}"


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == b


def _overlaps(static, measured: dict) -> bool:
    start, end = measured.get("line") or 0, measured.get("end_line") or measured.get("line") or 0
    return static.line <= end and start <= (static.end_line or static.line)

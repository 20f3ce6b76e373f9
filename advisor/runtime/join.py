"""`scan --profile`: copy measured cost from runtime findings onto the static findings at the same lines."""

from __future__ import annotations

import os

from advisor.contracts.finding import Finding


def annotate_findings(static_findings: list[Finding], profile_findings: list[Finding]) -> list[Finding]:
    """Static findings with self_us/share/calls from every overlapping runtime finding (same realpath, line
    ranges [line, end_line] intersecting), summed when several overlap; sorted by cost, unmeasured last."""
    by_path: dict[str, list[Finding]] = {}
    for runtime in profile_findings:
        by_path.setdefault(os.path.realpath(runtime.path), []).append(runtime)
    for finding in static_findings:
        overlapping = [r for r in by_path.get(os.path.realpath(finding.path), [])
                       if r.line <= finding.end_line and finding.line <= r.end_line]
        if overlapping:
            finding.extra["self_us"] = sum(r.extra.get("self_us", 0.0) for r in overlapping)
            finding.extra["share"] = sum(r.extra.get("share", 0.0) for r in overlapping)
            finding.extra["calls"] = max(r.extra.get("calls", 0) for r in overlapping)
            finding.extra["measured_by"] = sorted({r.rule for r in overlapping})
    return sorted(static_findings, key=lambda f: (-f.extra.get("self_us", -1.0), f.path, f.line))

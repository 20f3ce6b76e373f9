"""Detections + measured time -> Findings ranked by cost. Detections at the same source span merge (one per
layer becomes one finding with more calls); a finding under its rule's threshold is marked negligible."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from advisor.contracts.finding import Finding
from advisor.registry import load_rules

if TYPE_CHECKING:  # both import torch; `analyze` ranks trace findings without it
    from advisor.contracts.detection import Detection
    from advisor.runtime.time_attribution import Timing


def to_findings(detections: list[Detection], timing: Timing) -> list[Finding]:
    rules = load_rules()
    groups: dict[tuple, list[Detection]] = defaultdict(list)
    for d in detections:
        groups[(d.rule, d.loc.path, d.loc.line, d.end_line)].append(d)
    findings = []
    for (code, path, line, end_line), group in groups.items():
        rule = rules[code]
        nodes = frozenset().union(*(d.nodes for d in group))
        self_us, _ = timing.cost(nodes)
        share = self_us / timing.op_us if timing.op_us else 0.0
        negligible = share < rule.threshold_share
        evidence = dict(group[0].evidence)
        evidence["instances"] = len(group)
        for key in group[0].per_call:
            evidence[key] = _distinct(d.per_call[key] for d in group)
        findings.append(Finding(
            rule=code, kind=rule.kind, path=path, line=line, end_line=end_line, function=group[0].loc.function,
            message=group[0].message, fixable=False, fix_safety=rule.fix_safety,
            reasons=("runtime finding: `advisor fix PATH --profile TARGET` fixes it where the source allows",),
            extra={"self_us": round(self_us, 3), "share": round(share, 5), "calls": len(group),
                   "negligible": negligible, "evidence": evidence}))
    return rank(findings)


def _distinct(values) -> list:
    """Each value once, in the order first seen (what every call saw, without one entry per layer)."""
    seen: list = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def rank(findings: list[Finding]) -> list[Finding]:
    """Most expensive first; ties keep source order. Adds a 1-based `rank`."""
    ordered = sorted(findings, key=lambda f: (-f.extra.get("self_us", 0.0), f.path, f.line, f.rule))
    for position, finding in enumerate(ordered, 1):
        finding.extra["rank"] = position
    return ordered

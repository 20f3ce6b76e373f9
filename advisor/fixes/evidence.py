"""Runtime evidence for copy/cast fixes, keyed by source line: what the profiler's detectors found there, how
many watched calls ran there in the recorded step, and whether any op there wrote a tensor in place.

A detection says "this call was redundant"; a fix needs "every call on this line was", so the detections are
counted against the calls that ran. Lines are joined to source as `scan --profile` joins them: same realpath,
same line."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from advisor.findings import Finding


@dataclass(frozen=True)
class RuntimeHit:
    """One runtime finding on a line: its rule, cost and evidence."""

    rule: str
    line: int
    end_line: int
    calls: int
    function: str
    message: str
    extra: dict

    @classmethod
    def of(cls, finding: Finding) -> "RuntimeHit":
        keep = {k: finding.extra[k] for k in ("self_us", "share", "calls", "evidence") if k in finding.extra}
        return cls(finding.rule, finding.line, finding.end_line, finding.extra.get("calls", 0), finding.function,
                   finding.message, keep)


@dataclass
class FileEvidence:
    """What the profile saw in one file (picklable: it travels to scan worker processes)."""

    hits: dict[int, list[RuntimeHit]] = field(default_factory=dict)  # line -> runtime findings there
    observed: Counter = field(default_factory=Counter)  # (line, call name) -> watched calls that ran there
    mutating_lines: frozenset[int] = frozenset()  # lines where an op wrote a tensor in place

    def hit(self, line: int, rule: str) -> RuntimeHit | None:
        return next((h for h in self.hits.get(line, ()) if h.rule == rule), None)

    def calls(self, line: int, *rules: str) -> int:
        return sum(h.calls for h in self.hits.get(line, ()) if h.rule in rules)


@dataclass
class RuntimeEvidence:
    target: str
    files: dict[str, FileEvidence] = field(default_factory=dict)  # realpath -> evidence

    def for_path(self, path: str) -> FileEvidence | None:
        return self.files.get(os.path.realpath(path))


def evidence_from_report(report) -> RuntimeEvidence:
    """From a runtime.profile.ProfileReport: its findings, and the watched calls and in-place ops of its
    recorded step, by file and line."""
    evidence = RuntimeEvidence(report.target)

    def file(path: str) -> FileEvidence:
        return evidence.files.setdefault(os.path.realpath(path), FileEvidence())

    for finding in report.findings:
        file(finding.path).hits.setdefault(finding.line, []).append(RuntimeHit.of(finding))
    graph = report.capture.graph
    for call in graph.calls:
        if call.loc is not None:
            file(call.loc.path).observed[(call.loc.line, call.name)] += 1
    mutating: dict[str, set[int]] = {}
    for _, data in graph.graph.nodes(data=True):
        if data.get("mutable") and data.get("loc") is not None:
            mutating.setdefault(os.path.realpath(data["loc"].path), set()).add(data["loc"].line)
    for path, lines in mutating.items():
        file(path).mutating_lines = frozenset(lines)
    return evidence

"""The profiling pipeline as one function: Workload -> ProfileReport (findings ranked by measured time)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from advisor.contracts.evidence import FileEvidence, RuntimeEvidence, RuntimeHit, add_block_calls
from advisor.contracts.finding import Finding, as_text
from advisor.engine.runtime_engine import after_profile, runtime_findings
from advisor.runtime.capture import Capture, capture
from advisor.runtime.detect.attention_graph import block_calls
from advisor.runtime.runner import check_runs, prepare
from advisor.runtime.time_attribution import Timing, attribute
from advisor.workload import Workload


@dataclass
class ProfileReport:
    target: str
    capture: Capture
    timing: Timing
    findings: list[Finding]
    train: bool

    def to_json(self) -> dict:
        c, t = self.capture, self.timing
        return {"version": 1, "target": as_text(self.target), "device": c.device, "dtype": c.dtype,
                "mode": "train" if self.train else "eval", "steps": c.profiled_steps,
                "step_us": round(c.step_us, 3), "step_iqr_us": round(c.step_iqr_us, 3), "op_us": round(t.op_us, 3),
                "attributed_share": round(t.attributed_share, 5), "statement_share": round(t.statement_share, 5),
                "graph_truncated": c.graph.truncated,
                "findings": [f.to_json() for f in self.findings]}


def profile_workload(workload: Workload, target: str, device: str | None = None, dtype: str | None = None,
                     train: bool = False, trace_path: str | None = None,
                     progress: Callable[[str], None] = lambda _: None) -> ProfileReport:
    prepared = prepare(workload, device, dtype, train)
    progress("checking that the model runs")
    check_runs(prepared, target)
    result = capture(prepared, workload.steps, trace_path, progress)
    progress("attributing time and detecting")
    timing = attribute(result.events, result.graph, result.profiled_steps)
    findings = runtime_findings(result.graph, result.device, timing)
    findings = after_profile(workload.model, target, findings)
    return ProfileReport(target, result, timing, findings, train)


def evidence_from_report(report) -> RuntimeEvidence:
    """From a ProfileReport: its findings, and the watched calls and in-place ops of its recorded step, by file
    and line, and what its attention blocks saw."""
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
    add_block_calls(evidence, block_calls(graph))
    return evidence

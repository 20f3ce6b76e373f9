"""The profiling pipeline as one function: Workload -> ProfileReport (findings ranked by measured time)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from advisor.engine.runtime import after_profile, runtime_findings
from advisor.contracts.finding import Finding
from advisor.runtime.capture import Capture, capture
from advisor.runtime.runner import check_runs, prepare
from advisor.runtime.timing import Timing, attribute
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
        return {"version": 1, "target": self.target, "device": c.device, "dtype": c.dtype,
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

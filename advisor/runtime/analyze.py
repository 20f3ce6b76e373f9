"""`analyze` as a function: trace files (one per rank) -> findings aggregated across ranks, a kernel
breakdown, and the list of things the traces could not show."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from advisor.findings import Finding
from advisor.registry import load_rules
from advisor.runtime.events import build, resolve_path
from advisor.runtime.rank import rank
from advisor.runtime.trace import Trace, load_trace, trace_files
from advisor.runtime.trace_detect import detect

_CATEGORIES = (("attention", ("flash", "fmha", "attention", "sdpa")), ("gemm", ("gemm", "cutlass", "matmul", "xmma",
               "bmm", "addmm", "::mm")), ("softmax", ("softmax",)), ("copy", ("copy", "memcpy", "contiguous", "clone",
               "_to_copy")), ("reduction", ("reduce", "sum", "mean", "norm")), ("elementwise", ("elementwise",
               "vectorized", "add", "mul", "div", "where", "masked_fill", "gelu", "silu")))
OP_KINDS = tuple(name for name, _ in _CATEGORIES) + ("other",)


@dataclass
class AnalyzeReport:
    traces: list[Trace]
    findings: list[Finding]
    breakdown: list[dict]
    limitations: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"version": 1, "traces": [t.path for t in self.traces], "ranks": sorted({t.rank for t in self.traces}),
                "device": "cuda" if any(t.on_device for t in self.traces) else "cpu",
                "breakdown": self.breakdown, "limitations": self.limitations,
                "findings": [f.to_json() for f in self.findings]}


def analyze_path(path: str) -> AnalyzeReport:
    traces = [load_trace(file, index) for index, file in enumerate(trace_files(path))]
    rules = load_rules()
    per_key: dict[tuple, dict] = {}
    breakdown: dict[str, float] = defaultdict(float)
    for trace in traces:
        events = build(trace.raws, trace.on_device)
        steps = max(len({e.step for e in events if e.step >= 0}), 1)
        if not trace.has_steps:
            for e in events:
                e.step = 0
        total = sum(e.self_us for e in events if e.step >= 0) / steps
        for e in events:
            if e.step >= 0:
                breakdown[op_category(e.name)] += e.self_us / steps / len(traces)
        for hit in detect(events, trace.on_device):
            anchor = events[hit.events[0]]
            path_, line, function = _where(anchor, trace)
            key = (hit.rule, path_, line)
            entry = per_key.setdefault(key, {"hit": hit, "function": function, "ranks": {}, "calls": 0.0,
                                             "share": []})
            cost = _cost(events, hit.events) / steps
            entry["ranks"][trace.rank] = entry["ranks"].get(trace.rank, 0.0) + cost
            entry["calls"] += 1 / steps / len(traces)
            entry["total"] = total
    findings = []
    for (code, path_, line), entry in per_key.items():
        hit, rule = entry["hit"], rules[code]
        self_us = sum(entry["ranks"].values()) / len(traces)
        share = self_us / entry["total"] if entry["total"] else 0.0
        findings.append(Finding(
            rule=code, kind=rule.kind, path=path_, line=line, end_line=line, function=entry["function"],
            message=hit.message, reason="from a trace: no patch (run `advisor scan`/`fix` on the source)",
            extra={"self_us": round(self_us, 3), "share": round(share, 5), "calls": round(entry["calls"], 3),
                   "negligible": share < rule.threshold_share, "evidence": hit.evidence | {
                       "per_rank_us": {str(r): round(v, 3) for r, v in sorted(entry["ranks"].items())}}}))
    grand = sum(breakdown.values()) or 1.0
    rows = [{"category": name, "us": round(us, 3), "share": round(us / grand, 5)}
            for name, us in sorted(breakdown.items(), key=lambda kv: -kv[1])]
    return AnalyzeReport(traces, rank(findings), rows, _limitations(traces))


def _where(event, trace: Trace) -> tuple[str, int, str]:
    if event.frame is None:
        return trace.path, 0, event.name
    return resolve_path(event.frame[0]), event.frame[1], event.frame[2]


def _cost(events, indices: list[int]) -> float:
    """Time of the covered ops; for an attention hit, everything from the first matmul to the last, outermost."""
    if len(indices) == 1:
        return events[indices[0]].total_us
    first, last = indices[0], indices[-1]
    return sum(e.total_us for k, e in enumerate(events[first:last + 1], first)
               if e.parent is None or e.parent < first or k in (first, last))


def op_category(name: str) -> str:
    """The kind of an op or kernel by its name (one of OP_KINDS); analyze's breakdown and optimize's reports share it."""
    lowered = name.lower()
    for category, needles in _CATEGORIES:
        if any(needle in lowered for needle in needles):
            return category
    return "other"


def _limitations(traces: list[Trace]) -> list[str]:
    notes = ["a trace has no tensor identities: whether a copy or cast is needed (ADV202-ADV204, ADV302-ADV304) "
             "and the exact span of an attention block take `advisor profile`",
             "trace stacks name a function's first line, not the statement: line is the line of the `def`"]
    for trace in traces:
        if not trace.has_stacks:
            notes.append(f"{trace.path}: no Python stacks (profile with with_stack=True and "
                         "experimental_config=_ExperimentalConfig(verbose=True)): findings have no source location")
        if not trace.has_shapes:
            notes.append(f"{trace.path}: no input shapes (record_shapes=True): SDPA fallback reasons and mask "
                         "sizes are unknown")
        if not trace.has_steps:
            notes.append(f"{trace.path}: no ProfilerStep markers: times are for the whole trace, not per step")
        if not trace.on_device:
            notes.append(f"{trace.path}: no GPU kernels: the breakdown is by CPU op name")
    return notes

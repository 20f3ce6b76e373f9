"""`analyze` as a function: trace files (one per rank) -> findings aggregated across ranks, a kernel
breakdown, and the list of things the traces could not show."""

from __future__ import annotations

from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

from advisor.contracts.finding import Finding, ScanError, as_text
from advisor.registry import load_rules
from advisor.runtime.events import build, resolve_path
from advisor.runtime.rank import rank
from advisor.runtime.trace import Trace, TraceError, load_trace, trace_files
from advisor.contracts.detection import TraceHit
from advisor.runtime.trace_detect import detect

# First match wins: convolutions before gemm (cuDNN's implicit-GEMM kernels), normalisations before reductions.
_CATEGORIES = (("attention", ("flash", "fmha", "attention", "sdpa")),
               ("convolution", ("convolution", "conv1d", "conv2d", "conv3d", "conv_transpose", "slow_conv", "fprop",
                                "dgrad", "wgrad", "winograd")),
               ("normalization", ("layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm",
                                  "layernorm", "batchnorm", "groupnorm")),
               ("gemm", ("gemm", "cutlass", "matmul", "xmma",
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
    errors: list[ScanError] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"version": 1, "traces": [as_text(t.path) for t in self.traces],
                "ranks": sorted({t.rank for t in self.traces}),
                "device": "cuda" if any(t.on_device for t in self.traces) else "cpu",
                "breakdown": self.breakdown, "limitations": [as_text(line) for line in self.limitations],
                "findings": [f.to_json() for f in self.findings], "errors": [e.to_json() for e in self.errors]}


@dataclass
class _Located:
    """The detections at one (rule, path, line) of a trace: the first one's function and hit, each one's cost."""
    function: str
    hit: TraceHit
    costs: array = field(default_factory=lambda: array("d"))


@dataclass
class _TraceResult:
    """One trace's detections and time by category, per step; its events are gone by then."""
    trace: Trace
    steps: int
    total_us: float
    category_us: dict[str, float]
    hits: dict[tuple[str, str, int], _Located]  # by (rule, path, line), in the order first found


def analyze_path(path: str) -> AnalyzeReport:
    """Traces are read one at a time; one that cannot be read or analysed is an error entry and the others
    (the other ranks) are still analysed. When none could be, the report has no traces and its errors say why."""
    results, errors = [], []
    try:
        files = trace_files(path)
    except TraceError as exc:
        files, errors = [], [ScanError(exc.path, exc.reason)]
    for index, file in enumerate(files):
        try:
            results.append(_analyse_file(file, index))
        except TraceError as exc:
            errors.append(ScanError(exc.path, exc.reason))
        except Exception as exc:  # noqa: BLE001 - a bug of ours on one trace must not hide the other ranks
            errors.append(ScanError(file, f"internal error while analysing ({type(exc).__name__}: {exc}); "
                                          "please report it"))
    traces = [result.trace for result in results]
    findings, breakdown = _aggregate(results)
    return AnalyzeReport(traces, rank(findings), breakdown, _limitations(traces), errors)


def _analyse_file(file: str, index: int) -> _TraceResult:
    trace, raws = load_trace(file, index)
    events = build(raws, trace.on_device)
    del raws
    steps = max(len(set(events.step) - {-1}), 1)
    if not trace.has_steps:
        events.whole_trace_as_one_step()
    category_us: dict[str, float] = defaultdict(float)
    for name, step, self_us in zip(events.name, events.step, events.self_us):  # columns: no object per op
        if step >= 0:
            category_us[op_category(events.names[name])] += self_us / steps
    total = sum(self_us for self_us, step in zip(events.self_us, events.step) if step >= 0)
    hits: dict[tuple[str, str, int], _Located] = {}
    for hit in detect(events, trace.on_device):
        path_, line, function = _where(events[hit.events[0]])
        located = hits.setdefault((hit.rule, path_, line), _Located(function, hit))
        located.costs.append(_cost(events, hit.events) / steps)
    return _TraceResult(trace, steps, total / steps, category_us, hits)


def _aggregate(results: list[_TraceResult]) -> tuple[list[Finding], list[dict]]:
    """Findings merged by (rule, path, line) across ranks, and the breakdown: means per rank and step."""
    rules = load_rules()
    per_key: dict[tuple, dict] = {}
    breakdown: dict[str, float] = defaultdict(float)
    for result in results:
        for category, us in result.category_us.items():
            breakdown[category] += us / len(results)
        for key, located in result.hits.items():
            entry = per_key.setdefault(key, {"hit": located.hit, "function": located.function, "ranks": {},
                                             "calls": 0.0})
            for cost in located.costs:  # one at a time, as found: the sums do not depend on how hits are stored
                entry["ranks"][result.trace.rank] = entry["ranks"].get(result.trace.rank, 0.0) + cost
                entry["calls"] += 1 / result.steps / len(results)
    # a share is of the mean rank's op time, as `self_us` is the mean rank's (promise breaker round 31: it was of
    # the last rank read, so the order of the files decided it)
    mean_total = sum(result.total_us for result in results) / len(results) if results else 0.0
    findings = []
    for (code, path_, line), entry in per_key.items():
        hit, rule = entry["hit"], rules[code]
        self_us = sum(entry["ranks"].values()) / len(results)
        share = self_us / mean_total if mean_total else 0.0
        findings.append(Finding(
            rule=code, kind=rule.kind, path=path_, line=line, end_line=line, function=entry["function"],
            message=hit.message, reasons=("from a trace: no patch (run `advisor scan`/`fix` on the source)",),
            extra={"self_us": round(self_us, 3), "share": round(share, 5), "calls": round(entry["calls"], 3),
                   "negligible": share < rule.threshold_share, "evidence": hit.evidence | {
                       "per_rank_us": {str(r): round(v, 3) for r, v in sorted(entry["ranks"].items())}}}))
    grand = sum(breakdown.values()) or 1.0
    rows = [{"category": name, "us": round(us, 3), "share": round(us / grand, 5)}
            for name, us in sorted(breakdown.items(), key=lambda kv: -kv[1])]
    return findings, rows


NO_STACK = "(no Python stack in the trace)"  # one source for every rank's stackless hits (not each file's name)


def _where(event) -> tuple[str, int, str]:
    if event.frame is None:
        return NO_STACK, 0, event.name
    return resolve_path(event.frame[0]), event.frame[1], event.frame[2]


def _cost(events, indices: list[int]) -> float:
    """Time of the covered ops; for an attention hit, everything from the first matmul to the last, outermost."""
    if len(indices) == 1:
        return events[indices[0]].total_us
    first, last = indices[0], indices[-1]
    return sum(e.total_us for k, e in enumerate(events[first:last + 1], first)
               if e.parent is None or e.parent < first or k in (first, last))


@lru_cache(maxsize=4096)
def op_category(name: str) -> str:
    """The kind of an op or kernel by its name (one of OP_KINDS): analyze's breakdown and optimize's reports."""
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

"""The runtime engine: a profiled run's op graph -> every rule family's graph detectors (advisor.registry) ->
detections -> findings ranked by their measured time. A runtime detector is declared by its rule unit (a rule's
`graph`, or a family's `graph_detectors` module that finds several codes in one pass), never listed here. (A
Chrome trace, which has no op graph, goes through advisor.runtime.trace_detect instead.)"""

from __future__ import annotations

from importlib import import_module

from advisor.contracts.finding import Finding
from advisor.registry import families
from advisor.contracts.detection import Detection
from advisor.runtime.rank import to_findings
from advisor.runtime.recorder import OpGraph
from advisor.runtime.timing import Timing


def detect_graph(graph: OpGraph, device: str) -> list[Detection]:
    found = []
    for family in families():
        for module in family.graph_detectors:
            found += import_module(module).detect(graph, device)
        for rule in family.rules:
            if rule.graph is not None:
                found += rule.graph(graph, device)
    return found


def runtime_findings(graph: OpGraph, device: str, timing: Timing) -> list[Finding]:
    return to_findings(detect_graph(graph, device), timing)

"""The runtime engine: a profiled run's op graph -> every rule family's graph detectors (advisor.registry) ->
detections -> findings ranked by their measured time. A new runtime detector is listed in its rule unit, not
here. (A Chrome trace, which has no op graph, goes through advisor.runtime.trace_detect instead.)"""

from __future__ import annotations

from importlib import import_module

from advisor.findings import Finding
from advisor.registry import families
from advisor.runtime.detect import Detection
from advisor.runtime.rank import to_findings
from advisor.runtime.recorder import OpGraph
from advisor.runtime.timing import Timing


def detect_graph(graph: OpGraph, device: str) -> list[Detection]:
    return [detection for family in families() for module in family.graph_detectors
            for detection in import_module(module).detect(graph, device)]


def runtime_findings(graph: OpGraph, device: str, timing: Timing) -> list[Finding]:
    return to_findings(detect_graph(graph, device), timing)

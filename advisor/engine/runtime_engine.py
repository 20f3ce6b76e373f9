"""The runtime engine: a profiled run's op graph -> every rule family's `graph` hook and every rule's own `graph`
(advisor.registry) -> detections -> findings ranked by their measured time -> each family's `post_profile` hook.
A runtime detector is declared by its rule unit, never listed here. (A Chrome trace, which has no op graph, goes
through advisor.runtime.trace_detect instead.)"""

from __future__ import annotations

from advisor.contracts.detection import Detection
from advisor.contracts.finding import Finding
from advisor.registry import families
from advisor.runtime.rank import to_findings
from advisor.runtime.recorder import OpGraph
from advisor.runtime.time_attribution import Timing


def detect_graph(graph: OpGraph, device: str) -> list[Detection]:
    found = []
    for family in families():
        if family.graph is not None:
            found += family.graph(graph, device, family.rules)
        for rule in family.rules:
            if rule.graph is not None:
                found += rule.graph(graph, device)
    return found


def runtime_findings(graph: OpGraph, device: str, timing: Timing) -> list[Finding]:
    return to_findings(detect_graph(graph, device), timing)


def after_profile(model, target: str, ranked: list[Finding]) -> list[Finding]:
    """The ranked findings once every family's `post_profile` hook has read the live model (in family order)."""
    for family in families():
        if family.post_profile is not None:
            ranked = family.post_profile(model, target, ranked, family.rules)
    return ranked

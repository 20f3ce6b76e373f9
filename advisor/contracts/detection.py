"""What a runtime detector returns: a Detection in a profiled run's op graph, a TraceHit in a Chrome trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from advisor.runtime.frames import Location


@dataclass
class Detection:
    rule: str
    loc: Location
    end_line: int
    nodes: frozenset[int]
    message: str
    evidence: dict = field(default_factory=dict)
    per_call: dict = field(default_factory=dict)  # evidence that may differ per call: a finding lists each value seen


class TraceHit:
    """A detection in a trace: rule, the events it covers, and a message."""

    def __init__(self, rule: str, events: list[int], message: str, evidence: dict | None = None):
        self.rule, self.events, self.message, self.evidence = rule, events, message, evidence or {}

"""Detectors over the recorded op graph (run by advisor.engine.runtime, as the rule units list them). Each returns
Detections: a rule, the recorded ops whose measured time is the finding's cost, and where in the user's source it
happened."""

from __future__ import annotations

from dataclasses import dataclass, field

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

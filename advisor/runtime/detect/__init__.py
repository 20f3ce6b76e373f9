"""Detectors over the recorded op graph. Each returns Detections: a rule, the recorded ops whose measured time
is the finding's cost, and where in the user's source it happened."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from advisor.runtime.frames import Location

if TYPE_CHECKING:  # torch: `analyze` reads op names from detect.ops without it
    from advisor.runtime.recorder import OpGraph


@dataclass
class Detection:
    rule: str
    loc: Location
    end_line: int
    nodes: frozenset[int]
    message: str
    evidence: dict = field(default_factory=dict)


def detect_all(graph: OpGraph, device: str) -> list[Detection]:
    from advisor.runtime.detect import attention, casts, copies, masks, sdpa

    return [d for module in (attention, sdpa, copies, casts, masks) for d in module.detect(graph, device)]

"""Join profiler timings with the recorded op graph, and say how much op time lands on a user source line.

Profiler stacks only name a function's first line, so statement lines come from the recorder. Both see the
same program, so each profiled step's ops are aligned with the recorded step's ops by name and order
(difflib tolerates the few that differ, and the backward ops that only the profiler sees). An op the
dispatch recorder sees is matched to the outermost profiler event of that name, whose inclusive time covers
the kernel-internal calls (a clone's empty_like and copy_) that the recorder cannot see.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from difflib import SequenceMatcher

from advisor.runtime.events import OpEvent, resolve_path
from advisor.runtime.frames import Location
from advisor.runtime.recorder import OpGraph


@dataclass
class Timing:
    steps: int
    op_us: float  # measured op time per step
    node_us: dict[int, float] = field(default_factory=dict)  # per recorded op, per step (inclusive)
    node_calls: dict[int, float] = field(default_factory=dict)
    line_us: dict[tuple[str, int], float] = field(default_factory=dict)  # statement lines, per step
    function_us: dict[tuple[str, int, str], float] = field(default_factory=dict)  # function-level only
    statement_us: float = 0.0
    unattributed_us: float = 0.0

    @property
    def statement_share(self) -> float:
        return self.statement_us / self.op_us if self.op_us else 0.0

    @property
    def attributed_share(self) -> float:
        function_total = sum(self.function_us.values())
        return (self.statement_us + function_total) / self.op_us if self.op_us else 0.0

    def cost(self, nodes) -> tuple[float, float]:
        """Per-step time and call count of a set of recorded ops."""
        return (sum(self.node_us.get(n, 0.0) for n in nodes),
                sum(self.node_calls.get(n, 0.0) for n in nodes))


def align(events: list[OpEvent], graph: OpGraph) -> dict[int, int]:
    """event index -> recorded node, for every profiled step."""
    nodes = sorted(graph.graph.nodes)
    names = ["aten::" + graph.op(n)["op"] for n in nodes]
    visible = set(names)
    by_step: dict[int, list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        if event.name in visible and not _has_ancestor_in(events, i, visible):
            by_step[event.step].append(i)
    matched: dict[int, int] = {}
    for step_events in by_step.values():
        matcher = SequenceMatcher(None, names, [events[i].name for i in step_events], autojunk=False)
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                matched[step_events[block.b + k]] = nodes[block.a + k]
    return matched


def _has_ancestor_in(events: list[OpEvent], index: int, names: set[str]) -> bool:
    parent = events[index].parent
    while parent is not None:
        if events[parent].name in names:
            return True
        parent = events[parent].parent
    return False


def attribute(events: list[OpEvent], graph: OpGraph, steps: int) -> Timing:
    """Per-node cost from aligned events, and each event's self time assigned to a statement, a function, or neither."""
    matched = align(events, graph)
    timing = Timing(steps=steps, op_us=sum(e.self_us for e in events if e.step >= 0) / steps)
    statement_of: dict[int, Location | None] = {}
    for i, event in enumerate(events):
        if event.step < 0:
            continue
        if i in matched:
            node = matched[i]
            timing.node_us[node] = timing.node_us.get(node, 0.0) + event.total_us / steps
            timing.node_calls[node] = timing.node_calls.get(node, 0.0) + 1 / steps
            statement_of[i] = graph.op(node)["loc"]
        elif event.parent is not None and event.parent in statement_of:
            statement_of[i] = statement_of[event.parent]
        else:
            statement_of[i] = None
        loc = statement_of[i]
        share = event.self_us / steps
        if loc is not None:
            key = (loc.path, loc.line)
            timing.line_us[key] = timing.line_us.get(key, 0.0) + share
            timing.statement_us += share
        elif event.frame is not None:
            key = (resolve_path(event.frame[0]), event.frame[1], event.frame[2])
            timing.function_us[key] = timing.function_us.get(key, 0.0) + share
        else:
            timing.unattributed_us += share
    return timing

"""Join profiler timings with the recorded op graph, and say how much op time lands on a user source line.

Profiler stacks only name a function's first line, so statement lines come from the recorder. Both see the
same program, so each profiled step's ops are aligned with the recorded step's ops by name and order
(a banded longest common subsequence tolerates the few that differ, and the backward ops only the profiler
sees). An op the
dispatch recorder sees is matched to the outermost profiler event of that name, whose inclusive time covers
the kernel-internal calls (a clone's empty_like and copy_) that the recorder cannot see.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from advisor.runtime.events import OpEvent, resolve_path
from advisor.runtime.frames import Location
from advisor.runtime.recorder import Call, OpGraph

# The aten op the profiler shows for a watched call that dispatched nothing.
_QUIET_OP = {"contiguous": "aten::contiguous", "to": "aten::to", "float": "aten::to", "half": "aten::to",
             "bfloat16": "aten::to", "double": "aten::to", "type_as": "aten::to"}


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


def align(events: list[OpEvent], graph: OpGraph) -> dict[int, int | Call]:
    """event index -> recorded node (or watched call that dispatched nothing), for every profiled step."""
    sequence = _recorded_sequence(graph)
    names = [name for name, _ in sequence]
    visible = {"aten::" + graph.op(n)["op"] for n in graph.graph.nodes}
    quiet = set(names) - visible
    has_children = {e.parent for e in events}
    by_step: dict[int, list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        eligible = event.name in visible or (event.name in quiet and i not in has_children)
        if eligible and not _has_ancestor_in(events, i, visible):
            by_step[event.step].append(i)
    matched: dict[int, int | Call] = {}
    for step_events in by_step.values():
        for a, b in aligned_pairs(names, [events[i].name for i in step_events]):
            matched[step_events[b]] = sequence[a][1]
    return matched


def aligned_pairs(recorded: list[str], profiled: list[str], band: int = 32) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence, within a band around the diagonal.

    A model repeats the same layer, so the greedy longest-block-first matching of difflib can pair layer 1 of
    one side with layer 2 of the other when a stray event shifts a sequence; a global alignment cannot. The two
    sequences differ by a few events, so a band keeps it linear in their length."""
    if recorded == profiled:  # the usual case: nothing to search
        return [(i, i) for i in range(len(recorded))]
    n, m = len(recorded), len(profiled)
    width = band + abs(n - m)
    score = [[-1] * (2 * width + 1) for _ in range(n + 1)]  # score[i][j - i + width]; -1 is outside the band

    def at(i: int, j: int) -> int:
        k = j - i + width
        return score[i][k] if 0 <= k <= 2 * width and 0 <= j <= m else -1

    for i in range(n + 1):
        for j in range(max(0, i - width), min(m, i + width) + 1):
            if i == 0 or j == 0:
                best = 0
            else:
                best = max(at(i - 1, j), at(i, j - 1),
                           at(i - 1, j - 1) + (recorded[i - 1] == profiled[j - 1]))
            score[i][j - i + width] = best
    pairs, i, j = [], n, m
    while i > 0 and j > 0:
        if recorded[i - 1] == profiled[j - 1] and at(i, j) == at(i - 1, j - 1) + 1:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif at(i - 1, j) >= at(i, j - 1):
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def _recorded_sequence(graph: OpGraph) -> list[tuple[str, int | Call]]:
    """Recorded ops in order, with each watched call that dispatched nothing (`.contiguous()` on a contiguous
    tensor, a cast to the same dtype) where it ran: the profiler still shows it, as a childless aten op."""
    quiet: dict[int, list[Call]] = defaultdict(list)
    for call in graph.calls:
        if call.first_op == call.last_op and call.name in _QUIET_OP:
            quiet[call.first_op].append(call)
    sequence: list[tuple[str, int | Call]] = []
    for node in sorted(graph.graph.nodes) + [None]:
        position = node if node is not None else graph.graph.number_of_nodes()
        sequence += [(_QUIET_OP[call.name], call) for call in quiet.get(position, [])]
        if node is not None:
            sequence.append(("aten::" + graph.op(node)["op"], node))
    return sequence


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
    statement_of = _statements(events, {i: target.loc if isinstance(target, Call) else graph.op(target)["loc"]
                                        for i, target in matched.items()})
    for i, event in enumerate(events):
        if event.step < 0:
            continue
        node = matched.get(i)
        if isinstance(node, int):
            timing.node_us[node] = timing.node_us.get(node, 0.0) + event.total_us / steps
            timing.node_calls[node] = timing.node_calls.get(node, 0.0) + 1 / steps
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


def _statements(events: list[OpEvent], matched: dict[int, Location | None]) -> list[Location | None]:
    """The statement of every event: its matched node's, else its closest matched descendant's (a composite such
    as aten::linear is called by the same statement as the addmm it runs), else its enclosing op's."""
    statement_of: list[Location | None] = [matched.get(i) for i in range(len(events))]
    for i in range(len(events) - 1, -1, -1):  # children before parents: events are in start order
        parent = events[i].parent
        if statement_of[i] is not None and parent is not None and parent not in matched \
                and statement_of[parent] is None:
            statement_of[parent] = statement_of[i]
    for i, event in enumerate(events):
        if statement_of[i] is None and event.parent is not None:
            statement_of[i] = statement_of[event.parent]
    return statement_of

"""Findings from a trace alone: what op names, nesting, shapes and stacks can show without tensor identities.

The trace engine: every rule family's `trace` hook and every rule's own `trace` (advisor.registry) read one
TraceView of the trace's ops and yield TraceHits; no rule is named here. Locations are the first user frame of
the op's stack, whose line is the function's first line (traces do not carry statement lines).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Iterator

from advisor.contracts.detection import TraceHit
from advisor.registry import families
from advisor.runtime.events import OpEvents


def detect(events: OpEvents, on_device: bool) -> Iterator[TraceHit]:
    """Hits one at a time (a large trace has one per layer and step), family by family in the registry's order."""
    view = TraceView(events, on_device)
    for family in families():
        if family.trace is not None:
            yield from family.trace(view, family.rules)
        for rule in family.rules:
            if rule.trace is not None:
                yield from rule.trace(view)


class TraceView:
    """One trace's ops as the trace rules read them: the events, whether they ran on a GPU, each op's children,
    and the ops of the profiled steps by name (indexed in one pass, so each rule walks only the ops it names)."""

    def __init__(self, events: OpEvents, on_device: bool) -> None:
        self.events, self.on_device = events, on_device
        self.children = _Children(events.parent)
        by_id: dict[int, array] = {}
        for i, (name, step) in enumerate(zip(events.name, events.step)):
            if step >= 0:
                by_id.setdefault(name, array("I")).append(i)
        self._by_name: dict[str, list[array]] = {}
        for name, indices in by_id.items():
            self._by_name.setdefault(events.names[name], []).append(indices)

    def named(self, names: Iterable[str]) -> Iterator[int]:
        """Indices of the ops in a profiled step with one of these names, in trace order."""
        return heapq.merge(*(indices for name in set(names) for indices in self._by_name.get(name, ())))

    def name(self, i: int) -> str:
        return self.events.names[self.events.name[i]]

    def child_names(self, i: int) -> set[str]:
        return {self.name(k) for k in self.children.of(i)}

    def python_calls(self, name: str) -> Iterator[tuple[int, object]]:
        """(index, event) of each op of this name that Python called (no op encloses it), in trace order."""
        for i in self.named((name,)):
            event = self.events[i]
            if event.parent is None:
                yield i, event

    def inside(self, i: int, names: set[str]) -> bool:
        """Whether an op with one of these names encloses op i."""
        up = self.events.parent[i]
        while up >= 0:
            if self.name(up) in names:
                return True
            up = self.events.parent[up]
        return False


class _Children:
    """Each op's child ops as two index arrays (a dict of lists took ~100 bytes an op on a large trace)."""

    def __init__(self, parent: array) -> None:
        self._offset = array("I", bytes(4 * (len(parent) + 1)))
        for up in parent:
            if up >= 0:
                self._offset[up + 1] += 1
        for i in range(len(parent)):
            self._offset[i + 1] += self._offset[i]
        self._child = array("I", bytes(4 * self._offset[-1]))
        cursor = array("I", self._offset)
        for i, up in enumerate(parent):
            if up >= 0:
                self._child[cursor[up]] = i
                cursor[up] += 1

    def of(self, i: int) -> array:
        return self._child[self._offset[i]:self._offset[i + 1]]

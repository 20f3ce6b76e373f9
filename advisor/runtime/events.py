"""One shape for profiler op events, from a live torch.profiler run or from a Chrome/Kineto trace file.

Both sources are flattened to RawEvents and rebuilt the same way: ops nest by time on their thread, a GPU
kernel's time goes to the op that launched it (through the runtime call's correlation id), and each op
belongs to the ProfilerStep whose interval holds it. Reading torch's C++ event list directly is about
twenty times faster than building FunctionEvent trees, which matters for the overhead budget.
"""

from __future__ import annotations

import bisect
import heapq
import os
import re
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from advisor.runtime.frames import first_user_profiler_frame

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
OP, STEP, RUNTIME, KERNEL = range(4)  # event kinds: an aten op, a ProfilerStep marker, a CPU-side launch call
# (cudaLaunchKernel...) and device activity (a kernel, memcpy or memset)
NO_CORRELATION = -(1 << 63)  # a launch or kernel without a correlation id
NO_DETAILS = ((), (), (), ())  # an op's (dims, types, strides, concrete inputs) when none were recorded


@dataclass(slots=True)
class OpEvent:
    """One built op, made on access from OpEvents' columns."""
    name: str  # "aten::bmm"
    step: int  # number of the profiled step it ran in, -1 outside any step
    start: float
    self_us: float  # the op's own time: CPU self time, or its own GPU kernels' time when on a GPU
    total_us: float  # the same, including the ops it called
    frame: tuple[str, int, str] | None  # first user frame (file, function's first line, name)
    parent: int | None = None  # index of the enclosing op event
    dims: tuple = ()
    types: tuple = ()
    strides: tuple = ()
    concrete: tuple = ()


class _Interned:
    """Values stored once, referred to by index (a trace repeats each name, thread, stack and shape thousands
    of times)."""

    def __init__(self, *initial) -> None:
        self.values: list = []
        self._index: dict = {}
        for value in initial:
            self.index(value)

    def index(self, value) -> int:
        found = self._index.get(value)
        if found is None:
            found = self._index[value] = len(self.values)
            self.values.append(value)
        return found


class RawEvents:
    """Profiler events as columns, in the order they were read: about 40 bytes an event where an object per event
    took several hundred, so a large trace's events fit in a fraction of the file's size."""

    def __init__(self) -> None:
        self.kind = bytearray()
        self.name, self.tid, self.stack, self.details = array("I"), array("I"), array("I"), array("I")
        self.start, self.dur = array("d"), array("d")
        self.correlation = array("q")
        self.names, self.tids = _Interned(), _Interned()
        self.stacks, self.op_details = _Interned(()), _Interned(NO_DETAILS)

    def __len__(self) -> int:
        return len(self.kind)

    def append(self, kind: int, name: str, tid, start: float, dur: float, stack: tuple[str, ...] = (),
               details: tuple = NO_DETAILS, correlation: int | None = None) -> None:
        """`stack` innermost frame first; `details` (dims, types, strides, concrete inputs) as nested tuples."""
        self.kind.append(kind)
        self.name.append(self.names.index(name))
        self.tid.append(self.tids.index(tid))
        self.start.append(start)
        self.dur.append(dur)
        self.stack.append(self.stacks.index(stack))
        self.details.append(self.op_details.index(details))
        self.correlation.append(NO_CORRELATION if correlation is None else correlation)

    @property
    def has_stacks(self) -> bool:
        return any(self.stacks.values)

    @property
    def has_shapes(self) -> bool:
        return any(dims for dims, _, _, _ in self.op_details.values)


class OpEvents(Sequence):
    """Built ops as columns, in start order; `events[i]` is an OpEvent made on access, so no object per op is
    held. Analysis that visits every op reads the columns directly."""

    def __init__(self, raws: RawEvents) -> None:
        self.names, self._stacks, self._details = raws.names.values, raws.stacks.values, raws.op_details.values
        self.name, self.stack, self.details = array("I"), array("I"), array("I")
        self.step, self.parent = array("q"), array("i")  # -1: outside any step / no enclosing op
        self.start, self.self_us, self.total_us = array("d"), array("d"), array("d")

    def __len__(self) -> int:
        return len(self.name)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        parent = self.parent[index]
        return OpEvent(self.names[self.name[index]], self.step[index], self.start[index], self.self_us[index],
                       self.total_us[index], first_user_profiler_frame(self._stacks[self.stack[index]]),
                       None if parent < 0 else parent, *self._details[self.details[index]])

    def whole_trace_as_one_step(self) -> None:
        """For a trace without ProfilerStep markers: every op counts as step 0."""
        self.step = array("q", bytes(8 * len(self)))


def frozen(value):
    """Lists as tuples, so equal shapes are stored once; an object (dict) is refused with TypeError."""
    if isinstance(value, list):
        return tuple(frozen(item) for item in value)
    if isinstance(value, dict):
        raise TypeError("holds an object")
    return value


def is_op_name(name: str) -> bool:
    """aten/prim ops carry op time; Python frames, step markers and [memory] do not."""
    return "::" in name and not name.startswith(("ProfilerStep", "autograd::engine::evaluate_function"))


def resolve_path(path: str) -> str:
    """Profiler stacks trim the sys.path prefix; find the file again so findings carry a real path."""
    if os.path.isabs(path):
        return path
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or "."), path)
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    return path


def from_kineto(results, detailed: bool = True) -> RawEvents:
    """A live profiler's `prof.profiler.kineto_results`. `detailed=False` skips stacks, shapes and inputs
    (each a call into the profiler per event) when the profiler was not asked to record them."""
    raws = RawEvents()
    for e in results.events():
        name = e.name()
        if e.is_python_function():
            continue
        start, dur = e.start_ns() / 1e3, e.duration_ns() / 1e3
        if e.device_type().name != "CPU":
            raws.append(KERNEL, name, e.device_resource_id(), start, dur, correlation=e.linked_correlation_id())
        elif STEP_NAME.match(name):
            raws.append(STEP, name, e.start_thread_id(), start, dur)
        elif is_op_name(name) and detailed:
            raws.append(OP, name, e.start_thread_id(), start, dur, tuple(e.stack()),
                        (frozen(e.shapes()), frozen(e.dtypes()), (), frozen(e.concrete_inputs())))
        elif is_op_name(name):
            raws.append(OP, name, e.start_thread_id(), start, dur)
        elif name.startswith(("cuda", "hip")):
            raws.append(RUNTIME, name, e.start_thread_id(), start, dur, correlation=e.correlation_id())
    return raws


NESTING_SLACK_US = 1.0  # the profiler can stamp a child's end up to ~1 us after its parent's end


def build(raws: RawEvents, on_device: bool) -> OpEvents:
    """Nest ops per thread, charge kernels to their launching op, and number steps; returns ops in start order.
    Works on index arrays over the columns (a large trace has 1e5+ ops)."""
    start, dur, kind = raws.start, raws.dur, raws.kind
    steps = sorted((start[i], start[i] + dur[i], int(STEP_NAME.match(raws.names.values[raws.name[i]])[1]))
                   for i in _of_kind(raws, STEP))
    cpu = _by_thread_and_time(raws)
    parent_of = _enclosing(raws, cpu)
    ops = array("I", (k for k, i in enumerate(cpu) if kind[i] == OP))
    op_parent = array("i", [-1]) * len(cpu)  # arrays indexed like `cpu`
    for k in ops:
        op_parent[k] = _enclosing_op(raws, cpu, parent_of, k)
    own = _device_us(raws, cpu, parent_of) if on_device else array("d", (dur[i] for i in cpu))
    del parent_of
    total, self_time = array("d", own), own
    for k in _stable_sorted(ops, key=lambda k: -start[cpu[k]]):  # children before parents
        parent = op_parent[k]
        if parent >= 0:
            total[parent] += total[k] if on_device else 0.0
            if not on_device:
                self_time[parent] -= dur[cpu[k]]
    ordered = _stable_sorted(ops, key=lambda k: start[cpu[k]])
    del ops
    position = array("i", [-1]) * len(cpu)
    for n, k in enumerate(ordered):
        position[k] = n
    events = OpEvents(raws)  # filled a column at a time, each working array dropped once used
    events.parent = array("i", (position[op_parent[k]] if op_parent[k] >= 0 else -1 for k in ordered))
    del position, op_parent
    events.self_us = array("d", (max(self_time[k], 0.0) for k in ordered))
    del self_time
    events.total_us = array("d", (total[k] for k in ordered))
    del total
    ordered = array("I", (cpu[k] for k in ordered))  # now raw indices
    del cpu
    events.start = array("d", (start[i] for i in ordered))
    starts = [s[0] for s in steps]
    events.step = array("q", (_step_number(steps, starts, when) for when in events.start))
    events.name = array("I", (raws.name[i] for i in ordered))
    events.stack = array("I", (raws.stack[i] for i in ordered))
    events.details = array("I", (raws.details[i] for i in ordered))
    return events


def _device_us(raws: RawEvents, cpu: array, parent_of: array) -> array:
    """Each op's own GPU time (indexed like `cpu`): the kernels its launch calls started, through correlation ids."""
    device_us = array("d", bytes(8 * len(cpu)))
    launch = {raws.correlation[i]: k for k, i in enumerate(cpu) if raws.kind[i] == RUNTIME}
    for i in _of_kind(raws, KERNEL):
        k = launch.get(raws.correlation[i])
        if k is not None:
            device_us[k] += raws.dur[i]
    own = array("d", device_us)
    for k in (k for k, i in enumerate(cpu) if raws.kind[i] == RUNTIME):  # each call, in order
        up = _enclosing_op(raws, cpu, parent_of, k)
        if up >= 0:
            own[up] += device_us[k]
    return own


def _step_number(steps: list[tuple[float, float, int]], starts: list[float], when: float) -> int:
    """The number of the step (start, end, number; sorted, with their starts) whose interval holds `when`, else -1."""
    s = bisect.bisect_right(starts, when) - 1
    return steps[s][2] if s >= 0 and when <= steps[s][1] else -1


def _of_kind(raws: RawEvents, kind: int):
    """Indices of one kind of event, in the order they were read."""
    return (i for i, k in enumerate(raws.kind) if k == kind)


_SORT_RUN = 1 << 14


def _stable_sorted(indices: array, key) -> array:
    """`sorted(indices, key=key)` as an array, without a list of every index and key at once (~70 bytes an
    element): sorted runs, merged. heapq.merge takes equal keys from earlier runs first, so the order is the same."""
    runs = [array("I", sorted(indices[i:i + _SORT_RUN], key=key)) for i in range(0, len(indices), _SORT_RUN)]
    return runs[0] if len(runs) == 1 else array("I", heapq.merge(*runs, key=key))


def _by_thread_and_time(raws: RawEvents) -> array:
    """Ops and launch calls by (thread, start, longest first)."""
    tid_rank = [0] * len(raws.tids.values)  # threads in the order of their ids, as the profiler names them
    for rank, tid in enumerate(sorted(range(len(tid_rank)), key=raws.tids.values.__getitem__)):
        tid_rank[tid] = rank
    start, dur, tid = raws.start, raws.dur, raws.tid
    return _stable_sorted(array("I", (i for i, k in enumerate(raws.kind) if k in (OP, RUNTIME))),
                          key=lambda i: (tid_rank[tid[i]], start[i], -dur[i]))


def _enclosing(raws: RawEvents, cpu: array) -> array:
    """For each event of `cpu` (by thread and time), the position in `cpu` of the innermost event enclosing it on
    its thread, or -1."""
    parent_of = array("i", [-1]) * len(cpu)
    start, dur, tid = raws.start, raws.dur, raws.tid
    open_on_thread: list[int] = []
    last_tid = None
    for k, i in enumerate(cpu):
        if tid[i] != last_tid:
            open_on_thread, last_tid = [], tid[i]
        while open_on_thread and not _inside(start[i], dur[i], cpu[open_on_thread[-1]], raws):
            open_on_thread.pop()
        parent_of[k] = open_on_thread[-1] if open_on_thread else -1
        open_on_thread.append(k)
    return parent_of


def _inside(child_start: float, child_dur: float, parent: int, raws: RawEvents) -> bool:
    """Starts inside the parent and ends with it (within the profiler's timestamp slack)."""
    parent_end = raws.start[parent] + raws.dur[parent]
    return child_start < parent_end and child_start + child_dur <= parent_end + NESTING_SLACK_US


def _enclosing_op(raws: RawEvents, cpu: array, parent_of: array, k: int) -> int:
    """The innermost op (not a launch call) enclosing `cpu[k]`, as a position in `cpu`, or -1."""
    up = parent_of[k]
    while up >= 0 and raws.kind[cpu[up]] != OP:
        up = parent_of[up]
    return up

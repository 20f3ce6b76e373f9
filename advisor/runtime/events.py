"""One shape for profiler op events, from a live torch.profiler run or from a Chrome/Kineto trace file.

Both sources are flattened to RawEvents and rebuilt the same way: ops nest by time on their thread, a GPU
kernel's time goes to the op that launched it (through the runtime call's correlation id), and each op
belongs to the ProfilerStep whose interval holds it. Reading torch's C++ event list directly is about
twenty times faster than building FunctionEvent trees, which matters for the overhead budget.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
from dataclasses import dataclass, field

from advisor.runtime.frames import first_user_profiler_frame

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(slots=True)  # slots: a large trace holds hundreds of thousands
class RawEvent:
    kind: str  # "op", "step", "runtime" (a CPU-side launch call) or "kernel" (device activity)
    name: str
    tid: int
    start: float  # microseconds
    dur: float
    stack: tuple[str, ...] = ()
    dims: list = field(default_factory=list)
    types: list = field(default_factory=list)
    strides: list = field(default_factory=list)
    concrete: list = field(default_factory=list)
    correlation: int | None = None


@dataclass(slots=True)
class OpEvent:
    name: str  # "aten::bmm"
    step: int  # index of the profiled step it ran in, -1 outside any step
    start: float
    self_us: float  # the op's own time: CPU self time, or its own GPU kernels' time when on a GPU
    total_us: float  # the same, including the ops it called
    frame: tuple[str, int, str] | None  # first user frame (file, function's first line, name)
    parent: int | None = None  # index of the enclosing op event
    dims: list = field(default_factory=list)
    types: list = field(default_factory=list)
    strides: list = field(default_factory=list)
    concrete: list = field(default_factory=list)


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


def from_kineto(results, detailed: bool = True) -> list[RawEvent]:
    """A live profiler's `prof.profiler.kineto_results`. `detailed=False` skips stacks, shapes and inputs
    (each a call into the profiler per event) when the profiler was not asked to record them."""
    raws = []
    for e in results.events():
        name = e.name()
        if e.is_python_function():
            continue
        if e.device_type().name != "CPU":
            raws.append(RawEvent("kernel", name, e.device_resource_id(), e.start_ns() / 1e3, e.duration_ns() / 1e3,
                                 correlation=e.linked_correlation_id()))
        elif _STEP.match(name):
            raws.append(RawEvent("step", name, e.start_thread_id(), e.start_ns() / 1e3, e.duration_ns() / 1e3))
        elif is_op_name(name) and detailed:
            raws.append(RawEvent("op", name, e.start_thread_id(), e.start_ns() / 1e3, e.duration_ns() / 1e3,
                                 tuple(e.stack()), e.shapes(), e.dtypes(), [], e.concrete_inputs()))
        elif is_op_name(name):
            raws.append(RawEvent("op", name, e.start_thread_id(), e.start_ns() / 1e3, e.duration_ns() / 1e3))
        elif name.startswith(("cuda", "hip")):
            raws.append(RawEvent("runtime", name, e.start_thread_id(), e.start_ns() / 1e3, e.duration_ns() / 1e3,
                                 correlation=e.correlation_id()))
    return raws


NESTING_SLACK_US = 1.0  # the profiler can stamp a child's end up to ~1 us after its parent's end


def _inside(child: RawEvent, parent: RawEvent) -> bool:
    """Starts inside the parent and ends with it (within the profiler's timestamp slack)."""
    parent_end = parent.start + parent.dur
    return child.start < parent_end and child.start + child.dur <= parent_end + NESTING_SLACK_US


def build(raws: list[RawEvent], on_device: bool) -> list[OpEvent]:
    """Nest ops per thread, charge kernels to their launching op, and number steps; returns ops in start order."""
    steps = sorted((r.start, r.start + r.dur, int(_STEP.match(r.name).group(1))) for r in raws if r.kind == "step")
    cpu = sorted((r for r in raws if r.kind in ("op", "runtime")), key=lambda r: (r.tid, r.start, -r.dur))
    parent_of: list[int | None] = [None] * len(cpu)  # lists indexed like `cpu`, not dicts: a trace has 1e5+ ops
    open_by_tid: list[int] = []
    last_tid = None
    for i, r in enumerate(cpu):
        if r.tid != last_tid:
            open_by_tid, last_tid = [], r.tid
        while open_by_tid and not _inside(r, cpu[open_by_tid[-1]]):
            open_by_tid.pop()
        parent_of[i] = open_by_tid[-1] if open_by_tid else None
        open_by_tid.append(i)
    device_us = [0.0] * len(cpu)
    if on_device:
        launch = {r.correlation: i for i, r in enumerate(cpu) if r.kind == "runtime"}
        for kernel in (r for r in raws if r.kind == "kernel"):
            i = launch.get(kernel.correlation)
            if i is not None:
                device_us[i] += kernel.dur
    ops = [i for i, r in enumerate(cpu) if r.kind == "op"]
    op_parent: list[int | None] = [None] * len(cpu)
    for i in ops:
        up = parent_of[i]
        while up is not None and cpu[up].kind != "op":
            up = parent_of[up]
        op_parent[i] = up
    own = list(device_us) if on_device else [r.dur for r in cpu]
    for i in (i for i, r in enumerate(cpu) if r.kind == "runtime" and on_device):
        up = parent_of[i]
        while up is not None and cpu[up].kind != "op":
            up = parent_of[up]
        if up is not None:
            own[up] += device_us[i]
    total = list(own)
    self_time = list(own)
    for i in sorted(ops, key=lambda i: -cpu[i].start):  # children before parents
        parent = op_parent[i]
        if parent is not None:
            total[parent] += total[i] if on_device else 0.0
            if not on_device:
                self_time[parent] -= cpu[i].dur
    ordered = sorted(ops, key=lambda i: cpu[i].start)
    position = [0] * len(cpu)
    for k, i in enumerate(ordered):
        position[i] = k
    starts = [s[0] for s in steps]
    result = []
    for i in ordered:
        r = cpu[i]
        k = bisect.bisect_right(starts, r.start) - 1
        step = steps[k][2] if k >= 0 and r.start <= steps[k][1] else -1
        parent = op_parent[i]
        result.append(OpEvent(r.name, step, r.start, max(self_time[i], 0.0), total[i],
                              first_user_profiler_frame(r.stack), position[parent] if parent is not None else None,
                              r.dims, r.types, r.strides, r.concrete))
    return result

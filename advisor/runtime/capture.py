"""Measure a workload: unprofiled step times, then torch.profiler over several steps, then one recorded step."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from advisor.errors import is_utf8
from advisor.runtime.events import OpEvent, build, from_kineto
from advisor.runtime.native_log import without_native_log
from advisor.runtime.recorder import OpGraph, OpRecorder
from advisor.runtime.runner import PreparedStep

WARMUP_STEPS = 2
MIN_PROFILED_US = 20_000.0  # profile at least this much work: fixed profiler costs amortise, noise averages out
MAX_PROFILED_STEPS = 100


@dataclass
class Capture:
    events: list[OpEvent]
    graph: OpGraph
    profiled_steps: int
    step_us: float  # median wall time of an unprofiled step
    step_iqr_us: float
    device: str
    dtype: str


def time_steps(prepared: PreparedStep, steps: int) -> list[float]:
    """Wall time of each step in microseconds, synchronised; never called under the profiler."""
    times = []
    for _ in range(steps):
        prepared.sync()
        start = time.perf_counter()
        prepared.step()
        prepared.sync()
        times.append((time.perf_counter() - start) * 1e6)
    return times


def profiled_step_count(requested: int, step_us: float) -> int:
    """The workload's steps, raised for very short steps so that at least MIN_PROFILED_US is profiled."""
    if step_us <= 0:
        return requested
    return max(requested, min(MAX_PROFILED_STEPS, math.ceil(MIN_PROFILED_US / step_us)))


def records_details(prepared: PreparedStep, trace_path: str | None) -> bool:
    """Whether the profiler records stacks and shapes (see profile_steps): not where a loaded module's file name
    is not UTF-8 (`m\\xff.py`), which torch's profiler cannot encode into a stack (it raised "error unpacking
    string as utf-8" from the workload's run: promise round 33); the trace is then written without stacks."""
    return (prepared.train or trace_path is not None) and not unencodable_module_files()


def unencodable_module_files() -> bool:
    """Whether a loaded module's file name holds bytes that are not UTF-8 (lone surrogates in Python)."""
    return any(isinstance(name, str) and not is_utf8(name)
               for name in (getattr(module, "__file__", None) for module in list(sys.modules.values())))


def profile_steps(prepared: PreparedStep, steps: int, trace_path: str | None, stacks: bool):
    """torch.profiler over the steps after one warm-up step, recording only what will be read back.

    Python stacks (verbose, so aten ops carry them) and input shapes roughly double the profiler's cost. A live
    eval run needs neither: every forward op is joined to a recorded statement. Backward ops are not in the
    recorded forward graph, so --train keeps stacks for function-level attribution, and a --trace file keeps both
    for `advisor analyze`, whose detectors read shapes and stacks from the trace (`stacks`: records_details, which
    the caller reads the events back with). Memory events are never read.
    """
    activities = [ProfilerActivity.CPU]
    if prepared.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    config = torch._C._profiler._ExperimentalConfig(verbose=True) if stacks else None
    with without_native_log(), profile(
            activities=activities, record_shapes=trace_path is not None, with_stack=stacks,
            experimental_config=config, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
        for _ in range(steps + 1):
            prepared.step()
            prepared.sync()
            prof.step()
    if trace_path:
        prof.export_chrome_trace(trace_path)
    return prof


def record_graph(prepared: PreparedStep) -> OpGraph:
    """Only the forward is recorded: backward ops are timed by the profiler against their forward stacks."""
    recorder = OpRecorder(prepared.model)
    with recorder:
        prepared.forward()
    prepared.sync()
    return recorder.result()


def capture(prepared: PreparedStep, steps: int, trace_path: str | None = None,
            progress: Callable[[str], None] = lambda _: None) -> Capture:
    progress("warming up")
    for _ in range(WARMUP_STEPS):
        prepared.step()
    prepared.sync()
    progress(f"timing {steps} unprofiled steps")
    times = sorted(time_steps(prepared, steps))
    profiled = profiled_step_count(steps, statistics.median(times))
    progress(f"profiling {profiled} steps")
    detailed = records_details(prepared, trace_path)
    prof = profile_steps(prepared, profiled, trace_path, detailed)
    events = list(build(from_kineto(prof.profiler.kineto_results, detailed=detailed),
                        on_device=prepared.device.type == "cuda"))  # objects: timing revisits them; a live run is small
    progress("recording the op graph of one step")
    graph = record_graph(prepared)
    quartiles = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [times[0]] * 3
    return Capture(events, graph, profiled, statistics.median(times), quartiles[2] - quartiles[0],
                   prepared.device.type, str(prepared.dtype or "as loaded").replace("torch.", ""))

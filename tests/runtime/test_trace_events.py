"""Trace events held as columns: the built ops do not depend on the order events were read or on how the sort is
split into runs, and analysing a trace allocates a fraction of its size (an object per event took 0.7x)."""

from __future__ import annotations

import json
import os
import random
import tracemalloc
from array import array

from hypothesis import given, strategies as st

from advisor.runtime import events as events_module
from advisor.runtime.trace_analysis import analyze_path
from advisor.runtime.events import KERNEL, OP, RUNTIME, STEP, RawEvents, build
from benchmarks.analyze_large_trace import write_trace


@given(st.lists(st.integers(0, 5)), st.integers(1, 4))
def test_sorting_in_runs_keeps_the_stable_order(values, run):
    """Equal keys keep their input order across runs, as one stable sort would (no monkeypatch: hypothesis
    reruns the body)."""
    original = events_module._SORT_RUN
    events_module._SORT_RUN = run
    try:
        indices = array("I", range(len(values)))
        assert list(events_module._stable_sorted(indices, key=values.__getitem__)) == \
            sorted(range(len(values)), key=values.__getitem__)
    finally:
        events_module._SORT_RUN = original


def _nested_events(seed: int) -> list[tuple]:
    """Ops nested three deep on two threads, GPU launches and their kernels, two steps; distinct start times."""
    rnd, rows, correlation, clock = random.Random(seed), [], 0, 0.0
    for step in range(2):
        step_start = clock
        for _ in range(20):
            tid, outer_start = rnd.choice([1, 2]), clock
            rows.append((OP, rnd.choice(["aten::linear", "aten::matmul", "aten::to"]), tid, clock, 40.0))
            for child in range(3):
                child_start = outer_start + 1 + 12 * child + rnd.random()
                rows.append((OP, rnd.choice(["aten::addmm", "aten::bmm", "aten::_to_copy"]), tid, child_start, 8.0))
                correlation += 1
                rows.append((RUNTIME, "cudaLaunchKernel", tid, child_start + 6.5, 0.5, correlation))
                rows.append((KERNEL, "gemm", 7, child_start + 30, rnd.uniform(1, 20), correlation))
            clock += 45.0
        rows.append((STEP, f"ProfilerStep#{step}", 1, step_start, clock - step_start))
    return rows


def _built(rows: list[tuple], on_device: bool) -> list:
    raws = RawEvents()
    for kind, name, tid, start, dur, *correlation in rows:
        raws.append(kind, name, tid, start, dur, correlation=correlation[0] if correlation else None)
    return list(build(raws, on_device))


def test_built_ops_do_not_depend_on_the_order_events_were_read(monkeypatch):
    monkeypatch.setattr(events_module, "_SORT_RUN", 7)  # several merged runs
    rows = _nested_events(0)
    for on_device in (False, True):
        expected = _built(rows, on_device)
        assert any(e.parent is not None for e in expected) and {e.step for e in expected} == {0, 1}
        for seed in range(3):
            shuffled = list(rows)
            random.Random(seed).shuffle(shuffled)
            assert _built(shuffled, on_device) == expected


def test_analysing_a_trace_allocates_under_half_its_size(tmp_path):
    path = tmp_path / "rank0.json"
    write_trace(str(path), 5)
    tracemalloc.start()
    try:
        report = analyze_path(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert {f.rule for f in report.findings} == {"ADV110", "ADV205"}
    assert peak < 0.5 * os.path.getsize(path), f"{peak / os.path.getsize(path):.2f}x the file"
    json.dumps(report.to_json(), allow_nan=False)

"""Time and peak memory of `advisor analyze` on a large synthetic Kineto trace (~200 MB by default).

The trace looks like one `torch.profiler` writes with record_shapes and with_stack: ProfilerStep markers,
python_function events, and per layer a hand-written attention (linear, matmul, softmax, matmul) with
nested aten ops, input shapes and call stacks. `advisor analyze TRACE --format json` runs in a child process that
first imports the CLI and builds its parser (its RSS then is the baseline), so the rest of its peak RSS is the
analysis' share:
    python benchmarks/analyze_large_trace.py [--mb 200] [--keep PATH | --trace EXISTING.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

LAYERS = 12
OPS = [  # (name, children, input dims)
    ("aten::linear", ["aten::t", "aten::addmm"], [[8, 256, 768], [2304, 768], [2304]]),
    ("aten::matmul", ["aten::expand", "aten::bmm"], [[8, 12, 256, 64], [8, 12, 64, 256]]),
    ("aten::mul", [], [[8, 12, 256, 256], []]),
    ("aten::masked_fill", ["aten::clone"], [[8, 12, 256, 256], [1, 1, 256, 256], []]),
    ("aten::softmax", ["aten::_softmax"], [[8, 12, 256, 256], [], []]),
    ("aten::matmul", ["aten::expand", "aten::bmm"], [[8, 12, 256, 256], [8, 12, 256, 64]]),
    ("aten::contiguous", ["aten::clone", "aten::copy_"], [[8, 256, 12, 64]]),
    ("aten::linear", ["aten::t", "aten::addmm"], [[8, 256, 768], [768, 768], [768]]),
]
STACK = ("bench/model.py(41): forward;torch/nn/modules/module.py(1762): _call_impl;"
         "torch/nn/modules/module.py(1751): _wrapped_call_impl;bench/model.py(88): forward;"
         "torch/nn/modules/module.py(1762): _call_impl;bench/workload.py(12): step")


def _event(name: str, ts: float, dur: float, dims: list, counter: list[int], cat: str = "cpu_op") -> str:
    counter[0] += 1
    args = {"External id": counter[0], "Record function id": 0, "Ev Idx": counter[0],
            "Input Dims": dims, "Input type": ["float"] * len(dims), "Input Strides": [[1] * len(d) for d in dims],
            "Concrete Inputs": [""] * len(dims), "Call stack": STACK}
    return json.dumps({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args})


def _python_event(name: str, ts: float, dur: float, counter: list[int]) -> str:
    counter[0] += 1
    return json.dumps({"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": ts,
                       "dur": dur, "args": {"Python parent id": counter[0] - 1, "Python id": counter[0],
                                            "Python thread": 0}})


def write_trace(path: str, megabytes: int) -> int:
    """Writes steps until the file reaches `megabytes`; returns the number of events."""
    counter, events, ts, step = [0], 0, 1_700_000_000_000.0, 0
    with open(path, "w") as out:
        out.write('{"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": [\n')
        first = True
        while out.tell() < megabytes * 1_000_000:
            lines, start = [], ts
            for _ in range(LAYERS):
                for name, children, dims in OPS:
                    lines.append(_python_event("nn.Module: Attention", ts, 30.0, counter))
                    lines.append(_event(name, ts + 1, 20.0, dims, counter))
                    for k, child in enumerate(children):
                        lines.append(_event(child, ts + 2 + 8 * k, 6.0, dims, counter))
                    ts += 32.0
            lines.append(json.dumps({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
                                     "tid": 1, "ts": start, "dur": ts - start, "args": {}}))
            out.write(("" if first else ",\n") + ",\n".join(lines))
            first, events, step = False, events + len(lines), step + 1
            ts += 10.0
        out.write('\n], "traceName": "synthetic"}\n')
    return events


MEASURE = """
import contextlib, io, json, resource, sys, time
from advisor.cli import build_parser, main
build_parser()
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, cpu = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["analyze", sys.argv[1], "--format", "json"])
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "cpu": cpu, "peak_kb": peak, "baseline_kb": baseline, "code": code,
                  "findings": len(json.loads(out.getvalue())["findings"])}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="trace size in MB")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--keep", metavar="PATH", help="write the trace here and keep it (default: a temp file)")
    where.add_argument("--trace", metavar="PATH", help="analyze this existing trace instead of writing one")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="advisor-bench-")
    path = args.trace or args.keep or os.path.join(folder, "rank0.json")
    events = None if args.trace else write_trace(path, args.mb)
    size = os.path.getsize(path)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", MEASURE, path], capture_output=True, text=True, cwd=folder,
                         env={**os.environ, "PYTHONPATH": root})
    if not (args.keep or args.trace):
        os.unlink(path)
    os.rmdir(folder)
    if run.returncode:
        sys.exit(f"analyze failed: {(run.stderr.strip().splitlines() or ['no output'])[-1]}")
    result = json.loads(run.stdout)
    peak, baseline = result["peak_kb"] * 1024, result["baseline_kb"] * 1024
    share = peak - baseline
    print(f"trace: {size / 1e6:.0f} MB" + (f", {events} events" if events else "") +
          f"; analyze: {result['seconds']:.1f} s wall ({result['cpu']:.1f} s CPU), exit {result['code']}, "
          f"{result['findings']} finding(s)")
    print(f"peak RSS {peak / 1e6:.0f} MB ({peak / size:.2f}x the file); baseline (interpreter + advisor CLI "
          f"imported) {baseline / 1e6:.0f} MB; analysis share {share / 1e6:.0f} MB = {share / size:.2f}x the file")


if __name__ == "__main__":
    main()

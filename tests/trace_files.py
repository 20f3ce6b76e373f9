"""A small Kineto-shaped trace as `advisor analyze` reads it, changed where a test needs it to be odd."""

from __future__ import annotations

STACK = "model.py(10): forward;torch/nn/modules/module.py(1762): _call_impl"


def trace(rank: int = 0, **changes) -> dict:
    """A small Kineto-shaped trace: one profiler step holding matmul -> softmax -> matmul."""
    ops = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 100.0 + 10 * k, "dur": 5.0,
            "args": {"Call stack": STACK, "Input Dims": [[2, 4, 8, 8]], "Input type": ["float"]}}
           for k, name in enumerate(["aten::matmul", "aten::softmax", "aten::matmul"])]
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 90.0,
            "dur": 100.0, "args": {}}
    data = {"distributedInfo": {"rank": rank}, "traceEvents": [step, *ops]}
    for key, value in changes.items():
        if key in ("ts", "dur", "args"):
            data["traceEvents"][1][key] = value
        elif key == "step":  # fields of the ProfilerStep marker
            step.update(value)
        elif key == "extra":  # more events
            data["traceEvents"] += value
        else:
            data[key] = value
    return data

"""Read Chrome/Kineto trace files written by torch.profiler (plain or .gz), one per rank, into RawEvents."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass

from advisor.errors import AdvisorError
from advisor.runtime.events import RawEvent, is_op_name

_TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class Trace:
    path: str
    rank: int
    raws: list[RawEvent]
    has_stacks: bool
    has_shapes: bool
    has_steps: bool
    on_device: bool


def trace_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(_TRACE_SUFFIXES))
        if not files:
            raise AdvisorError(f"{path}: no trace files (*.json, *.json.gz) in this folder")
        return files
    if not os.path.isfile(path):
        raise AdvisorError(f"{path}: no such file or folder")
    return [path]


def load_trace(path: str, index: int) -> Trace:
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise AdvisorError(f"{path}: cannot read the trace ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise AdvisorError(f"{path}: not a complete JSON trace (truncated?): {exc.msg} at line {exc.lineno}") from exc
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise AdvisorError(f"{path}: not a Chrome/Kineto trace (no traceEvents list)")
    rank = (data.get("distributedInfo") or {}).get("rank", index)
    raws = [raw for raw in map(_raw, events) if raw is not None]
    return Trace(path, int(rank), raws, any(r.stack for r in raws), any(r.dims for r in raws),
                 any(r.kind == "step" for r in raws), any(r.kind == "kernel" for r in raws))


def _raw(event: dict) -> RawEvent | None:
    if not isinstance(event, dict) or event.get("ph") != "X":
        return None
    cat, name, args = event.get("cat", ""), event.get("name", ""), event.get("args") or {}
    base = dict(name=name, tid=event.get("tid", 0), start=float(event.get("ts", 0.0)), dur=float(event.get("dur", 0.0)))
    if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        return RawEvent("kernel", correlation=args.get("correlation"), **base)
    if cat == "cuda_runtime" or cat == "cuda_driver":
        return RawEvent("runtime", correlation=args.get("correlation"), **base)
    if cat == "user_annotation" and name.startswith("ProfilerStep#"):
        return RawEvent("step", **base)
    if cat == "cpu_op" and is_op_name(name):
        stack = tuple(frame for frame in (args.get("Call stack") or "").split(";") if frame)
        return RawEvent("op", stack=stack, dims=args.get("Input Dims") or [], types=args.get("Input type") or [],
                        strides=args.get("Input Strides") or [], concrete=args.get("Concrete Inputs") or [], **base)
    return None

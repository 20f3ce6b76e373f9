"""Read Chrome/Kineto trace files written by torch.profiler (plain or .gz), one per rank, into RawEvents.

A trace is streamed (ijson): memory holds the events analysis keeps, as columns (RawEvents), not the file's JSON
tree (about eight times the file) nor an object per event (about as large as the file). Every value kept is
checked, so a malformed trace is one TraceError naming the file and the event, never an internal error or a NaN
in the output.
"""

from __future__ import annotations

import gzip
import math
import os
import stat
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import ijson

from advisor.errors import AdvisorError
from advisor.runtime.events import KERNEL, OP, RUNTIME, STEP, STEP_NAME, RawEvents, frozen, is_op_name

_TRACE_SUFFIXES = (".json", ".json.gz")
_CHUNK_BYTES = 1 << 16
MAX_US = 1e18  # ~31,000 years: a larger timestamp or duration is no measurement, and sums of them stay finite
_OP_DETAILS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")  # in RawEvents' details order
_INT64_MAX = (1 << 63) - 1


class TraceError(AdvisorError):
    """One trace cannot be analysed; `path` and `reason` apart, so a folder's report can list it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class _Malformed(ValueError):
    """A value in one event is not what a Kineto trace holds there."""


@dataclass
class Trace:
    path: str
    rank: int
    has_stacks: bool
    has_shapes: bool
    has_steps: bool
    on_device: bool


def trace_files(path: str) -> list[str]:
    """The regular *.json / *.json.gz files of a folder (a FIFO or socket would block the read), or the file.
    Raises TraceError naming `path` when there is none."""
    if os.path.isdir(path):
        candidates = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(_TRACE_SUFFIXES))
        files = [candidate for candidate in candidates if _is_regular(candidate)]
        if not files:
            raise TraceError(path, "no trace files (regular *.json, *.json.gz files) in this folder")
        return files
    if not os.path.lexists(path):
        raise TraceError(path, "no such file or folder")
    if not _is_regular(path):
        raise TraceError(path, "not a regular file")
    return [path]


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def load_trace(path: str, index: int) -> tuple[Trace, RawEvents]:
    """The trace's facts and its kept events; rank `index` unless the trace names its own."""
    reader = _Reader()
    try:
        with _open_regular(path) as handle:
            reader.read(handle)
        rank = _rank(reader.info, index)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(path, f"cannot read the trace ({exc})") from None
    except ijson.JSONError as exc:
        first_line = (str(exc).splitlines() or ["invalid JSON"])[0]  # the parser adds lines pointing at the byte
        raise TraceError(path, f"not a complete JSON trace (truncated?): {first_line}") from None
    except _Malformed as exc:
        raise TraceError(path, f"malformed trace: {exc}") from None
    if not reader.seen:
        raise TraceError(path, "not a Chrome/Kineto trace (no events in a traceEvents list)")
    raws = reader.raws
    trace = Trace(path, rank, raws.has_stacks, raws.has_shapes, STEP in raws.kind, KERNEL in raws.kind)
    return trace, raws


@contextmanager
def _open_regular(path: str):
    """Open without blocking on a FIFO, and read only a regular file."""
    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError("not a regular file")
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=handle, mode="rb") as unzipped:
                yield unzipped
        else:
            yield handle


def _rank(info: list, default: int) -> int:
    if not info:
        return default
    if not isinstance(info[-1], dict):
        raise _Malformed("distributedInfo is not an object")
    rank = info[-1].get("rank", default)
    if isinstance(rank, bool) or not isinstance(rank, (int, float)) or not float(rank).is_integer():
        raise _Malformed(f"distributedInfo.rank is not an integer ({rank!r})")
    return int(rank)


MAX_NESTING = 100  # arrays and objects inside each other; a trace nests a handful (args' input shapes)


class _DepthLimit:
    """A target of ijson's event parser that refuses JSON nested deeper than `limit`: the item parsers build each
    event whole, and `[[[[...]]]]` of a few tens of KB grew memory with the square of its depth (5 GB at 80 KB)
    before a RecursionError."""

    def __init__(self, limit: int) -> None:
        self.limit, self.depth = limit, 0

    def send(self, event: tuple) -> None:
        kind = event[0]
        if kind in ("start_map", "start_array"):
            self.depth += 1
            if self.depth > self.limit:
                raise _Malformed(f"values nested deeper than {self.limit} levels")
        elif kind in ("end_map", "end_array"):
            self.depth -= 1


class _Reader:
    """Feeds the file in chunks to two incremental parsers (the events, and distributedInfo, which may come
    before or after them) and keeps only the events analysis uses."""

    def __init__(self) -> None:
        self.raws = RawEvents()
        self.info = ijson.sendable_list()
        self.seen = 0
        self._events = ijson.sendable_list()
        self._stacks: dict[str, tuple[str, ...]] = {}  # each "Call stack" text split once

    def read(self, handle) -> None:
        parsers = [ijson.basic_parse_coro(_DepthLimit(MAX_NESTING), use_float=True),  # first: before any is built
                   ijson.items_coro(self._events, "traceEvents.item", use_float=True),
                   ijson.items_coro(self._events, "item", use_float=True),  # the Trace Event Format's array form
                   ijson.items_coro(self.info, "distributedInfo", use_float=True)]
        for chunk in iter(partial(handle.read, _CHUNK_BYTES), b""):
            for parser in parsers:
                parser.send(chunk)
            self._keep()
        for parser in parsers:
            parser.close()
        self._keep()

    def _keep(self) -> None:
        for event in self._events:
            self.seen += 1
            try:
                self._keep_event(event)
            except _Malformed as exc:
                raise _Malformed(f"event {self.seen}: {exc}") from None
        del self._events[:]

    def _keep_event(self, event) -> None:
        if not isinstance(event, dict):
            raise _Malformed(f"an event is not an object ({event!r:.40})")
        start, dur = _microseconds(event, "ts"), _microseconds(event, "dur")  # of every event, kept or not
        if event.get("ph") != "X":
            return
        cat, name, args = event.get("cat", ""), event.get("name", ""), event.get("args") or {}
        if not isinstance(cat, str) or not isinstance(name, str) or not isinstance(args, dict):
            raise _Malformed("cat and name must be strings and args an object")
        kind = _kind(cat, name)
        if kind is None:
            return
        tid = event.get("tid", 0)
        if isinstance(tid, bool) or not isinstance(tid, (int, str)):
            raise _Malformed(f"tid is not a number or a name ({tid!r})")
        tid = str(tid)
        if kind in (KERNEL, RUNTIME):
            correlation = args.get("correlation")
            if isinstance(correlation, bool) or not isinstance(correlation, (int, type(None))) \
                    or correlation is not None and not -_INT64_MAX <= correlation <= _INT64_MAX:
                raise _Malformed(f"args.correlation is not a 64-bit integer ({correlation!r})")
            self.raws.append(kind, name, tid, start, dur, correlation=correlation)
        elif kind == OP:
            details = tuple(_detail(args, key) for key in _OP_DETAILS)
            self.raws.append(kind, name, tid, start, dur, self._stack(args), details)
        else:
            self.raws.append(kind, name, tid, start, dur)

    def _stack(self, args: dict) -> tuple[str, ...]:
        stack = args.get("Call stack") or ""
        if not isinstance(stack, str):
            raise _Malformed(f"args.Call stack is not a string ({stack!r})")
        if stack not in self._stacks:
            self._stacks[stack] = tuple(frame for frame in stack.split(";") if frame)
        return self._stacks[stack]


def _kind(cat: str, name: str) -> int | None:
    if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        return KERNEL
    if cat in ("cuda_runtime", "cuda_driver"):
        return RUNTIME
    if cat == "user_annotation" and name.startswith("ProfilerStep#"):
        match = STEP_NAME.match(name)
        if not match or int(match[1]) > _INT64_MAX:
            raise _Malformed(f"{name!r} is not a ProfilerStep#N marker")
        return STEP
    if cat == "cpu_op" and is_op_name(name):
        return OP
    return None


def _microseconds(event: dict, key: str) -> float:
    value = event.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or abs(value) > MAX_US or (key == "dur" and value < 0):
        raise _Malformed(f"{key} is not a time in microseconds ({value!r})")
    return float(value)


def _detail(args: dict, key: str) -> tuple:
    """One of an op's recorded inputs (shapes, types...) as nested tuples."""
    value = args.get(key) or []
    if not isinstance(value, list):
        raise _Malformed(f"args.{key} is not a list ({value!r})")
    try:
        return frozen(value)
    except TypeError as exc:
        raise _Malformed(f"args.{key} {exc}") from None

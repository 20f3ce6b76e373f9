"""Read Chrome/Kineto trace files written by torch.profiler (plain or .gz), one per rank, into RawEvents.

A trace is streamed (ijson): memory holds the events analysis keeps, not the file's JSON tree (about eight
times the file). Every value kept is checked, so a malformed trace is one TraceError naming the file and the
event, never an internal error or a NaN in the output.
"""

from __future__ import annotations

import gzip
import math
import os
import stat
import sys
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import ijson

from advisor.errors import AdvisorError
from advisor.runtime.events import RawEvent, is_op_name

_TRACE_SUFFIXES = (".json", ".json.gz")
_CHUNK_BYTES = 1 << 16
MAX_US = 1e18  # ~31,000 years: a larger timestamp or duration is no measurement, and sums of them stay finite
_OP_DETAILS = (("dims", "Input Dims"), ("types", "Input type"), ("strides", "Input Strides"),
               ("concrete", "Concrete Inputs"))


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
    """The regular *.json / *.json.gz files of a folder (a FIFO or socket would block the read), or the file."""
    if os.path.isdir(path):
        candidates = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(_TRACE_SUFFIXES))
        files = [candidate for candidate in candidates if _is_regular(candidate)]
        if not files:
            raise AdvisorError(f"{path}: no trace files (regular *.json, *.json.gz files) in this folder")
        return files
    if not os.path.lexists(path):
        raise AdvisorError(f"{path}: no such file or folder")
    if not _is_regular(path):
        raise AdvisorError(f"{path}: not a regular file")
    return [path]


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def load_trace(path: str, index: int) -> tuple[Trace, list[RawEvent]]:
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
    trace = Trace(path, rank, any(r.stack for r in raws), any(r.dims for r in raws),
                  any(r.kind == "step" for r in raws), any(r.kind == "kernel" for r in raws))
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


class _Reader:
    """Feeds the file in chunks to two incremental parsers (the events, and distributedInfo, which may come
    before or after them) and keeps only the events analysis uses. Repeated stacks and shapes share one object."""

    def __init__(self) -> None:
        self.raws: list[RawEvent] = []
        self.info = ijson.sendable_list()
        self.seen = 0
        self._events = ijson.sendable_list()
        self._shared: dict = {}

    def read(self, handle) -> None:
        parsers = [ijson.items_coro(self._events, "traceEvents.item", use_float=True),
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
                raw = self._raw(event)
            except _Malformed as exc:
                raise _Malformed(f"event {self.seen}: {exc}") from None
            if raw is not None:
                self.raws.append(raw)
        del self._events[:]

    def _raw(self, event) -> RawEvent | None:
        if not isinstance(event, dict) or event.get("ph") != "X":
            return None
        cat, name, args = event.get("cat", ""), event.get("name", ""), event.get("args") or {}
        if not isinstance(cat, str) or not isinstance(name, str) or not isinstance(args, dict):
            raise _Malformed("cat and name must be strings and args an object")
        kind = _kind(cat, name)
        if kind is None:
            return None
        tid = event.get("tid", 0)
        if isinstance(tid, bool) or not isinstance(tid, (int, str)):
            raise _Malformed(f"tid is not a number or a name ({tid!r})")
        raw = RawEvent(kind, sys.intern(name), sys.intern(str(tid)), _microseconds(event, "ts"),
                       _microseconds(event, "dur"))
        if kind in ("kernel", "runtime"):
            raw.correlation = args.get("correlation")
            if isinstance(raw.correlation, bool) or not isinstance(raw.correlation, (int, type(None))):
                raise _Malformed(f"args.correlation is not an integer ({raw.correlation!r})")
        elif kind == "op":
            stack = args.get("Call stack") or ""
            if not isinstance(stack, str):
                raise _Malformed(f"args.Call stack is not a string ({stack!r})")
            raw.stack = self._share(("stack", stack), lambda: tuple(frame for frame in stack.split(";") if frame))
            for attribute, key in _OP_DETAILS:
                value = args.get(key) or []
                if not isinstance(value, list):
                    raise _Malformed(f"args.{key} is not a list ({value!r})")
                frozen = _frozen(value, key)
                setattr(raw, attribute, self._share((attribute, frozen), lambda: frozen))
        return raw

    def _share(self, key, make):
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


def _kind(cat: str, name: str) -> str | None:
    if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        return "kernel"
    if cat in ("cuda_runtime", "cuda_driver"):
        return "runtime"
    if cat == "user_annotation" and name.startswith("ProfilerStep#"):
        return "step"
    if cat == "cpu_op" and is_op_name(name):
        return "op"
    return None


def _microseconds(event: dict, key: str) -> float:
    value = event.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or abs(value) > MAX_US or (key == "dur" and value < 0):
        raise _Malformed(f"{key} is not a time in microseconds ({value!r})")
    return float(value)


def _frozen(value, key: str):
    """Lists as tuples (shared between events, never mutated); anything else a trace does not hold is malformed."""
    if isinstance(value, list):
        return tuple(_frozen(item, key) for item in value)
    if isinstance(value, dict):
        raise _Malformed(f"args.{key} holds an object")
    return value

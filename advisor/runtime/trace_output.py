"""Where `profile --trace PATH` writes: checked before the workload runs, confirmed after the profiler wrote.

The profiler does not report a failed write (a missing folder, a folder given as the file), so advisor checks
the path first and the file afterwards. A symbolic link is written through: the link stays, its target is the
trace.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from advisor.errors import AdvisorError


@dataclass
class TraceOutput:
    requested: str  # as given, for messages
    path: str  # the real file the profiler writes
    before: tuple[int, int, int] | None  # (inode, mtime, size) of a file already there


def check_trace_path(requested: str | None) -> TraceOutput | None:
    """None without --trace; raises AdvisorError when the trace could not be written there."""
    if requested is None:
        return None
    path = os.path.realpath(requested)
    if os.path.isdir(path) or requested.endswith((os.sep, "/")):  # `traces/`: a folder, made or not (round 18)
        raise AdvisorError(f"--trace {requested}: is a folder; give a file name, e.g. "
                           f"{os.path.join(requested, 'trace.json')}")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise AdvisorError(f"--trace {requested}: the folder {folder} does not exist")
    if os.path.lexists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        raise AdvisorError(f"--trace {requested}: exists and is not a regular file")
    if not os.access(folder, os.W_OK):
        raise AdvisorError(f"--trace {requested}: cannot write in {folder}")
    return TraceOutput(requested, path, _identity(path))


def confirm_trace_written(output: TraceOutput | None) -> None:
    """Raises AdvisorError unless the profiler left a new, non-empty file at the path."""
    if output is None:
        return
    now = _identity(output.path)
    if now is None or now == output.before or now[2] == 0:
        raise AdvisorError(f"--trace {output.requested}: the profiler did not write the trace")


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_mtime_ns, status.st_size

"""Child processes that end with their parent, whatever ends it (SIGTERM, SIGHUP, SIGKILL, a crash): a scan worker
blocked on its task queue, or a workload worker in the middle of a request, would otherwise live on under init."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_INTERVAL_S = 0.2


def end_with_parent(parent_pid: int, group: bool = False) -> None:
    """Called first in the child. On Linux the kernel kills it when the parent dies (PR_SET_PDEATHSIG); elsewhere,
    or with `group` (the child leads a process group, and what it started there must end too, which a signal to
    the child alone would not do), a daemon thread watches for the parent's pid to change. A parent already gone by
    the time this runs ends it too."""
    if group or not (sys.platform.startswith("linux") and _set_parent_death_signal()):
        threading.Thread(target=_watch, args=(parent_pid, group), name="advisor-parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:
        _end(group)


def _set_parent_death_signal() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int, group: bool) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_INTERVAL_S)
    _end(group)


def _end(group: bool) -> None:
    if group:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def worker_pool(workers: int, start=None, *args) -> ProcessPoolExecutor:
    """A process pool whose workers end with this process (`end_with_parent`), each running `start(*args)` once as
    it starts (what every task needs, sent once rather than with each task)."""
    return ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(os.getpid(), start, args))


def _start_worker(parent_pid: int, start, args: tuple) -> None:
    end_with_parent(parent_pid)
    if start is not None:
        start(*args)

"""Child processes that end with their parent, whatever ends it (SIGTERM, SIGHUP, SIGKILL, a crash): a scan worker
blocked on its task queue would otherwise wait forever under init once its parent is gone."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_INTERVAL_S = 0.5


def end_with_parent(parent_pid: int) -> None:
    """Called first in the child. On Linux the kernel kills it when the parent dies (PR_SET_PDEATHSIG); elsewhere a
    daemon thread watches for the parent's pid to change. A parent already gone by the time this runs ends it too."""
    if not (sys.platform.startswith("linux") and _set_parent_death_signal()):
        threading.Thread(target=_watch, args=(parent_pid,), name="advisor-parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(1)


def _set_parent_death_signal() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_INTERVAL_S)
    os._exit(1)

"""Python's cyclic garbage collector held off while one file is read and analysed.

The collector runs by allocation counts and traverses every live tracked object of the generations it collects;
an analysis allocates millions of libcst nodes that stay alive until the file is done and are then freed by
reference counting, so the collector's passes over them find nothing and grow with the file: 20% of a cold scan's
CPU time, and the 800-block file's excess over 8x its 100-block time (benchmarks/scan_speed.py,
benchmarks/scan_scaling.py). Cycles made while it is held off are collected by its first pass afterwards (peak
memory of the 400-block file: 646 MB held off, 659 MB not). mypy raises its thresholds for the same reason.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside the block; the collector's state is restored after it (a caller that turned it
    off keeps it off, and a nested pause changes nothing)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_set_aside = 0  # scans under way in this process that set the objects alive at their start aside


@contextmanager
def long_lived_set_aside() -> Iterator[None]:
    """The objects alive as a scan starts (imported modules, torch, libcst, the tree's facts) are moved out of the
    collector's reach until it ends (`gc.freeze`): each of its full passes read them all again, and a pool forked
    inside inherits them set aside (a cold scan of 300 files of `transformers/models` in one process: 5% less
    CPU). Nested scans share the outermost one's; the objects return to the collector as it ends. A process that
    froze objects itself (a server forking workers) is left as it is: `gc.unfreeze` would release its objects too."""
    global _set_aside
    if _set_aside == 0 and gc.get_freeze_count():
        yield
        return
    if _set_aside == 0:
        gc.freeze()
    _set_aside += 1
    try:
        yield
    finally:
        _set_aside -= 1
        if _set_aside == 0:
            gc.unfreeze()

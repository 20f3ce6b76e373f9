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

"""A file's analysis run again where deep nesting fits: CPython's parser accepts an expression nested about three
times deeper than the default recursion limit of 1,000 frames (a sum of 2,900 terms at module level), while libcst's
code generation and advisor's walks recurse once or more a level, so such a file raised RecursionError and was lost
to the scan (breaker round 53: a 400-term sum). The retry runs in a thread of its own whose stack holds the frames,
with the limit raised while it runs; the main thread's 8 MB stack overflowed (a crash, not an error) first."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

DEEP_LIMIT = 60_000  # frames: a 2,900-level sum took more than 8,000
DEEP_STACK = 1 << 30  # bytes of address space for the thread's stack (pages are used only as it grows): 16 KB a frame

T = TypeVar("T")
_outer_limits: list[int] = []  # the limits of the threads that asked for the deep runs under way


def run_with_deep_stack(run: Callable[[], T]) -> T:
    """run() in a thread with DEEP_STACK of stack and the recursion limit at least DEEP_LIMIT, its result returned
    or its exception raised here; the limit and the stack size of new threads are put back after."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = run()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            outcome["error"] = exc

    limit, stack = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(max(limit, DEEP_LIMIT))  # a thread takes the limit as it starts
    _outer_limits.append(limit)
    try:
        threading.stack_size(DEEP_STACK)
        try:
            thread = threading.Thread(target=target, name="advisor-deep-analysis", daemon=True)
            thread.start()
        finally:
            threading.stack_size(stack)
        thread.join()
    finally:
        _outer_limits.pop()
        sys.setrecursionlimit(limit)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


@contextmanager
def outer_recursion_limit() -> Iterator[None]:
    """Inside a deep run, the limit of the thread that asked for it, for the block: CPython's parser allows nesting
    in proportion to the limit, and code the user's interpreter refuses to compile (a 5,000-term sum) stays a syntax
    error rather than being analysed under the raised one. Outside a deep run, nothing changes."""
    if not _outer_limits:
        yield
        return
    deep = sys.getrecursionlimit()
    sys.setrecursionlimit(_outer_limits[-1])
    try:
        yield
    finally:
        sys.setrecursionlimit(deep)

"""Keep the profiler's native log lines (`USDT: ... profiler_start`, `gpuGetDeviceCount failed`) off the user's
stderr. Kineto writes them from C++ straight to file descriptor 2, and KINETO_LOG_LEVEL does not silence the USDT
lines (checked on torch 2.13), so fd 2 is redirected to a temporary file while the profiler runs and everything but
Kineto's own lines is written back afterwards (a workload's messages are kept, in order, just later)."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

# Kineto's log prefix: LEVEL:YYYY-MM-DD HH:MM:SS pid:tid File.cpp:line]
KINETO_LINE = re.compile(rb"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+\.(?:cpp|h):\d+\] ")


@contextmanager
def without_native_log() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(line for line in captured if not KINETO_LINE.match(line))
            if kept:
                os.write(2, kept)

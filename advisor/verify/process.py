"""Parent side of a workload worker: a child Python process that runs user code behind a pipe.

User code can print, raise, call sys.exit()/os._exit(), hang or crash the interpreter; none of that may reach
advisor's own stdout or end advisor. The child's stdout/stderr go to a log file, requests and replies
(`advisor.verify.messages`) travel as pickles over a private pipe pair, and every way the child can fail becomes a
WorkerFailed with one line.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from advisor.errors import AdvisorError
from advisor.verify.messages import Failed, Hello, Ok, Progress, Request

DEFAULT_TIMEOUT_S = 600.0
STARTUP_TIMEOUT_S = 300.0  # starting Python and importing torch is ours, not the workload's: --timeout does not apply


class WorkerFailed(AdvisorError):
    """The workload process raised, exited, crashed or timed out; the message is one line for the user."""


# Unless the user set them: idle OpenMP threads sleep (two workers are timed in turns, and the idle one's spinning
# threads took the timed one's cores: the demo's interval was [1.3, 2.5] with spinning, [1.38, 1.41] without), and
# glibc keeps freed memory below its own 32 MiB mmap ceiling instead of returning it each step (a fresh process paid
# page faults for the original ViT's score tensors, 34 ms a step, that vanished after any profiler session pinned
# the heap, 19 ms: the speedup depended on what had run before; fixed thresholds give both sides the steady state).
WORKER_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                      "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def worker_environment() -> dict[str, str]:
    """This process's environment with WORKER_ENVIRONMENT's defaults for what the user did not set."""
    return {**WORKER_ENVIRONMENT, **os.environ}


class WorkerProcess:
    """A long-lived child running `advisor.verify.worker`; `call` sends one request and waits for its reply."""

    def __init__(self, label: str, timeout_s: float = DEFAULT_TIMEOUT_S, log_path: str | None = None,
                 on_progress: Callable[[str], None] = lambda _: None):
        self.label, self.timeout_s, self.on_progress = label, timeout_s, on_progress
        self._own_log = log_path is None  # a temporary log is removed on a clean close, kept after a failure
        if log_path is None:
            descriptor, log_path = tempfile.mkstemp(prefix=f"advisor-{label}-", suffix=".log")
            os.close(descriptor)
        self.log_path = log_path
        self.failed = False
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # never through a link: a log in `optimize --report DIR` is created there first (advisor.verify.report_folder)
        with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "advisor.verify.worker", str(to_child_r), str(from_child_w), str(os.getpid())],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,  # its own process group: a timeout kills whatever it started too
                env=worker_environment())
        os.close(to_child_r)
        os.close(from_child_w)
        self._send, self._receive = Connection(to_child_w, readable=False), Connection(from_child_r, writable=False)
        self.closed = False

    def call(self, request: Request, timeout_s: float | None = None, doing: str | None = None):
        """Send a request; return its reply's value (the type each request's class names), or raise WorkerFailed
        (on a Failed reply the worker stays usable; on anything else it is closed). `doing` names the request in
        those messages (default: its name)."""
        doing = doing or f"`{request.name}`"
        if self.closed:
            raise WorkerFailed(f"the {self.label} process is no longer running")
        try:
            self._send.send_bytes(pickle.dumps(request))
        except (BrokenPipeError, OSError):
            self._fail(f"the {self.label} process exited before {doing}" + self._exit_text())
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._receive.poll(left):
                self._fail(f"the {self.label} process did not finish {doing} within "
                           f"{timeout_s or self.timeout_s:g} s (--timeout); it was stopped")
            try:
                reply = pickle.loads(self._receive.recv_bytes())
            except (EOFError, OSError):
                self._fail(f"the {self.label} process ended during {doing}" + self._exit_text())
            except Exception as exc:  # noqa: BLE001 - a reply we cannot read (a class only the child has)
                self._fail(f"the {self.label} process's reply to {doing} could not be read "
                           f"({type(exc).__name__}: {exc})")
            if isinstance(reply, Progress):
                self.on_progress(reply.text)
            elif isinstance(reply, Ok):
                return reply.value
            elif isinstance(reply, Failed):  # user code raised; the worker is still usable
                self.failed = True
                raise WorkerFailed(reply.line)
            else:
                self._fail(f"the {self.label} process answered {doing} with a message advisor does not know "
                           f"({type(reply).__name__})")

    def _exit_text(self) -> str:
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return ""
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            return f" (killed by {name}; see {self.log_path})"
        return f" (exit code {code}, e.g. sys.exit() or os._exit() in the workload; see {self.log_path})"

    def _fail(self, message: str):
        self.failed = True
        self.close()
        raise WorkerFailed(message)

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the child and everything it started; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for connection in (self._send, self._receive):
            connection.close()
        if self._process.poll() is None:
            try:
                self._process.wait(timeout=2)  # it exits by itself once its request pipe closes
            except subprocess.TimeoutExpired:
                pass
        if self._process.poll() is None:
            _kill_group(self._process.pid)
            self._process.wait()
        left = _group_members(self._process.pid)  # started by the workload and still running after it ended
        settled = time.monotonic() + EXIT_GRACE_S  # helpers that end by themselves once the worker is gone
        while left and time.monotonic() < settled:  # (multiprocessing's resource tracker: breaker round 19)
            time.sleep(0.02)
            left = _group_members(self._process.pid)
        if left:
            _kill_group(self._process.pid)
            _left_running.extend(left)
            deadline = time.monotonic() + 5  # SIGKILL is delivered, not yet done: end with them gone
            while _group_members(self._process.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        if self._own_log and not self.failed:
            os.unlink(self.log_path)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


EXIT_GRACE_S = 1.0  # how long what the workload started may take to end after the worker, before it is killed
_left_running: list[str] = []  # "pid (name)" of what workers' process groups held when they closed


def take_left_running() -> list[str]:
    """What the workload left running in the workers closed since the last call (each one killed), and forget it."""
    left = _left_running[:]
    _left_running.clear()
    return left


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _group_members(group: int) -> list[str]:
    """The live processes of a process group, as "pid (name)" (Linux /proc; elsewhere only whether any is left).
    A process that left the group (setsid, a daemon) is not seen."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    if not os.path.isdir("/proc/self"):
        return [f"process group {group}"]
    members = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                name, fields = handle.read().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        state, _parent, process_group = fields.split()[:3]
        if int(process_group) == group and state != "Z":  # a zombie has ended; it only waits to be reaped
            members.append(f"{entry} ({name.split('(', 1)[1]})")
    return members


def start_worker(label: str, timeout_s: float = DEFAULT_TIMEOUT_S, on_progress: Callable[[str], None] = lambda _: None,
                 threads: int | None = None, overlay: dict[str, str] | None = None, overlay_root: str | None = None,
                 log_path: str | None = None) -> WorkerProcess:
    """A worker that imports like this process (same sys.path), optionally with patched files overlaid."""
    worker = WorkerProcess(label, timeout_s, log_path, on_progress)
    try:
        worker.call(Hello(tuple(sys.path), threads, overlay, overlay_root),
                    timeout_s=max(timeout_s, STARTUP_TIMEOUT_S))
    except BaseException:
        worker.close()
        raise
    return worker

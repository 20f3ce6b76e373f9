"""Workers are timed in turns, so their environment must not let one side's state leak into the other's time: idle
OpenMP threads sleep, and glibc keeps freed memory (fixed thresholds) unless the user chose otherwise."""

import sys

from advisor.verify.messages import Hello
from advisor.verify.process import WORKER_ENVIRONMENT, WorkerProcess


def _environment() -> dict:
    worker = WorkerProcess("env-check")
    try:
        return worker.call(Hello(tuple(sys.path))).environment
    finally:
        worker.close()


def test_workers_get_the_timing_defaults(monkeypatch):
    for name in WORKER_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert _environment() == WORKER_ENVIRONMENT
    assert _environment()["OMP_WAIT_POLICY"] == "PASSIVE"


def test_a_users_own_settings_are_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    seen = _environment()
    assert seen["OMP_WAIT_POLICY"] == "ACTIVE" and seen["MALLOC_TRIM_THRESHOLD_"] == "0"

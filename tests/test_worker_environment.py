"""Workers are timed in turns: an idle worker's OpenMP threads must sleep, not spin on the timed worker's cores."""

import sys

from advisor.verify.process import WorkerProcess


def _hello() -> dict:
    worker = WorkerProcess("env-check")
    try:
        return worker.call("hello", sys_path=sys.path)
    finally:
        worker.close()


def test_idle_openmp_threads_sleep_by_default(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert _hello()["omp_wait_policy"] == "PASSIVE"


def test_a_users_openmp_wait_policy_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert _hello()["omp_wait_policy"] == "ACTIVE"

"""Shared by the profile/analyze tests: run a fixture target once per test module, find marked lines."""

from __future__ import annotations

import os
from pathlib import Path

from advisor.engine.profiling import profile_workload
from advisor.workload_loader import load_workload

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "profile"


def marker_line(path: Path | str, marker: str) -> int:
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return number
    raise AssertionError(f"{marker} not in {path}")


def source_line(path: str, needle: str) -> int:
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        if needle in text:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def run_fixture(name: str, function: str = "workload", steps: int = 2, **options):
    target = f"{FIXTURES / name}:{function}"
    workload = load_workload(target)
    workload.steps = steps
    return profile_workload(workload, target, **options)


def by_rule(report, rule: str) -> list:
    return [f for f in report.findings if f.rule == rule]


def same_file(a: str, b: str | Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(str(b))

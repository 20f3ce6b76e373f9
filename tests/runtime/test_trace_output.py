"""`profile --trace PATH`: a path the profiler cannot write is refused before the workload runs, a symlink is
written through (the link stays), and a trace the profiler did not write is reported, never claimed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.errors import AdvisorError
from advisor.runtime.trace_output import check_trace_path, confirm_trace_written

TARGET = f"{Path(__file__).resolve().parents[2] / 'fixtures' / 'profile' / 'handwritten_attention.py'}:workload"


def test_missing_folder_is_refused_before_running(capsys, tmp_path):
    assert main(["profile", TARGET, "--trace", str(tmp_path / "missing" / "t.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_folder_is_refused_and_nothing_is_left_in_it(capsys, tmp_path):
    assert main(["profile", TARGET, "--trace", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_folder_name_that_does_not_exist_is_refused_not_written_as_a_file(capsys, tmp_path):
    """Breaker round 18: `--trace traces/` exited 0 and wrote a file named `traces`."""
    assert main(["profile", TARGET, "--trace", str(tmp_path / "traces") + "/"]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_symlinked_trace_path_is_written_through(capsys, tmp_path):
    (tmp_path / "traces").mkdir()
    link = tmp_path / "latest.json"
    link.symlink_to(tmp_path / "traces" / "run1.json")
    assert main(["profile", TARGET, "--trace", str(link), "--format", "json"]) in (0, 1)
    capsys.readouterr()
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "traces" / "run1.json")
    assert json.loads((tmp_path / "traces" / "run1.json").read_text())["traceEvents"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "traces"]


def test_a_trace_that_was_not_written_is_reported(tmp_path):
    output = check_trace_path(str(tmp_path / "t.json"))
    with pytest.raises(AdvisorError, match="did not write"):
        confirm_trace_written(output)
    (tmp_path / "t.json").write_text("{}")
    stale = check_trace_path(str(tmp_path / "t.json"))
    with pytest.raises(AdvisorError, match="did not write"):
        confirm_trace_written(stale)  # an old file left in place is not this run's trace
    (tmp_path / "t.json").write_text('{"traceEvents": []}')
    confirm_trace_written(stale)

"""`optimize --report DIR` writes only inside DIR and never through a symbolic link: DIR itself, a file in it or its
`patches` folder being a link is refused with one line (exit 2), before the workload runs where the name is known."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.errors import AdvisorError

ROOT = Path(__file__).resolve().parents[2]
TARGET = f"{ROOT / 'fixtures' / 'profile' / 'clean.py'}:workload"


def optimize_into(capsys, report: Path) -> tuple[int, str]:
    code = main(["optimize", TARGET, "--report", str(report), "--timeout", "60"])
    _, err = capsys.readouterr()
    return code, err


def one_line(err: str) -> str:
    [line] = err.strip().splitlines()
    assert "Errno" not in line and "Error:" not in line.split("error:", 1)[-1]
    return line


def test_a_report_folder_that_is_a_link_is_refused(capsys, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "report").symlink_to(outside)
    code, err = optimize_into(capsys, tmp_path / "report")
    assert code == 2 and "symbolic link" in one_line(err)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", ["result.json", "trace_before.json", "original.log", "patches"])
def test_a_link_inside_the_report_folder_is_refused_before_the_workload_runs(capsys, tmp_path, name):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    report = tmp_path / "report"
    report.mkdir()
    (report / name).symlink_to(outside)
    dangling = tmp_path / "created-through-a-link"
    (report / "report.md").symlink_to(dangling)
    code, err = optimize_into(capsys, report)
    assert code == 2 and "symbolic link" in one_line(err)
    assert outside.read_text() == "precious\n" and not dangling.exists()
    assert not (report / "original.log").exists() or (report / "original.log").is_symlink()


def test_a_report_path_that_is_a_file_is_one_clear_line(capsys, tmp_path):
    (tmp_path / "report").write_text("x")
    code, err = optimize_into(capsys, tmp_path / "report")
    assert code == 2 and "not a folder" in one_line(err)


def test_a_report_folder_that_cannot_be_created_is_one_clear_line(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    code, err = optimize_into(capsys, tmp_path / "file" / "report")
    assert code == 2 and "cannot create" in one_line(err) and "Not a directory" in err


def test_a_link_planted_after_the_check_is_never_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    report = tmp_path / "report"
    from advisor.verify.report_folder import ReportFolder

    folder = ReportFolder(str(report))
    (report / "trace_after.json").symlink_to(outside)
    with pytest.raises(AdvisorError, match="symbolic link"):
        folder.write_text("trace_after.json", "{}")
    (report / "patches").symlink_to(tmp_path)
    with pytest.raises(AdvisorError, match="symbolic link"):
        folder.write_text("patches/model.py.diff", "diff")
    assert outside.read_text() == "precious\n" and not (tmp_path / "model.py.diff").exists()


def test_a_hard_linked_file_in_the_report_folder_is_replaced_not_written_into(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    report = tmp_path / "report"
    report.mkdir()
    os.link(outside, report / "result.json")
    from advisor.verify.report_folder import ReportFolder

    ReportFolder(str(report)).write_text("result.json", "{}")
    assert outside.read_text() == "precious\n" and (report / "result.json").read_text() == "{}"

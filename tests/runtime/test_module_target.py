"""A `package.module:function` TARGET resolves as `python -m` would: against the current directory (and, for
optimize, `--root`), with a message that says what to set when it still fails."""

import json
from pathlib import Path

from advisor.cli import main

WORKLOAD = "import torch\n\ndef workload():\n    return torch.nn.Linear(4, 4), torch.ones(2, 4)\n"


def make_package(folder: Path, name: str = "mypkg", body: str = WORKLOAD) -> Path:
    package = folder / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(body)
    return folder


def test_a_module_target_resolves_against_the_current_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(make_package(tmp_path))
    code = main(["profile", "mypkg.model:workload", "--format", "json"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    assert json.loads(captured.out)["target"] == "mypkg.model:workload"


def test_a_module_target_resolves_against_root_for_optimize(tmp_path, capsys, monkeypatch):
    make_package(tmp_path / "repo")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    code = main(["optimize", "mypkg.model:workload", "--root", str(tmp_path / "repo"), "--format", "json",
                 "--timing-budget", "0.2", "--report", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["patches"] == []


def test_a_module_that_is_still_not_found_says_what_to_set(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "nopkg.model:workload"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot import nopkg.model: No module named 'nopkg'" in line
    assert f"searched the current directory {tmp_path}" in line and "PYTHONPATH" in line


def test_optimize_names_each_folder_it_searched_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # optimize's root defaults to the current directory (breaker round 53)
    assert main(["optimize", "nopkg.model:workload", "--report", str(tmp_path / "r")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.count(str(tmp_path)) == 1, line


def test_a_missing_dependency_of_the_target_is_named_as_such(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(make_package(tmp_path, body="import not_installed_dep\n" + WORKLOAD))
    assert main(["profile", "mypkg.model:workload"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "importing mypkg.model failed: it imports 'not_installed_dep', which is not installed" in line

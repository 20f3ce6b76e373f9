"""The wheel is the product: it must carry every module and every rule file, and work from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"


def _run(argv: list[str], cwd: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_wheel_ships_rules_and_runs_outside_the_checkout(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("advisor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    in_tree = {str(p.relative_to(ROOT)) for p in (ROOT / "advisor").rglob("*.py")}
    rule_files = {f"advisor/rules/{p.name}" for p in (ROOT / "rules").glob("*.py")}
    assert in_tree - names == set() and rule_files - names == set()

    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere.mkdir()
    (elsewhere / "model.py").write_text(FIXTURE.read_text())
    where = _run(["-c", "import advisor.registry as r; print(r.__file__)"], elsewhere, site)
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr  # not the checkout's copy
    rules = _run(["-m", "advisor", "rules", "--format", "json"], elsewhere, site)
    assert rules.returncode == 0, rules.stderr
    from advisor.registry import load_rules

    assert len(json.loads(rules.stdout)["rules"]) == len(load_rules())
    scan = _run(["-m", "advisor", "scan", "model.py", "--format", "json"], elsewhere, site)
    assert scan.returncode == 1, scan.stderr
    report = json.loads(scan.stdout)
    assert report["errors"] == [] and [f["rule"] for f in report["findings"]] == ["ADV101"]


def test_an_install_without_rule_files_is_an_error_not_an_empty_list(tmp_path, monkeypatch):
    from advisor.registry import load_rules

    (tmp_path / "empty_rules").mkdir()
    (tmp_path / "empty_rules" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match="no rule files"):
        load_rules("empty_rules")

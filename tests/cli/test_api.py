"""The Python API: advisor.scan/fix/profile/optimize run the CLI's own paths and return typed results whose
to_json() is the CLI's JSON; `import advisor` stays cheap."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import advisor
from advisor.cli import main
from advisor.errors import AdvisorError
from advisor.contracts.finding import Finding
from advisor.results import FixReport, OptimizeReport, ProfileReport, ScanReport
from optimize_models import write_model

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"
COPIES_AND_CASTS = ROOT / "fixtures" / "profile" / "copies_and_casts.py"
HEAVY = ("torch", "transformers", "libcst", "networkx")


def test_import_advisor_and_naming_the_api_import_no_heavy_library():
    script = ("import sys, advisor\nf = (advisor.scan, advisor.fix, advisor.profile, advisor.optimize)\n"
              f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.stdout.strip() == "[]", run.stderr


@pytest.mark.parametrize("call", ["advisor.scan('model.py', select=['ADV1'])", "advisor.fix('model.py')",
                                  "advisor.scan('model.py', unsafe_fixes=True)"])
def test_the_api_works_as_the_first_thing_a_fresh_process_does(workdir, call):
    """The API loads the rule units (their helpers imported on first use) before the engine: a fresh process whose
    first call was `advisor.scan(...)` raised ImportError (the helpers were half built by a lazy loader)."""
    shutil.copy(NANOGPT, workdir / "model.py")
    script = f"import advisor\nreport = {call}\n" \
        "print(type(report).__name__, len(getattr(report, 'findings', None) or report.files))"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=workdir)
    assert run.returncode == 0, run.stderr[-2000:]
    kind, found = run.stdout.split()
    assert kind in ("ScanReport", "FixReport") and int(found) >= 1


def test_scan_returns_typed_findings_and_the_cli_json(capsys, workdir):
    shutil.copy(COPIES_AND_CASTS, workdir / "model.py")
    (workdir / "broken.py").write_text("def f(:\n")
    report = advisor.scan(".")
    assert isinstance(report, ScanReport) and report.files_scanned == 1
    assert all(isinstance(f, Finding) for f in report.findings)
    assert sorted(f.rule for f in report.findings) == ["ADV101", "ADV204"]
    assert report.errors[0].path.endswith("broken.py")
    assert main(["scan", ".", "--format", "json"]) == 1
    assert report.to_json() == json.loads(capsys.readouterr().out)
    assert [f.name for f in dataclasses.fields(ScanReport)] == list(report.to_json())


def test_scan_options_and_configuration_are_the_clis(workdir):
    shutil.copy(COPIES_AND_CASTS, workdir / "model.py")
    assert [f.rule for f in advisor.scan("model.py", select=["ADV2"]).findings] == ["ADV204"]
    assert [f.rule for f in advisor.scan(["model.py"], ignore="ADV2,ADV3").findings] == ["ADV101"]
    (workdir / "pyproject.toml").write_text('[tool.advisor]\nselect = ["ADV2"]\n')
    assert [f.rule for f in advisor.scan(workdir / "model.py").findings] == ["ADV204"]
    assert [f.rule for f in advisor.scan("model.py", tree=workdir).findings] == ["ADV204"]  # `--tree`
    with pytest.raises(ValueError, match="ADV9"):
        advisor.scan("model.py", select=["ADV9"])
    with pytest.raises(TypeError, match="selct"):
        advisor.scan("model.py", selct=["ADV1"])
    with pytest.raises(ValueError, match="backend"):
        advisor.scan("model.py", backend="cudnn")
    (workdir / "pyproject.toml").write_text('[tool.advisor]\nselct = ["ADV2"]\n')
    with pytest.raises(AdvisorError, match="unknown key 'selct'"):
        advisor.scan("model.py")


@pytest.mark.parametrize("verb, options, error, says", [
    ("fix", {"apply": "no"}, TypeError, "'apply' must be a bool"),  # a truthy string would have written the file
    ("scan", {"cache": "false"}, TypeError, "'cache' must be a bool"),
    ("profile", {"timeout": -1}, ValueError, "as --timeout takes none"),
    ("profile", {"timeout": "5"}, TypeError, "must be a number"),
    ("profile", {"device": "gpu"}, ValueError, "device must be one of cpu, cuda"),
    ("optimize", {"calls": 0}, ValueError, "as --calls takes none"),
    # a third promises round: nan, inf and negative budgets ran the workload, then failed (OverflowError) or not
    ("optimize", {"timing_budget": float("inf")}, ValueError, "as --timing-budget takes none"),
    ("optimize", {"timing_budget": float("nan")}, ValueError, "as --timing-budget takes none"),
    ("optimize", {"timing_budget": -5}, ValueError, "as --timing-budget takes none"),
    ("scan", {"profile": 123}, TypeError, "'profile' must be a str or path, not int"),  # was sent to the worker
    ("fix", {"tree": 1}, TypeError, "'tree' must be a str or path, not int"),
    ("fix", {"config": ["a.toml"]}, TypeError, "'config' must be a str or path, not list"),
    # a fourth promises round: the API asked nothing and applied every verified patch
    ("optimize", {"interactive": True}, TypeError, "the API asks nothing"),
    ("fix", {"interactive": True}, TypeError, "the API asks nothing"),
    # breaker round 18: the terminal's options were accepted (`verbose=True` printed, `format="sarif"` ignored)
    ("scan", {"verbose": True}, TypeError, "the API prints nothing"),
    ("fix", {"quiet": False}, TypeError, "the API prints nothing"),
    ("scan", {"format": "sarif"}, TypeError, "returns the typed result"),
])
def test_an_option_the_flag_would_refuse_is_refused_before_anything_runs(workdir, verb, options, error, says):
    shutil.copy(COPIES_AND_CASTS, workdir / "model.py")
    before = (workdir / "model.py").read_bytes()
    with pytest.raises(error, match=says):
        getattr(advisor, verb)("model.py:workload" if verb in ("profile", "optimize") else "model.py", **options)
    assert (workdir / "model.py").read_bytes() == before


SAFE_AND_UNSAFE = "import torch\n\n\ndef f(x):\n    return x.float().float(), x.contiguous().clone()\n"


def test_fix_shows_then_applies_and_says_what_remains(workdir):
    model = workdir / "model.py"
    model.write_text(SAFE_AND_UNSAFE)  # a safe fix (ADV301) and an unsafe one (ADV204)
    before = model.read_text()
    shown = advisor.fix("model.py")
    assert isinstance(shown, FixReport) and not shown.applied and model.read_text() == before
    [file] = shown.files
    assert file.written is None and file.diff.startswith("--- a/model.py") and shown.remaining == 2
    applied = advisor.fix("model.py", apply=True)
    assert applied.files[0].written.endswith("model.py") and applied.files[0].diff == file.diff
    assert applied.remaining == 1  # the unsafe fold, without unsafe_fixes
    assert "x.float().float()" not in model.read_text() and "contiguous().clone()" in model.read_text()
    assert advisor.fix("model.py", apply=True, unsafe_fixes=True).remaining == 0
    assert "clone(memory_format=torch.contiguous_format)" in model.read_text()
    assert json.loads(json.dumps(applied.to_json()))["files"][0]["path"] == "model.py"


def test_profile_returns_the_measured_findings(workdir):
    report = advisor.profile(f"{ROOT / 'fixtures' / 'profile' / 'handwritten_attention.py'}:workload")
    assert isinstance(report, ProfileReport) and report.mode == "eval" and report.step_us > 0
    assert "ADV110" in {f["rule"] for f in report.findings}
    assert [f.name for f in dataclasses.fields(ProfileReport)] == list(report.to_json())
    with pytest.raises(AdvisorError):
        advisor.profile(f"{workdir / 'missing.py'}:workload")


def test_optimize_returns_each_patch_verdict_and_writes_the_reports(tmp_path):
    model = write_model(tmp_path, forward_epilogue="self.last_weights = att")  # unsafe: not run without the option
    report = advisor.optimize(f"{model}:workload", report=str(tmp_path / "report"), timing_budget=1)
    assert isinstance(report, OptimizeReport) and report.speedup is None
    [patch] = report.patches
    assert patch["verdict"] == "not-run" and "--unsafe-fixes" in patch["reason"]
    assert Path(report.report).is_file() and json.loads((tmp_path / "report" / "result.json").read_text())[
        "patches"] == [p.to_json() for p in report.patches]
    assert patch.verdict == "not-run" and patch.fix_safety == "unsafe"
    assert list(report.to_json()) == [f.name for f in dataclasses.fields(OptimizeReport)]


@pytest.mark.parametrize("paths, error, says", [
    ([], ValueError, "no paths given"),  # argparse printed its usage line and raised SystemExit
    (123, TypeError, "paths must be a path or an iterable of paths, not int"),
])
def test_no_paths_is_a_bad_argument_not_an_exit(capsys, paths, error, says):
    for verb in (advisor.scan, advisor.fix):
        with pytest.raises(error, match=says):
            verb(paths)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("verb", [advisor.profile, advisor.optimize])
def test_a_target_that_is_no_path_or_name_is_a_bad_argument(verb):
    """`advisor.profile(123)` was sent to the worker and came back as an AdvisorError about `rpartition`."""
    with pytest.raises(TypeError, match="target must be a path or 'module:attribute' string, not int"):
        verb(123)


@pytest.mark.parametrize("paths", [["model.py", None], [3], [b"model.py"]])
def test_a_path_that_is_no_str_or_pathlike_is_refused(workdir, paths):
    """Breaker round 16: `advisor.scan(["m.py", None])` scanned a missing file named "None" and raised nothing."""
    shutil.copy(COPIES_AND_CASTS, workdir / "model.py")
    with pytest.raises(TypeError, match="each path must be a str or an os.PathLike of str"):
        advisor.scan(paths)


def test_the_command_an_api_run_reports_spells_its_options():
    """Promise breaker round 31: `advisor.optimize(..., unsafe_fixes=True, train=True)` reported an apply_command
    without those flags, which then verified in eval mode or wrote nothing."""
    from advisor.api import _arguments
    from advisor.commands.optimize import apply_command

    args = _arguments("optimize", ["m.py:workload"], {"unsafe_fixes": True, "train": True, "report": "r",
                                                      "backend": "sdpa"})
    assert apply_command(args) == ("advisor optimize --unsafe-fixes --train --report r --backend sdpa m.py:workload "
                                   "--apply")


def test_optimize_takes_no_rule_selection_it_could_not_repeat():
    """optimize has no --select/--ignore (its configuration file chooses): an API option of that name could not
    be spelled in the apply command it reports, which would then patch the rule it left out."""
    with pytest.raises(TypeError, match="unexpected option 'ignore'"):
        advisor.optimize("m.py:workload", ignore=["ADV101"])

"""The CLI contract: exit codes, JSON fields, bad input as error entries, fix --apply safety, selection."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.rewrite.patch import FileChanged, write_atomically
from fixture_models import fixture_inputs, golden_path
from in_process_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
POSITIVE = ROOT / "fixtures" / "attention" / "positive"
NANOGPT = POSITIVE / "01_nanogpt_causal.py"
WEIGHTS_RETURNED = ROOT / "fixtures" / "attention" / "negative" / "01_weights_returned.py"


def test_scan_json_contract(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "model.py")
    code, out, _ = run_cli(capsys, "scan", "model.py", "--format", "json")
    assert code == 1
    data = json.loads(out)
    assert data["version"] == 1 and data["files_scanned"] == 1 and data["errors"] == []
    (finding,) = data["findings"]
    for key in ("rule", "kind", "path", "line", "end_line", "function", "message", "fixable", "fix_safety",
                "reason", "patch"):
        assert key in finding
    assert finding["path"] == "model.py"  # relative to the current directory
    assert finding["rule"] == "ADV101" and finding["kind"] == "attention" and finding["fix_safety"] == "safe"
    assert finding["patch"].startswith("--- a/model.py")
    assert "scaled_dot_product_attention" in finding["patch"]


def test_bad_inputs_are_error_entries_and_the_scan_goes_on(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "good.py")
    (workdir / "syntax.py").write_text("def broken(:\n")
    (workdir / "latin1.py").write_bytes(b"x = '\xff\xfe'\n")
    (workdir / "empty.py").write_text("")
    (workdir / "nul.py").write_bytes(b"x = 1\x00\n")
    (workdir / "loop").mkdir()
    os.symlink("..", workdir / "loop" / "up")  # a directory cycle
    code, out, _ = run_cli(capsys, "scan", ".", "missing.py", "--format", "json")
    data = json.loads(out)
    errors = {e["path"]: e["message"] for e in data["errors"]}
    assert code == 1 and len(data["findings"]) == 1
    assert "syntax error" in errors["syntax.py"]
    assert "UTF-8" in errors["latin1.py"]
    assert "no such file" in errors["missing.py"]
    assert "nul.py" in errors
    assert data["files_scanned"] == 2  # good.py and empty.py


def test_nothing_scannable_exits_2_with_one_line(capsys, workdir):
    (workdir / "syntax.py").write_text("def broken(:\n")
    code, out, err = run_cli(capsys, "scan", "syntax.py")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("advisor: error:")
    assert run_cli(capsys, "scan", "nowhere")[0] == 2
    assert run_cli(capsys, "scan", "syntax.py", "--format", "yaml")[0] == 2  # usage error


def test_clean_file_exits_0(capsys, workdir):
    (workdir / "plain.py").write_text("import torch\n\ndef f(x):\n    return torch.softmax(x, -1)\n")
    assert run_cli(capsys, "scan", "plain.py")[0] == 0


def test_fix_shows_diff_without_writing_then_apply_writes_and_is_idempotent(capsys, workdir):
    target = workdir / "model.py"
    shutil.copy(NANOGPT, target)
    before = target.read_text()
    code, out, _ = run_cli(capsys, "fix", "model.py")
    assert code == 1 and "scaled_dot_product_attention" in out and target.read_text() == before
    code, out, _ = run_cli(capsys, "fix", "model.py", "--apply")
    after = target.read_text()
    assert code == 0 and after != before and "scaled_dot_product_attention" in after
    assert after == golden_path(NANOGPT).read_text()
    code, _, _ = run_cli(capsys, "fix", "model.py", "--apply")
    assert code == 0 and target.read_text() == after


@pytest.mark.parametrize("chain, settled", [
    ("torch.softmax(x.float(), -1).float().float().contiguous().contiguous()",
     "softmax(x, -1, dtype=torch.float32).float().contiguous()\n"),
    # breaker round 16: removing the copy makes the two casts meet, a fix no first scan sees
    ("x.contiguous().float().contiguous().float()", "return x.contiguous().float()\n"),
    ("x" + ".contiguous()" * 6, "return x.contiguous()\n"),  # breaker round 18: six took two runs
])
def test_fixes_nested_in_one_expression_settle_in_one_apply(capsys, workdir, chain, settled):
    """A fourteenth breaker's: each `fix --apply` took one layer of a chain of redundant copies and casts (three runs
    to settle, and a pre-commit hook failing each commit); one run now applies them all, the next changes nothing."""
    target = workdir / "m.py"
    target.write_text(f"import torch\n\n\ndef g(x):\n    return {chain}\n")
    code, preview, _ = run_cli(capsys, "fix", "m.py")
    code, out, _ = run_cli(capsys, "fix", "m.py", "--apply")
    after = target.read_text()
    assert code == 0 and settled in after
    # breaker round 16: the preview showed one round, `--apply` wrote four; the diff shown is the text written
    assert [line[1:] for line in preview.splitlines() if line.startswith("+") and not line.startswith("+++")] == \
        [line for line in after.splitlines() if line.strip().startswith(("return", "a ="))]
    code, out, _ = run_cli(capsys, "fix", "m.py", "--apply")
    assert code == 0 and target.read_text() == after and "0 file(s) rewritten" in out


def test_the_tree_option_reads_the_whole_tree_s_facts_for_the_files_named(capsys, workdir):
    """A fourteenth breaker's: pre-commit names the staged files only, and a commit touching only the model proved
    `first-order-autograd` without the training script's gradient penalty; `--tree .` (the hooks' entries) reads
    it, and still scans only the file named."""
    shutil.copy(NANOGPT, workdir / "model.py")
    (workdir / "train.py").write_text("import torch\n\n\ndef penalty(y, x):\n"
                                      "    return torch.autograd.grad(y, x, create_graph=True)\n")
    code, out, _ = run_cli(capsys, "scan", "model.py", "--format", "json")
    assert [f["fix_safety"] for f in json.loads(out)["findings"]] == ["safe"]
    code, out, _ = run_cli(capsys, "scan", "model.py", "--tree", ".", "--format", "json")
    report = json.loads(out)
    assert report["files_scanned"] == 1 and [f["fix_safety"] for f in report["findings"]] == ["unsafe"]
    assert "train.py" in report["findings"][0]["reason"]


def test_apply_refuses_a_file_changed_since_it_was_read(tmp_path):
    target = tmp_path / "m.py"
    target.write_text("a = 1\n")
    with pytest.raises(FileChanged):
        write_atomically(str(target), "a = 0\n", "a = 2\n")
    assert target.read_text() == "a = 1\n"
    write_atomically(str(target), "a = 1\n", "a = 2\n")
    assert target.read_text() == "a = 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.py"]  # no temporary file left behind


def test_unsafe_fix_only_with_flag(capsys, workdir):
    target = workdir / "m.py"
    shutil.copy(WEIGHTS_RETURNED, target)
    before = target.read_text()
    code, out, _ = run_cli(capsys, "scan", "m.py", "--format", "json")
    (finding,) = json.loads(out)["findings"]
    assert finding["rule"] == "ADV102" and finding["fix_safety"] == "unsafe" and finding["reason"]
    run_cli(capsys, "fix", "m.py", "--apply")
    assert target.read_text() == before
    run_cli(capsys, "fix", "m.py", "--apply", "--unsafe-fixes")
    assert "scaled_dot_product_attention" in target.read_text()


def test_select_ignore_and_inline_suppression(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "a.py")
    shutil.copy(WEIGHTS_RETURNED, workdir / "b.py")

    def rules(*extra):
        _, out, _ = run_cli(capsys, "scan", "a.py", "b.py", "--format", "json", *extra)
        return sorted(f["rule"] for f in json.loads(out)["findings"])

    assert rules() == ["ADV101", "ADV102"]
    assert rules("--select", "ADV101") == ["ADV101"]
    assert rules("--ignore", "adv10") == []
    assert rules("--select", "ADV1", "--ignore", "ADV102") == ["ADV101"]
    source = (workdir / "a.py").read_text().replace("att = F.softmax(att, dim=-1)",
                                                     "att = F.softmax(att, dim=-1)  # advisor: ignore[ADV101]")
    (workdir / "a.py").write_text(source)
    assert rules() == ["ADV102"]


def test_a_string_holding_the_suppression_words_suppresses_nothing():
    """A third promises round: a string literal (not a comment) saying `# advisor: ignore` on a line of the block
    hid the finding; only comments suppress."""
    from advisor.engine.static import analyze_source

    source = Path(NANOGPT).read_text()
    commented = source.replace("att = F.softmax(att, dim=-1)", "att = F.softmax(att, dim=-1)  # advisor: ignore")
    quoted = source.replace("att = F.softmax(att, dim=-1)", "att = F.softmax(att, dim=-1); _ = '# advisor: ignore'")
    assert not [f for f in analyze_source(commented, "a.py").findings if f.rule == "ADV101"]
    assert [f for f in analyze_source(quoted, "a.py").findings if f.rule == "ADV101"]


def test_sarif_and_diff_formats(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "a.py")
    _, out, _ = run_cli(capsys, "scan", "a.py", "--format", "sarif")
    sarif = json.loads(out)
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"][0]["ruleId"] == "ADV101"
    _, out, _ = run_cli(capsys, "scan", "a.py", "--format", "diff")
    assert "+++ b/a.py" in out


def test_scan_diff_shows_an_unsafe_patch_only_with_unsafe_fixes_and_labelled(capsys, workdir):
    shutil.copy(ROOT / "fixtures" / "attention" / "negative" / "03_helper_returns_attention.py", workdir / "a.py")
    _, out, _ = run_cli(capsys, "scan", "a.py", "--format", "json")
    assert [(f["rule"], f["fix_safety"], bool(f["patch"])) for f in json.loads(out)["findings"]] == \
        [("ADV102", "unsafe", True)]
    _, out, _ = run_cli(capsys, "scan", "a.py", "--format", "diff")
    assert out == ""
    _, out, _ = run_cli(capsys, "scan", "a.py", "--format", "diff", "--unsafe-fixes")
    label, *diff = out.splitlines()
    assert label.startswith("# ADV102 UNSAFE fix (--unsafe-fixes): the attention weights are used outside")
    assert diff[:2] == ["--- a/a.py", "+++ b/a.py"]


def test_scan_diff_is_each_files_fixes_together_which_git_apply_takes(capsys, workdir):
    """Two fixes two lines apart: one diff for the file, as `fix` prints it (promise round 33: one patch per
    finding, each against the original, gave overlapping hunks that `git apply` refused)."""
    (workdir / "n.py").write_text("import torch\n\n\ndef f():\n    y = torch.randn(4, 4).contiguous().contiguous()\n"
                                  "    z = y.float().float()\n    return z\n")
    _, out, _ = run_cli(capsys, "scan", "n.py", "--format", "json")
    assert len([f for f in json.loads(out)["findings"] if f["fix_safety"] == "safe"]) == 2
    _, scanned, _ = run_cli(capsys, "scan", "n.py", "--format", "diff")
    _, fixed, _ = run_cli(capsys, "fix", "n.py")
    assert scanned == fixed and scanned.count("--- a/n.py") == 1
    subprocess.run(["git", "init", "-q"], cwd=workdir, check=True)
    applied = subprocess.run(["git", "apply", "-"], cwd=workdir, input=scanned, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert ".contiguous().contiguous()" not in (workdir / "n.py").read_text()


def test_rules_are_data(capsys):
    code, out, _ = run_cli(capsys, "rules", "--format", "json")
    rules = {r["code"]: r for r in json.loads(out)["rules"]}
    assert code == 0 and {"ADV101", "ADV102", "ADV103"} <= set(rules)
    assert rules["ADV101"]["fix_safety"] == "safe" and rules["ADV102"]["fix_safety"] == "unsafe"


def test_interactive_review_applies_only_accepted_patches(workdir):
    for name in ("a.py", "b.py"):
        shutil.copy(NANOGPT, workdir / name)
    before = (workdir / "a.py").read_text()
    result = subprocess.run([sys.executable, "-m", "advisor", "fix", "a.py", "b.py", "--interactive"],
                            input="n\ny\n", capture_output=True, text=True, cwd=workdir, timeout=120)
    assert result.returncode == 1, result.stderr  # one finding was declined and remains
    assert (workdir / "a.py").read_text() == before
    assert "scaled_dot_product_attention" in (workdir / "b.py").read_text()


def test_parallel_scan_matches_serial(workdir):
    from advisor.engine.static import scan_paths

    for index, fixture in enumerate(fixture_inputs(POSITIVE)):
        shutil.copy(fixture, workdir / f"m{index:02d}.py")
    serial = scan_paths(["."], jobs=1)
    parallel = scan_paths(["."], jobs=2)
    assert len(serial.files) >= 16
    assert [f.to_json() for f in serial.findings] == [f.to_json() for f in parallel.findings]


def test_a_worker_that_dies_is_one_error_entry_and_the_scan_goes_on(workdir, monkeypatch):
    """A segfault in one worker breaks the whole process pool; the scan must still report every other file and
    name the one that killed its process (workers are forked, so they see the patched analysis)."""
    import os

    from advisor.engine import static as scan

    for index, fixture in enumerate(fixture_inputs(POSITIVE)[:20]):
        shutil.copy(fixture, workdir / f"m{index:02d}.py")
    (workdir / "m05.py").write_text((workdir / "m05.py").read_text() + "\n# crash here\n")
    real = scan._analyze_file

    def crash_on_marker(path, *args):
        if path.endswith("m05.py"):
            os._exit(139)  # what a segfault looks like to the pool: the worker vanishes without a result
        return real(path, *args)

    monkeypatch.setattr(scan, "_analyze_file", crash_on_marker)
    result = scan.scan_paths(["."], jobs=2)
    assert [os.path.basename(e.path) for e in result.errors] == ["m05.py"]
    assert result.errors[0].internal and "process died" in result.errors[0].message
    assert len(result.files) == 19 and all(f.findings for f in result.files)


# --- smaller, same standard -----------------------------------------------------------------------------------------

def strict_json(text: str) -> dict:
    """JSON as a strict parser reads it: a lone surrogate (\\udcff) is not text."""
    data = json.loads(text)
    json.dumps(data, ensure_ascii=False).encode("utf-8")  # raises UnicodeEncodeError on a lone surrogate
    return data


def test_a_file_named_ipynb_that_is_no_notebook_is_an_error_entry_named_or_walked(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "attention.ipynb")  # Python source, not a notebook's JSON
    code, out, _ = run_cli(capsys, "scan", "attention.ipynb", "--format", "json")
    data = json.loads(out)
    assert code == 2 and data["findings"] == [] and data["files_scanned"] == 0
    [error] = data["errors"]
    assert error["path"] == "attention.ipynb" and error["message"].startswith("not a Jupyter notebook: invalid JSON")
    shutil.copy(NANOGPT, workdir / "model.py")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    data = json.loads(out)
    assert data["files_scanned"] == 1 and [e["path"] for e in data["errors"]] == ["attention.ipynb"]


def test_symlink_loops_and_dangling_links_met_in_a_walk_are_error_entries(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "model.py")
    os.symlink("gone.py", workdir / "dangling.py")
    os.symlink("b.py", workdir / "a.py")
    os.symlink("a.py", workdir / "b.py")
    (workdir / "sub").mkdir()
    os.symlink("..", workdir / "sub" / "up")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    data = json.loads(out)
    errors = {e["path"]: e["message"] for e in data["errors"]}
    assert code == 1 and data["files_scanned"] == 1
    assert errors["dangling.py"] == "broken symbolic link"
    assert "symbolic link loop" in errors["a.py"] and "symbolic link loop" in errors["b.py"]
    assert "symbolic link loop" in errors[os.path.join("sub", "up")]


def test_non_utf8_file_names_are_escaped_in_json_and_percent_encoded_in_sarif(capsys, workdir):
    name = b"model_\xff.py"
    shutil.copy(NANOGPT, os.path.join(bytes(workdir), name))
    os.symlink(b"nowhere_\xfe.py", os.path.join(bytes(workdir), b"broken_\xfe.py"))
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    data = strict_json(out)
    [finding] = data["findings"]
    assert finding["path"] == "model_\\xff.py"  # the patch's header names it as git does, for `git apply`
    assert finding["patch"].startswith('--- "a/model_\\377.py"\n+++ "b/model_\\377.py"\n')
    assert [e["path"] for e in data["errors"]] == ["broken_\\xfe.py"]
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "sarif")
    run = strict_json(out)["runs"][0]
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "model_%FF.py"
    notification = run["invocations"][0]["toolExecutionNotifications"][0]
    assert notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "broken_%FE.py"


def test_non_utf8_file_names_are_escaped_in_every_field_of_profile_and_analyze_json(capsys, workdir):
    """Promise round 32: the findings' paths were escaped, but profile's `target` and `top_lines` paths and
    analyze's `traces` and `limitations` carried the lone surrogates a strict parser rejects."""
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "profile" / "handwritten_attention.py"
    name = os.fsdecode(b"model_\xff.py")
    shutil.copy(fixture, workdir / name)
    code, out, _ = run_cli(capsys, "profile", f"{name}:workload", "--format", "json")
    data = strict_json(out)
    assert code == 1 and data["target"] == "model_\\xff.py:workload"
    assert data["top_lines"] and all(row["path"] == "model_\\xff.py" for row in data["top_lines"])
    (workdir / "traces").mkdir()
    (workdir / "traces" / os.fsdecode(b"rank_\xfe.json")).write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5, "pid": 1, "tid": 1}]}')
    code, out, _ = run_cli(capsys, "analyze", "traces", "--format", "json")
    data = strict_json(out)
    assert data["traces"] == [os.path.join("traces", "rank_\\xfe.json")]
    assert any("rank_\\xfe.json" in line for line in data["limitations"]), data["limitations"]


def test_a_non_utf8_file_name_is_traced_and_optimized(capsys, workdir):
    """Promise round 33: torch's profiler cannot encode the name into a Python stack ("the workload raised
    RuntimeError: error unpacking string as utf-8"), and optimize's reports could not be written: the trace is
    recorded without stacks there, and every report and JSON field writes the byte `\\xff`."""
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "profile" / "handwritten_attention.py"
    name = os.fsdecode(b"model_\xff.py")
    shutil.copy(fixture, workdir / name)
    code, out, err = run_cli(capsys, "profile", f"{name}:workload", "--trace", "t.json", "--format", "json")
    assert code == 1 and strict_json(out)["target"] == "model_\\xff.py:workload", err
    assert json.loads((workdir / "t.json").read_text())["traceEvents"]
    code, out, err = run_cli(capsys, "optimize", f"{name}:workload", "--report", "r", "--timing-budget", "0.5",
                             "--format", "json")
    assert code in (0, 1) and strict_json(out)["target"] == "model_\\xff.py:workload", err
    assert strict_json((workdir / "r" / "result.json").read_text(encoding="utf-8"))["target"] == \
        "model_\\xff.py:workload"
    for report in ("report.md", "report.html"):
        assert "model_\\xff.py" in (workdir / "r" / report).read_text(encoding="utf-8")


def test_sarif_uris_are_percent_encoded(capsys, workdir):
    (workdir / "a dir#1").mkdir()
    shutil.copy(NANOGPT, workdir / "a dir#1" / "m%.py")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "sarif")
    [result] = json.loads(out)["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "a%20dir%231/m%25.py"


def test_sarif_execution_is_not_successful_when_nothing_could_be_scanned(capsys, workdir):
    (workdir / "syntax.py").write_text("def broken(:\n")
    code, out, _ = run_cli(capsys, "scan", "syntax.py", "--format", "sarif")
    assert code == 2 and json.loads(out)["runs"][0]["invocations"][0]["executionSuccessful"] is False
    shutil.copy(NANOGPT, workdir / "model.py")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "sarif")
    assert code == 1 and json.loads(out)["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_a_nul_byte_names_its_line_and_deep_nesting_is_not_called_out_of_memory(capsys, workdir):
    (workdir / "nul.py").write_bytes(b"x = 1\ny = 2\x00\n")
    (workdir / "deep.py").write_text("x = " + "-" * 100_000 + "1\n")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    errors = {e["path"]: e["message"] for e in json.loads(out)["errors"]}
    assert errors["nul.py"].startswith("syntax error at line 2:") and "null byte" in errors["nul.py"]
    assert "None" not in errors["nul.py"]
    assert "memory" not in errors["deep.py"] and "nested too deeply for the Python" in errors["deep.py"]

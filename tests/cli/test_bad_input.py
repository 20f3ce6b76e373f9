"""One bad file never stops or hangs a scan, and every output format and exit code keeps
its promise whatever the input (hostile names, closed pipes, unknown codes, nothing scannable)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.contracts.finding import Finding
from advisor.report.profile_console import print_measured
from advisor.report.terminal import stdout_console
from in_process_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"
NESTED_500 = "x = " + "(" * 500 + "1" + ")" * 500 + "\n"
PY312_ONLY = "type Pair = tuple[int, int]\n"  # a 3.12 statement: a syntax error on 3.11


def run_advisor(*argv, cwd: Path, stdin: str = "", timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "advisor", *argv], cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def _errors(out: str) -> dict[str, str]:
    return {e["path"]: e["message"] for e in json.loads(out)["errors"]}


# --- section 3: scans that never hang or die ---------------------------------------------------------------------

def test_a_5000_term_expression_is_one_error_entry_and_the_scan_goes_on(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "good.py")
    (workdir / "long.py").write_text("x = " + " + ".join(["1"] * 5000) + "\n")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    assert code == 1 and len(json.loads(out)["findings"]) == 1
    assert "too deeply nested" in _errors(out)["long.py"]


def test_an_internal_error_on_one_file_exits_2_but_still_reports_the_others(capsys, workdir, monkeypatch):
    import advisor.fixes.attention_fix as scan

    real = scan.find_attention

    def broken_on_b(parsed):
        if parsed.path.endswith("b.py"):
            raise KeyError("ADV999")
        return real(parsed)

    monkeypatch.setattr(scan, "find_attention", broken_on_b)
    for name in ("a.py", "b.py"):
        shutil.copy(NANOGPT, workdir / name)
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    assert code == 2 and len(json.loads(out)["findings"]) == 1
    assert "internal error" in _errors(out)["b.py"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
def test_fifos_and_device_links_are_never_read(workdir):
    shutil.copy(NANOGPT, workdir / "good.py")
    os.mkfifo(workdir / "pipe.py")
    os.symlink("/dev/zero", workdir / "zero.py")
    walked = run_advisor("scan", ".", "--format", "json", cwd=workdir, timeout=60)  # a hang fails on the timeout
    assert walked.returncode == 1, walked.stderr
    report = json.loads(walked.stdout)
    assert report["files_scanned"] == 1 and report["errors"] == []  # the walk reads regular files only
    explicit = run_advisor("scan", "pipe.py", "zero.py", "good.py", "--format", "json", cwd=workdir, timeout=60)
    errors = _errors(explicit.stdout)
    assert errors == {"pipe.py": "not a regular file (a FIFO)", "zero.py": "not a regular file (a character device)"}


@pytest.mark.parametrize("body", [NESTED_500, PY312_ONLY], ids=["500-parens", "py312-syntax"])
def test_code_this_interpreter_cannot_parse_is_one_syntax_error_whatever_it_mentions(capsys, workdir, body):
    (workdir / "plain.py").write_text(body)
    (workdir / "attn.py").write_text("import torch\n\ndef f(x):\n    return torch.softmax(x, -1)\n\n" + body)
    shutil.copy(NANOGPT, workdir / "good.py")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    errors = _errors(out)
    assert code == 1 and set(errors) == {"plain.py", "attn.py"}
    version = f"Python {sys.version_info.major}.{sys.version_info.minor} parser"
    for message in errors.values():
        assert message.startswith("syntax error at line") and version in message
    assert errors["plain.py"].split(":", 1)[1] == errors["attn.py"].split(":", 1)[1]  # same error, other line


def test_type_stubs_are_never_scanned(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "model.pyi")
    shutil.copy(NANOGPT, workdir / "model.py")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    assert json.loads(out)["files_scanned"] == 1 and _errors(out) == {}
    code, out, _ = run_cli(capsys, "scan", "model.pyi", "model.py", "--format", "json")
    report = json.loads(out)
    assert [f["path"] for f in report["findings"]] == ["model.py"] and "type stub" in _errors(out)["model.pyi"]


@pytest.mark.parametrize("codec", ["rot13", "hex", "base64", "zlib", "undefined", "punycode"])
def test_a_coding_line_naming_a_codec_that_decodes_no_text_is_one_error_entry(capsys, workdir, codec):
    """Breaker round 18: `# -*- coding: rot13 -*-` (a codec `tokenize` finds, which decodes no source text) ended the
    whole scan with a LookupError: no JSON, no result for the good file beside it."""
    shutil.copy(NANOGPT, workdir / "good.py")
    (workdir / "bad.py").write_bytes(f"# -*- coding: {codec} -*-\nx = 1\n".encode())
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "json")
    assert code == 1 and any(f["path"].endswith("good.py") for f in json.loads(out)["findings"])
    assert f"its coding line names {codec!r}" in _errors(out)["bad.py"]


@pytest.mark.parametrize("output", ["json", "sarif"])
def test_a_profile_workload_that_raises_still_gives_a_document(capsys, workdir, output):
    """Breaker round 18: `scan --profile TARGET --format json` printed nothing when the workload raised."""
    (workdir / "w.py").write_text("import torch\n\n\ndef raises():\n    raise RuntimeError('boom')\n")
    code, out, err = run_cli(capsys, "scan", "w.py", "--profile", "w.py:raises", "--format", output)
    document = json.loads(out)
    assert code == 2 and err.startswith("advisor: error:") and "boom" in err
    messages = [e["message"] for e in document["errors"]] if output == "json" else \
        [n["message"]["text"] for n in document["runs"][0]["invocations"][0]["toolExecutionNotifications"]]
    assert any("--profile" in m and "boom" in m for m in messages), messages


def test_user_code_warnings_stay_silent(workdir):
    noisy = NANOGPT.read_text() + "\n\ndef g(x):\n    pattern = '\\d+'\n    return x is 1, pattern\n"
    (workdir / "noisy.py").write_text(noisy)
    result = run_advisor("scan", "noisy.py", cwd=workdir)
    assert result.returncode == 1 and result.stderr == ""
    result = run_advisor("fix", "noisy.py", cwd=workdir)
    assert result.returncode == 1 and result.stderr == ""


# --- section 4: output and exit codes ---------------------------------------------------------------------------

def test_fix_prints_errors_and_exits_non_zero_on_bad_files(capsys, workdir):
    (workdir / "syntax.py").write_text("def broken(:\n")
    (workdir / "plain.py").write_text("x = 1\n")
    code, out, err = run_cli(capsys, "fix", ".")  # errors on stderr, one line each (README's Exit codes)
    assert code == 1 and "syntax.py" in err and "syntax error" in err and "syntax.py" not in out
    code, out, err = run_cli(capsys, "fix", ".", "--apply")
    assert code == 1 and "syntax.py" in err


@pytest.mark.parametrize("option", [("--select", "FOO,BAR"), ("--ignore", "ADV1;DROP"), ("--select", ",")])
def test_unknown_rule_codes_are_usage_errors(capsys, workdir, option):
    shutil.copy(NANOGPT, workdir / "a.py")
    code, out, err = run_cli(capsys, "scan", "a.py", *option)
    assert code == 2 and out == "" and err.startswith("advisor: error:") and err.count("\n") == 1


def test_markup_and_escape_sequences_in_names_are_shown_as_text(capsys, workdir):
    (workdir / "x[").mkdir()  # with its file: the path `x[/]y.py`, a closing tag rich cannot match
    for name in ("x[/]y.py", "e\x1b[31mvil.py", "[bold]z.py"):
        shutil.copy(NANOGPT, workdir / name)
    (workdir / "bad[red]x.py").write_text("def broken(:\n")
    code, out, err = run_cli(capsys, "scan", ".")
    assert code == 1 and "\x1b" not in out + err
    shown = out + err  # the findings on stdout, the unreadable file's error on stderr
    assert "x[/]y.py" in shown and "[bold]z.py" in shown and "e\\x1b[31mvil.py" in shown and "bad[red]x.py" in shown
    code, out, _ = run_cli(capsys, "fix", ".", "--apply")
    assert code == 1 and "fixed x[/]y.py" in out and "fixed e\\x1b[31mvil.py" in out and "\x1b" not in out


@pytest.mark.parametrize("argv", [["scan", "s\udcfe.py"], ["fix", "s\udcfe.py"], ["analyze", "t\udcff.json"],
                                  ["scan", "--config", "c\udcff.toml", "."]], ids=["scan", "fix", "analyze", "config"])
def test_a_name_whose_bytes_are_not_utf8_is_written_as_json_writes_it_in_an_error_line(capsys, workdir, argv):
    """One-line errors write such bytes `\\xNN`, as JSON does (they reach Python as lone surrogates, which a UTF-8
    terminal cannot print: promise round 34)."""
    if "s\udcfe.py" in argv:
        (workdir / os.fsdecode(b"s\xfe.py")).write_text("def broken(:\n")
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and ("\\xfe" in err or "\\xff" in err) and "\\udc" not in err
    err.encode("utf-8")  # printable on a UTF-8 terminal


def test_a_diff_quotes_a_name_with_control_characters_as_git_does(capsys, workdir):
    """`scan --format diff` and `fix` printed `--- a/e<ESC>[31mvil.py` raw (a colour sequence in the terminal) and a
    tab ended the name for `git apply`; git's quoted form is text and applies. So does a name that is not UTF-8 (a
    fourteenth breaker's latin-1 `café.py`, printed `a/caf\\xe9.py`, which git could not find)."""
    for name in ("e\x1b[31mvil.py", "t\tab.py", os.fsdecode(b"caf\xe9.py")):
        shutil.copy(NANOGPT, workdir / name)
    for verb in (["scan", ".", "--format", "diff"], ["fix", "."]):
        code, out, _ = run_cli(capsys, *verb)
        assert "\x1b" not in out and '--- "a/e\\033[31mvil.py"\n+++ "b/e\\033[31mvil.py"\n' in out
        assert '--- "a/t\\tab.py"\n+++ "b/t\\tab.py"\n' in out
        assert '--- "a/caf\\351.py"\n+++ "b/caf\\351.py"\n' in out
    subprocess.run(["git", "init", "-q"], cwd=workdir, check=True)
    checked = subprocess.run(["git", "apply", "--check", "-"], cwd=workdir, input=out, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr


def test_stack_frames_with_markup_do_not_crash_measured_output(capsys):
    finding = Finding(rule="ADV110", kind="attention", path="m[/]odel.py", line=3, end_line=4,
                      function="Block[/].forward\x1b[2J", message="use SDPA [/i]", extra={"self_us": 10.0})
    print_measured(stdout_console(), "measured", [finding], ["summary"])
    out = capsys.readouterr().out
    assert "m[/]odel.py" in out and "Block[/].forward" in out and "\x1b" not in out


def test_machine_formats_when_nothing_could_be_scanned(capsys, workdir):
    (workdir / "syntax.py").write_text("def broken(:\n")
    code, out, _ = run_cli(capsys, "scan", "syntax.py", "--format", "json")
    assert code == 2 and json.loads(out)["files_scanned"] == 0 and "syntax.py" in _errors(out)
    code, out, _ = run_cli(capsys, "scan", "syntax.py", "--format", "sarif")
    (notification,) = json.loads(out)["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert code == 2 and "syntax error" in notification["message"]["text"]


def test_sarif_and_diff_keep_errors(capsys, workdir):
    shutil.copy(NANOGPT, workdir / "a.py")
    (workdir / "syntax.py").write_text("def broken(:\n")
    code, out, _ = run_cli(capsys, "scan", ".", "--format", "sarif")
    run = json.loads(out)["runs"][0]
    assert code == 1 and len(run["results"]) == 1
    (notification,) = run["invocations"][0]["toolExecutionNotifications"]
    assert notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "syntax.py"
    code, out, err = run_cli(capsys, "scan", ".", "--format", "diff")
    assert code == 1 and "+++ b/" in out and "syntax.py" in err and "syntax.py" not in out


@pytest.mark.parametrize("verb", [["scan", "--format", "json"], ["fix"]])
def test_a_reader_that_leaves_early_keeps_the_exit_code(workdir, verb):
    """`fix | head` once exited 0 ("nothing found") while every finding remained."""
    for index in range(3):
        shutil.copy(NANOGPT, workdir / f"m{index}.py")
    process = subprocess.Popen([sys.executable, "-m", "advisor", verb[0], ".", *verb[1:]], cwd=workdir,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # like `| head` exiting before advisor writes
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1 and err == b""


def test_a_closed_standard_output_is_one_line_that_says_so(workdir):
    """`advisor scan . >&-`: Python starts with `sys.stdout` None; that was an internal error about `isatty`
    (promise round 34's note)."""
    shutil.copy(NANOGPT, workdir / "a.py")
    process = subprocess.run([sys.executable, "-m", "advisor", "scan", "a.py"], cwd=workdir, stderr=subprocess.PIPE,
                             text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert process.returncode == 2 and process.stderr == (
        "advisor: error: standard output is closed: nothing can be reported\n")


def test_interactive_review_at_end_of_input_quits_cleanly(workdir):
    shutil.copy(NANOGPT, workdir / "a.py")
    before = (workdir / "a.py").read_text()
    result = run_advisor("fix", "a.py", "--interactive", cwd=workdir, stdin="")
    assert result.returncode == 1 and "Traceback" not in result.stderr and "EOFError" not in result.stderr
    assert (workdir / "a.py").read_text() == before


def test_interactive_review_with_standard_input_closed_quits_cleanly(workdir):
    """Promise round 32: with stdin closed (`<&-`) Python has no `sys.stdin`, and the question raised
    `RuntimeError: input(): lost sys.stdin` (exit 2; optimize then wrote no report)."""
    shutil.copy(NANOGPT, workdir / "a.py")
    before = (workdir / "a.py").read_text()
    result = subprocess.run(["sh", "-c", f'"{sys.executable}" -m advisor fix a.py --interactive <&-'], cwd=workdir,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "lost sys.stdin" not in result.stderr
    assert (workdir / "a.py").read_text() == before


def test_quiet_prints_no_summary_line(capsys, workdir):
    """`-q` prints the findings (or diffs) and errors only: neither "no findings in ..." nor the table's title."""
    (workdir / "plain.py").write_text("x = 1\n")
    code, out, _ = run_cli(capsys, "scan", "-q", "plain.py")
    assert code == 0 and out.strip() == ""
    (workdir / "att.py").write_text("def attend(q, k, v):\n    return (q @ k.transpose(-2, -1) / 8.0).softmax(-1) @ v\n")
    code, out, _ = run_cli(capsys, "scan", "-q", "att.py")
    assert code == 1 and "att.py" in out and "finding(s) in" not in out


def test_debug_is_accepted_after_the_verb(capsys, workdir):
    (workdir / "plain.py").write_text("x = 1\n")
    assert run_cli(capsys, "scan", "plain.py", "--debug")[0] == 0
    assert run_cli(capsys, "--debug", "scan", "plain.py")[0] == 0


def test_attention_inside_a_match_case_is_found_and_its_rewrite_computes_the_same(capsys, workdir):
    import torch

    source = ("import torch\nimport torch.nn.functional as F\n\n\ndef attend(q, k, v, mode):\n    match mode:\n"
              "        case \"plain\" if q.dim() == 4:\n"
              "            scores = q @ k.transpose(-2, -1) / (q.size(-1) ** 0.5)\n"
              "            weights = F.softmax(scores, dim=-1)\n            out = weights @ v\n"
              "        case [first, *rest]:\n            out = v\n"
              "    return out\n")
    (workdir / "m.py").write_text(source)
    code, out, _ = run_cli(capsys, "scan", "m.py", "--format", "json")
    (finding,) = json.loads(out)["findings"]
    assert code == 1 and finding["rule"] == "ADV101" and finding["line"] == 8 and finding["fix_safety"] == "safe"
    assert run_cli(capsys, "fix", "m.py", "--apply")[0] == 0
    fixed = (workdir / "m.py").read_text()
    assert "scaled_dot_product_attention" in fixed
    original_ns, fixed_ns = {}, {}
    exec(compile(source, "m.py", "exec"), original_ns)
    exec(compile(fixed, "m.py", "exec"), fixed_ns)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    torch.testing.assert_close(fixed_ns["attend"](q, k, v, "plain"), original_ns["attend"](q, k, v, "plain"))


def test_the_profilers_native_log_lines_stay_off_stderr_and_other_lines_stay(capfd):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from advisor.runtime.native_log import without_native_log

    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(2).add(1)
    assert "profiler_start" in capfd.readouterr().err  # what Kineto prints unless silenced (torch 2.13)
    with without_native_log():
        with profile(activities=[ProfilerActivity.CPU]):
            torch.ones(2).add(1)
            os.write(2, b"a line from the workload\n")
        os.write(2, b"WARNING:2026-01-01 00:00:00 1:1 CudaDeviceProperties.cpp:27] gpuGetDeviceCount failed\n")
    err = capfd.readouterr().err
    assert err == "a line from the workload\n"


@pytest.mark.parametrize("verb", ["scan", "fix"])
def test_a_tree_that_is_no_folder_is_a_one_line_error(capsys, workdir, verb):
    """Breaker round 16: `--tree srcc` (a typo in a hook) was accepted, the tree's facts silently missing, and a
    patch the real tree calls unsafe was written."""
    shutil.copy(NANOGPT, workdir / "model.py")
    before = (workdir / "model.py").read_bytes()
    code, out, err = run_cli(capsys, verb, "model.py", "--tree", "srcc", *(["--apply"] if verb == "fix" else []))
    assert code == 2 and err.strip() == "advisor: error: --tree srcc: no such folder" and "Traceback" not in err
    assert (workdir / "model.py").read_bytes() == before


class _Terminal:
    """A stream that says it is a terminal."""

    def __init__(self) -> None:
        import io
        self.buffer = io.StringIO()

    def write(self, text: str) -> int:
        return self.buffer.write(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_a_diff_shown_on_a_terminal_is_whole_and_sends_no_control_sequence(monkeypatch):
    """Breaker round 16: on an 80-column terminal each diff line was cut at the width (a change past column 80
    showed identical `-` and `+` lines), a source's ESC sequence reached the terminal, and with FORCE_COLOR set a
    diff written to a file was highlighted, which `git apply` refuses."""
    import io

    from rich.console import Console

    from advisor.report.findings_console import print_diff

    diff = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-" + "x" * 100 + "old\x1b[2J\n+" + "x" * 100 + "new\n"
    terminal = _Terminal()
    print_diff(Console(file=terminal, width=80, force_terminal=True), diff)
    shown = terminal.buffer.getvalue()
    assert "old" in shown and "new" in shown and "\x1b[2J" not in shown and "\\x1b[2J" in shown
    monkeypatch.setenv("FORCE_COLOR", "1")
    piped = io.StringIO()
    print_diff(Console(file=piped), diff)
    assert piped.getvalue() == diff

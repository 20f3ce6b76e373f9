"""Never corrupt user source: line endings, indentation style and neighbouring statements survive a rewrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.engine.static import analyze_source

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = (ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py").read_text()


def test_crlf_line_endings_are_kept():
    source = NANOGPT.replace("\n", "\r\n")
    fixed = analyze_source(source, "m.py").fixed
    assert fixed != source and "scaled_dot_product_attention" in fixed
    assert fixed.count("\n") == fixed.count("\r\n")  # no bare LF introduced


SOFT_CAPPED = """\
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, cap=50.0):
        super().__init__()
        self.cap = cap

    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(-2, -1)) * 0.125
        scores = torch.tanh(scores / self.cap) * self.cap
        return torch.matmul(torch.softmax(scores, dim=-1), v)
"""


def test_crlf_line_endings_are_kept_in_the_pasted_flex_helper():
    """The flex helper's docstrings span lines: pasted into a CRLF file, their line breaks are the file's too."""
    source = SOFT_CAPPED.replace("\n", "\r\n")
    fixed = analyze_source(source, "m.py", unsafe_fixes=True, backend="flex").fixed
    assert "advisor_flex_attention(" in fixed and '"""' in fixed
    assert fixed.count("\n") == fixed.count("\r\n")  # no bare LF introduced


def test_tab_indentation_compiles_and_is_kept():
    source = NANOGPT.replace("    ", "\t")
    fixed = analyze_source(source, "m.py").fixed
    compile(fixed, "m.py", "exec")
    call = next(line for line in fixed.splitlines() if "y = F.scaled_dot_product_attention(" in line)
    assert call.startswith("\t\t") and call.lstrip("\t").startswith("y = ")  # tabs only, as the file has them


def test_semicolon_neighbours_survive():
    source = NANOGPT.replace("        att = F.softmax(att, dim=-1)\n",
                             "        att = F.softmax(att, dim=-1); marker = 1\n")
    fixed = analyze_source(source, "m.py").fixed
    sdpa_path = fixed.split("# manual implementation of attention")[1].split("\n        else:\n")[0]
    assert "scaled_dot_product_attention" in sdpa_path and "F.softmax" not in sdpa_path
    assert "marker = 1\n" in sdpa_path  # the neighbour runs on the SDPA path (and stays in the kept original)
    compile(fixed, "m.py", "exec")


def test_scan_with_profile_ranks_static_findings_by_measured_time(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    target = "fixtures/profile/handwritten_attention.py"
    code = main(["scan", target, "--profile", f"{target}:workload", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    (finding,) = data["findings"]
    assert code == 1 and finding["rule"] == "ADV101"
    assert finding["self_us"] > 0 and 0 < finding["share"] <= 1 and finding["calls"] >= 1
    assert "ADV110" in finding["measured_by"]


TWO_BLOCKS = '''
import torch
import torch.nn.functional as F


def first(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) / 4.0
    return torch.matmul(F.softmax(scores, dim=-1), v)


def both(q, k, v):
    a = F.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1) @ v
    b = F.softmax(k @ q.transpose(-2, -1) * 0.5, dim=-1) @ v
    return a + b
'''


def test_several_blocks_in_one_file_and_one_function_are_all_rewritten():
    result = analyze_source(TWO_BLOCKS, "m.py")
    assert [f.rule for f in result.findings] == ["ADV101"] * 3
    assert result.fixed.count("scaled_dot_product_attention") == 3  # each behind its `kv-length` check
    namespace: dict = {}
    exec(compile(result.fixed, "m.py", "exec"), namespace)
    original: dict = {}
    exec(compile(TWO_BLOCKS, "m.py", "exec"), original)
    import torch

    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    for name in ("first", "both"):
        torch.testing.assert_close(namespace[name](q, k, v), original[name](q, k, v), atol=1e-5, rtol=1e-5)


def test_comments_above_deleted_statements_stay_in_the_file():
    """libcst keeps the comment lines above a statement as that statement's own; deleting the statement took them
    with it (a license block above the scores, a `# TODO` between two of the block's statements)."""
    source = (
        "import torch\n\n\n"
        "def attend(q, k, v, proj):\n"
        "    q = proj(q)\n\n"
        "    # ------------------------------------------\n"
        "    # Copyright (c) 2024 ACME. Apache-2.0.\n"
        "    # ------------------------------------------\n\n"
        "    s = q @ k.transpose(-2, -1) / 8.0\n"
        "    # TODO: masks\n"
        "    w = s.softmax(dim=-1)\n"
        "    return w @ v\n")
    fixed = analyze_source(source, "m.py").fixed
    assert "scaled_dot_product_attention" in fixed
    for line in source.splitlines():
        if line.strip().startswith("#"):  # the fallback of a guarded patch holds them one level deeper
            assert line.strip() in {kept.strip() for kept in fixed.splitlines()}, line
    assert analyze_source(fixed, "m.py").fixed == fixed  # idempotent


def test_a_comment_inside_a_guarded_span_is_written_once():
    """A guarded patch copies the block's statements, with the comments between them, into its `else:`; the
    comment was also carried to the statement after the block, a stray copy (breaker round 57)."""
    source = (
        "import math\nimport torch\nimport torch.nn.functional as F\n\n\n"
        "def attn(q, k, v):\n"
        "    s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))\n"
        "    # softmax\n"
        "    p = F.softmax(s, dim=-1)\n"
        "    o = torch.matmul(p, v)\n"
        "    return o\n")
    fixed = analyze_source(source, "m.py").fixed
    assert "scaled_dot_product_attention" in fixed and "else:" in fixed
    assert fixed.count("# softmax") == 1
    assert fixed.index("# softmax") > fixed.index("else:")


def test_a_diff_printed_to_a_pipe_keeps_long_lines_and_applies(tmp_path):
    """The diff on stdout went through the console at its width: a 165-column line was cut, and `git apply` refused
    the patch."""
    import shutil
    import subprocess
    import sys

    long = "    # " + "x" * 160
    source = f"import torch\n\n\ndef attend(q, k, v):\n{long}\n    s = q @ k.transpose(-2, -1) / 8.0\n" \
             f"    return s.softmax(dim=-1) @ v\n"
    (tmp_path / "m.py").write_text(source)
    shown = subprocess.run([sys.executable, "-m", "advisor", "fix", "m.py"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert long in shown.stdout.splitlines() or " " + long in shown.stdout.splitlines(), shown.stdout
    if shutil.which("git"):
        (tmp_path / "fix.diff").write_text(shown.stdout)
        applied = subprocess.run(["git", "apply", "--check", "fix.diff"], cwd=tmp_path, capture_output=True,
                                 text=True)
        assert applied.returncode == 0, applied.stderr


DIFF_LAYOUTS = {  # breaker round 16: each printed diff was a corrupt patch for git apply and patch -p1
    "no_final_newline": ("import torch\n\n\ndef f(x):\n    y = x.contiguous().contiguous()\n    return y", "\n"),
    "form_feed_in_a_comment": ("import torch\n\x0c\n\ndef f(x):\n    # a page break \x0c here\n"
                               "    y = x.contiguous().contiguous()\n    return y\n", "\n"),
    "cr_only": ("import torch\r\r\rdef f(x):\r    y = x.contiguous().contiguous()\r    return y\r", "\r"),
    "crlf": ("import torch\r\n\r\n\r\ndef f(x):\r\n    y = x.contiguous().contiguous()\r\n    return y\r\n", "\r\n"),
}


@pytest.mark.parametrize("layout, name", [(layout, "m.py") for layout in sorted(DIFF_LAYOUTS)] +
                         [("crlf", "my model.py")])  # breaker round 19: `patch` ends a name at a space, git's tab
def test_every_printed_diff_applies_with_git_and_patch_as_fix_apply_writes(tmp_path, layout, name):
    """`scan --format diff` and `fix`'s diff split lines where git and patch do (at "\\n" only) and mark a last line
    without a newline; applied, each gives the bytes `fix --apply` writes."""
    import shutil
    import subprocess
    import sys

    source, _ = DIFF_LAYOUTS[layout]
    for folder in ("git", "patch", "applied"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_bytes(source.encode())
    run = [sys.executable, "-m", "advisor"]
    diff = subprocess.run([*run, "scan", "--no-cache", "--format", "diff", name], cwd=tmp_path / "git",
                          capture_output=True).stdout
    shown = subprocess.run([*run, "fix", "--no-cache", name], cwd=tmp_path / "patch", capture_output=True).stdout
    subprocess.run([*run, "fix", "--no-cache", "--apply", "-q", name], cwd=tmp_path / "applied", check=True)
    expected = (tmp_path / "applied" / name).read_bytes()
    assert expected != source.encode()
    assert shutil.which("git") and shutil.which("patch"), "the check needs git and patch"
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path / "git", check=True)
    applied = subprocess.run(["git", "apply", "-"], cwd=tmp_path / "git", input=diff, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    patched = subprocess.run(["patch", "-p1", "-s"], cwd=tmp_path / "patch", input=shown, capture_output=True)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert (tmp_path / "git" / name).read_bytes() == expected == (tmp_path / "patch" / name).read_bytes()


@pytest.mark.parametrize("binding", ["B, H, F, D = q.shape", "F = q.shape[-2]"])
def test_an_added_import_is_never_shadowed_by_a_name_the_function_binds(binding):
    """Breaker round 16: no torch alias in the module, so the fix added `import torch.nn.functional as F`; `B, H, F,
    D = q.shape` (audio code's frequency bins) bound `F` locally, and the fixed function raised AttributeError."""
    from fixture_models import load_module_from_source
    import torch

    source = ("from math import sqrt\n\nfrom torch import softmax\n\n\ndef attend(q, k, v):\n"
              f"    {binding}\n    att = (q @ k.transpose(-2, -1)) / sqrt(q.shape[-1])\n"
              "    return softmax(att, dim=-1) @ v\n")
    fixed = analyze_source(source, "m.py").fixed
    assert "scaled_dot_product_attention" in fixed and " as F\n" not in fixed
    q = torch.randn(1, 2, 4, 8)
    torch.testing.assert_close(load_module_from_source(fixed, "shadowed_fixed").attend(q, q, q),
                               load_module_from_source(source, "shadowed").attend(q, q, q))

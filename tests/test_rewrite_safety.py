"""Never corrupt user source: line endings, indentation style and neighbouring statements survive a rewrite."""

from __future__ import annotations

import json
from pathlib import Path

from advisor.cli import main
from advisor.scan import analyze_source

ROOT = Path(__file__).resolve().parent.parent
NANOGPT = (ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py").read_text()


def test_crlf_line_endings_are_kept():
    source = NANOGPT.replace("\n", "\r\n")
    fixed = analyze_source(source, "m.py").fixed
    assert fixed != source and "scaled_dot_product_attention" in fixed
    assert fixed.count("\n") == fixed.count("\r\n")  # no bare LF introduced


def test_tab_indentation_compiles_and_is_kept():
    source = NANOGPT.replace("    ", "\t")
    fixed = analyze_source(source, "m.py").fixed
    compile(fixed, "m.py", "exec")
    assert "\n\t\ty = F.scaled_dot_product_attention(" in fixed


def test_semicolon_neighbours_survive():
    source = NANOGPT.replace("        att = F.softmax(att, dim=-1)\n",
                             "        att = F.softmax(att, dim=-1); marker = 1\n")
    fixed = analyze_source(source, "m.py").fixed
    assert "        marker = 1\n" in fixed and "att = F.softmax" not in fixed
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

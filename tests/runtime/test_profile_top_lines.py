"""`advisor profile` shows where the time goes: the source lines that took the most op time, in the
text report and the JSON (`top_lines`)."""

import json
from pathlib import Path

from advisor.cli import main

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "profile" / "handwritten_attention.py"


def test_profile_lists_the_top_lines_by_op_time_with_their_code(capsys):
    assert main(["profile", f"{FIXTURE}:workload", "--format", "json"]) == 1
    rows = json.loads(capsys.readouterr().out)["top_lines"]
    assert 1 <= len(rows) <= 10
    assert [r["us"] for r in rows] == sorted((r["us"] for r in rows), reverse=True)
    assert all(r["path"].endswith("handwritten_attention.py") and 0 < r["share"] <= 1 for r in rows)
    assert any("softmax" in r["code"] for r in rows)
    assert main(["profile", f"{FIXTURE}:workload"]) == 1
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "top lines by op time" in text and rows[0]["code"][:20] in text

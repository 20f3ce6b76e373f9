"""README's "Run advisor on your repository" works as written: its commands, run in a fresh copy of the example
script's folder, scan, verify the attention patch of the script as it is, and apply it."""

import re
import shlex
import shutil
from pathlib import Path

from advisor.cli import main

ROOT = Path(__file__).resolve().parents[2]


def guide_commands() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run advisor on your repository", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```console\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line[2:]) for line in block.splitlines() if line.startswith("$ advisor ")]


def test_the_guide_scans_verifies_and_applies_on_a_fresh_copy(tmp_path, capsys, monkeypatch):
    from advisor.verify import optimize_pipeline as pipeline

    monkeypatch.setattr(pipeline.Trial, "verdict", property(  # verdict by parity alone: timing is the machine's
        lambda t: pipeline.NOT_RUN if t.error or t.parity is None else
        pipeline.VERIFIED if t.parity.ok else pipeline.PARITY_FAILED))
    shutil.copyfile(ROOT / "fixtures" / "scripts" / "gpt_generate.py", tmp_path / "gpt_generate.py")
    monkeypatch.chdir(tmp_path)
    scan, optimize, apply = guide_commands()
    assert scan[:2] == ["advisor", "scan"] and "--apply" in apply
    assert main(scan[1:]) == 1  # the hand-written attention is found
    fast = ["--timing-budget", "0.3", "--report", str(tmp_path.parent / "report")]  # the suite runs on 2 cores
    assert main(optimize[1:2] + fast + optimize[2:]) == 1  # verified, not applied
    out = " ".join(capsys.readouterr().out.split())
    assert "ADV101" in out and "captured GPT and the inputs of 3 call(s)" in out
    assert "scaled_dot_product_attention" not in (tmp_path / "gpt_generate.py").read_text()
    assert main(apply[1:2] + fast + apply[2:]) == 0
    assert "F.scaled_dot_product_attention(q, k, v, is_causal=True)" in (tmp_path / "gpt_generate.py").read_text()

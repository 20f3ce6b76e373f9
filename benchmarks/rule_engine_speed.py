"""Static analysis time, the reference (a git ref, `main` by default) against this checkout, side by side in one
run: Inductor's fuse_attention.py (many attention findings) and the fixtures. Each side runs in its own process
from a copy of its own sources, the two alternating round by round (a loaded machine slows both alike); each file's
time is its fastest round. Both must give identical findings, patches and fixed text, which is asserted.

    python benchmarks/rule_engine_speed.py [--reference main] [--repeat 3]

Columns: `fix` is a finding's patches plus the file's fixed text (what `fix` and `scan --format json` need);
`text` (this checkout only) is what `scan` in text format needs: findings, no diff built, no fix applied.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs inside each side's process: analyse every file `repeat` times, keep the fastest time per file.
MEASURE = r"""
import json, sys, time, warnings
import advisor
from advisor.{module} import analyze_source
warnings.simplefilter("ignore")
files, repeat, root = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
assert advisor.__file__.startswith(root), advisor.__file__
out = {{"fix": {{}}, "text": {{}}, "results": {{}}}}
for path in files:
    source = open(path, encoding="utf-8").read()
    best = best_text = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = analyze_source(source, path, unsafe_fixes=True)
        fixed = result.fixed
        best = min(best, time.perf_counter() - start)
        if {text_mode}:
            start = time.perf_counter()
            analyze_source(source, path, patches=False)
            best_text = min(best_text, time.perf_counter() - start)
    out["fix"][path], out["text"][path] = best, best_text
    out["results"][path] = {{"findings": [f.to_json() for f in result.findings], "fixed": fixed}}
print(json.dumps(out))
"""


def fuse_attention() -> str:
    import torch._inductor.fx_passes.fuse_attention as module

    return module.__file__


def materialise(reference: str | None, into: Path) -> None:
    """The package as installed: advisor/ with the top-level rules/ as advisor/rules (pyproject's mapping)."""
    if reference is None:
        shutil.copytree(ROOT / "advisor", into / "advisor", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "rules", into / "advisor" / "rules", ignore=shutil.ignore_patterns("__pycache__"))
        return
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", reference, "advisor", "rules"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "rules").rename(into / "advisor" / "rules")


def measure(tree: Path, files: list[str], repeat: int, module: str, text_mode: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = MEASURE.format(module=module, text_mode=text_mode)
    done = subprocess.run([sys.executable, "-c", code, json.dumps(files), str(repeat), str(tree)],
                          capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode != 0:
        sys.exit(f"measuring {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def fastest(kept: dict | None, round_: dict) -> dict:
    """`round_` with each file's time the lower of its own and `kept`'s (results must not change between rounds)."""
    if kept is None:
        return round_
    assert kept["results"] == round_["results"], "a side's results changed between rounds"
    for column in ("fix", "text"):
        round_[column] = {path: min(seconds, kept[column][path]) for path, seconds in round_[column].items()}
    return round_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", default="main", help="git ref of the old path (default: main)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    fixtures = sorted(str(p) for p in (ROOT / "fixtures").rglob("*.py"))
    files = [fuse_attention(), *fixtures]
    with tempfile.TemporaryDirectory() as scratch:
        old_tree, new_tree = Path(scratch) / "old", Path(scratch) / "new"
        old_tree.mkdir(), new_tree.mkdir()
        materialise(args.reference, old_tree)
        materialise(None, new_tree)
        old_module = "scan" if (old_tree / "advisor" / "scan.py").exists() else "engine.static"
        old = new = None
        for _ in range(args.repeat):
            old = fastest(old, measure(old_tree, files, 1, old_module, text_mode=False))
            new = fastest(new, measure(new_tree, files, 1, "engine.static", text_mode=True))
    for path in files:
        before, after = old["results"][path], new["results"][path]
        differing = [(a, b) for a, b in zip(before["findings"], after["findings"]) if a != b][:1]
        assert before == after, f"{path}: findings, patches or fixed text differ, first: {differing}"
    findings = {path: len(new["results"][path]["findings"]) for path in files}
    print(f"{'':34} {'findings':>8} {args.reference + ' s':>10} {'new fix s':>10} {'new text s':>10} {'fix x':>6}"
          f" {'text x':>6}")
    rows = [("fuse_attention.py", [files[0]]), (f"fixtures ({len(fixtures)} files)", fixtures)]
    for label, group in rows:
        before = sum(old["fix"][p] for p in group)
        after, text = sum(new["fix"][p] for p in group), sum(new["text"][p] for p in group)
        print(f"{label:34} {sum(findings[p] for p in group):8d} {before:10.3f} {after:10.3f} {text:10.3f}"
              f" {before / after:6.2f} {before / text:6.2f}")
    print("findings, patches and fixed text identical on every file")


if __name__ == "__main__":
    main()

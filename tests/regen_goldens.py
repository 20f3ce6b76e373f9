"""Regenerate fixtures/attention/golden/*.py from the current rewriter. Review the diff before committing:
the goldens are the reviewed expectation, the parity tests are the proof."""

from pathlib import Path

from advisor.scan import analyze_source

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "attention"

if __name__ == "__main__":
    for source_path in sorted((ROOT / "positive").glob("*.py")):
        fixed = analyze_source(source_path.read_text(), str(source_path)).fixed
        (ROOT / "golden" / source_path.name).write_text(fixed)
        print("wrote", source_path.name)

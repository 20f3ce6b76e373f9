"""Regenerate fixtures/attention/golden/*.py from the current rewriter. Review the diff before committing:
the goldens are the reviewed expectation, the parity tests are the proof. Run from tests/."""

from pathlib import Path

from advisor.engine.static import analyze_source
from fixture_models import assumed_facts

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "attention"

if __name__ == "__main__":
    for source_path in sorted((ROOT / "positive").glob("*.py")):
        source = source_path.read_text()  # a positive that declares assumed facts is judged by its unsafe patch
        fixed = analyze_source(source, str(source_path), unsafe_fixes=bool(assumed_facts(source))).fixed
        (ROOT / "golden" / source_path.name).write_text(fixed)
        print("wrote", source_path.name)

"""Regenerate each attention golden (`fixtures/attention/positive/x.fixed.py`, beside its input `x.py`, and the flex
backend's, `fixtures/attention/flex/`) from the current rewriter. Review the diff before committing: the goldens are
the reviewed expectation, the parity tests are the proof. Run from tests/."""

from advisor.engine.static import analyze_source
from fixture_models import FIXTURE_ROOT, assumed_facts, fixture_inputs, fixture_paths, golden_path

if __name__ == "__main__":
    for source_path in fixture_paths("positive"):
        source = source_path.read_text()  # a positive that declares assumed facts is judged by its unsafe patch
        fixed = analyze_source(source, str(source_path), unsafe_fixes=bool(assumed_facts(source))).fixed
        golden_path(source_path).write_text(fixed)
        print("wrote", golden_path(source_path).name)
    for source_path in fixture_inputs(FIXTURE_ROOT / "flex"):  # as tests/rewrite/test_flex_backend.py rewrites them
        fixed = analyze_source(source_path.read_text(), str(source_path), unsafe_fixes=True, backend="flex").fixed
        golden_path(source_path).write_text(fixed)
        print("wrote", golden_path(source_path).name)

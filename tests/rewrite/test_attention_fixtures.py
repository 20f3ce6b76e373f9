"""Judges the attention matcher and SDPA rewriter on the fixtures under fixtures/attention/.

positive/  each file holds one hand-written attention block that SDPA computes exactly: one safe ADV101 finding,
           a patch, and a rewrite that runs, matches the original at 1e-5 and dispatches SDPA.
negative/  each file looks like attention but must not get a safe rewrite; its docstring's first line names
           the expected rule ('EXPECT: ADV102' = weights leave the block, unsafe fix only; 'EXPECT: ADV103' =
           cannot be proved equal, no fix).
x.fixed.py the expected rewritten text of the positive x.py beside it (its golden), when present; never a fixture.

Tests that need `advisor.engine.static.analyze_source` import it lazily, so the fixture self-checks run (and pass)
before the rewriter exists; the rest fail with ImportError until then.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
from pathlib import Path

import pytest
import torch

from attention_sources import fact_names
from fixture_models import (
    FIXTURE_ROOT,
    assumed_facts,
    build,
    dispatched_ops,
    docstring_first_line,
    expected_code,
    first_output,
    fixture_paths,
    golden_path,
    iter_tensors,
    load_module_from_source,
    make_parameters,
    parity,
    run_forward,
    uses_sdpa,
)

POSITIVES = fixture_paths("positive")
NEGATIVES = fixture_paths("negative")
ALL_FIXTURES = POSITIVES + NEGATIVES

ATOL = 1e-5
RTOL = 1e-5
SEEDS = (0, 1, 2)
# positives whose default inputs fully mask a query row under a -inf fill: NaN in the original, 0 in SDPA
NAN_ROWS = {"04_fairseq_bmm_keypad", "11_tensor_matmul_where", "25_split_scores_helper_method"}
# positives whose masks are built inside the model from its own shapes: no input can mask a whole row
MASKS_FROM_SHAPES = {"09_einops_einsum_causal", "14_hf_gpt2_prepermuted_where", "20_whisper_split_scale_prepermuted"}


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def _rel(path: Path) -> str:
    return str(path.relative_to(Path(__file__).resolve().parents[2]))


@functools.lru_cache(maxsize=None)
def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _patched(path: Path):
    """The analysis a positive is judged by: with --unsafe-fixes when its docstring declares assumed facts."""
    source = _source(path)
    return _analyze(source, _rel(path), unsafe_fixes=bool(assumed_facts(source)))


@functools.lru_cache(maxsize=None)
def _analyze(source: str, path: str, unsafe_fixes: bool = False):
    from advisor.engine.static import analyze_source  # ImportError until the scanner exists: expected

    return analyze_source(source, path, unsafe_fixes=unsafe_fixes)


def _attention_findings(result) -> list:
    return [f for f in result.findings if f.kind == "attention" or f.rule in {"ADV101", "ADV102", "ADV103"}]


def _describe(findings) -> str:
    return "; ".join(f"{f.rule} line {f.line}-{f.end_line} {f.function}: {f.reason or f.message}"
                     for f in findings) or "no findings"


def _enclosing_function(tree: ast.AST, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if start <= line <= (node.end_lineno or node.lineno):
                if best is None or node.lineno >= best.lineno:
                    best = node
    return best


def _import_lines(source: str) -> list[str]:
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend(lines[node.lineno - 1:node.end_lineno])
    return found


def _make_function_text(source: str) -> str:
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "make":
            return "\n".join(source.splitlines()[node.lineno - 1:node.end_lineno])
    raise AssertionError("fixture has no module-level make()")


_IMPORT_LINE = re.compile(r"^\s*(import|from)\s+\S")


# ----------------------------------------------------------------------------------------------------------------
# Fixture self-checks (no advisor needed)


def test_fixture_counts():
    assert len(POSITIVES) >= 18, POSITIVES
    assert len(NEGATIVES) >= 8, NEGATIVES
    codes = [expected_code(_source(p)) for p in NEGATIVES]
    assert "ADV102" in codes and "ADV103" in codes


def test_every_golden_sits_beside_its_input():
    """A golden (`x.fixed.py`) is the expected rewrite of the `x.py` next to it, and never judged as an input: a
    golden whose input was renamed or removed would no longer be compared with anything."""
    goldens = sorted(FIXTURE_ROOT.rglob("*.fixed.py"))
    assert {golden_path(p) for p in POSITIVES} <= set(goldens)
    assert [p for p in goldens if not p.with_name(p.name.removesuffix(".fixed.py") + ".py").exists()] == []
    assert not set(goldens) & set(ALL_FIXTURES)


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_ids(ALL_FIXTURES))
def test_fixture_runs(path):
    """Every fixture imports, make() builds it, and the forward pass produces a finite first output."""
    source = _source(path)
    first = docstring_first_line(source)
    assert first, f"{path.name}: the module docstring's first line must name the form"
    if path in NEGATIVES:
        assert expected_code(source) in {"ADV102", "ADV103"}, f"{path.name}: first line must be 'EXPECT: ADV10x'"
    module = load_module_from_source(source, path.stem)
    for seed in SEEDS:
        model, inputs = build(module, seed)
        out = run_forward(model, inputs)
        main = first_output(out)
        assert isinstance(main, torch.Tensor), f"{path.name}: first output is {type(main).__name__}"
        assert not torch.isinf(main).any() and not torch.isnan(main).all(), f"{path.name}: non-finite output"
    # the same seed rebuilds the same model and inputs
    again = run_forward(*build(module, 0))
    model0, inputs0 = build(module, 0)
    for a, b in zip(iter_tensors(again), iter_tensors(run_forward(model0, inputs0))):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_ids(ALL_FIXTURES))
def test_fixture_original_does_not_use_sdpa(path):
    model, inputs = build(load_module_from_source(_source(path), path.stem), 0)
    ops = dispatched_ops(model, inputs)
    assert not uses_sdpa(ops), f"{path.name}: the hand-written original already dispatches SDPA"
    assert any(op.startswith("aten::softmax") or op.startswith("aten::_softmax") for op in ops)


# ----------------------------------------------------------------------------------------------------------------
# Positives: one safe ADV101 finding, rewritten to SDPA exactly


@pytest.mark.parametrize("path", POSITIVES, ids=_ids(POSITIVES))
def test_positive_single_safe_finding(path):
    source = _source(path)
    result = _patched(path)  # without --unsafe-fixes, masks under `if m is not None:` may be guarded by absence
    findings = _attention_findings(result)
    assert len(findings) == 1, f"{path.name}: expected exactly one attention finding, got {_describe(findings)}"
    (finding,) = findings
    assert finding.rule == "ADV101", _describe(findings)
    assert finding.kind == "attention"
    assert finding.fixable is True
    assumed = assumed_facts(source)
    assert fact_names(finding, "assumed") == assumed, f"{path.name}: {finding.reason}"
    assert finding.fix_safety == ("unsafe" if assumed else "safe")
    assert finding.patch, "an ADV101 finding must carry its patch"
    nlines = len(source.splitlines())
    assert 1 <= finding.line <= finding.end_line <= nlines, (finding.line, finding.end_line)
    func = _enclosing_function(ast.parse(source), finding.line)
    assert func is not None, "the finding must point inside a function"
    assert func.name in re.split(r"[.:]", finding.function or ""), (finding.function, func.name)


@pytest.mark.parametrize("path", POSITIVES, ids=_ids(POSITIVES))
def test_positive_matches_golden(path):
    golden = golden_path(path)
    result = _patched(path)
    if not golden.exists():
        pytest.skip(f"no golden file {_rel(golden)} yet (generate it from the rewriter and review it)")
    assert result.fixed == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", POSITIVES, ids=_ids(POSITIVES))
def test_positive_rewrite_is_exact_and_uses_sdpa(path):
    source = _source(path)
    analysis = _patched(path)
    fixed = analysis.fixed
    assert fixed != source, f"{path.name}: nothing was rewritten"
    ast.parse(fixed)
    (finding,) = _attention_findings(analysis)
    accepted = "fully-masked-rows" in fact_names(finding, "accepted")
    # inputs with fully masked rows, unless the patch assumes there are none (then it is unsafe, and says so)
    fully_masked = "fully-masked-rows" not in fact_names(finding, "assumed")
    result = parity(source, fixed, atol=ATOL, rtol=RTOL, seeds=SEEDS, name=path.stem, accept_nan=accepted,
                    fully_masked=fully_masked)
    assert result.tensors_compared >= len(SEEDS)
    assert result.dropped == 0
    assert (result.nan_to_finite > 0) == (path.stem in NAN_ROWS), (
        f"{path.name}: {result.nan_to_finite} NaNs of the original became finite")

    rewritten_model, inputs = build(load_module_from_source(fixed, path.stem + "_fixed"), 0)
    assert uses_sdpa(dispatched_ops(rewritten_model, inputs)), f"{path.name}: the rewrite never calls SDPA"
    original_model, inputs = build(load_module_from_source(source, path.stem), 0)
    assert not uses_sdpa(dispatched_ops(original_model, inputs))


@pytest.mark.parametrize("path", POSITIVES, ids=_ids(POSITIVES))
def test_masked_positive_inputs_can_mask_a_whole_row(path):
    """Every positive whose masks may mask a whole query row builds inputs that do (make(fully_masked=True))."""
    (finding,) = _attention_findings(_patched(path))
    if "fully-masked-rows" in fact_names(finding, "proved") or not finding.extra["roles"]["mask"] \
            or path.stem in MASKS_FROM_SHAPES:
        return
    module = load_module_from_source(_source(path), path.stem)
    assert "fully_masked" in make_parameters(module), f"{path.name}: make() has no fully_masked option"


@pytest.mark.parametrize("path", POSITIVES, ids=_ids(POSITIVES))
def test_positive_rewrite_is_idempotent(path):
    fixed = _patched(path).fixed
    again = _analyze(fixed, _rel(path))
    leftover = [f for f in again.findings if f.rule == "ADV101"]
    assert not leftover, f"the rewritten source still has {_describe(leftover)}"
    assert again.fixed == fixed, "a second pass changed the rewritten source"


@pytest.mark.parametrize("path", POSITIVES, ids=_ids(POSITIVES))
def test_positive_rewrite_is_local(path):
    """Only the function holding the block changes (plus added import lines); the rest is byte-identical."""
    source = _source(path)
    result = _patched(path)
    fixed = result.fixed
    findings = [f for f in result.findings if f.rule == "ADV101"]
    assert findings, "no ADV101 finding"
    src_lines = source.splitlines(keepends=True)
    new_lines = fixed.splitlines(keepends=True)

    assert new_lines[0] == src_lines[0], "the first line (the docstring) changed"
    assert new_lines[-1] == src_lines[-1], "the last line changed"
    for line in _import_lines(source):
        assert line in fixed.splitlines(), f"import line changed or removed: {line!r}"
    assert _make_function_text(fixed) == _make_function_text(source), "make() changed"

    tree = ast.parse(source)
    spans = []
    for finding in findings:
        func = _enclosing_function(tree, finding.line)
        assert func is not None
        start = min([func.lineno] + [d.lineno for d in func.decorator_list])
        spans.append((start, func.end_lineno))

    def inside(line_no: int) -> bool:  # 1-based line of the original
        return any(start <= line_no <= end for start, end in spans)

    matcher = difflib.SequenceMatcher(a=src_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "insert":
            added = [ln for ln in new_lines[j1:j2] if ln.strip()]
            at_function = any(start <= i1 + 1 <= end + 1 for start, end in spans)
            if at_function or all(_IMPORT_LINE.match(ln) for ln in added):
                continue
            raise AssertionError(f"lines inserted outside the rewritten function at line {i1 + 1}: {added!r}")
        changed = range(i1 + 1, i2 + 1)
        outside = [n for n in changed if not inside(n)]
        assert not outside, (
            f"{tag} touches lines {outside} outside the rewritten function(s) {spans}: "
            f"{[src_lines[n - 1] for n in outside]!r}"
        )


# ----------------------------------------------------------------------------------------------------------------
# Negatives: reported with a reason, never safely patched


@pytest.mark.parametrize("path", NEGATIVES, ids=_ids(NEGATIVES))
def test_negative_reported_not_safely_fixed(path):
    source = _source(path)
    code = expected_code(source)
    result = _analyze(source, _rel(path))
    findings = _attention_findings(result)
    assert not [f for f in findings if f.rule == "ADV101"], f"{path.name}: got a safe finding: {_describe(findings)}"
    matching = [f for f in findings if f.rule == code]
    assert matching, f"{path.name}: expected {code}, got {_describe(findings)}"
    for finding in matching:
        assert finding.kind == "attention"
        assert isinstance(finding.reason, str) and len(finding.reason.split()) >= 3, (
            f"{code} needs a reason a person can read, got {finding.reason!r}"
        )
        if code == "ADV103":
            assert finding.fixable is False, "ADV103 offers no fix"
        else:
            assert finding.fix_safety == "unsafe", "the ADV102 fix drops the weights: it is unsafe"
    assert result.fixed == source, f"{path.name}: the safe pass changed the source"


ADV102_NEGATIVES = [p for p in NEGATIVES if expected_code(_source(p)) == "ADV102"]
ADV103_NEGATIVES = [p for p in NEGATIVES if expected_code(_source(p)) == "ADV103"]


@pytest.mark.parametrize("path", ADV102_NEGATIVES, ids=_ids(ADV102_NEGATIVES))
def test_adv102_unsafe_fix_computes_the_output(path):
    source = _source(path)
    result = _analyze(source, _rel(path), unsafe_fixes=True)
    assert [f for f in result.findings if f.rule == "ADV102"], _describe(result.findings)
    fixed = result.fixed
    assert fixed != source, f"{path.name}: --unsafe-fixes applied nothing"
    ast.parse(fixed)
    # the attention output must match; the weights may come back as None
    parity(source, fixed, atol=ATOL, rtol=RTOL, seeds=SEEDS, allow_dropped_weights=True, name=path.stem)
    model, inputs = build(load_module_from_source(fixed, path.stem + "_unsafe"), 0)
    assert uses_sdpa(dispatched_ops(model, inputs)), f"{path.name}: the unsafe rewrite never calls SDPA"


@pytest.mark.parametrize("path", ADV103_NEGATIVES, ids=_ids(ADV103_NEGATIVES))
def test_adv103_not_fixed_even_with_unsafe_fixes(path):
    source = _source(path)
    result = _analyze(source, _rel(path), unsafe_fixes=True)
    assert [f for f in result.findings if f.rule == "ADV103"], _describe(result.findings)
    assert result.fixed == source, f"{path.name}: an ADV103 block must never be rewritten"

"""Differential fuzzing of the attention rewrite, CI-sized profile.

Each family of generated attention variants (tests/fuzz/attention_variants.py) must be free of counterexamples:
every safe patch advisor offers matches the original's outputs, stored tensors and gradients, or advisor offers
no safe patch. Families that still find a known wrong-patch class are expected to fail (strict xfail): when the
class is closed, the test turns XPASS and fails, so the marker is removed with the fix. The long profile is
`benchmarks/fuzz_attention.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from fuzz.attention_variants import FAMILIES, Variant, render
from fuzz.differential import COUNTEREXAMPLE, INVALID, SAFE_OK, check, compare

CORE_EXAMPLES, FAMILY_EXAMPLES = 24, 6

# family -> why it still fails (its class of fault, as FAMILIES names it, and the reproduction in
# fixtures/attention/regressions/)
KNOWN_BUGS: dict[str, str] = {}


REGRESSIONS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "attention" / "regressions").glob("*.py"))
# regression fixtures whose wrong safe patch is not fixed yet (number prefix -> class of fault)
OPEN_REGRESSIONS: dict[str, str] = {}


def _profile(examples: int):
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                    phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


def _assert_sound(variant: Variant) -> None:
    source = render(variant)
    outcome = check(source)
    assert outcome.status != INVALID, f"the generator wrote a variant that does not run: {outcome.detail}\n{source}"
    assert outcome.status != COUNTEREXAMPLE, (
        f"{outcome.kind}: {outcome.detail}\n--- original\n{source}\n--- advisor's rewrite\n{outcome.fixed}")


def _family_param(name: str):
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[name])] if name in KNOWN_BUGS else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("family", [_family_param(name) for name in FAMILIES])
def test_family_has_no_wrong_safe_patch(family: str) -> None:
    examples = CORE_EXAMPLES if family == "core" else FAMILY_EXAMPLES
    _profile(examples)(given(FAMILIES[family][1])(_assert_sound))()


def _regression_param(path: Path):
    number = path.name.split("_", 1)[0]
    marks = [pytest.mark.xfail(strict=True, reason=f"class {OPEN_REGRESSIONS[number]}: not fixed yet")] \
        if number in OPEN_REGRESSIONS else []
    return pytest.param(path, marks=marks, id=path.stem)


@pytest.mark.parametrize("path", [_regression_param(p) for p in REGRESSIONS])
def test_regression_fixture_gets_no_wrong_safe_patch(path: Path) -> None:
    """Each counterexample the fuzzer found, kept as a fixture: refused, unsafe, or a safe patch that holds."""
    outcome = check(path.read_text(encoding="utf-8"))
    assert outcome.status != INVALID, outcome.detail
    assert outcome.status != COUNTEREXAMPLE, f"{outcome.kind}: {outcome.detail}\n--- rewrite\n{outcome.fixed}"


def test_the_plain_block_gets_a_safe_patch_that_holds() -> None:
    """The harness is not vacuous: the nanoGPT-style default variant is rewritten and checked."""
    outcome = check(render(Variant()))
    assert outcome.status == SAFE_OK and outcome.safe_patches == 1


# The harness itself: a wrong rewrite must be caught, an accepted divergence must be declared.

def _plain_source(**changes) -> str:
    return render(Variant(**changes))


def test_harness_catches_a_changed_scale() -> None:
    source = _plain_source()
    wrong = source.replace("scores = scores * D ** -0.5", "scores = scores * D ** -0.25")
    assert wrong != source
    assert compare(source, wrong)[0] == "wrong-values"


def test_harness_catches_gradients_that_only_the_rewrite_has() -> None:
    source = _plain_source()
    wrong = source.replace("scores = q @ k.transpose(-2, -1)",
                           "scores = (q @ k.transpose(-2, -1)).detach()")
    assert wrong != source
    assert compare(source, wrong)[0] == "wrong-gradients"


def test_harness_catches_a_tensor_no_longer_stored() -> None:
    source = _plain_source(hazard="store_weights")
    wrong = source.replace("self.last_attn = attn", "pass")
    assert wrong != source
    assert compare(source, wrong)[0] == "lost-stored-tensor"


def test_harness_accepts_nan_to_zero_only_when_declared() -> None:
    source = _plain_source(mask="key_padding", left_padding=True, causal_too=True, fill="-inf", polarity="invert")
    finite = source.replace("attn = F.softmax(scores, dim=-1)", "attn = F.softmax(scores, dim=-1).nan_to_num(0.0)")
    assert finite != source
    assert compare(source, finite)[0] == "nan-divergence"
    assert compare(source, finite, accepts_nan=True) is None

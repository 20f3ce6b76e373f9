"""`fix` applies a file's fixes until they settle (engine.static._settle), so that what it shows is what a second
run would leave alone. A fix that keeps applying to its own output (the text still growing after the last round) is
a bug of ours: only its first round is applied, and the file's report says so, instead of the patch nested once per
round (breaker round 56)."""

from __future__ import annotations

from advisor.engine.static import FIX_ROUNDS, Applied, FileResult, _settle


def _result(text: str, fixed: str) -> FileResult:
    result = FileResult("m.py", text)
    result._applied = Applied(fixed)
    return result


def test_fixes_that_never_settle_apply_one_round_and_say_so():
    rounds = []

    def analyze(text: str) -> FileResult:
        rounds.append(text)
        return _result(text, text + "x")  # every round changes the text again

    result = _result("a", "ab")
    _settle(result, analyze)
    assert len(rounds) == FIX_ROUNDS - 1
    assert result.applied.text == "ab"
    assert any("did not settle" in problem for problem in result.applied.problems)


def test_fixes_still_shrinking_keep_the_last_round_for_the_next_run():
    """20 chained copies lose one a round: the next run takes the rest, as README says."""
    def analyze(text: str) -> FileResult:
        return _result(text, text[:-1])

    result = _result("a" * 40, "a" * 39)
    _settle(result, analyze)
    assert result.applied.text == "a" * (40 - FIX_ROUNDS) and not result.applied.problems


def test_fixes_that_settle_keep_the_last_round():
    def analyze(text: str) -> FileResult:
        return _result(text, text if text.endswith("cc") else text + "c")

    result = _result("a", "ab")
    _settle(result, analyze)
    assert result.applied.text == "abcc" and not result.applied.problems

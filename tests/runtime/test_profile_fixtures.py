"""advisor profile on the bundled fixtures: each hot spot found at its marked line, ranked by measured time."""

import pytest

from profile_helpers import FIXTURES, by_rule, marker_line, run_fixture, same_file


@pytest.fixture(scope="module")
def attention_report():
    return run_fixture("handwritten_attention.py")


@pytest.fixture(scope="module")
def copies_report():
    return run_fixture("copies_and_casts.py")


def test_attention_block_spans_qk_to_av_and_ranks_first(attention_report):
    path = FIXTURES / "handwritten_attention.py"
    [attention] = by_rule(attention_report, "ADV110")
    assert same_file(attention.path, path)
    assert (attention.line, attention.end_line) == (marker_line(path, "LINE_QK"), marker_line(path, "LINE_AV"))
    assert attention.function == "CausalSelfAttention.forward"
    assert attention.extra["calls"] == 2  # one block per layer, merged into one finding
    assert attention.extra["evidence"]["score_bytes"] == 2 * 4 * 256 * 256 * 4
    # its rank follows the measured time (a loaded machine may reorder blocks this close; the ranking itself is
    # held in test_findings_are_ranked_by_measured_time); what the block computes outweighs the mask it rebuilds
    [mask] = by_rule(attention_report, "ADV501")
    assert attention.extra["rank"] == 1 + sum(f.extra["self_us"] > attention.extra["self_us"]
                                              for f in attention_report.findings)
    assert attention.extra["evidence"]["score_bytes"] > 4 * 256 * 256 * 4 >= mask.extra["evidence"].get("bytes", 0)
    assert 0.0 < attention.extra["share"] <= 1.0


def test_mask_rebuilt_every_forward(attention_report):
    path = FIXTURES / "handwritten_attention.py"
    [mask] = by_rule(attention_report, "ADV501")
    assert mask.line == marker_line(path, "LINE_MASK")
    assert mask.extra["evidence"]["shape"] == [256, 256] and mask.extra["calls"] == 2


def test_needed_copy_before_view_is_not_reported(attention_report):
    assert {f.kind for f in attention_report.findings} == {"attention", "mask-rebuild"}


def test_findings_are_ranked_by_measured_time(attention_report, copies_report):
    for report in (attention_report, copies_report):
        costs = [f.extra["self_us"] for f in report.findings]
        assert costs == sorted(costs, reverse=True)
        assert [f.extra["rank"] for f in report.findings] == list(range(1, len(costs) + 1))


@pytest.mark.parametrize("rule, marker", [
    ("ADV202", "LINE_STRIDED_OK"), ("ADV201", "LINE_ALREADY_CONTIGUOUS"), ("ADV203", "LINE_UNDONE"),
    ("ADV204", "LINE_COPY_COPY"), ("ADV301", "LINE_SAME_DTYPE"), ("ADV302", "LINE_ROUND_TRIP"),
    ("ADV303", "LINE_PARAM_CAST"), ("ADV304", "LINE_SOFTMAX_UPCAST")])
def test_copy_and_cast_kinds_at_their_lines(copies_report, rule, marker):
    path = FIXTURES / "copies_and_casts.py"
    lines = [f.line for f in by_rule(copies_report, rule) if same_file(f.path, path)]
    assert lines == [marker_line(path, marker)]


def test_no_op_calls_are_shown_as_negligible_not_hidden(copies_report):
    for rule in ("ADV201", "ADV301"):
        [finding] = by_rule(copies_report, rule)
        assert finding.extra["self_us"] == 0 and finding.extra["negligible"]
    [param] = by_rule(copies_report, "ADV303")
    assert param.extra["evidence"]["param"] == "table"
    real_copies = [f for f in copies_report.findings if f.rule in ("ADV202", "ADV203", "ADV204", "ADV302")]
    assert all(f.extra["self_us"] > 0 for f in real_copies)


def test_sdpa_math_fallback_with_reason_and_fused_call_not_reported():
    report = run_fixture("sdpa_fallback.py")
    path = FIXTURES / "sdpa_fallback.py"
    [fallback] = by_rule(report, "ADV401")
    assert fallback.line == marker_line(path, "LINE_FALLBACK")
    assert any("dropout" in reason for reason in fallback.extra["evidence"]["reasons"])
    assert [f.rule for f in report.findings] == ["ADV401"]  # no mask-rebuild from SDPA's own dropout


# Shares are weighted by measured op time, so they move with machine load: the 95% goal is reported by
# benchmarks/profile_overhead.py; tests only guard against attribution breaking (every op on a user line,
# most of the time on a statement line).
STATEMENT_FLOOR = 0.85
ATTRIBUTED_FLOOR = 0.95  # the product goal; seen 0.976-1.0 over 45 runs on a loaded 2-core machine


def test_clean_fixture_reports_nothing():
    report = run_fixture("clean.py")
    assert report.findings == []
    assert report.timing.attributed_share >= ATTRIBUTED_FLOOR
    assert report.timing.statement_share >= STATEMENT_FLOOR


def test_most_op_time_lands_on_user_statements(attention_report, copies_report):
    for report in (attention_report, copies_report):
        assert report.timing.statement_share >= STATEMENT_FLOOR
        assert report.timing.attributed_share >= ATTRIBUTED_FLOOR


def test_train_mode_profiles_backward_and_still_finds_attention():
    report = run_fixture("handwritten_attention.py", train=True)
    path = FIXTURES / "handwritten_attention.py"
    [attention] = by_rule(report, "ADV110")
    assert attention.line == marker_line(path, "LINE_QK")
    assert report.to_json()["mode"] == "train"
    # Backward ops carry their forward function's stack: nearly all of them land on user code.
    assert report.timing.attributed_share >= ATTRIBUTED_FLOOR

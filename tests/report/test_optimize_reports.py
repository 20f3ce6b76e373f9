"""The three renderers of an `optimize` result (console, Markdown, HTML) and the SVG chart helper, on hand-built
result dicts: the numbers they print, the edge cases of the contract, and hostile strings that must stay text."""

from __future__ import annotations

import io
import re
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from rich.console import Console

import optimize_results
from advisor.report import optimize_view as view
from advisor.report.optimize_console import print_optimize
from advisor.report.optimize_html import render_html
from advisor.report.optimize_markdown import render_markdown
from advisor.report.svg_charts import Bar, bar_chart, nice_ticks

MARKER = "+        marker_only_in_rejected_patch = 1\n"


def _with_marked_rejection() -> dict:
    result = optimize_results.typical()
    result["patches"][3]["diff"] += MARKER  # the parity-failed patch
    return result


def console_text(result: dict, terminal: bool = False) -> str:
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=terminal, color_system="truecolor" if terminal else None)
    print_optimize(console, result)
    return out.getvalue()


# ---- console ----

def test_console_prints_numbers_verdicts_and_only_verified_diffs():
    result = _with_marked_rejection()
    text = console_text(result)
    assert "1.85x (CI 1.79x to 1.91x) faster" in text
    assert view.duration(result["before"]["median_us"]) in text and view.duration(result["after"]["median_us"]) in text
    for label in ("verified", "no measurable gain", "parity failed", "diff written to", "applied"):
        assert label in text
    assert "abs 3.1e-01 (atol 1e-05)" in text  # the failing patch's parity against its tolerance
    assert "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)" in text
    assert "marker_only_in_rejected_patch" not in text  # diffs of rejected patches are not offered in the terminal
    assert "aten::bmm (removed)" in text and "(added)" in text
    assert "blocks.0.attn.bias" in text  # state_dict mismatch is reported


@pytest.mark.parametrize("terminal", [False, True])
def test_console_shows_hostile_strings_as_text(terminal):
    text = console_text(optimize_results.hostile(), terminal)
    assert "[/][bold red]x[/]" in text  # shown, not parsed as rich markup (which would raise or restyle)
    assert "\\x1b[31mred\\x1b]0;title\\x07" in text  # terminal escapes shown as \xNN
    assert "\x1b]" not in text and "\x07" not in text and "\x1b[31mred" not in text and "\r" not in text
    assert "\u202e" not in text and "\\u202eevil" in text  # a bidi override is shown, not obeyed


@pytest.mark.parametrize("name", sorted(optimize_results.ALL))
def test_console_renders_every_edge_case(name):
    text = console_text(optimize_results.ALL[name]())
    assert "advisor optimize:" in text and "environment" in text


def test_console_says_why_there_is_no_speedup():
    assert "nothing to patch" in console_text(optimize_results.no_patches())
    rejected = console_text(optimize_results.all_rejected())
    assert "no verified patch" in rejected and "the patched module failed to import" in rejected
    assert "y = F.scaled_dot_product_attention" not in rejected


# ---- Markdown ----

def _markdown_tokens(text: str):
    return MarkdownIt("commonmark", {"html": True}).enable("table").parse(text)


def _html_blocks(text: str) -> str:
    """The raw HTML a Markdown renderer passes through (fenced diffs excluded)."""
    return "".join(t.content for t in _markdown_tokens(text) if t.type == "html_block")


def _markdown_html(text: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).enable("table").render(text)


def test_markdown_tables_keep_their_shape_and_diffs_their_text():
    for result in (optimize_results.typical(), optimize_results.hostile()):
        text = render_markdown(result)
        tokens = _markdown_tokens(text)
        widths, row = [], 0
        for token in tokens:
            if token.type == "tr_open":
                row = 0
            elif token.type in ("th_open", "td_open"):
                row += 1
            elif token.type == "tr_close":
                widths.append(row)
        tables = [t for t in tokens if t.type == "table_open"]
        assert len(tables) == 6  # summary, patches, found not patched, findings, environment, ops
        assert set(widths) <= {2, 3, 4, 5, 7}, widths  # a `|` in a name would add a column
        fences = [t.content for t in tokens if t.type == "fence" and t.info == "diff"]
        assert fences == [view.printable(p["diff"]) for p in result["patches"]]


def test_markdown_folds_every_diff_and_the_op_table():
    text = render_markdown(optimize_results.typical())
    blocks = _html_blocks(text)
    assert blocks.count("<details>") == blocks.count("</details>") == 4 + 1
    assert "| **speedup** |  | **1.85x (CI 1.79x to 1.91x)** |" in text
    assert "abs 3.1e-01 (atol 1e-05)" in text
    assert "SDPA kernels after | aten::\\_scaled\\_dot\\_product\\_flash\\_attention\\_for\\_cpu |" in text
    assert len(text) < 65536  # GitHub's limit for one comment


def test_markdown_renders_hostile_strings_as_literal_text():
    html = _markdown_html(render_markdown(optimize_results.hostile()))
    assert "<script>" not in html and "alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "[/][bold red]x[/]" in html and "<strong>b</strong>" not in html
    assert "\x1b" not in html and "\\x1b[31mred" in html and "\u202e" not in html


@pytest.mark.parametrize("name", sorted(optimize_results.ALL))
def test_markdown_renders_every_edge_case(name):
    text = render_markdown(optimize_results.ALL[name]())
    assert text.startswith("## advisor optimize: ") and "### Environment" in text
    blocks = _html_blocks(text)
    assert blocks.count("<details>") == blocks.count("</details>")


def test_markdown_without_after_side_or_interval():
    assert "No finding had a patch to verify." in render_markdown(optimize_results.no_patches())
    text = render_markdown(optimize_results.no_interval())
    assert "| **speedup** |  | **1.85x** |" in text and "CI" not in text.split("### Patches")[1].split("<details>")[0]


# ---- HTML ----

class _Page(HTMLParser):
    """Tags, attributes and text of a page, to check what a browser would see."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.data: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.data.append(data)

    def count(self, tag: str, css: str | None = None) -> int:
        return sum(1 for t, attrs in self.tags if t == tag and (css is None or css in (attrs.get("class") or "")))


def test_html_is_self_contained_with_four_charts():
    text = render_html(optimize_results.typical())
    page = _Page(text)
    assert page.count("svg", "chart") == 4  # step time, time per op kind, speedup per patch, peak memory
    assert page.count("script") == 0 and page.count("link") == 0 and page.count("img") == 0
    assert not re.search(r"(src|href)\s*=|url\(|@import|https?://(?!www\.w3\.org/2000/svg)", text)
    assert page.count("details") == 4 and page.count("span", "add") > 0 and page.count("span", "del") > 0
    assert "1.85x (CI 1.79x to 1.91x) faster" in text


def test_html_escapes_hostile_strings():
    text = render_html(optimize_results.hostile())
    page = _Page(text)
    assert page.count("script") == 0
    joined = "".join(page.data)
    assert "<script>alert(1)</script>" in joined  # as text, not as an element
    assert "\x1b" not in text and "\\x1b[31mred" in joined and "\u202e" not in text
    assert "# </pre></details>" in joined  # a diff line that closes our own tags stays text


@pytest.mark.parametrize("name", sorted(optimize_results.ALL))
def test_html_renders_every_edge_case(name):
    page = _Page(render_html(optimize_results.ALL[name]()))
    charts = page.count("svg", "chart")
    expected = {"typical": 4, "hostile": 4, "no_interval": 4, "no_patches": 3, "all_rejected": 3}[name]
    assert charts == expected  # no speedup chart when nothing was timed


def test_html_step_time_falls_back_to_the_median_interval_without_samples():
    text = render_html(optimize_results.no_interval())
    assert "too few samples for a box" in text


# ---- charts and views ----

@pytest.mark.parametrize("lo,hi", [(0, 1), (0, 48_300), (0.93, 1.91), (0, 612 * 2 ** 20), (5, 5)])
def test_nice_ticks_cover_the_range_with_round_steps(lo, hi):
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 2 <= len(ticks) <= 12
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1
    mantissa = float(f"{steps.pop():e}".split("e")[0])
    assert mantissa in (1.0, 2.0, 2.5, 5.0)


def test_bar_lengths_are_proportional_to_values():
    svg = bar_chart("t", [("a", [Bar("before", 300.0), Bar("after", 100.0)])], {"before": "#111", "after": "#222"},
                    str)
    widths = [float(w) for w in re.findall(r'width="([\d.]+)" height="\d+" fill="[^"]+" rx="2"><title>', svg)]
    assert len(widths) == 2 and widths[0] == pytest.approx(3 * widths[1], rel=0.01)


def test_op_diff_marks_added_and_removed_and_groups_kinds():
    deltas = {d.op: d for d in view.op_diff(optimize_results.typical())}
    assert deltas["aten::bmm"].status == "removed" and deltas["aten::bmm"].kind == "gemm"
    assert deltas["aten::_scaled_dot_product_flash_attention_for_cpu"].status == "added"
    assert deltas["aten::addmm"].status == "" and deltas["aten::addmm"].delta_text == "-100 us"
    kinds = {kind: (before, after) for kind, before, after in view.time_by_kind(optimize_results.typical())}
    assert kinds["attention"] == (0.0, 7600.0) and kinds["softmax"] == (9100.0, 0.0)
    assert kinds["gemm"] == (14200.0 + 11800.0, 11700.0)
    assert all(d.us_after is None for d in view.op_diff(optimize_results.no_patches()))


# ---- fields the optimize run adds, and nulls anywhere the contract allows them ----

def test_every_format_says_how_the_interval_is_computed_and_what_was_left_unchecked():
    result = optimize_results.typical()
    console, markdown, page = _visible(result)
    for text in (console, markdown, page):
        assert "speedup interval: median step time ratio; 95% percentile bootstrap" in text
        assert "state_dict keys missing on patch p4: blocks.0.attn.mask" in text
        assert re.search(r"not compared:[\s│]+past", text)  # outputs the parity run skipped are named (cells wrap)
        assert "diff written to demo/model.py" not in text  # an applied patch's written_to is its own file
        assert "peak memory from" in text and "threads fixed at 2" in text
    for text in (markdown, page):
        assert "checked on 3 input(s) of demo/model.py:workload" in text


def _visible(result: dict) -> tuple[str, str, str]:
    """What a reader sees of each format: the terminal text, the text of the rendered Markdown, the page's text."""
    markdown = "".join(_Page(_markdown_html(render_markdown(result))).data)
    return console_text(result), markdown, "".join(_Page(render_html(result)).data)


NULLABLE_TOP = ("after", "speedup", "speedup_ci", "report", "ops", "findings_before", "findings_after", "traces",
                "state_dict", "environment", "notes", "speedup_method")
NULLABLE_PATCH = ("parity", "speedup", "speedup_ci", "reason", "written_to", "facts", "diff", "function", "end_line",
                  "state_dict", "unsafe_facts_checked_on")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_renderers_survive_nulls_wherever_the_contract_allows_them(data):
    result = optimize_results.typical()
    for key in data.draw(st.sets(st.sampled_from(NULLABLE_TOP))):
        result[key] = None
    for patch in result["patches"]:
        for key in data.draw(st.sets(st.sampled_from(NULLABLE_PATCH))):
            patch[key] = None
    text = console_text(result)
    assert "advisor optimize:" in text and "None" not in text
    assert "None" not in render_markdown(result)
    page = _Page(render_html(result))
    assert "None" not in "".join(page.data)


def test_non_finite_numbers_stay_out_of_the_charts():
    result = optimize_results.typical()
    result["patches"][0]["speedup"] = float("inf")
    result["patches"][1]["speedup_ci"] = [float("nan"), 1.2]
    result["before"]["samples_us"][3] = float("nan")
    result["after"]["peak_bytes"] = float("nan")
    result["patches"][3]["parity"]["max_abs_err"] = float("nan")
    page = _Page(render_html(result))
    assert page.count("svg", "chart") == 4
    assert "nan" in "".join(page.data) and "inf" in "".join(page.data)  # the tables still say what happened
    console_text(result)
    render_markdown(result)

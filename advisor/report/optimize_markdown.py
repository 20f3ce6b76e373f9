"""The `optimize` report as GitHub-flavoured Markdown that fits a pull-request comment: summary table, per-patch
numbers, each diff folded in a `<details>` block, environment, and the op diff folded too.

Text in table cells is backslash-escaped (CommonMark renders any escaped ASCII punctuation literally), text inside
the HTML of `<summary>` is html-escaped, and each diff sits in a fence longer than any backtick run inside it."""

from __future__ import annotations

import re
from html import escape

from advisor.report import optimize_view as view

OP_ROWS = 25
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~!#])")


def render_markdown(result: dict) -> str:
    parts = [f"## advisor optimize: {_text(view.printable(result.get('target', '?')))}",
             f"**{_text(view.headline(result))}**", _summary(result), _patches(result), _unpatched(result),
             _findings(result),
             _environment(result), _ops(result)]
    notes = view.notes(result)
    if notes:
        parts.append("\n".join(f"- {_text(note)}" for note in notes))
    return "\n\n".join(part for part in parts if part) + "\n"


def _text(value: str) -> str:
    """Literal text in a Markdown paragraph or table cell: punctuation escaped, line breaks kept inside the cell."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", value).replace("\r", "").replace("\n", "<br>")


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]], align: str = "") -> str:
    """Cells are Markdown already (escaped by the caller); `align` has one `l`/`r` per column."""
    marks = ["---:" if align[i:i + 1] == "r" else "---" for i in range(len(columns))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(marks) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


def _summary(result: dict) -> str:
    rows = [(measure, before, after) for measure, before, after in view.summary_rows(result)]
    rows.append(("**speedup**", "", f"**{view.speedup_text(result.get('speedup'), result.get('speedup_ci'))}**"))
    rows.append(("patches", view.count_verdicts(result), ""))
    return _table(("", "before", "after"), rows, "lrr")


def _patches(result: dict) -> str:
    patches = result.get("patches") or []
    if not patches:
        return "No finding had a patch to verify."
    rows = []
    for patch in patches:
        row = view.patch_row(patch)
        rows.append((_text(row.id), _text(row.rule) + (f" ({_text(row.safety)})" if row.safety else ""),
                     f"{_text(row.location)}<br>{_text(row.function)}",
                     f"**{row.verdict}**" + (f"<br>{_text(row.reason)}" if row.reason else ""),
                     "<br>".join(_text(line) for line in row.parity) or view.NONE, row.speedup, _text(row.outcome)))
    table = _table(view.PATCH_COLUMNS, rows)
    return "### Patches\n\n" + table + "".join(_folded_diff(patch) for patch in patches if patch.get("diff"))


def _folded_diff(patch: dict) -> str:
    diff = view.printable(patch["diff"]).replace("\r", "")
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", diff)), default=0))
    facts = "".join(f"\n- {_text(fact)}" for fact in view.assumed_facts(patch))
    if facts:
        facts = f"\n{_text(view.facts_heading(patch))}\n{facts}"
    summary = escape(f"{view.patch_title(patch)}: {view.verdict(patch)}")
    return (f"\n\n<details><summary>{summary}</summary>\n{facts}\n\n{fence}diff\n{diff.rstrip(chr(10))}\n{fence}\n\n"
            "</details>")


def _unpatched(result: dict) -> str:
    rows = [tuple(_text(cell) for cell in row) for row in view.unpatched_rows(result)]
    return f"### {view.UNPATCHED_TITLE}\n\n" + _table(view.UNPATCHED_COLUMNS, rows, "lllrl") if rows else ""


def _findings(result: dict) -> str:
    rows = [(_text(rule), _text(where), _text(function), state, _text(why))
            for rule, where, function, state, why in view.findings_diff(result)]
    return "### Findings before and after\n\n" + _table(view.FINDING_COLUMNS, rows) if rows else ""


def _environment(result: dict) -> str:
    rows = [(key, _text(value)) for key, value in view.environment_rows(result)]
    return "### Environment\n\n" + _table(("", ""), rows)


def _ops(result: dict) -> str:
    deltas = view.op_diff(result)
    if not deltas:
        return ""
    rows = []
    for delta in deltas[:OP_ROWS]:
        rows.append((_text(delta.op) + (f" *({delta.status})*" if delta.status else ""), delta.kind,
                     *delta.numbers()))
    shown = f"top {OP_ROWS} of {len(deltas)}" if len(deltas) > OP_ROWS else f"{len(deltas)}"
    table = _table(view.OP_COLUMNS, rows, "llrrrrr")
    return f"<details><summary>Ops before and after ({shown}, biggest change first)</summary>\n\n{table}\n\n</details>"

"""Terminal report of `advisor optimize`: summary, verdict per patch, diffs of the verified patches, findings gone,
op diff, environment. Every cell is a rich `Text`, never a markup string, so `[/]` in a file or op name is shown
as typed instead of being parsed (or crashing rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from advisor.report import optimize_view as view
from advisor.report.findings_console import print_diff

VERDICT_STYLES = {"verified": "green", "parity-failed": "red", "no-gain": "yellow", "not-run": "dim"}
CHANGE_STYLES = {"added": "green", "removed": "red", "gone": "green", "remains": "yellow", "new": "red"}
OP_ROWS = 20  # the op diff is sorted by change in time; the tail is noise in a terminal


def print_optimize(console: Console, result: dict) -> None:
    console.print(Text.assemble(("advisor optimize: ", "bold"), view.printable(result.get("target", "?")),
                                " - ", (view.headline(result), "bold")))
    console.print(_summary(result))
    patches = result.get("patches") or []
    if patches:
        console.print(_patches(patches))
    for patch in patches:
        if patch.get("verified") and patch.get("diff"):
            console.print(Text(view.patch_title(patch), style="bold"))
            facts = view.assumed_facts(patch)
            if facts:
                console.print(Text(view.facts_heading(patch), style="yellow"))
            for fact in facts:
                console.print(Text(f"  - {fact}", style="yellow"))
            print_diff(console, view.printable(patch["diff"]))
    unpatched = view.unpatched_rows(result)
    if unpatched:
        console.print(_table(view.UNPATCHED_TITLE.lower(), view.UNPATCHED_COLUMNS, unpatched))
    findings = view.findings_diff(result)
    if findings:
        console.print(_table("findings before -> after", view.FINDING_COLUMNS,
                             [(*row[:3], Text(row[3], style=CHANGE_STYLES[row[3]]), row[4]) for row in findings]))
    deltas = view.op_diff(result)
    if deltas:
        console.print(_ops(deltas))
    console.print(_table("environment", ("", ""), view.environment_rows(result), header=False))
    for note in view.notes(result):
        console.print(Text(note, style="dim"))


def _table(title: str, columns: tuple[str, ...], rows, header: bool = True, justify: tuple[str, ...] = (),
           caption: str | None = None) -> Table:
    table = Table(title=Text(title), show_header=header, title_justify="left", caption=caption, caption_justify="left")
    for index, column in enumerate(columns):
        table.add_column(Text(column), overflow="fold", justify=justify[index] if index < len(justify) else "left")
    for row in rows:
        table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
    return table


def _summary(result: dict) -> Table:
    rows = [(measure, before, after) for measure, before, after in view.summary_rows(result)]
    speedup = view.speedup_text(result.get("speedup"), result.get("speedup_ci"))
    rows.append(("speedup", "", Text(speedup, style="bold green" if (result.get("speedup") or 0) > 1 else "bold")))
    rows.append(("patches", view.count_verdicts(result), ""))
    return _table("summary", ("", "before", "after"), rows, justify=("left", "right", "right"))


def _patches(patches: list[dict]) -> Table:
    rows = []
    for patch in patches:
        row = view.patch_row(patch, sep="\n")
        state = Text(row.verdict, style=VERDICT_STYLES.get(patch.get("verdict"), ""))
        if row.reason:
            state.append("\n" + row.reason, style="dim")
        where = Text(row.location)
        where.append("\n" + row.function, style="dim")
        patch_rule = Text(f"{row.id}\n{row.rule}")
        if row.safety:
            patch_rule.append("\n" + row.safety, style="yellow")
        rows.append((patch_rule, where, state, "\n".join(row.parity) or view.NONE, row.speedup, row.outcome))
    return _table("patches", ("patch", "location", "verdict", "parity", "speedup", "applied"), rows,
                  caption="parity: max abs and rel error, with the tolerances; speedup: alone, with its interval")


def _ops(deltas: list[view.OpDelta]) -> Table:
    rows = []
    for delta in deltas[:OP_ROWS]:
        op = Text(delta.op, style=CHANGE_STYLES.get(delta.status, ""))
        if delta.status:
            op.append(f" ({delta.status})", style="dim")
        rows.append((op, delta.kind, *delta.numbers()))
    title = "ops before -> after" + (f" (top {OP_ROWS} of {len(deltas)} by change)" if len(deltas) > OP_ROWS else "")
    return _table(title, view.OP_COLUMNS, rows,
                  justify=("left", "left", "right", "right", "right", "right", "right"))

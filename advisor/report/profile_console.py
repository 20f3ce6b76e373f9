"""Terminal rendering of measured findings (profile and analyze): rank, kind, location, time, share, what to do."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from advisor.contracts.finding import Finding
from advisor.report.terminal import short_path, shown


def _us(value: float) -> str:
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def print_measured(console: Console, title: str, findings: list[Finding], summary: list[str]) -> None:
    for line in summary:
        console.print(line, highlight=False)
    if not findings:
        console.print("advisor: no findings")
        return
    table = Table(title=title)
    for column, justify in (("#", "right"), ("kind", "left"), ("location", "left"), ("time/step", "right"),
                            ("share", "right"), ("calls", "right"), ("what to do", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for finding in findings:
        extra = finding.extra
        span = f"{finding.line}" if finding.end_line == finding.line else f"{finding.line}-{finding.end_line}"
        location = f"{short_path(finding.path)}:{span}\n[dim]{shown(finding.function)}[/dim]"
        share = f"{extra.get('share', 0.0):.1%}"
        if extra.get("negligible"):
            share = f"[dim]{share} (negligible)[/dim]"
        table.add_row(str(extra.get("rank", "")), f"{shown(finding.kind)}\n[dim]{finding.rule}[/dim]", location,
                      _us(extra.get("self_us", 0.0)), share, f"{extra.get('calls', 0):g}", shown(finding.message))
    console.print(table)


def print_top_lines(console: Console, rows: list[dict]) -> None:
    """Where the op time went, line by line (profile's `top_lines`): the lines to read first."""
    if not rows:
        return
    table = Table(title="top lines by op time")
    for column, justify in (("location", "left"), ("time/step", "right"), ("share", "right"), ("code", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows:
        table.add_row(f"{short_path(row['path'])}:{row['line']}", _us(row["us"]), f"{row['share']:.1%}",
                      shown(row["code"]))
    console.print(table)

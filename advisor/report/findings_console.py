"""Terminal rendering of static findings: a rich table, then reasons, then syntax-highlighted diffs."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from advisor.contracts.finding import Finding, ScanError
from advisor.report.terminal import printable, short_path, shown


def print_findings(console: Console, findings: list[Finding], errors: list[ScanError], files_scanned: int,
                   quiet: bool = False) -> None:
    """The errors, then the findings' table; `quiet` (-q): no summary line, neither the table's title nor "no
    findings"."""
    print_errors(errors)
    if findings:
        table = Table(title=None if quiet else f"advisor: {len(findings)} finding(s) in {files_scanned} file(s)")
        for column in ("location", "rule", "fix", "what"):
            table.add_column(column, overflow="fold")
        for finding in findings:
            fix = ("-" if not finding.fixable else
                   ("safe" if finding.fix_safety == "safe" else "[yellow]unsafe[/yellow]"))
            what = shown(finding.message)
            if finding.reason is not None:
                what += f"\n[dim]{shown(finding.reason)}[/dim]"
            if "backends" in finding.extra:
                what += "\n" + backends_summary(finding.extra["backends"], finding.extra.get("emission"))
            if "self_us" in finding.extra:
                what += (f"\n[bold]measured: {finding.extra['self_us'] / 1000:.3f} ms/step, "
                         f"{finding.extra['share']:.1%} of the step[/bold]")
            cell = f":cell {finding.extra['cell']}" if "cell" in finding.extra else ""  # a notebook's lines are a cell's
            location = f"{short_path(finding.path)}{cell}:{finding.line}\n[dim]{shown(finding.function)}[/dim]"
            table.add_row(location, finding.rule, fix, what)
        console.print(table)
    elif not quiet:
        console.print(f"advisor: no findings in {files_scanned} file(s)")


_MARKS = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "[yellow]?[/yellow]"}


def backends_summary(backends: dict, emission: dict | None) -> str:
    """The backend verdicts on one line (reasons for refusals; `?` = not known statically), variants that
    would be eligible, and what `--backend` emitted when it was not plain SDPA."""
    verdicts, variants = [], []
    for name, verdict in backends.items():
        text = f"{name} {_MARKS[verdict['eligible']]}"
        if verdict["eligible"] is False:
            text += f" [dim]({shown(verdict['reason'])})[/dim]"
        verdicts.append(text)
        if verdict.get("variant") and verdict["variant"] not in variants:
            variants.append(verdict["variant"])
    lines = ["backends: " + ", ".join(verdicts)] + [f"[dim]variant: {shown(variant)}[/dim]" for variant in variants]
    if emission and emission["requested"] != "sdpa":
        lines.append(f"[bold]--backend {emission['requested']}:[/bold] emitted {emission['emitted']}"
                     + (f" [dim]({shown(emission['reason'])})[/dim]" if emission["reason"] else ""))
    return "\n".join(lines)


def print_errors(errors: list[ScanError]) -> None:
    """On stderr, one line each however long the path (not wrapped at the console's width)."""
    console = Console(file=sys.stderr, highlight=False, emoji=False)
    for error in errors:
        console.print(f"[red]error[/red] {short_path(error.path)}: {shown(error.message)}", highlight=False,
                      soft_wrap=True)


def print_diff(console: Console, diff: str) -> None:
    """Highlighted on a terminal; elsewhere (a pipe, a file, also with FORCE_COLOR set) the patch text as it is, so
    `git apply` takes it. On a terminal no line is cut at its width (a change past column 80 showed identical `-`
    and `+` lines) and control characters are shown as `\\xNN`, never sent (breaker round 16)."""
    if not _is_tty(console.file):
        console.file.write(diff if diff.endswith("\n") or not diff else diff + "\n")
        return
    text = printable(diff.replace("\r\n", "\n"))
    width = max([console.width, *(len(line) + 1 for line in text.splitlines())])
    console.print(Syntax(text, "diff", theme="ansi_dark", background_color="default", word_wrap=False,
                         code_width=width), crop=False, soft_wrap=True)


def _is_tty(file) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError, OSError):
        return False

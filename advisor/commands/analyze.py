"""`advisor analyze TRACE_FILE_OR_DIR`: findings from Chrome/Kineto traces recorded elsewhere (one per rank)."""

from __future__ import annotations

import json
import sys

from rich.console import Console

from advisor.errors import AdvisorError
from advisor.contracts.finding import display_path
from advisor.commands.common import status as status_display
from advisor.report.profile_console import print_measured
from advisor.report.terminal import shown, stdout_console
from advisor.runtime.trace_analysis import analyze_path


def add_parser(sub) -> None:
    parser = sub.add_parser("analyze", help="find hot spots in torch.profiler traces from other machines")
    parser.add_argument("trace", metavar="TRACE_FILE_OR_DIR")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def run(args) -> int:
    """Exit 2 when a trace could not be analysed (the others are still reported), else 1 when findings remain.
    JSON is one object also when no trace could be read (its errors say why); text is then one error line."""
    with status_display(Console(stderr=True), "reading traces"):
        report = analyze_path(args.trace)
    code = 2 if report.errors else 1 if report.findings else 0
    if args.format == "json":
        print(json.dumps(report.to_json(), indent=2, allow_nan=False))
        return code
    if not report.traces:
        raise AdvisorError("; ".join(f"{error.path}: {error.message}" for error in report.errors))
    for error in report.errors:
        print(f"advisor: error: {display_path(error.path)}: {error.message}", file=sys.stderr)
    ranks = sorted({t.rank for t in report.traces})
    summary = [f"{len(report.traces)} trace(s), rank(s) {', '.join(map(str, ranks))}",
               "time by category: " + ", ".join(f"{row['category']} {row['share']:.0%}" for row in report.breakdown)]
    summary += [f"[dim]could not determine: {shown(note)}[/dim]" for note in report.limitations]
    print_measured(stdout_console(), "advisor analyze: findings (mean per rank and step)",
                   report.findings, summary)
    return code

"""`advisor analyze TRACE_FILE_OR_DIR`: findings from Chrome/Kineto traces recorded elsewhere (one per rank)."""

from __future__ import annotations

import json

from rich.console import Console

from advisor.report.profile_console import print_measured
from advisor.report.terminal import shown, stdout_console
from advisor.runtime.analyze import analyze_path


def add_parser(sub) -> None:
    parser = sub.add_parser("analyze", help="find hot spots in torch.profiler traces from other machines")
    parser.add_argument("trace", metavar="TRACE_FILE_OR_DIR")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def run(args) -> int:
    with Console(stderr=True).status("reading traces"):
        report = analyze_path(args.trace)
    if args.format == "json":
        print(json.dumps(report.to_json(), indent=2))
        return 1 if report.findings else 0
    ranks = sorted({t.rank for t in report.traces})
    summary = [f"{len(report.traces)} trace(s), rank(s) {', '.join(map(str, ranks))}",
               "time by category: " + ", ".join(f"{row['category']} {row['share']:.0%}" for row in report.breakdown)]
    summary += [f"[dim]could not determine: {shown(note)}[/dim]" for note in report.limitations]
    print_measured(stdout_console(), "advisor analyze: findings (mean per rank and step)",
                   report.findings, summary)
    return 1 if report.findings else 0

"""`advisor scan PATH...`: report findings (text table, JSON, SARIF, or the diffs)."""

from __future__ import annotations

import json

from advisor.commands.common import add_selection_arguments, run_scan
from advisor.report.terminal import stdout_console
from advisor.report.findings_console import print_diff, print_findings
from advisor.report.sarif import to_sarif


def add_parser(sub) -> None:
    parser = sub.add_parser("scan", help="find slow patterns in source files")
    add_selection_arguments(parser)
    parser.add_argument("--format", choices=("text", "json", "sarif", "diff"), default="text")
    parser.add_argument("--profile", metavar="TARGET", default=None,
                        help="run TARGET (file.py:function) under the profiler and rank findings by measured time")
    parser.set_defaults(run=run)


def run(args) -> int:
    result = run_scan(args)
    findings = result.findings
    if args.profile:
        findings = _with_measured_cost(findings, args.profile)
    if args.format == "json":
        print(json.dumps({"version": 1, "files_scanned": len(result.files),
                          "findings": [f.to_json() for f in findings],
                          "errors": [e.to_json() for e in result.errors]}, indent=2))
    elif args.format == "sarif":
        print(json.dumps(to_sarif(findings), indent=2))
    elif args.format == "diff":
        console = stdout_console()
        for finding in findings:
            if finding.patch:
                print_diff(console, finding.patch)
    else:
        print_findings(stdout_console(), findings, result.errors, len(result.files))
    return 1 if findings else 0


def _with_measured_cost(findings, target: str):
    """Static findings annotated with self_us/share/calls from a profiled run, most expensive first."""
    from advisor.commands.profile import profile_in_child
    from advisor.runtime.join import annotate_findings

    return annotate_findings(findings, profile_in_child(target)["findings"])

"""`advisor scan PATH...`: report findings (text table, JSON, SARIF, or the diffs)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from advisor.commands.common import add_selection_arguments, exit_code, file_diff, is_machine_format, run_scan
from advisor.commands.profile import ends_what_the_workload_left, profile_in_child
from advisor.contracts.finding import Finding, ScanError, display_path
from advisor.errors import AdvisorError, visible
from advisor.report.findings_console import print_diff, print_errors, print_findings
from advisor.report.github import github_annotations
from advisor.report.sarif import to_sarif
from advisor.report.terminal import stdout_console, write_report
from advisor.results import ScanReport
from advisor.runtime.join import annotate_findings

if TYPE_CHECKING:  # the scanner imports libcst: only the verb's run needs it
    from advisor.engine.static import ScanResult


def add_parser(sub) -> None:
    parser = sub.add_parser("scan", help="find slow patterns in source files")
    add_selection_arguments(parser)
    parser.add_argument("--format", choices=("text", "json", "sarif", "github", "diff"), default="text",
                        help="github: workflow commands that annotate the findings' lines in a pull request")
    parser.add_argument("--profile", metavar="TARGET", default=None,
                        help="run TARGET (file.py:function) under the profiler and rank findings by measured time")
    parser.set_defaults(run=run)


@ends_what_the_workload_left  # --profile runs it
def run(args) -> int:
    """With --profile, the workload runs first: its measured copies and casts are joined to the source as
    `fix --profile` joins them (the same findings, with the same patches), and every finding gets its cost."""
    try:
        # the text table shows no patch; the diffs are each file's fixes applied together, as `fix` shows them
        result, findings = scanned(args, patches=args.format != "text", fixed=args.format == "diff")
    except ProfileFailed as exc:
        if not is_machine_format(args):
            raise
        from advisor.engine.static import ScanResult  # a reader of the document gets one, its error saying why

        print(f"advisor: error: {exc}", file=sys.stderr)
        result, findings = ScanResult(errors=[ScanError(args.profile, f"--profile: {exc}")]), []
    return write_report(lambda: _render(args.format, result, findings, args.unsafe_fixes,
                                        getattr(args, "quiet", False)), exit_code(result, bool(findings)))


class ProfileFailed(AdvisorError):
    """`--profile`'s workload could not be run, so the scan is not run either: one error line and exit 2, and for
    `--format json|sarif|github` a document whose `errors` say so (breaker round 18: it printed none)."""


def scanned(args, patches: bool = True, fixed: bool = False) -> tuple[ScanResult, list[Finding]]:
    """The scan (the CLI's and advisor.scan's one path) and its findings, each joined to its measured cost when
    args.profile names a workload (ProfileFailed where it cannot run)."""
    try:
        profiled = profile_in_child(args.profile) if args.profile else None
    except AdvisorError as exc:
        raise ProfileFailed(str(exc)) from None
    result = run_scan(args, runtime=profiled.evidence if profiled else None, patches=patches, fixed=fixed)
    findings = result.findings
    if profiled:
        findings = annotate_findings(findings, profiled.findings)
    return result, findings


def _render(output_format: str, result: ScanResult, findings: list[Finding], unsafe_fixes: bool,
            quiet: bool = False) -> None:
    """Every format carries the errors: in the document (JSON, SARIF), or on stderr beside a patch (diff). The
    diffs are what `fix` would apply, one a file with its fixes applied together (per-finding patches, each against
    the original, overlap where two fixes are near: `git apply` refused them, promise round 33): unsafe ones only
    with --unsafe-fixes, each named on a comment line above its file's diff that says so and why (`patch` and
    `git apply` skip such lines). JSON lists every patch with its fix_safety."""
    if output_format == "json":
        print(json.dumps(ScanReport(1, len(result.files), findings, result.errors).to_json(), indent=2))
    elif output_format == "sarif":
        print(json.dumps(to_sarif(findings, result.errors, len(result.files)), indent=2))
    elif output_format == "github":
        for line in github_annotations(findings, result.errors):
            print(line)
    elif output_format == "diff":
        print_errors(result.errors)
        console = stdout_console()
        for file in result.files:
            applicable = file.applicable(unsafe_fixes)
            if not applicable or file.applied.text == file.source:
                continue
            for finding in applicable:
                if finding.fix_safety != "safe":
                    console.print(f"# {finding.rule} UNSAFE fix (--unsafe-fixes): {finding.reason} (line "
                                  f"{finding.line})", markup=False, highlight=False, soft_wrap=True)
            try:
                print_diff(console, file_diff(file, file.applied.text))
            except AdvisorError as exc:
                print(f"advisor: error: {visible(display_path(file.path))}: {visible(str(exc))}", file=sys.stderr)
    else:
        print_findings(stdout_console(), findings, result.errors, len(result.files), quiet)

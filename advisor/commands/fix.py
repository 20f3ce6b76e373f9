"""`advisor fix PATH...`: show the patches as diffs; `--apply` writes them, `--interactive` asks per patch."""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING

from advisor.commands.common import EXIT_ERROR, add_selection_arguments, exit_code, file_diff, run_scan
from advisor.commands.profile import ends_what_the_workload_left, profile_in_child
from advisor.commands.review import APPLY, QUIT, ask_to_apply
from advisor.report.terminal import shown, stdout_console, write_report
from advisor.errors import AdvisorError, visible
from advisor.contracts.finding import display_path
from advisor.report.findings_console import print_diff, print_errors
from advisor.results import FileFix, FixReport
from advisor.rewrite.patch import resolve_inside, write_atomically

if TYPE_CHECKING:  # the scanner imports libcst: only the verb's run needs it
    from advisor.engine.static import ScanResult


def add_parser(sub) -> None:
    parser = sub.add_parser("fix", help="rewrite slow patterns (diff by default)")
    add_selection_arguments(parser)
    parser.add_argument("--apply", action="store_true", help="write the fixes to the files")
    parser.add_argument("--interactive", action="store_true", help="ask y/n/q for each patch, then write")
    parser.add_argument("--force-readonly", action="store_true",
                        help="also rewrite read-only files (their mode, owner and group are kept)")
    parser.add_argument("--profile", metavar="TARGET", default=None,
                        help="run TARGET (file.py:function) under the profiler and also fix the copies and casts it "
                             "measured (without it, only statically provable copy/cast fixes are offered)")
    parser.set_defaults(run=run)


@ends_what_the_workload_left  # --profile runs it
def run(args) -> int:
    """Exit 2 when a fix could not be written (each such file is one error line; the other files are still
    fixed), else 1 when findings remain. --interactive scans in this process, so the answers pick among the
    findings' own fixes, which the rewrite layer then applies together."""
    console = stdout_console()
    report, scanned = fix_paths(args, ask=partial(_ask, console) if args.interactive else None,
                       on_scanned=lambda result: print_errors(result.errors))
    failures = [file for file in report.files if file.error]
    code = EXIT_ERROR if failures else exit_code(scanned, report.remaining > 0)
    return write_report(partial(_print_report, args, console, report, failures), code)


def _print_report(args, console, report: FixReport, failures: list[FileFix]) -> None:
    """The diffs (or what was written) and the errors; a reader that leaves early (`fix | head`) keeps the code."""
    for file in report.files:
        if not (args.apply or args.interactive):
            print_diff(console, file.diff)
            continue
        for problem in file.problems:  # a conflict leaves that finding to a later run; it is no write error
            print(f"advisor: {visible(problem)}", file=sys.stderr)
        if file.written and not args.quiet:
            console.print(f"fixed {shown(display_path(file.written))}")
    for failure in failures:
        print(f"advisor: error: {visible(display_path(failure.path))}: {visible(failure.error)}", file=sys.stderr)
    if (args.apply or args.interactive) and not args.quiet:
        not_written = f", {len(failures)} file(s) not written" if failures else ""
        written = sum(1 for file in report.files if file.written)
        console.print(f"advisor: {written} file(s) rewritten, {report.remaining} finding(s) remain{not_written}")


def fix_paths(args, ask=None, on_scanned=lambda result: None) -> tuple[FixReport, ScanResult]:
    """The fixes of the scanned files (the CLI's and advisor.fix's one path): each file's applicable fixes (safe,
    and unsafe with args.unsafe_fixes), or those `ask(findings) -> (chosen, quit)` picks, applied together by the
    rewrite layer and written when args.apply. Returns the report and the scan it came from (for the exit code).
    Each file's fixes are applied until they settle, in memory, before anything is shown or written
    (engine.static.FIX_ROUNDS): the diff shown is what `--apply` writes, in one write a file."""
    runtime = _profiled(args.profile) if args.profile else None
    interactive = ask is not None
    result = run_scan(args, runtime=runtime, patches=interactive, fixed=not interactive,
                      jobs=1 if interactive else None)
    on_scanned(result)
    remaining, files = 0, []
    quit_requested = False
    written: set[str] = set()
    for file in result.files:
        if runtime is not None and not args.unsafe_fixes and not args.quiet:
            _note_observed(file.findings, args.profile)
        applicable = file.applicable(args.unsafe_fixes)
        if not applicable or (interactive and quit_requested):
            remaining += len(file.findings)
            continue
        chosen = applicable
        if interactive:
            chosen, quit_requested = ask(applicable)
        outcome = file.fixed_with(chosen) if interactive else file.applied
        fixed = FileFix(file.path, "", problems=list(outcome.problems))
        left = len(file.findings)
        try:
            fixed.diff = file_diff(file, outcome.text)
            if args.apply or interactive:
                fixed.written = _write(file, outcome.text, args, written) if outcome.text != file.source else None
                left = outcome.left if outcome.left is not None else \
                    len(file.findings) - len(chosen) + outcome.not_applied
        except AdvisorError as exc:
            fixed.error = str(exc)
        remaining += left
        if outcome.text != file.source or fixed.error:
            files.append(fixed)
    report = FixReport(1, len(result.files), bool(args.apply or interactive), files, remaining, result.errors)
    return report, result


def _write(file, new_text: str, args, written: set[str]) -> str | None:
    """Write through links to the real file, once, and only inside the scanned paths (README: "Writes"); a
    notebook gets its fixed cells written into its JSON. Returns the file written, None when it already was."""
    target = resolve_inside(file.path, args.paths)
    if target in written:
        return None
    before, after = file.source, new_text
    if file.notebook is not None:
        try:
            before, after = file.notebook.raw, file.notebook.with_code(new_text)
        except ValueError as exc:
            raise AdvisorError(str(exc)) from None
    write_atomically(target, before, after, force_readonly=args.force_readonly)
    written.add(target)
    return target


def _note_observed(findings, target: str) -> None:
    """An unsafe patch whose unproved facts all held on the profiled run is still not applied; say where it can
    be verified (facts from the run, README "How `optimize` verifies a patch")."""
    for finding in findings:
        if finding.extra.get("discharged") == "observed":
            where = f"{visible(display_path(finding.path))}:{finding.line} {finding.rule}"
            print(f"advisor: {where}: not applied (unsafe); its unproved facts held on every call of the profiled "
                  f"run: `advisor optimize {visible(target)}` verifies it on that workload", file=sys.stderr)


def _ask(console, findings):
    """y/n/q per patch: (the findings accepted, whether the user quit)."""
    chosen = []
    for finding in findings:
        label = "" if finding.fix_safety == "safe" else " [yellow](UNSAFE fix)[/yellow]"
        where = f"{shown(display_path(finding.path))}:{finding.line}"
        console.print(f"\n{where} {finding.rule} {shown(finding.message)}{label}")
        answer = ask_to_apply(console, finding.patch)
        if answer == QUIT:  # also at the end of input: keep what was accepted
            return chosen, True
        if answer == APPLY:
            chosen.append(finding)
    return chosen, False


def _profiled(target: str):
    """The runtime evidence of one profiled run of TARGET (in a worker process, as `scan --profile` runs it),
    joined to the scanned files by realpath and line."""
    return profile_in_child(target).evidence

"""`advisor fix PATH...`: show the patches as diffs; `--apply` writes them, `--interactive` asks per patch."""

from __future__ import annotations

import sys

from advisor.commands.common import EXIT_ERROR, add_selection_arguments, exit_code, run_scan
from advisor.commands.profile import ends_what_the_workload_left, profile_in_child
from advisor.commands.review import APPLY, QUIT, ask_to_apply
from advisor.report.terminal import shown, stdout_console
from advisor.errors import AdvisorError, visible
from advisor.findings import ScanError, display_path
from advisor.report.findings_console import print_diff, print_errors
from advisor.rewrite.patch import resolve_inside, unified_diff, write_atomically


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
    runtime = _profiled(args.profile) if args.profile else None
    result = run_scan(args, runtime=runtime, patches=args.interactive, fixed=not args.interactive,
                      jobs=1 if args.interactive else None)
    console = stdout_console()
    print_errors(console, result.errors)
    remaining, applied, failures = 0, 0, []
    quit_requested = False
    written: set[str] = set()
    for file in result.files:
        if runtime is not None and not args.unsafe_fixes:
            _note_observed(file.findings, args.profile)
        applicable = file.applicable(args.unsafe_fixes)
        remaining += len(file.findings) - len(applicable)
        if not applicable:
            continue
        chosen = applicable
        try:
            if args.interactive and not quit_requested:
                chosen, quit_requested = _ask(console, applicable)
                remaining += len(applicable) - len(chosen)
                outcome = file.fixed_with(chosen)
            elif args.interactive:
                remaining += len(applicable)
                continue
            else:
                outcome = file.applied
                if not args.apply:
                    print_diff(console, unified_diff(display_path(file.path), file.source, outcome.text))
                    remaining += len(applicable)
                    continue
            remaining += outcome.not_applied
            for problem in outcome.problems:  # a conflict leaves that finding to a later run; it is no write error
                print(f"advisor: {visible(problem)}", file=sys.stderr)
            target = _write(file, outcome.text, args, written) if outcome.text != file.source else None
            if target is not None:
                applied += 1
                console.print(f"fixed {shown(display_path(target))}")
        except AdvisorError as exc:
            failures.append(ScanError(file.path, str(exc)))
            remaining += len(chosen)
    for failure in failures:
        print(f"advisor: error: {visible(display_path(failure.path))}: {visible(failure.message)}", file=sys.stderr)
    if args.apply or args.interactive:
        not_written = f", {len(failures)} file(s) not written" if failures else ""
        console.print(f"advisor: {applied} file(s) rewritten, {remaining} finding(s) remain{not_written}")
    return EXIT_ERROR if failures else exit_code(result, remaining > 0)


def _write(file, new_text: str, args, written: set[str]) -> str | None:
    """Write through links to the real file, once, and only inside the scanned paths (README: "Writes").
    Returns the file written, None when it already was."""
    target = resolve_inside(file.path, args.paths)
    if target in written:
        return None
    write_atomically(target, file.source, new_text, force_readonly=args.force_readonly)
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
    return profile_in_child(target)["evidence"]

"""`advisor fix PATH...`: show the patches as diffs; `--apply` writes them, `--interactive` asks per patch."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.prompt import Prompt

from advisor.commands.common import EXIT_ERROR, add_selection_arguments, exit_code, run_scan
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


def run(args) -> int:
    """Exit 2 when a fix could not be written (each such file is one error line; the other files are still
    fixed), else 1 when findings remain."""
    args.runtime = _profiled(args.profile) if args.profile else None
    result = run_scan(args, runtime=args.runtime)
    console = stdout_console()
    print_errors(console, result.errors)
    remaining, applied, failures = 0, 0, []
    quit_requested = False
    written: set[str] = set()
    for file in result.files:
        applicable = [f for f in file.findings if f.patch and (f.fix_safety == "safe" or args.unsafe_fixes)]
        remaining += len(file.findings) - len(applicable)
        if not applicable:
            continue
        chosen = applicable
        try:
            if args.interactive and not quit_requested:
                chosen, quit_requested = _ask(console, applicable)
                remaining += len(applicable) - len(chosen)
                new_text = _fixed_with(file, chosen, args) if chosen else file.source
            elif args.interactive:
                remaining += len(applicable)
                continue
            else:
                new_text = file.fixed
                if not args.apply:
                    print_diff(console, unified_diff(display_path(file.path), file.source, new_text))
                    remaining += len(applicable)
                    continue
            target = _write(file, new_text, args, written) if new_text != file.source else None
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


def _ask(console, findings):
    chosen = []
    for finding in findings:
        label = "" if finding.fix_safety == "safe" else " [yellow](UNSAFE fix)[/yellow]"
        where = f"{shown(display_path(finding.path))}:{finding.line}"
        console.print(f"\n{where} {finding.rule} {shown(finding.message)}{label}")
        print_diff(console, finding.patch)
        try:
            answer = Prompt.ask("apply this patch?", choices=["y", "n", "q"], default="n", console=console)
        except EOFError:  # input ended (a closed pipe, Ctrl-D): quit, keeping what was accepted
            answer = "q"
        if answer == "q":
            return chosen, True
        if answer == "y":
            chosen.append(finding)
    return chosen, False


def _fixed_with(file, chosen, args) -> str:
    """Re-run the rewrite restricted to the chosen findings (by rule and line)."""
    from advisor.scan import analyze_source  # libcst: imported when the verb runs, not to build the CLI

    keep = {(f.rule, f.line) for f in chosen}
    result = analyze_source(file.source, file.path, unsafe_fixes=args.unsafe_fixes, select=args.select,
                            ignore=args.ignore, only=keep, backend=args.backend, runtime=args.runtime)
    if result.source != file.source:
        raise AdvisorError("changed while reviewing; not written")
    return result.fixed


def _profiled(target: str):
    """The runtime evidence of one profiled run of TARGET, joined to the scanned files by realpath and line."""
    from advisor.fixes.evidence import evidence_from_report
    from advisor.runtime.profile import profile_workload
    from advisor.workload_loader import load_workload

    with Console(stderr=True).status("profiling") as status:
        report = profile_workload(load_workload(target), target, progress=lambda message: status.update(message))
    return evidence_from_report(report)

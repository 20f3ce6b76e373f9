"""`advisor fix PATH...`: show the patches as diffs; `--apply` writes them, `--interactive` asks per patch."""

from __future__ import annotations

from rich.prompt import Prompt

from advisor.commands.common import add_selection_arguments, run_scan
from advisor.report.terminal import stdout_console
from advisor.errors import AdvisorError
from advisor.findings import display_path
from advisor.report.findings_console import print_diff
from advisor.rewrite.patch import unified_diff, write_atomically
from advisor.scan import analyze_source


def add_parser(sub) -> None:
    parser = sub.add_parser("fix", help="rewrite slow patterns (diff by default)")
    add_selection_arguments(parser)
    parser.add_argument("--apply", action="store_true", help="write the fixes to the files")
    parser.add_argument("--interactive", action="store_true", help="ask y/n/q for each patch, then write")
    parser.set_defaults(run=run)


def run(args) -> int:
    result = run_scan(args)
    console = stdout_console()
    remaining, applied = 0, 0
    quit_requested = False
    for file in result.files:
        applicable = [f for f in file.findings if f.patch and (f.fix_safety == "safe" or args.unsafe_fixes)]
        remaining += len(file.findings) - len(applicable)
        if not applicable:
            continue
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
        if new_text != file.source:
            write_atomically(file.path, file.source, new_text)
            applied += 1
            console.print(f"fixed {display_path(file.path)}")
    if args.apply or args.interactive:
        console.print(f"advisor: {applied} file(s) rewritten, {remaining} finding(s) remain")
    return 1 if remaining else 0


def _ask(console, findings):
    chosen = []
    for finding in findings:
        label = "" if finding.fix_safety == "safe" else " [yellow](UNSAFE fix)[/yellow]"
        console.print(f"\n{display_path(finding.path)}:{finding.line} {finding.rule} {finding.message}{label}")
        print_diff(console, finding.patch)
        answer = Prompt.ask("apply this patch?", choices=["y", "n", "q"], default="n", console=console)
        if answer == "q":
            return chosen, True
        if answer == "y":
            chosen.append(finding)
    return chosen, False


def _fixed_with(file, chosen, args) -> str:
    """Re-run the rewrite restricted to the chosen findings (by rule and line)."""
    keep = {(f.rule, f.line) for f in chosen}
    result = analyze_source(file.source, file.path, unsafe_fixes=args.unsafe_fixes, select=args.select,
                            ignore=args.ignore, only=keep, backend=args.backend)
    if result.source != file.source:
        raise AdvisorError(f"{file.path}: changed while reviewing")
    return result.fixed

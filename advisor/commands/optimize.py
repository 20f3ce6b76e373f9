"""`advisor optimize [TARGET]`: profile, patch, then re-measure every patch (parity and speedup) and report.

Without TARGET it runs the bundled demo (advisor/demo/gpt.py) from a temporary copy, so --apply never edits the
installed package. Exit codes: 0 when every verified patch was applied or there was nothing to verify, 1 when
verified patches remain unapplied, 2 for bad input or a workload that could not run at all (or left processes
running)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
from functools import partial
from importlib import resources

from rich.console import Console

from advisor.commands.common import add_backend_argument, add_call_site_argument
from advisor.commands.common import status as status_display
from advisor.commands.profile import (CALLS_WITHOUT_SCRIPT, add_workload_arguments, ends_what_the_workload_left,
                                      seconds, workload_source)
from advisor.commands.review import APPLY, QUIT, ask_to_apply
from advisor.contracts.rule_choice import RuleChoice
from advisor.errors import shell_join
from advisor.results import OptimizeReport
from advisor.verify.report_folder import ReportFolder
from advisor.report.optimize_console import print_optimize
from advisor.report.optimize_html import render_html
from advisor.report.optimize_markdown import render_markdown
from advisor.report.terminal import shown, stdout_console

DEMO_FUNCTION = "workload"


def add_parser(sub) -> None:
    parser = sub.add_parser("optimize", help="patch, then re-measure each patch's parity and speedup")
    parser.add_argument("target", nargs="?", metavar="TARGET",
                        help="path/to/file.py:function or package.module:function; or, after `--`, a script: "
                             "`advisor optimize -- python infer.py ARGS` (default: the bundled demo)")
    parser.add_argument("--apply", action="store_true", help="write the verified patches")
    parser.add_argument("--interactive", action="store_true",
                        help="ask before writing each verified patch (implies --apply)")
    parser.add_argument("--force-readonly", action="store_true",
                        help="also rewrite read-only files (their mode, owner and group are kept)")
    parser.add_argument("--report", metavar="DIR", help="folder for the reports, traces and logs (default: a new "
                                                        "temporary folder)")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    parser.add_argument("--unsafe-fixes", action=argparse.BooleanOptionalAction, default=None,
                        help="also verify patches marked unsafe")
    parser.add_argument("--timing-budget", type=seconds, default=4.0, metavar="S",
                        help="seconds of interleaved timing per comparison (default 4; at least 12 rounds run)")
    add_backend_argument(parser, "attention patches target sdpa, flash (SDPA pinned to the flash kernel) or flash-attn")
    add_call_site_argument(parser)
    parser.add_argument("--root", default=".", metavar="DIR",
                        help="--apply writes only under this folder (default: the current directory)")
    add_workload_arguments(parser)
    parser.set_defaults(run=run, select=None, ignore=None)  # [tool.advisor]'s, which settle fills


@ends_what_the_workload_left
def run(args) -> int:
    stderr = Console(stderr=True)
    with status_display(stderr, "starting") as status:
        review = partial(_review, stderr, status) if args.interactive else None
        result = optimized(args, progress=status.update, review=review,
                           say=lambda message: stderr.print(message, highlight=False))
    _print(result.to_json(), args.format)
    unapplied = [p for p in result.patches if p.verified and not p.applied]
    return 1 if unapplied else 0


def rule_choice(args) -> RuleChoice:
    """[tool.advisor]'s select, ignore and paths, which `settle` put on `args` (optimize has no flags for them)."""
    return RuleChoice(tuple(args.select) if args.select is not None else None, tuple(args.ignore or ()),
                      getattr(args, "path_rules", None))


def optimized(args, progress=lambda message: None, review=None, say=lambda message: None) -> OptimizeReport:
    """The optimize result with its reports written (the CLI's and advisor.optimize's one path). Without a TARGET
    the bundled demo runs from a temporary copy (`say` tells where)."""
    from advisor.runtime.runner import resolve_device  # torch: imported when the verb runs, not to build the CLI
    from advisor.verify.optimize_pipeline import Options, optimize

    if args.device:
        resolve_device(args.device)
    root, script = args.root, args.script
    target = workload_source(args)[0] if args.script is not None or args.target is not None else None
    if target is None:
        target, root = _demo_copy()
        say(f"advisor: no TARGET given: running the bundled demo from a copy in {root}")
    report_dir = os.path.abspath(args.report or tempfile.mkdtemp(prefix="advisor-optimize-"))
    options = Options(target=target, report_dir=report_dir, root=root, device=args.device, dtype=args.dtype,
                      train=args.train, unsafe_fixes=args.unsafe_fixes, backend=args.backend,
                      call_site_facts=args.call_site_facts, apply=args.apply or args.interactive,
                      force_readonly=args.force_readonly,
                      timeout_s=args.timeout, timing_budget_s=args.timing_budget, script=script,
                      seeds=(args.calls or Options.seeds) if script is not None else Options.seeds, review=review,
                      rules=rule_choice(args))
    result = optimize(options, progress=progress)
    result.report = os.path.join(report_dir, "report.html")
    result.notes += unchanged_flags(args, result)
    unapplied = [p for p in result.patches if p.verified and not p.applied]
    observed = any(p.discharged == "observed" for p in unapplied) and not options.unsafe_fixes
    result.apply_command = apply_command(args, observed) if unapplied and (observed or not args.apply) else None
    _write_reports(result, report_dir)
    return result


def _review(console: Console, status, patches: list[dict]) -> list[str]:
    """The ids of the verified patches the user accepts; the spinner pauses while the question is open."""
    status.stop()
    accepted = []
    try:
        for patch in patches:
            lo, hi = patch["speedup_ci"]
            console.print(f"\n{shown(patch['path'])}:{patch['line']} {patch['rule']} {patch['label']}: "
                          f"{patch['speedup']:.2f}x faster (95% interval {lo:.2f}-{hi:.2f}), "
                          f"max abs error {patch['max_abs_err']:.1e}", highlight=False)
            answer = ask_to_apply(console, patch["diff"])
            if answer == QUIT:
                break
            if answer == APPLY:
                accepted.append(patch["id"])
    finally:
        status.start()
    return accepted


def _demo_copy() -> tuple[str, str]:
    """The demo model copied into a fresh temporary folder: (TARGET, the folder as --root)."""
    folder = tempfile.mkdtemp(prefix="advisor-demo-")
    with resources.as_file(resources.files("advisor.demo") / "gpt.py") as source:
        shutil.copyfile(source, os.path.join(folder, "gpt.py"))
    return f"{os.path.join(folder, 'gpt.py')}:{DEMO_FUNCTION}", folder


def unchanged_flags(args, result: OptimizeReport) -> list[str]:
    """A line for each flag given that changed nothing in this run, so its silence is not read as an effect."""
    lines = []
    if args.unsafe_fixes and not any(p.fix_safety != "safe" for p in result.patches):
        lines.append("--unsafe-fixes changed nothing: no patch of the code that ran is marked unsafe")
    if args.calls is not None and args.script is None:
        lines.append(CALLS_WITHOUT_SCRIPT)
    return lines


def apply_command(args, observed: bool = False) -> str:
    """The command line of this run with `--apply` added (before a script's `--`; `--interactive`, whose declined
    patches it writes, dropped), and `--unsafe-fixes` where a verified patch rests on facts observed in the run: what
    writes its verified patches. It runs the verification
    again; only what verifies then is written."""
    words = list(args.argv)
    at = words.index("--") if "--" in words else len(words)
    words, at = [w for w in words[:at] if w != "--interactive"] + words[at:], at - words[:at].count("--interactive")
    added = [flag for flag, wanted in (("--apply", True), ("--unsafe-fixes", observed)) if wanted and flag not in words]
    return "advisor " + shell_join(words[:at] + added + words[at:])


def _write_reports(result: OptimizeReport, folder: str) -> None:
    """result.json, report.md and the self-contained report.html (result.report) in the report folder, and
    each verified patch's diff as patches/ID.diff (its path in the patch's `diff_file`)."""
    with ReportFolder(folder) as report:
        for patch in result.patches:
            if patch.verified and patch.diff:
                name = "patches/" + re.sub(r"[^\w.-]", "_", patch.id) + ".diff"
                patch.diff_file = report.write_text(name, patch.diff)
        document = result.to_json()
        outputs = {"result.json": json.dumps(document, indent=2), "report.md": render_markdown(document),
                   "report.html": render_html(document)}
        for name, text in outputs.items():
            report.write_text(name, text)


def _print(result: dict, output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(result, indent=2))
    elif output_format == "markdown":
        print(render_markdown(result))
    else:
        print_optimize(stdout_console(), result)

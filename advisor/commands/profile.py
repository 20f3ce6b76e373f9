"""`advisor profile TARGET`: run the workload under the profiler and report measured hot spots by source line.

The workload runs in a child process (advisor.verify.process): its prints, exits, hangs and crashes never reach
this process's stdout or end it; each becomes one error line."""

from __future__ import annotations

import json
import sys
from functools import wraps

from rich.console import Console

from advisor.errors import AdvisorError, visible
from advisor.contracts.finding import display_path
from advisor.report.profile_console import print_measured, print_top_lines
from advisor.report.terminal import shown, stdout_console
from advisor.commands.common import status as status_display
from advisor.runtime.trace_output import check_trace_path, confirm_trace_written
from advisor.verify.messages import Load, Profile, Profiled
from advisor.verify.process import DEFAULT_TIMEOUT_S, start_worker, take_left_running


def add_parser(sub) -> None:
    parser = sub.add_parser("profile", help="measure where a workload's time goes, by source line")
    parser.add_argument("target", nargs="?", metavar="TARGET",
                        help="path/to/file.py:function or package.module:function; or, after `--`, a script: "
                             "`advisor profile -- python train.py ARGS`")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--trace", metavar="FILE", help="also write the Chrome trace of the profiled steps")
    add_workload_arguments(parser)
    parser.set_defaults(run=run)


def add_workload_arguments(parser) -> None:
    """Options shared by the verbs that run a workload (profile, optimize)."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: the workload's, else cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    parser.add_argument("--train", action="store_true", help="forward + backward instead of inference")
    parser.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"stop a workload request that takes longer (default {DEFAULT_TIMEOUT_S:g} s)")
    parser.add_argument("--calls", type=_count, default=None, metavar="N",
                        help=f"script mode: stop the script at its model's N-th call (default {SCRIPT_CALLS}); "
                             "optimize takes the inputs of those N calls as its parity inputs")
    parser.set_defaults(script=None)


# a script runs to its model's third call by default: far enough that a second model called in the same loop is seen
# (and refused, as one model is measured per run), and those calls' inputs are optimize's parity inputs
SCRIPT_CALLS = 3


CALLS_WITHOUT_SCRIPT = ("--calls changed nothing: it sets how many model calls a script after `--` runs for; a "
                        "TARGET function's inputs come from its `seed` argument")


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def workload_source(args) -> tuple[str, list[str] | None]:
    """(TARGET as shown, the script command or None): exactly one of a TARGET and `-- python script.py` is given."""
    if args.script is not None:
        if args.target is not None:
            raise AdvisorError(f"give a TARGET or a script after `--`, not both (got {args.target!r} and a script)")
        from advisor.script import parse_command

        return parse_command(args.script).shown, args.script
    if args.target is None:
        raise AdvisorError("give a TARGET (path/to/file.py:function) or a script: `-- python script.py ARGS`")
    return args.target, None


MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: beyond it (inf, 1e10) the deadline overflows the clock


def seconds(text: str) -> float:
    """A number of seconds above 0 and at most a week (nan, inf and negatives are usage errors)."""
    value = float(text)
    if not 0 < value <= MAX_TIMEOUT_S:
        raise ValueError(text)
    return value


def profile_in_child(target: str, device: str | None = None, dtype: str | None = None, train: bool = False,
                     trace_path: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                     script: list[str] | None = None, calls: int = SCRIPT_CALLS) -> Profiled:
    """Profile TARGET in a worker process (see Worker.profile); a script runs to its model's `calls`-th call."""
    if device:
        from advisor.runtime.runner import resolve_device  # torch: imported when the verb runs, not to build the CLI

        resolve_device(device)  # a missing GPU is a usage error before any process starts
    with status_display(Console(stderr=True), "starting the workload process") as status, \
            start_worker("workload", timeout_s, on_progress=status.update) as worker:
        status.update("loading the workload")
        loaded = worker.call(Load(target, device, dtype, train, script=script, calls=calls),
                             doing=f"running the script to its model's call {calls}" if script else None)
        if loaded.captured:
            status.console.print(f"advisor: {shown(loaded.captured)}", highlight=False, soft_wrap=True)
        return worker.call(Profile(trace_path))


def ends_what_the_workload_left(run_verb):
    """For a verb that runs the workload: processes it started and left running were killed when its worker
    closed (advisor.verify.process); that is one warning line naming them, and exit 2 (the results still print)."""
    @wraps(run_verb)
    def run(args) -> int:
        try:
            code = run_verb(args)
        finally:
            left = take_left_running()
            if left:
                print(f"advisor: warning: the workload left {len(left)} process(es) running after it ended "
                      f"({', '.join(map(visible, left))}); they were killed", file=sys.stderr)
        return 2 if left else code
    return run


def profiled_target(args) -> tuple[str, Profiled]:
    """(TARGET as shown, its profile): the CLI's and advisor.profile's one path, the trace written where asked."""
    target, script = workload_source(args)
    if args.calls is not None and script is None and not getattr(args, "quiet", False):
        print(f"advisor: note: {CALLS_WITHOUT_SCRIPT}", file=sys.stderr)
    trace = check_trace_path(args.trace)
    profiled = profile_in_child(target, args.device, args.dtype, args.train, trace and trace.path, args.timeout,
                                script, args.calls or SCRIPT_CALLS)
    confirm_trace_written(trace)
    return target, profiled


@ends_what_the_workload_left
def run(args) -> int:
    target, profiled = profiled_target(args)
    findings, summary = profiled.findings, profiled.summary
    if args.format == "json":
        print(json.dumps(profiled.document, indent=2))
    else:
        lines = [
            f"{shown(target)}: {summary.device}, {summary.dtype}, {'train' if args.train else 'eval'}; "
            f"step {summary.step_us / 1000:.2f} ms median (unprofiled, IQR {summary.step_iqr_us / 1000:.2f} "
            f"ms); measured op time {summary.op_us / 1000:.2f} ms/step",
            f"op time on a user source line: {summary.statement_share:.1%} (statement), "
            f"{summary.attributed_share:.1%} (statement or function)"]
        if args.trace:
            lines.append(f"Chrome trace written to {shown(display_path(args.trace))}")
        console = stdout_console()
        print_measured(console, "advisor profile: measured findings", findings, lines)
        print_top_lines(console, profiled.document.get("top_lines") or [])
    return 1 if findings else 0

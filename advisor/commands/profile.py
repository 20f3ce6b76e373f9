"""`advisor profile TARGET`: run the workload under the profiler and report measured hot spots by source line."""

from __future__ import annotations

import json

from rich.console import Console

from advisor.findings import display_path
from advisor.report.profile_console import print_measured
from advisor.report.terminal import stdout_console
from advisor.runtime.profile import profile_workload
from advisor.runtime.trace_output import check_trace_path, confirm_trace_written
from advisor.workload_loader import load_workload


def add_parser(sub) -> None:
    parser = sub.add_parser("profile", help="measure where a workload's time goes, by source line")
    parser.add_argument("target", metavar="TARGET", help="path/to/file.py:function or package.module:function")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--trace", metavar="FILE", help="also write the Chrome trace of the profiled steps")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: the workload's, else cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    parser.add_argument("--train", action="store_true", help="profile forward + backward instead of inference")
    parser.set_defaults(run=run)


def run(args) -> int:
    stderr = Console(stderr=True)
    trace = check_trace_path(args.trace)
    with stderr.status("loading the workload") as status:
        workload = load_workload(args.target)
        report = profile_workload(workload, args.target, args.device, args.dtype, args.train, trace and trace.path,
                                  progress=lambda message: status.update(message))
    confirm_trace_written(trace)
    if args.format == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        t = report.timing
        summary = [
            f"{args.target}: {report.capture.device}, {report.capture.dtype}, {'train' if args.train else 'eval'}; "
            f"step {report.capture.step_us / 1000:.2f} ms median (unprofiled, IQR "
            f"{report.capture.step_iqr_us / 1000:.2f} ms); measured op time {t.op_us / 1000:.2f} ms/step",
            f"op time on a user source line: {t.statement_share:.1%} (statement), {t.attributed_share:.1%} "
            "(statement or function)"]
        if args.trace:
            summary.append(f"Chrome trace written to {display_path(args.trace)}")
        print_measured(stdout_console(), "advisor profile: measured findings",
                       report.findings, summary)
    return 1 if report.findings else 0

"""The Python API: advisor.scan / fix / profile / optimize run the CLI's own code paths (the same options, the same
[tool.advisor] configuration, the same JSON) and return the typed results of advisor.results. Nothing is printed:
no progress bar, no notes. Bad input raises advisor.errors.AdvisorError (the CLI's one-line error, exit 2) or
ValueError/TypeError for a bad argument; files that cannot be scanned are the result's `errors`, as in the JSON."""

from __future__ import annotations

from collections.abc import Iterable
from os import PathLike

from advisor.results import FixReport, OptimizeReport, ProfileReport, ScanReport


def scan(paths: str | PathLike | Iterable[str | PathLike], **options) -> ScanReport:
    """`advisor scan PATH... --format json`. Options: select, ignore (codes or prefixes, a list or "ADV1,ADV2"),
    unsafe_fixes, backend, config, force_exclude, profile (a TARGET whose measured costs join the findings)."""
    from advisor.commands.scan import scanned

    args = _arguments("scan", _paths(paths), options, format="json")
    result, findings = scanned(args)
    return ScanReport(1, len(result.files), findings, result.errors)


def fix(paths: str | PathLike | Iterable[str | PathLike], apply: bool = False, **options) -> FixReport:
    """`advisor fix PATH...`: each file's diff, written when `apply`. Options: as scan's, and force_readonly."""
    from advisor.commands.fix import fix_paths

    args = _arguments("fix", _paths(paths), options, format="json", apply=apply)
    report, _ = fix_paths(args)
    return report


def profile(target: str, **options) -> ProfileReport:
    """`advisor profile TARGET --format json`. Options: device, dtype, train, trace (a file for the Chrome trace),
    timeout (seconds)."""
    from advisor.commands.profile import profiled_target

    args = _arguments("profile", [target], options)
    return ProfileReport.from_json(_ending_left_processes(profiled_target, args)[1].document)


def optimize(target: str | None = None, apply: bool = False, **options) -> OptimizeReport:
    """`advisor optimize [TARGET] --format json` (no TARGET: the bundled demo, from a copy). Options: report (the
    report folder), unsafe_fixes, backend, config, root, device, dtype, train, timeout, timing_budget."""
    from advisor.commands.optimize import optimized

    args = _arguments("optimize", [target] if target is not None else [], options, apply=apply)
    return _ending_left_processes(optimized, args)


def _ending_left_processes(produce, args):
    """Run `produce(args)`; processes the workload left running were killed with its worker: that is an error here,
    as it is exit 2 for the CLI."""
    from advisor.errors import AdvisorError
    from advisor.verify.process import take_left_running

    try:
        return produce(args)
    finally:
        left = take_left_running()
        if left:
            raise AdvisorError(f"the workload left {len(left)} process(es) running after it ended "
                               f"({', '.join(left)}); they were killed")


def _paths(paths) -> list[str]:
    if isinstance(paths, (str, PathLike)):
        return [str(paths)]
    return [str(path) for path in paths]


def _arguments(verb: str, positional: list[str], options: dict, **fixed):
    """The verb's argparse namespace as the CLI builds it (its defaults, then the configuration file), with the
    keyword options in place of flags."""
    from advisor.backends import REQUESTABLE
    from advisor.cli import build_parser
    from advisor.config import configure
    from advisor.registry import parse_selectors

    args = build_parser().parse_args([verb, "--", *positional] if positional else [verb])
    for name, value in {**options, **fixed}.items():
        if name not in vars(args) and name not in fixed:
            raise TypeError(f"{verb}() got an unexpected option {name!r}")
        if name in ("select", "ignore") and value is not None:
            value = parse_selectors(value if isinstance(value, str) else ",".join(value))
        if name == "backend" and value is not None and value not in REQUESTABLE:
            raise ValueError(f"backend must be one of {', '.join(REQUESTABLE)}, not {value!r}")
        setattr(args, name, value)
    args.quiet = True
    args.argv = [verb, *positional]  # what optimize's `apply_command` repeats
    configure(args)
    return args

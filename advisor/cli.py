"""Command line: one subcommand module per verb; errors become one line and exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from importlib import import_module

from advisor.errors import AdvisorError, visible

VERBS = ("scan", "fix", "profile", "analyze", "optimize", "rules")
SCRIPT_VERBS = ("profile", "optimize")  # `advisor VERB [options] -- python script.py ARGS`
EXIT_CLEAN, EXIT_ERROR = 0, 2  # 1 (findings remain) is returned by the verbs themselves
DEBUG_HELP = "show tracebacks for errors"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 on usage errors; keep it one line
        self.exit(EXIT_ERROR, f"advisor: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="advisor", description="Find what makes PyTorch model code slow and fix it.")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for verb in VERBS:
        module = import_module(f"advisor.commands.{verb}")
        module.add_parser(sub)
        # accepted after the verb too; SUPPRESS keeps a `--debug` given before the verb from being reset
        sub.choices[verb].add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def split_script(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """For the verbs that run a workload, everything after the first `--` is the user's script command, kept out
    of argparse (its own options are not advisor's)."""
    if "--" not in argv:
        return argv, None
    at = argv.index("--")
    verb = next((word for word in argv[:at] if not word.startswith("-")), None)
    if verb not in SCRIPT_VERBS:
        return argv, None
    return argv[:at], argv[at + 1:]


def script_target(args) -> list[str] | None:
    """`advisor optimize train.py`: a TARGET that names a Python file, with no `:function`, is the script to run as
    it is (`-- python train.py`), as `python train.py` would (its TARGET is then unset)."""
    target = getattr(args, "target", None)
    if args.verb not in SCRIPT_VERBS or target is None or not target.endswith((".py", ".pyw")) or \
            not os.path.isfile(target):
        return None
    args.target = None
    return ["python", target]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv  # known before parsing, so a failure while building the parser obeys it too
    if sys.stdout is None:  # started with its standard output closed (`advisor scan . >&-`): Python gives None
        print("advisor: error: standard output is closed: nothing can be reported", file=sys.stderr)
        return EXIT_ERROR
    try:
        parser = build_parser()
        argv, script = split_script(argv)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # usage errors (2) and --help (0): return the code instead of exiting
            return exc.code if isinstance(exc.code, int) else EXIT_ERROR
        args.argv = argv + (["--", *script] if script is not None else [])  # as given: to repeat the run
        script = script if script is not None else script_target(args)
        if script is not None:
            args.script = script
        from advisor.config import configure

        configure(args)
        return args.run(args)
    except AdvisorError as exc:
        if debug:  # the traceback, with the exit code the error has without --debug
            traceback.print_exc()
            return EXIT_ERROR
        print(f"advisor: error: {visible(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # the reader left before the verb could say how it ended
        from advisor.report.terminal import quiet_stdout

        quiet_stdout()
        return EXIT_CLEAN
    except KeyboardInterrupt:
        print("advisor: interrupted", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the contract is one line, never a traceback
        if debug:
            traceback.print_exc()
            return EXIT_ERROR
        print(f"advisor: error: {type(exc).__name__}: {visible(exc)} (run with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_ERROR

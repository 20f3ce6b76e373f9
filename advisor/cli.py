"""Command line: one subcommand module per verb; errors become one line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from advisor.errors import AdvisorError

VERBS = ("scan", "fix", "profile", "analyze", "optimize", "rules")
EXIT_CLEAN, EXIT_ERROR = 0, 2  # 1 (findings remain) is returned by the verbs themselves


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 on usage errors; keep it one line
        self.exit(EXIT_ERROR, f"advisor: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="advisor", description="Find what makes PyTorch model code slow and fix it.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for verb in VERBS:
        module = import_module(f"advisor.commands.{verb}")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2) and --help (0): return the code instead of exiting
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        return args.run(args)
    except AdvisorError as exc:
        if args.debug:
            raise
        print(f"advisor: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # `advisor scan ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return EXIT_CLEAN
    except KeyboardInterrupt:
        print("advisor: interrupted", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the contract is one line, never a traceback
        if args.debug:
            raise
        print(f"advisor: error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
        return EXIT_ERROR

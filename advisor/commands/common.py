"""Arguments, the run loop and the exit code shared by `scan` and `fix`."""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from advisor.backends import REQUESTABLE
from advisor.errors import AdvisorError, visible
from advisor.registry import parse_selectors
from advisor.contracts.finding import ScanError, display_path, relative_path
from advisor.report.terminal import shown
from advisor.rewrite.patch import unified_diff

if TYPE_CHECKING:  # the scanner imports libcst: only the verb's run needs it
    from advisor.engine.static import ScanResult

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def add_selection_arguments(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders to scan")
    parser.add_argument("--select", type=_codes, default=None, help="only these rule codes or prefixes (ADV1,...)")
    parser.add_argument("--ignore", type=_codes, default=None, help="skip these rule codes or prefixes")
    parser.add_argument("--unsafe-fixes", action=argparse.BooleanOptionalAction, default=None,
                        help="also offer fixes marked unsafe (fix: apply them; scan --format diff: show them, "
                             "labelled)")
    add_backend_argument(parser, "attention rewrites target: sdpa (PyTorch picks the kernel), flash (SDPA pinned to "
                                 "the flash kernel where eligible), flash-attn (the flash_attn package, SDPA fallback), "
                                 "flex (FlexAttention: also soft-capping and index-computed masks SDPA cannot take)")
    add_call_site_argument(parser)
    parser.add_argument("--cache", action=argparse.BooleanOptionalAction, default=None,
                        help="--no-cache: analyse every file afresh, neither reading nor writing the cache of "
                             "each file's results ($XDG_CACHE_HOME/advisor)")
    parser.add_argument("--force-exclude", action=argparse.BooleanOptionalAction, default=None,
                        help="apply the configuration's `exclude` to paths named on the command line too")
    parser.add_argument("--tree", metavar="DIR", default=None,
                        help="read what the whole tree says (hooks, autograd requests, callers, writes elsewhere) "
                             "from every Python file under DIR, and scan or fix only PATH (pre-commit's hooks pass "
                             "the staged files and `--tree .`)")
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument("-q", "--quiet", action="store_true",
                      help="print the findings (or diffs) and errors only: no progress bar, notes or summary lines")
    talk.add_argument("-v", "--verbose", action="store_true",
                      help="also say on stderr which configuration file was read, each file scanned and the time")


def add_backend_argument(parser, help_text: str) -> None:
    """--backend and --config: the options a verb that builds patches reads from [tool.advisor] too."""
    parser.add_argument("--backend", choices=REQUESTABLE, default=None, help=f"{help_text} (default sdpa)")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="read options from FILE (a pyproject.toml's [tool.advisor], or a TOML file of those "
                             "keys) instead of the nearest pyproject.toml with [tool.advisor]")


def add_call_site_argument(parser) -> None:
    parser.add_argument("--call-site-facts", dest="call_site_facts", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="--no-call-site-facts: prove facts from each function's own source only, never from its "
                             "callers in the scanned tree (for a library whose callers live outside it)")


def _codes(text: str) -> list[str]:
    """Comma-separated codes or prefixes; one that names no rule is a usage error (exit 2), never an empty run."""
    try:
        return parse_selectors(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_scan(args, runtime=None, patches: bool = True, fixed: bool = True, jobs: int | None = None) -> ScanResult:
    """Scan with a progress bar on stderr; exit 2 (via AdvisorError) when nothing at all could be scanned.
    `runtime` (advisor.contracts.evidence.RuntimeEvidence) joins a profile's copy/cast findings to the source;
    `patches`, `fixed` and `jobs` are scan_paths' (what the verb shows, and whether it picks fixes afterwards)."""
    from advisor.engine.static import scan_paths  # libcst: loaded by the verbs that scan, not by argument parsing

    tree = getattr(args, "tree", None)
    if tree and not os.path.isdir(tree):  # a typo in a hook's `--tree` dropped the tree's facts, silently
        raise AdvisorError(f"--tree {visible(tree)}: no such folder")
    stderr = Console(stderr=True, highlight=False, soft_wrap=True)
    verbose = getattr(args, "verbose", False)
    if verbose:
        config = getattr(args, "config_path", None)
        where = shown(display_path(str(config))) if config else "none found (defaults)"
        stderr.print(f"advisor: configuration: {where}")
    started = time.monotonic()
    with _ProgressAfterAMoment(stderr, enabled=not getattr(args, "quiet", False)) as progress:
        def on_file(path: str, total: int) -> None:
            progress.advance(f"scanned {shown(display_path(path))}", total)
            if verbose:
                stderr.print(f"advisor: scanned {shown(display_path(path))}")

        result = scan_paths(args.paths, unsafe_fixes=args.unsafe_fixes, select=args.select, ignore=args.ignore,
                            backend=args.backend, runtime=runtime, patches=patches, fixed=fixed, jobs=jobs,
                            call_site_facts=args.call_site_facts, path_rules=getattr(args, "path_rules", None),
                            cache=getattr(args, "cache", True) is not False, on_file=on_file,
                            tree_paths=[args.tree] if getattr(args, "tree", None) else None)
    if verbose:
        stderr.print(f"advisor: {len(result.files)} file(s) scanned, {len(result.errors)} not, in "
                     f"{time.monotonic() - started:.2f} s")
    if result.all_excluded:
        if not getattr(args, "quiet", False):
            stderr.print("advisor: every path named is excluded (`exclude` with force-exclude): nothing to scan")
    elif not result.files and not result.errors:  # the JSON's `errors` say why, as the text's line does
        result.errors.extend(ScanError(path, "no Python files found") for path in args.paths)
    if not result.files and not result.all_excluded and not is_machine_format(args):
        reasons = "; ".join(f"{e.path}: {e.message}" for e in result.errors)
        raise AdvisorError(f"nothing could be scanned ({reasons})")
    return result


class _ProgressAfterAMoment:
    """A bar on stderr (files done of all, elapsed time), drawn only on a terminal and only once the scan has taken
    longer than a moment: a quick scan leaves no flicker, a piped one no escape codes."""

    MOMENT_S = 0.5

    def __init__(self, console: Console, enabled: bool):
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console, transient=True,
                                  disable=not (enabled and _is_a_terminal(console)))
        self._task = self._progress.add_task("scanning", total=None)
        self._started = time.monotonic()

    def __enter__(self) -> _ProgressAfterAMoment:
        return self

    def advance(self, description: str, total: int) -> None:
        self._progress.update(self._task, description=description, total=total, advance=1)
        if not self._progress.live.is_started and time.monotonic() - self._started > self.MOMENT_S:
            self._progress.start()

    def __exit__(self, *exc) -> None:
        self._progress.stop()


class _NoStatus:
    """What `status` gives off a terminal: rich's `Status` that draws nothing (its console still prints)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __enter__(self) -> "_NoStatus":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, *args, **kwargs) -> None:
        return None

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


def status(console: Console, message: str):
    """rich's spinner on a terminal; nothing in a pipe or a file, where its frames would break the one-line error
    (promise round 35: FORCE_COLOR made rich draw it into a redirected stderr)."""
    return console.status(message) if _is_a_terminal(console) else _NoStatus(console)


def _is_a_terminal(console: Console) -> bool:
    """The console's file is a terminal: not rich's `is_terminal`, which FORCE_COLOR (set by many CI systems for
    colour) turns on for a pipe or a log file too, where a bar's cursor codes are noise."""
    try:
        return console.file.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def is_machine_format(args) -> bool:
    """JSON, SARIF and GitHub readers get a document even when nothing could be scanned (its errors say why)."""
    return getattr(args, "format", "text") in ("json", "sarif", "github")


def exit_code(result: ScanResult, findings_remain: bool) -> int:
    """2 when nothing could be scanned or advisor itself failed on a file (results are still printed), else 1 when
    findings remain or a file could not be read or parsed (a CI gate must not pass over an unchecked file), else 0
    (also when every path named was excluded: there was nothing to check)."""
    if not (result.files or result.all_excluded) or any(error.internal for error in result.errors):
        return EXIT_ERROR
    return EXIT_FINDINGS if findings_remain or result.errors else EXIT_CLEAN



def file_diff(file, new_text: str) -> str:
    """The diff from a scanned file's text to `new_text`, as `git apply` reads it (a notebook's: per changed cell);
    AdvisorError where a notebook's cells cannot take the text back."""
    if file.notebook is not None:
        try:
            return file.notebook.cell_diffs(relative_path(file.path), new_text)
        except ValueError as exc:
            raise AdvisorError(str(exc)) from None
    return unified_diff(relative_path(file.path), file.source, new_text)

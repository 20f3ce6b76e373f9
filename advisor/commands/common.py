"""Arguments, the run loop and the exit code shared by `scan` and `fix`."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import Progress

from advisor.backends import REQUESTABLE
from advisor.errors import AdvisorError
from advisor.registry import unknown_selectors
from advisor.report.terminal import shown

if TYPE_CHECKING:  # the scanner imports libcst: only the verb's run needs it
    from advisor.engine.static import ScanResult

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
SELECTOR = re.compile(r"[A-Z]+[0-9]*")


def add_selection_arguments(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders to scan")
    parser.add_argument("--select", type=_codes, default=None, help="only these rule codes or prefixes (ADV1,...)")
    parser.add_argument("--ignore", type=_codes, default=None, help="skip these rule codes or prefixes")
    parser.add_argument("--unsafe-fixes", action="store_true",
                        help="also offer fixes marked unsafe (fix: apply them; scan --format diff: show them, "
                             "labelled)")
    parser.add_argument("--backend", choices=REQUESTABLE, default="sdpa",
                        help="attention rewrites target: sdpa (PyTorch picks the kernel), flash (SDPA pinned to the "
                             "flash kernel where eligible), flash-attn (the flash_attn package, SDPA fallback)")
    add_call_site_argument(parser)


def add_call_site_argument(parser) -> None:
    parser.add_argument("--no-call-site-facts", dest="call_site_facts", action="store_false",
                        help="prove facts from each function's own source only, never from its callers in the "
                             "scanned tree (for a library whose callers live outside it)")


def _codes(text: str) -> list[str]:
    """Comma-separated codes or prefixes; one that names no rule is a usage error (exit 2), never an empty run."""
    codes = [code.strip().upper() for code in text.split(",") if code.strip()]
    malformed = [code for code in codes if not SELECTOR.fullmatch(code)]
    unknown = malformed or unknown_selectors(codes)
    if not codes or unknown:
        raise argparse.ArgumentTypeError(f"unknown rule code or prefix: {', '.join(unknown) or repr(text)} "
                                         "(`advisor rules` lists them)")
    return codes


def run_scan(args, runtime=None, patches: bool = True, fixed: bool = True, jobs: int | None = None) -> ScanResult:
    """Scan with a progress bar on stderr; exit 2 (via AdvisorError) when nothing at all could be scanned.
    `runtime` (advisor.fixes.evidence.RuntimeEvidence) joins a profile's copy/cast findings to the source;
    `patches`, `fixed` and `jobs` are scan_paths' (what the verb shows, and whether it picks fixes afterwards)."""
    from advisor.engine.static import scan_paths  # libcst: loaded by the verbs that scan, not by argument parsing

    stderr = Console(stderr=True)
    with Progress(console=stderr, transient=True, disable=not stderr.is_terminal) as progress:
        task = progress.add_task("scanning", total=None)
        result = scan_paths(args.paths, unsafe_fixes=args.unsafe_fixes, select=args.select, ignore=args.ignore,
                            backend=args.backend, runtime=runtime, patches=patches, fixed=fixed, jobs=jobs,
                            call_site_facts=args.call_site_facts,
                            on_file=lambda path: progress.update(task, description=f"scanning {shown(path)}"))
    if not result.files and not _is_machine_format(args):
        reasons = "; ".join(f"{e.path}: {e.message}" for e in result.errors) or "no Python files found"
        raise AdvisorError(f"nothing could be scanned ({reasons})")
    return result


def _is_machine_format(args) -> bool:
    """JSON and SARIF readers get a document even when nothing could be scanned (its errors say why)."""
    return getattr(args, "format", "text") in ("json", "sarif")


def exit_code(result: ScanResult, findings_remain: bool) -> int:
    """2 when nothing could be scanned or advisor itself failed on a file (results are still printed), else 1 when
    findings remain or a file could not be read or parsed (a CI gate must not pass over an unchecked file), else 0."""
    if not result.files or any(error.internal for error in result.errors):
        return EXIT_ERROR
    return EXIT_FINDINGS if findings_remain or result.errors else EXIT_CLEAN


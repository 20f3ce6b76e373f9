"""Arguments and the run loop shared by `scan` and `fix`."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress

from advisor.backends.site import REQUESTABLE
from advisor.errors import AdvisorError
from advisor.scan import ScanResult, scan_paths


def add_selection_arguments(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders to scan")
    parser.add_argument("--select", type=_codes, default=None, help="only these rule codes or prefixes (ADV1,...)")
    parser.add_argument("--ignore", type=_codes, default=None, help="skip these rule codes or prefixes")
    parser.add_argument("--unsafe-fixes", action="store_true", help="also offer fixes marked unsafe")
    parser.add_argument("--backend", choices=REQUESTABLE, default="sdpa",
                        help="attention rewrites target: sdpa (PyTorch picks the kernel), flash (SDPA pinned to the "
                             "flash kernel where eligible), flash-attn (the flash_attn package, SDPA fallback)")


def _codes(text: str) -> list[str]:
    return [code.strip().upper() for code in text.split(",") if code.strip()]


def run_scan(args) -> ScanResult:
    """Scan with a progress bar on stderr; exit 2 (via AdvisorError) when nothing at all could be scanned."""
    stderr = Console(stderr=True)
    with Progress(console=stderr, transient=True, disable=not stderr.is_terminal) as progress:
        task = progress.add_task("scanning", total=None)
        result = scan_paths(args.paths, unsafe_fixes=args.unsafe_fixes, select=args.select, ignore=args.ignore,
                            backend=args.backend,
                            on_file=lambda path: progress.update(task, description=f"scanning {path}"))
    if not result.files:
        reasons = "; ".join(f"{e.path}: {e.message}" for e in result.errors) or "no Python files found"
        raise AdvisorError(f"nothing could be scanned ({reasons})")
    return result

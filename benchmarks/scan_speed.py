"""A cold scan against CPython's own parser over the same files, side by side in one run: prints files, the seconds
of `ast.parse` over every file, the seconds of a cold `advisor scan --format json` (as the CLI runs it, pool
included), and their ratio (the target: at most 3). Wall seconds, and CPU seconds (this process and the
scan's worker processes), whose ratio holds still on a machine other jobs share.

    python benchmarks/scan_speed.py [TREE] [--limit N] [--jobs N] [--json FILE] [--profile]

TREE defaults to the installed transformers/models. `--json FILE` writes the scan's findings and errors (sorted
JSON, no timings) to compare two versions of the engine byte for byte; `--profile` prints the top functions of the
scan run in this process (jobs=1).
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import inspect
import json
import pstats
import resource
import time
import warnings
from pathlib import Path

from advisor.engine.static import scan_paths
from advisor.contracts.finding import display_path
from advisor.static.discover import discover


def default_tree() -> str:
    import transformers

    return str(Path(transformers.__file__).parent / "models")


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (the scan's pool is shut down when it
    returns)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(run, *args):
    """(result, wall seconds, CPU seconds) of run(*args)."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = run(*args)
    return result, time.perf_counter() - wall, cpu_seconds() - cpu


def parse_all(files: list[str]) -> None:
    """What CPython's parser does for every file: read and parse it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in files:
            ast.parse(Path(path).read_bytes(), path)


def cold_scan(files: list[str], jobs: int | None):
    """What `advisor scan --format json` runs (patches built, no fixed text), with nothing reused from an earlier
    run (the on-disk cache off where the engine has one)."""
    options = {"cache": False} if "cache" in inspect.signature(scan_paths).parameters else {}
    return scan_paths(files, jobs=jobs, patches=True, fixed=False, **options)


def findings_document(result) -> str:
    """The scan's findings and errors as sorted JSON, the same bytes for the same findings."""
    findings = [finding.to_json() for finding in result.findings]
    errors = [{"path": display_path(error.path), "message": error.message} for error in result.errors]
    return json.dumps({"findings": findings, "errors": errors}, indent=1, sort_keys=True) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", default=None, help="default: the installed transformers/models")
    parser.add_argument("--limit", type=int, default=None, help="only the first N files (a quick run)")
    parser.add_argument("--jobs", type=int, default=None, help="scan processes (default: as `advisor scan`)")
    parser.add_argument("--json", default=None, help="write the findings here, to diff two versions")
    parser.add_argument("--profile", action="store_true", help="profile the scan in this process (jobs=1)")
    args = parser.parse_args()
    files, _ = discover([args.tree or default_tree()])
    files = files[:args.limit] if args.limit else files
    _, parse_wall, parse_cpu = timed(parse_all, files)
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        result, scan_wall, scan_cpu = timed(profiler.runcall, cold_scan, files, 1)
    else:
        result, scan_wall, scan_cpu = timed(cold_scan, files, args.jobs)
    print(f"{'files':>7} {'':>5} {'ast.parse s':>12} {'scan s':>9} {'ratio':>7} {'findings':>9} {'errors':>7}")
    for kind, parse, scan in (("wall", parse_wall, scan_wall), ("cpu", parse_cpu, scan_cpu)):
        print(f"{len(files):>7} {kind:>5} {parse:>12.2f} {scan:>9.2f} {scan / parse:>7.1f} {len(result.findings):>9} "
              f"{len(result.errors):>7}")
    if args.json:
        Path(args.json).write_text(findings_document(result))
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()

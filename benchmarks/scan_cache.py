"""Warm scans: `advisor scan TREE --format json` cold (an empty cache) and warm (the same tree again),
side by side in one run, each as a user runs it (a fresh process, imports included), with a cache folder of its
own. The two must print identical findings, which is asserted. The target: warm at most 10% of cold.

    python benchmarks/scan_cache.py [TREE] [--limit N] [--jobs J]

TREE defaults to the installed transformers/models; --limit scans only its first N files (sorted).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def default_tree() -> str:
    import transformers

    return str(Path(transformers.__file__).parent / "models")


def python_files(tree: str, limit: int | None) -> list[str]:
    if limit is None:
        return [tree]
    return sorted(str(p) for p in Path(tree).rglob("*.py"))[:limit]


def timed_scan(targets: list[str], cache_home: str, extra: list[str]) -> tuple[float, dict]:
    env = {**os.environ, "XDG_CACHE_HOME": cache_home}
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "advisor", "scan", *targets, "--format", "json", *extra],
                         capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if run.returncode not in (0, 1):
        sys.exit(f"advisor scan failed ({run.returncode}): {run.stderr[-2000:]}")
    return seconds, json.loads(run.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", default=None)
    parser.add_argument("--limit", type=int, default=None, help="only the first N .py files of the tree")
    args = parser.parse_args()
    tree = args.tree or default_tree()
    targets = python_files(tree, args.limit)
    with tempfile.TemporaryDirectory(prefix="advisor-cache-bench-") as cache_home:
        cold, cold_report = timed_scan(targets, cache_home, [])
        warm, warm_report = timed_scan(targets, cache_home, [])
    assert warm_report == cold_report, "the warm scan's findings differ from the cold scan's"
    files = cold_report["files_scanned"] if "files_scanned" in cold_report else len(targets)
    print(f"tree: {tree}" + (f" (first {args.limit} files)" if args.limit else ""))
    print(f"files scanned: {files}, findings: {len(cold_report['findings'])}, errors: {len(cold_report['errors'])}")
    print(f"cold scan (empty cache):  {cold:8.2f} s")
    print(f"warm scan (same tree):    {warm:8.2f} s")
    print(f"warm / cold:              {warm / cold:8.3f}  (target <= 0.10)")


if __name__ == "__main__":
    main()

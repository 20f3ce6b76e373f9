"""Which files a scan reads, and reading them without ever stopping the scan on one bad file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from advisor.findings import ScanError
from advisor.static.source_encoding import SourceDecodeError, decode_source

SKIP_DIRS = {
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".env", ".tox", ".nox", "build", "dist",
    "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache", "site-packages", ".eggs",
}


@dataclass
class SourceFile:
    path: str
    text: str


def _is_skipped_dir(name: str) -> bool:
    return name in SKIP_DIRS or name.endswith(".egg-info")


def discover(paths: list[str]) -> tuple[list[str], list[ScanError]]:
    """Python files under `paths`, sorted and unique. Explicit file arguments are always kept."""
    files: list[str] = []
    errors: list[ScanError] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            files.append(str(path))
        elif path.is_dir():
            files.extend(_walk(path, errors))
        elif path.is_symlink():
            errors.append(ScanError(raw, "broken symbolic link"))
        else:
            errors.append(ScanError(raw, "no such file or directory"))
    seen: set[str] = set()
    unique = [f for f in files if not (os.path.realpath(f) in seen or seen.add(os.path.realpath(f)))]
    return unique, errors


def _walk(root: Path, errors: list[ScanError]) -> list[str]:
    found: list[str] = []
    visited: set[str] = set()

    def onerror(exc: OSError) -> None:
        errors.append(ScanError(exc.filename or str(root), exc.strerror or str(exc)))

    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=onerror):
        real = os.path.realpath(dirpath)
        if real in visited:  # a symlink loop or a second link to the same folder
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames[:] = sorted(d for d in dirnames if not _is_skipped_dir(d))
        for name in sorted(filenames):
            if name.endswith(".py"):
                found.append(os.path.join(dirpath, name))
    return found


def read_source(path: str) -> SourceFile | ScanError:
    """The file's text (decoded as its coding line or BOM says; the BOM is not part of it), or the one-line
    reason it cannot be read as Python source."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return ScanError(path, exc.strerror or str(exc))
    try:
        text, _ = decode_source(data)
    except SourceDecodeError as exc:
        return ScanError(path, str(exc))
    return SourceFile(path, text)

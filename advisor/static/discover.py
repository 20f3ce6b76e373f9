"""Which files a scan reads, and reading them without ever stopping the scan on one bad file."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePath

from advisor.contracts.finding import ScanError
from advisor.static.notebook import NotebookCode, notebook_code
from advisor.static.source_encoding import SourceDecodeError, decode_source

SKIP_DIRS = {
    ".git", ".hg", ".svn", "__pycache__", ".ipynb_checkpoints", ".venv", "venv", "env", ".env", ".tox", ".nox",
    "build", "dist", "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache", "site-packages", ".eggs",
}
# ... of which these also name source folders (RL code's `env/`): walked where they hold Python files of their own
# (a package, or scripts) and are no environment (`pyvenv.cfg`, `conda-meta`), since a caller there decides what
# the tree's call sites prove; a build's output keeps its modules deeper (`build/lib/...`)
PACKAGE_NAMES = {"env", "venv", "build", "dist"}
ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta")

LIBRARY_DIRS = ("site-packages", "dist-packages")  # where installed packages live

MISSING, BROKEN_LINK, LINK_LOOP = "no such file or directory", "broken symbolic link", "symbolic link loop"
FILE_KINDS = ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "a FIFO"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


@dataclass
class SourceFile:
    path: str
    text: str
    notebook: NotebookCode | None = None  # a notebook's cells: `text` is their code as one module
    digest: str = ""  # of the bytes read (the notebook's whole JSON): what the scan cache keys the file by


def is_library_file(path: str) -> bool:
    """A file of an installed package (what `optimize` may patch when a workload ran it)."""
    return any(part in LIBRARY_DIRS for part in PurePath(path).parts)


def in_environment(path: str) -> bool:
    """Inside a Python environment (a folder above it holds `pyvenv.cfg` or `conda-meta`): the packages installed
    there, pip's editable checkouts of dependencies in its `src/` among them (promise breaker round 30)."""
    parents = PurePath(os.path.realpath(path)).parents
    return any(os.path.exists(os.path.join(folder, marker)) for folder in parents for marker in ENVIRONMENT_MARKERS)


def _is_skipped_dir(name: str, path: str) -> bool:
    if name in PACKAGE_NAMES and _holds_python_files(path) and \
            not any(os.path.exists(os.path.join(path, marker)) for marker in ENVIRONMENT_MARKERS):
        return False
    return name in SKIP_DIRS or name.endswith(".egg-info")


def _holds_python_files(path: str) -> bool:
    try:
        return any(entry.endswith(".py") for entry in os.listdir(path))
    except OSError:
        return False


def discover(paths: list[str], path_rules=None) -> tuple[list[str], list[ScanError]]:
    """Python files under `paths`, sorted and unique. Only regular files are read (a FIFO blocks forever, a link
    to /dev/zero never ends): the walk skips anything else, an explicit path gets an error entry saying what it is.
    Type stubs (.pyi) hold no code that runs, so they are never scanned: the walk skips them, an explicit one gets
    an error entry. Jupyter notebooks (.ipynb) are read as their code cells (advisor.static.notebook). Other
    explicit files are kept whatever their name (scripts without `.py`); a walk takes `.pyw` files and files
    without a suffix whose first line runs Python (`#!/usr/bin/env python3`). A walk reports the links it cannot
    follow: dangling `.py` links and link loops.
    `path_rules` (advisor.config.PathRules) excludes what its globs name from the walk, and, with force_exclude,
    explicit paths too (as Ruff's `exclude` and `force-exclude`)."""
    files: list[str] = []
    errors: list[ScanError] = []
    excluded = path_rules.excludes if path_rules else (lambda path: False)
    for raw in paths:
        path = Path(raw)
        kind = _file_kind(raw)
        if path_rules and path_rules.excludes_named(raw):
            continue
        if kind == "directory":
            files.extend(_walk(path, errors, excluded))
        elif kind != "regular file":
            errors.append(ScanError(raw, kind if kind in (MISSING, BROKEN_LINK, LINK_LOOP) else
                                    f"not a regular file ({kind})"))
        elif raw.endswith(".pyi"):
            errors.append(ScanError(raw, "a type stub (.pyi) holds no code that runs; stubs are not scanned"))
        else:
            files.append(str(path))
    seen: set[str] = set()
    unique = [f for f in files if not (os.path.realpath(f) in seen or seen.add(os.path.realpath(f)))]
    return unique, errors


def _file_kind(path: str) -> str:
    """What `path` is once links are followed, in words."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return BROKEN_LINK if os.path.islink(path) else MISSING
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return LINK_LOOP
        return exc.strerror or str(exc)
    for test, kind in FILE_KINDS:
        if test(mode):
            return kind
    return "special file"


def _walk(root: Path, errors: list[ScanError], excluded) -> list[str]:
    """`.py`, `.pyw` and `.ipynb` files and Python scripts without a suffix under `root`, links followed. A link back
    to an enclosing folder, a link loop and a dangling `.py` link are error entries; a second link to a folder
    already walked is walked once, silently."""
    found: list[str] = []
    visited: set[str] = set()

    def onerror(exc: OSError) -> None:
        errors.append(ScanError(exc.filename or str(root), exc.strerror or str(exc)))

    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=onerror):
        real = os.path.realpath(dirpath)
        if real in visited:  # a second link to the same folder
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames[:] = sorted(d for d in dirnames if not (_is_skipped_dir(d, os.path.join(dirpath, d)) or
                                                         excluded(os.path.join(dirpath, d))))
        for name in [d for d in dirnames if _encloses(os.path.join(dirpath, d), real)]:
            errors.append(ScanError(os.path.join(dirpath, name), f"{LINK_LOOP} (to an enclosing folder)"))
            dirnames.remove(name)
        for name in sorted(filenames):
            candidate = os.path.join(dirpath, name)
            if excluded(candidate):
                continue
            kind = _file_kind(candidate)
            if kind == "regular file" and (name.endswith((".py", ".ipynb", ".pyw")) or _python_script(candidate)):
                found.append(candidate)
            elif kind == LINK_LOOP or name.endswith(".py") and kind == BROKEN_LINK:
                errors.append(ScanError(candidate, kind))
    return found


PYTHON_RUNNERS = (b"python", b"pypy", b"uv run", b"pipx run")  # `#!/usr/bin/env -S uv run --script` (breaker round 18)


def _python_script(path: str) -> bool:
    """A file without a suffix whose first line runs Python (`#!/usr/bin/env python3`): an entry script, whose calls
    count for the tree's facts as those of any module (breaker round 17: `bin/train` passed a padding mask)."""
    if "." in os.path.basename(path):
        return False
    try:
        with open(path, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and any(runner in first for runner in PYTHON_RUNNERS)


def _encloses(folder: str, real_parent: str) -> bool:
    """`folder` is a link to `real_parent` or to a folder above it: walking it would never end."""
    if not os.path.islink(folder):
        return False
    target = os.path.realpath(folder)
    return real_parent == target or real_parent.startswith(target.rstrip(os.sep) + os.sep)


def regular_file_bytes(path: str | Path, follow_links: bool = True, own: bool = False) -> bytes:
    """The bytes of the regular file at `path`, opened without blocking (a FIFO would wait for a writer forever, a
    device never ends) and checked after opening; OSError for anything else (`not a regular file`) or a read that
    fails. `follow_links=False`: a link is refused too; `own`: so is a file of another user or one that group or
    others can write (where the system has user ids)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(os.open(path, flags), "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise OSError("not a regular file")
        if own and hasattr(os, "getuid") and (status.st_uid != os.getuid() or status.st_mode & 0o022):
            raise OSError("not this user's private file")
        return handle.read()


def read_source(path: str) -> SourceFile | ScanError:
    """The file's text (decoded as its coding line or BOM says; the BOM is not part of it), or the one-line
    reason it cannot be read as Python source. Opened without blocking and checked again after opening, so a
    file replaced by a FIFO or a device since discovery is refused, not read."""
    try:
        data = regular_file_bytes(path)
    except OSError as exc:
        return ScanError(path, exc.strerror or str(exc))
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    try:
        text, _ = decode_source(data)
    except SourceDecodeError as exc:
        return ScanError(path, str(exc))
    if path.endswith(".ipynb"):
        try:
            code = notebook_code(text)
            code.text.encode("utf-8")  # JSON's `\\ud800` escape: a character no source text can hold
        except UnicodeEncodeError as exc:
            return ScanError(path, f"a code cell holds {exc.object[exc.start]!r}, a lone surrogate, which is not "
                                   "source text")
        except ValueError as exc:
            return ScanError(path, str(exc))
        return SourceFile(path, code.text, code, digest)
    return SourceFile(path, text, digest=digest)

"""Unified diffs, and writing a rewritten file atomically only if nobody changed it since it was read."""

from __future__ import annotations

import difflib
import hashlib
import os
import tempfile

from advisor.errors import AdvisorError


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class FileChanged(AdvisorError):
    """The file on disk is not the text the patch was computed from."""


def write_atomically(path: str, expected_before: str, new_text: str) -> None:
    """Replace `path` with `new_text` via a temporary file and rename; refuse if the file changed on disk."""
    with open(path, "rb") as handle:
        current = handle.read().decode("utf-8", errors="surrogateescape")
    if fingerprint(current) != fingerprint(expected_before):
        raise FileChanged(f"{path}: changed since it was read; not writing (run advisor again)")
    directory = os.path.dirname(os.path.abspath(path))
    mode = os.stat(path).st_mode
    descriptor, temporary = tempfile.mkstemp(prefix=".advisor-", suffix=".py", dir=directory)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as handle:
            handle.write(new_text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise

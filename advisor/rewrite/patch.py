"""Unified diffs, and writing a fixed file back so that no byte outside the fix and no one else's edit is lost.

A write goes to a temporary file in the same folder and is renamed over the file (atomic: a reader or a crash
sees the old text or the new, never half of one). The new file gets the old one's mode, owner and group, and is
written in the encoding the file was read in (coding line, BOM). Refused with a one-line reason, the file left as
it was: anything but a regular file; a file with hard links (the rename would leave the other names on the old
text); a read-only file, unless `force_readonly`; an owner or group the running user cannot give the new file.

Lost updates: the file must hold the text the fix was computed from when it is opened, and again just before the
rename (same inode, size, mtime and bytes). After the rename the old inode is read once more, and an edit written
into it meanwhile is put back and reported. The remaining window is the few microseconds between that last check
and the rename, where an editor that saves by renaming its own file over this one loses that save.
"""

from __future__ import annotations

import difflib
import os
import signal
import stat
import tempfile
import threading
from contextlib import contextmanager

from advisor.errors import AdvisorError, diff_name
from advisor.static.line_index import diff_lines, marked
from advisor.static.source_encoding import SourceDecodeError, decode_source, encode_source

TEMP_PREFIX, TEMP_SUFFIX = ".advisor-", ".tmp"  # never *.py, so a scan can never take one for source
_DEFERRED_SIGNALS = {getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name)}


class WriteRefused(AdvisorError):
    """The fix was not written. The message says why, not which file: the caller names it."""


class FileChanged(WriteRefused):
    """The file on disk is not the text the patch was computed from."""


def unified_diff(path: str, before: str, after: str) -> str:
    """A patch `git apply` and `patch -p1` read: lines split at "\n" only, a last line without one marked."""
    return "".join(map(marked, difflib.unified_diff(diff_lines(before), diff_lines(after),
                                                    fromfile=diff_name("a", path), tofile=diff_name("b", path))))


def resolve_inside(path: str, roots: list[str]) -> str:
    """The real file behind `path` (links resolved, so a link is never replaced by a file), when it lies inside
    one of `roots` (the scanned folders, or files named on the command line); refused otherwise."""
    real = os.path.realpath(path)
    for root in map(os.path.realpath, roots):
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return real
    raise WriteRefused(f"is {real} through a symbolic link, outside the scanned tree; not written")


def write_atomically(path: str, expected_before: str, new_text: str, force_readonly: bool = False) -> None:
    """Replace `path` with `new_text`; raises WriteRefused (FileChanged when someone else edited it)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise WriteRefused(f"cannot open it to write the fix ({exc.strerror})") from None
    try:  # before fdopen, which raises IsADirectoryError for a folder put at the file's name
        status = os.fstat(descriptor)
        _refuse_unsafe(path, status, force_readonly)
    except BaseException:
        os.close(descriptor)
        raise
    with os.fdopen(descriptor, "rb") as original:
        before = original.read()
        try:
            current, codec = decode_source(before)
            if current != expected_before:
                raise FileChanged("changed since it was read; not writing (run advisor again)")
            data = encode_source(new_text, codec)
        except SourceDecodeError as exc:
            raise WriteRefused(f"{exc}; not written") from None
        with _signals_deferred():
            _replace(path, data, status, lambda: _holds(path, descriptor, status, before))
            after = _read_whole(descriptor)
            if after != before:  # written into the old inode between the last check and the rename
                _replace(path, after, status, lambda: True)
                raise FileChanged("changed while the fix was being written; that edit is kept and the fix is not "
                                  "applied (run advisor again)")


def _refuse_unsafe(path: str, status: os.stat_result, force_readonly: bool) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise WriteRefused("not a regular file; not written")
    if status.st_nlink > 1:
        raise WriteRefused(f"has {status.st_nlink} hard links, which a rewrite (a new file renamed over it) would "
                           "split; not written")
    read_only = not status.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK)
    if read_only and not force_readonly:
        raise WriteRefused("is read-only; not written (--force-readonly writes it, keeping its mode)")


def _read_whole(descriptor: int) -> bytes:
    """Everything the open file holds now, however much was written into it since it was first read."""
    chunks, offset = [], 0
    while chunk := os.pread(descriptor, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _holds(path: str, descriptor: int, status: os.stat_result, before: bytes) -> bool:
    """The name still points at the inode that was read, and it still holds the bytes that were read."""
    now = os.stat(path, follow_symlinks=False)
    same = (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) == (status.st_dev, status.st_ino,
                                                                      status.st_size, status.st_mtime_ns)
    return same and os.pread(descriptor, len(before) + 1, 0) == before


def _replace(path: str, data: bytes, status: os.stat_result, still_unchanged) -> None:
    """Write `data` to a temporary file with the original's mode, owner and group, and rename it over `path` if
    `still_unchanged()` just before the rename. The temporary file never survives, and is never named."""
    temporary = None
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX,
                                                 dir=os.path.dirname(path))
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            created = os.fstat(descriptor)
            if (created.st_uid, created.st_gid) != (status.st_uid, status.st_gid):
                os.fchown(descriptor, status.st_uid, status.st_gid)
            os.fchmod(descriptor, stat.S_IMODE(status.st_mode))
            os.fsync(descriptor)
        if not still_unchanged():
            raise FileChanged("changed since it was read; not writing (run advisor again)")
        os.replace(temporary, path)
        temporary = None
    except PermissionError as exc:
        if exc.filename is None:  # fchown: the running user cannot give the file its owner or group
            raise WriteRefused(f"cannot keep its owner and group ({status.st_uid}:{status.st_gid}); not "
                               "written") from None
        raise WriteRefused(f"cannot write in its folder ({exc.strerror}); not written") from None
    except OSError as exc:
        raise WriteRefused(f"cannot write the fixed file ({exc.strerror}); not written") from None
    finally:
        if temporary is not None and os.path.lexists(temporary):
            os.unlink(temporary)


@contextmanager
def _signals_deferred():
    """SIGTERM, SIGHUP and SIGINT wait until the file is written or left as it was, then act as they would have,
    so no temporary file is left behind (only SIGKILL can strand one: .advisor-*.tmp, never scanned). Handlers,
    not a signal mask: a process-wide signal goes to any thread that does not block it (torch starts threads)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {number: signal.signal(number, lambda received, _frame: pending.append(received))
                for number in _DEFERRED_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        for number in pending:
            signal.raise_signal(number)

"""Process states read from Linux /proc, for the tests that check what outlives advisor."""

from __future__ import annotations

from pathlib import Path

HAS_PROC = Path("/proc/self/stat").exists()


def _stat(pid: int | str) -> list[str] | None:
    """The fields after the command name: state, parent pid, process group, ..."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def running(pid: int) -> bool:
    """Alive and not a zombie (one whose parent is gone may wait for a reaper)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def children(pid: int) -> set[int]:
    """The running processes whose parent is `pid`."""
    found = set()
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found

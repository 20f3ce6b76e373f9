"""The one value every stage hands on: a finding at a source location, maybe with a patch."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Finding:
    rule: str
    kind: str
    path: str
    line: int
    end_line: int
    function: str
    message: str
    fixable: bool = False
    fix_safety: str = "safe"
    reason: str | None = None
    patch: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        extra = data.pop("extra")
        data["path"] = display_path(self.path)
        data.update(extra)
        return data


@dataclass
class ScanError:
    path: str
    message: str
    internal: bool = False  # a bug of ours, not bad input: the run exits 2 even when other files were scanned

    def to_json(self) -> dict[str, str]:
        return {"path": display_path(self.path), "message": self.message}


def display_path(path: str) -> str:
    """Relative to the current directory when the file is under it, else absolute (as Ruff prints it)."""
    absolute = os.path.abspath(path)
    cwd = os.getcwd()
    if absolute == cwd or absolute.startswith(cwd + os.sep):
        return os.path.relpath(absolute, cwd)
    return absolute

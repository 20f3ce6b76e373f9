"""The one value every stage hands on: a finding at a source location, maybe with a patch."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.contracts.fix_safety import FixSafety


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
    fix_safety: FixSafety = FixSafety.SAFE
    reasons: tuple[str, ...] = ()  # why there is no patch, or what an unsafe one assumes; each one sentence
    patch: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fix_safety = FixSafety(self.fix_safety)  # an engine may pass the plain string
        self.reasons = tuple(self.reasons)

    @property
    def reason(self) -> str | None:
        """The reasons as the one line every report prints (and JSON's `reason`): joined by "; ", None if none."""
        return joined(self.reasons)

    def to_json(self) -> dict[str, Any]:
        copied = asdict(self)
        extra = copied.pop("extra")
        data = {("reason" if name == "reasons" else name): value for name, value in copied.items()}
        data["reason"] = self.reason  # in the place of `reasons`: the JSON field is the joined line
        data["path"] = display_path(self.path)
        data.update(extra)
        return data


@dataclass
class ScanError:
    path: str
    message: str
    internal: bool = False  # a bug of ours, not bad input: the run exits 2 even when other files were scanned

    def to_json(self) -> dict[str, str]:
        return {"path": display_path(self.path), "message": as_text(self.message)}


def joined(reasons: tuple[str, ...]) -> str | None:
    """Reasons as one line of text, where text is rendered (JSON's `reason` fields, reports): None when none."""
    return "; ".join(reasons) if reasons else None


def located_message(finding: "Finding") -> str:
    """The finding's message (and reason) for a format that points at lines of the file: a notebook's lines are
    its cells', not the JSON file's, so there the cell and lines lead the message and no file line is given."""
    text = finding.message if finding.reason is None else f"{finding.message} ({finding.reason})"
    cell = finding.extra.get("cell")
    return text if cell is None else f"cell {cell}, lines {finding.line}-{finding.end_line}: {text}"


def display_path(path: str) -> str:
    """Relative to the current directory when the file is under it, else absolute (as Ruff prints it); bytes of a
    name that are not UTF-8 written as `\\xNN` (see as_text)."""
    return as_text(relative_path(path))


def relative_path(path: str) -> str:
    """display_path's choice of path, as the file system's name (not escaped): a link to a file is named by its
    target (where a fix is written), and a file under the current directory reached through a link (`cd` into a
    linked folder, `$PWD/model.py`) relative to it, as `git apply` takes it (promise round 35)."""
    cwd = current_folder()
    if cwd is None:
        return path
    absolute = os.path.abspath(path)
    if os.path.islink(absolute) and os.path.isfile(absolute):  # a dangling link, or one to a device, keeps its name
        absolute = os.path.realpath(absolute)
    for file, folder in ((absolute, cwd), (os.path.realpath(absolute), os.path.realpath(cwd))):
        if file == folder or file.startswith(folder + os.sep):
            return os.path.relpath(file, folder)
    return absolute


def current_folder() -> str | None:
    """The working directory, or None where it was deleted under a running shell (a removed build folder): absolute
    paths are still scanned and shown from there."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


def as_text(text: str) -> str:
    """Text that strict JSON parsers and UTF-8 terminals accept: a file name's bytes that are not UTF-8 reach
    Python as lone surrogates (surrogateescape), and are written here as `\\xNN` instead."""
    if text.isascii():
        return text
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name produced: written as `\\udNNN`
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


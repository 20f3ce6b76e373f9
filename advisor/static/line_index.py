"""Lines as diffs count them: split at "\n" only, as git and patch read a file (`str.splitlines` also splits at
form feeds, lone CRs and other separators, and a diff built from those lines was a corrupt patch: breaker round 16).
Line starts of a text, for the diffs of the rewrite layer."""

from __future__ import annotations

import bisect
import re

DIFF_LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")
NO_NEWLINE = "\\ No newline at end of file\n"


def diff_lines(text: str) -> list[str]:
    """The text's lines, each with its "\n" (the last may have none)."""
    return DIFF_LINE.findall(text)


def marked(diff_line: str) -> str:
    """A line of a unified diff, followed by diff's marker where it is a file's last line without a newline."""
    return diff_line if diff_line.endswith("\n") else f"{diff_line}\n{NO_NEWLINE}"


class LineIndex:
    """Line starts of one text, to turn character offsets into line numbers without rescanning it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = diff_lines(text)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def line_of(self, offset: int) -> int:
        """0-based index of the line holding `offset` (len(lines) at the very end of the text)."""
        return bisect.bisect_right(self.starts, offset) - 1

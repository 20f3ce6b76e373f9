"""Line starts of a text, shared by the parsed module (line numbers of nodes) and the diffs of the rewrite layer."""

from __future__ import annotations

import bisect


class LineIndex:
    """Line starts of one text, to turn character offsets into line numbers without rescanning it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def line_of(self, offset: int) -> int:
        """0-based index of the line holding `offset` (len(lines) at the very end of the text)."""
        return bisect.bisect_right(self.starts, offset) - 1

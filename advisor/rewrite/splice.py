"""Edits as character ranges of the original text, and unified diffs built from those ranges alone.

A rewrite changes a few top-level statements; regenerating and diffing the whole module for every finding made a
scan quadratic in the blocks per file. Here each finding costs only the size of what it changes: the edited
statements are spliced into the original text, and each changed region (with its diff context) is diffed on its own,
its hunk headers shifted to the region's place in the file."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from advisor.errors import diff_name
from advisor.static.line_index import LineIndex, diff_lines, marked

CONTEXT = 3  # lines of context in a hunk, as `diff -u` and difflib's default
HUNK_HEADER = re.compile(r"@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


@dataclass(frozen=True)
class Edit:
    """Characters [start, end) of the original text become `text` (start == end inserts)."""

    start: int
    end: int
    text: str


def apply_edits(source: str, edits: list[Edit]) -> str:
    """The source with every edit applied; edits must not overlap."""
    pieces, cursor = [], 0
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        if edit.start < cursor:
            raise ValueError("overlapping edits")
        pieces += [source[cursor:edit.start], edit.text]
        cursor = edit.end
    pieces.append(source[cursor:])
    return "".join(pieces)


def local_diff(path: str, index: LineIndex, edits: list[Edit]) -> str:
    """What `difflib.unified_diff(whole before, whole after)` prints, computed from the edited regions only."""
    regions = _regions(index, sorted(edits, key=lambda e: (e.start, e.end)))
    hunks: list[str] = []
    shift = 0  # lines added minus removed by earlier regions
    for first, last, region_edits in regions:
        start, end = index.starts[first], index.starts[last]
        before = index.lines[first:last]
        after = diff_lines(apply_edits(index.text[start:end], [Edit(e.start - start, e.end - start, e.text)
                                                               for e in region_edits]))
        for line in list(difflib.unified_diff(before, after, n=CONTEXT))[2:]:  # [2:]: its ---/+++ lines
            hunks.append(marked(_shifted(line, first, first + shift)))
        shift += len(after) - len(before)
    if not hunks:
        return ""
    return f"--- {diff_name('a', path)}\n+++ {diff_name('b', path)}\n" + "".join(hunks)


def _regions(index: LineIndex, edits: list[Edit]) -> list[tuple[int, int, list[Edit]]]:
    """Line ranges [first, last) around the edits, widened by the context and merged where hunks would touch."""
    regions: list[tuple[int, int, list[Edit]]] = []
    for edit in edits:
        first = max(index.line_of(edit.start) - CONTEXT, 0)
        end_line = index.line_of(edit.end)
        if index.starts[end_line] != edit.end:  # the edit ends inside a line: the region takes all of it
            end_line += 1
        last = min(end_line + CONTEXT, len(index.lines))
        if regions and first <= regions[-1][1]:
            previous = regions.pop()
            first, last, edit_list = previous[0], max(previous[1], last), previous[2] + [edit]
        else:
            edit_list = [edit]
        regions.append((first, last, edit_list))
    return regions


def _shifted(line: str, old_offset: int, new_offset: int) -> str:
    hit = HUNK_HEADER.match(line)
    if hit is None:
        return line
    old_start, new_start = int(hit.group(1)) + old_offset, int(hit.group(3)) + new_offset
    return f"@@ -{old_start}{hit.group(2)} +{new_start}{hit.group(4)} @@" + line[hit.end():]

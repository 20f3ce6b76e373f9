"""A Jupyter notebook read as one Python module: its code cells in order, IPython's `%magic`, `!shell` and
`%%cell-magic` lines masked line for line (so they never break the parse and line numbers stay), with a map from
the module's lines back to (cell, line in the cell)."""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass

MAGIC_LINE = re.compile(r"^(\s*)(%|!)")  # a line magic or shell escape (IPython reads them at any indentation)
CELL_MAGIC = re.compile(r"^\s*%%")


@dataclass(frozen=True)
class NotebookCode:
    """The code cells as one module; `starts[i]` is the module line where code cell `cells[i]` begins and
    `cells[i]` its 1-based position among all the notebook's cells (markdown included, as Jupyter lists them)."""

    text: str
    starts: tuple[int, ...]
    cells: tuple[int, ...]

    def locate(self, line: int) -> tuple[int, int]:
        """(cell, line in that cell) of a module line."""
        index = max(bisect_right(self.starts, line) - 1, 0)
        return self.cells[index], line - self.starts[index] + 1


def notebook_code(raw: str) -> NotebookCode:
    """ValueError when the file is not a notebook (not JSON, no cell list, a cell source that is not text)."""
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not a Jupyter notebook: invalid JSON at line {exc.lineno} ({exc.msg})") from None
    cells = document.get("cells") if isinstance(document, dict) else None
    if not isinstance(cells, list):
        raise ValueError("not a Jupyter notebook: no list of cells (nbformat 4)")
    lines: list[str] = []
    starts, numbers = [], []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        if not isinstance(source, str):
            raise ValueError(f"not a Jupyter notebook: cell {number} has a source that is not text")
        starts.append(len(lines) + 1)
        numbers.append(number)
        lines.extend(_masked(source.splitlines()) or [""])
    return NotebookCode("\n".join(lines) + "\n", tuple(starts), tuple(numbers))


def _masked(cell_lines: list[str]) -> list[str]:
    """A cell magic makes the whole cell IPython's (`%%bash`, `%%timeit`): every line becomes a comment. A line
    magic or shell escape becomes `pass` at its indentation, so a block that holds only it still parses."""
    if cell_lines and CELL_MAGIC.match(cell_lines[0]):
        return ["# (IPython cell magic)"] * len(cell_lines)
    masked = []
    for line in cell_lines:
        magic = MAGIC_LINE.match(line)
        masked.append(f"{magic.group(1)}pass  # (IPython magic)" if magic else line)
    return masked

"""A Jupyter notebook read as one Python module: its code cells in order, between boundary comments, IPython's
`%magic`, `!shell` and `%%cell-magic` lines masked line for line (so they never break the parse and line numbers
stay), with a map from the module's lines back to (cell, line in the cell), and the way back: a fixed module
split at the boundaries into cells, the masked lines restored, written into the notebook's JSON in the layout it
was read in (only the changed cells' sources differ)."""

from __future__ import annotations

import ast
import difflib
import io
import json
import keyword
import re
import tokenize
from bisect import bisect_right
from dataclasses import dataclass

from advisor.errors import diff_name

# IPython's line syntax (at any indentation): a line magic or shell escape, one assigned (`files = !ls`,
# `t = %timeit -o f()`), or a help request (`obj?`, `??obj`); none of them is Python.
MAGIC_LINE = re.compile(r"^(\s*)(?:[%!]|[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*[%!]|\?{1,2}[\w.]|[\w.]+\?{1,2}\s*$)")
CODE_NEWLINE = re.compile(r"\r\n|\r|\n")  # the newlines Python's tokenizer reads (not str.splitlines' \f, \u2028, ...)
CODE_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # one line of a cell's source list, its newline kept
CELL_MAGIC = re.compile(r"^\s*%%")
# cell magics that run their body as Python code (IPython's own, and the profilers' most used)
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "python", "python3", "memit", "mprun",
                                "snakeviz", "lprun"})
BOUNDARY = "# advisor: notebook cell boundary"
LINE_MAGIC_MASK, CELL_MAGIC_MASK = "pass  # (IPython magic)", "# (IPython cell magic)"
CONTINUED_MAGIC_MASK = "# (IPython magic)"  # a magic's line after one ending in a backslash (`!pip install \\`)
# a line magic that names Python values (`%time print(s.shape)`, `!echo {s}`) runs code that may read them: it is
# masked as a call of them all, so a rewrite that deletes `s` sees the read (`_advisor_ipython(time, print, s, shape)`)
READ_MASK_CALL = "_advisor_ipython"
MASKED_LINE = re.compile(rf"^(?:pass|{READ_MASK_CALL}\([\w, ]*\))  # \(IPython magic\)$"
                         r"|^# \(IPython (?:cell )?magic\)$")
IDENTIFIER = re.compile(r"[^\W\d]\w*")
# line magics that run the rest of their line as Python: `%time loss = step(x)` (no options)
PYTHON_LINE_MAGIC = re.compile(r"^(\s*)%(?:time|timeit|prun)\s+(?!-)(.+)$")


@dataclass(frozen=True)
class NotebookCode:
    """The code cells as one module; `starts[i]` is the module line where code cell `cells[i]` begins and
    `cells[i]` its 1-based position among all the notebook's cells (markdown included, as Jupyter lists them).
    `raw` is the notebook's JSON as read; `magics[i]` the masked lines of code cell i, in order."""

    text: str
    starts: tuple[int, ...]
    cells: tuple[int, ...]
    raw: str = ""
    magics: tuple[tuple[str, ...], ...] = ()

    @property
    def run_text(self) -> str:
        """`text` with each masked `%time STATEMENT` (`%timeit`, `%prun`: PYTHON_LINE_MAGICS) made that statement,
        where it parses alone, line for line: what the notebook runs, for the tree's facts (breaker round 18: a
        gradient penalty or a module hook on a `%time` line was unseen). The fixes read `text`, whose masked lines
        are restored when written."""
        parts = self.text.removesuffix("\n").split(f"\n{BOUNDARY}\n")
        out = []
        for part, magics in zip(parts, self.magics):
            lines, pending = part.split("\n"), list(magics)
            for index, line in enumerate(lines):
                if MASKED_LINE.match(line.strip()) and pending:
                    lines[index] = _statement_of(pending.pop(0)) or line
            out.append("\n".join(lines))
        return f"\n{BOUNDARY}\n".join(out) + ("\n" if self.text.endswith("\n") else "")

    def locate(self, line: int) -> tuple[int, int]:
        """(cell, line in that cell) of a module line."""
        index = max(bisect_right(self.starts, line) - 1, 0)
        return self.cells[index], line - self.starts[index] + 1

    def with_code(self, fixed: str) -> str:
        """The notebook's JSON with the code cells of `fixed` (this module after a fix); ValueError when the fix
        moved a cell boundary or a masked line, or the JSON's layout cannot be reproduced."""
        document = json.loads(self.raw)
        layout = _layout(document, self.raw)
        for cell, text in zip(_code_cells(document), self._cell_texts(fixed)):
            source = _joined(cell.get("source", ""))
            if text != "\n".join(_code_lines(source)):
                text = _with_newlines_of(source, text.split("\n"))
                cell["source"] = CODE_LINE.findall(text) if isinstance(cell.get("source"), list) else text
        return layout(document)

    def cell_diffs(self, path: str, fixed: str) -> str:
        """The fix as one unified diff per changed cell (`path:cell N`), as a reader of the notebook sees it."""
        before = self._cell_texts(self.text)
        after = self._cell_texts(fixed)
        diffs = []
        for number, old, new in zip(self.cells, before, after):
            if old != new:
                diffs.extend(difflib.unified_diff([f"{line}\n" for line in old.split("\n")],
                                                  [f"{line}\n" for line in new.split("\n")],
                                                  diff_name("a", f"{path}:cell {number}"),
                                                  diff_name("b", f"{path}:cell {number}")))
        return "".join(diffs)

    def _cell_texts(self, module: str) -> list[str]:
        """Each code cell's text in `module`, its masked lines restored."""
        parts = module.removesuffix("\n").split(f"\n{BOUNDARY}\n")
        if len(parts) != len(self.cells):
            raise ValueError("the fix moved a notebook cell boundary; not written")
        texts = []
        for part, magics in zip(parts, self.magics):
            lines, pending = part.split("\n"), list(magics)
            for index, line in enumerate(lines):
                if MASKED_LINE.match(line.strip()):
                    if not pending:
                        raise ValueError("the fix changed a masked IPython line; not written")
                    lines[index] = pending.pop(0)
            if pending:
                raise ValueError("the fix removed a masked IPython line; not written")
            first = next((line for line in lines if line.strip()), "")  # IPython skips blank lines above it
            if magics and CELL_MAGIC.match(magics[0]) and first != magics[0]:
                raise ValueError(f"the fix put code above `{magics[0].strip()[:40]}`, which must stay its cell's "
                                 "first line; not written")
            texts.append("\n".join(lines))
        return texts


def notebook_code(raw: str) -> NotebookCode:
    """ValueError when the file is not a notebook (not JSON, no cell list, a cell source that is not text)."""
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not a Jupyter notebook: invalid JSON at line {exc.lineno} ({exc.msg})") from None
    except RecursionError:  # valid JSON nested deeper than the decoder recurses (a hostile user, round 22)
        raise ValueError("not a Jupyter notebook advisor reads: its JSON nests too deep for Python's decoder") \
            from None
    cells = document.get("cells") if isinstance(document, dict) else None
    if not isinstance(cells, list) and isinstance(document, dict) and "worksheets" in document:
        raise ValueError("not a Jupyter notebook advisor reads: nbformat 3 (`jupyter nbconvert --to notebook "
                         "--inplace` converts it to nbformat 4)")
    if not isinstance(cells, list):
        raise ValueError("not a Jupyter notebook: no list of cells (nbformat 4)")
    lines: list[str] = []
    starts, numbers, magics = [], [], []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = _joined(cell.get("source", ""))
        if not isinstance(source, str):
            raise ValueError(f"not a Jupyter notebook: cell {number} has a source that is not text")
        if starts:
            lines.append(BOUNDARY)
        starts.append(len(lines) + 1)
        numbers.append(number)
        cell_lines = _code_lines(source)
        masked = _masked(cell_lines) or [""]
        magics.append(tuple(o for o, m in zip(cell_lines, masked) if o != m))
        lines.extend(masked)
    return NotebookCode("\n".join(lines) + "\n", tuple(starts), tuple(numbers), raw, tuple(magics))


def _joined(source):
    return "".join(source) if isinstance(source, list) and all(isinstance(s, str) for s in source) else source


def _code_lines(source: str) -> list[str]:
    """The source's lines as Python reads them: a form feed or U+2028 inside a string literal splits no line."""
    lines = CODE_NEWLINE.split(source)
    return lines[:-1] if lines[-1] == "" else lines


def _with_newlines_of(source: str, lines: list[str]) -> str:
    """`lines` (a fixed cell) joined with the newlines `source` has where its lines are kept or rewritten one for
    one (re-indented too), and the cell's first newline on the lines the fix added: a cell of mixed CRLF and LF
    lines keeps each kept line's own (breaker round 16: every newline of a fixed cell became its first)."""
    old = CODE_LINE.findall(source)
    bare = [line.rstrip("\r\n") for line in old]
    ends = [None] * len(lines)
    matcher = difflib.SequenceMatcher(None, [line.strip() for line in bare], [line.strip() for line in lines],
                                      autojunk=False)  # a kept line the fix re-indents (moved under an `else:`)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or tag == "replace" and i2 - i1 == j2 - j1:  # kept, or rewritten line for line
            for offset in range(j2 - j1):
                ends[j1 + offset] = old[i1 + offset][len(bare[i1 + offset]):]
    newline = _newline(source)
    joined = [line + (end or newline) for line, end in zip(lines, ends)]
    if not source.endswith(("\n", "\r")):  # the cell's last line had no newline, and keeps none
        joined[-1] = lines[-1]
    return "".join(joined)


def _newline(source: str) -> str:
    """The newline a cell's source is written with, so a rewritten cell keeps its CRs."""
    first = CODE_NEWLINE.search(source)
    return first.group() if first else "\n"


def _code_cells(document: dict) -> list[dict]:
    return [c for c in document["cells"] if isinstance(c, dict) and c.get("cell_type") == "code"]


def _layout(document: dict, raw: str):
    """The json.dumps settings that write `raw` back byte for byte (nbformat's: indent 1, sorted keys, UTF-8, a
    final newline), so a fix changes nothing but the cells it rewrites; ValueError when none does. Its newlines
    may be CRLF (git's autocrlf checkout on Windows): json.dumps writes a newline only between tokens (one in a
    string is escaped), so CRLF is its text with every newline replaced."""
    newline = "\r\n" if "\r\n" in raw else "\n"
    first = re.search(r"\n( *)\S", raw.rstrip())  # the indent is the first inner line's (no inner line: none)
    indent = len(first.group(1)) if first else None
    for separators in (None, (",", ":")):  # json.dumps' default, or compact
        for sort_keys in (True, False):
            for ensure_ascii in (False, True):
                settings = dict(indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)
                text = json.dumps(document, **settings).replace("\n", newline)
                if raw in (text, text + newline):
                    end = raw[len(text):]
                    return lambda changed: json.dumps(changed, **settings).replace("\n", newline) + end
    raise ValueError("the notebook's JSON is not laid out as json.dumps writes it (nbformat does); not written")


def _masked(cell_lines: list[str]) -> list[str]:
    """A cell magic makes the whole cell IPython's (`%%bash`, `%%html`): every line becomes a comment, except under
    the magics that run their body as Python (`%%time`, `%%capture`: PYTHON_CELL_MAGICS), whose body is read as any
    cell (a gradient penalty timed by `%%time` still asks autograd for double backward) and whose magic line reads
    the names it spells. A line magic or shell escape becomes `pass` at its indentation, so a block that holds only
    it still parses; only where a statement starts, as IPython reads them (`% b)` continuing a bracket, or a
    string's line, is Python)."""
    blank = next((i for i, line in enumerate(cell_lines) if line.strip()), len(cell_lines))
    if blank < len(cell_lines) and CELL_MAGIC.match(cell_lines[blank]):  # IPython skips blank lines above it
        name = (cell_lines[blank].lstrip()[2:].split() or [""])[0]
        if name in PYTHON_CELL_MAGICS:
            return cell_lines[:blank] + [_line_mask(cell_lines[blank])] + _masked(cell_lines[blank + 1:])
        return [CELL_MAGIC_MASK] * len(cell_lines)
    masked: list[str] = []
    continued = False  # the previous line was a magic's, ended by a backslash: this one is the magic's too
    for line in cell_lines:
        if continued:
            masked.append(CONTINUED_MAGIC_MASK)
        else:
            magic = MAGIC_LINE.match(line)
            starts = magic and _statement_ends(masked)
            masked.append(f"{_indentation(masked, magic.group(1))}{_line_mask(line)}" if starts else line)
            continued = bool(starts)
        continued = continued and line.rstrip().endswith("\\")
    return masked


def _indentation(masked: list[str], own: str) -> str:
    """A masked magic's indentation: its own, unless that would open a block no statement opens (IPython runs
    `  %matplotlib inline` at the top of a cell): then the previous statement's."""
    previous = next((line for line in reversed(masked) if line.strip() and not line.lstrip().startswith("#")), None)
    if previous is None:
        return ""
    indent = previous[:len(previous) - len(previous.lstrip())]
    opens = previous.split("#", 1)[0].rstrip().endswith(":")
    return own if opens or len(own) <= len(indent) else indent


def _statement_of(line: str) -> str | None:
    """The statement a `%time STATEMENT` line runs (no options), at the line's indentation, where it parses alone."""
    match = PYTHON_LINE_MAGIC.match(line)
    if match is None:
        return None
    statement = f"{match.group(1)}{match.group(2)}"
    try:
        ast.parse(statement.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return statement


def _line_mask(line: str) -> str:
    """`pass`, or a call reading every name the line spells (keywords aside), on one line."""
    names = [name for name in dict.fromkeys(IDENTIFIER.findall(line)) if not keyword.iskeyword(name) and
             name.isascii()]
    return f"{READ_MASK_CALL}({', '.join(names)})  # (IPython magic)" if names else LINE_MAGIC_MASK


def _statement_ends(lines: list[str]) -> bool:
    """Whether `lines` end between statements: no bracket, string or backslash continuation left open."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO("".join(f"{line}\n" for line in lines)).readline):
            pass
    except tokenize.TokenError:
        return False
    except SyntaxError:  # a dedent that matches no block: the parse reports it; the line starts a statement
        return True
    return True

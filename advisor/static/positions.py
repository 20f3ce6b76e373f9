"""Positions (libcst's PositionProvider ranges) computed one top-level statement at a time: the provider
regenerates the code of the whole file to count lines and columns, while a finding needs the lines of a few nodes
of one class or function. Each top-level statement's first line comes from CPython's `ast` (a fraction of the
cost), and the statement's regenerated code is checked against the source at that line before its positions are
used; where the check fails (or `ast` cannot read the file) the whole file's positions are computed as before."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from advisor.static.python_ast import python_tree

NEWLINE = re.compile(r"\r\n?|\n")  # what libcst counts as a line break


class StatementPositions:
    """node -> CodeRange, as `wrapper.resolve(PositionProvider)` maps it."""

    def __init__(self, wrapper: MetadataWrapper, source: str, parent_of: Callable[[cst.CSTNode], cst.CSTNode | None]):
        self.wrapper, self.module, self.source, self.parent_of = wrapper, wrapper.module, source, parent_of
        self.computed: dict[cst.CSTNode, CodeRange] = {}
        self.done: set[cst.CSTNode] = set()  # top-level statements whose positions are in `computed`
        self.whole = False
        self._starts: dict[cst.CSTNode, int] | None = None
        self._line_offsets: list[int] | None = None
        self._ends: dict[cst.CSTNode, int | None] | None = None  # top-level statement -> the next one's first line

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        if node not in self.computed and not self.whole:
            statement = self._top_level(node)
            if statement is None or statement in self.done or not self._one_statement(statement):
                self._whole_file()
        return self.computed[node]

    def _top_level(self, node: cst.CSTNode) -> cst.CSTNode | None:
        parent = self.parent_of(node)
        while parent is not None and parent is not self.module:
            node, parent = parent, self.parent_of(parent)
        return node if parent is self.module and node in self.starts else None

    @property
    def starts(self) -> dict[cst.CSTNode, int]:
        """Top-level statement -> the line its code (leading comments and blank lines included) starts on."""
        if self._starts is None:
            self._starts = _statement_starts(self.module, self.source)
        return self._starts

    def region(self, node: cst.CSTNode) -> tuple[str, bool] | None:
        """The source lines from the first line of the top-level statement holding `node` to the next one's first
        line, as `ast` places them, and whether they are exactly `node`'s code (a top-level statement other than
        the last, whose lines run on into the module's footer); None where `ast` gives no lines. Every line of
        the statement's code lies in them, so a word missing from them is missing from the code, without
        regenerating it."""
        statement = self._top_level(node)
        if statement is None:
            return None
        if self._ends is None:
            lines = list(self.starts.values())
            self._ends = dict(zip(self.starts, lines[1:] + [None]))
        end = self._ends[statement]
        text = self.source[self.offset(self.starts[statement]):None if end is None else self.offset(end)]
        return text, statement is node and end is not None

    def _one_statement(self, statement: cst.CSTNode) -> bool:
        provider = PositionProvider()
        provider._computed = {}
        state = PositionProvidingCodegenState(default_indent=self.module.default_indent,
                                              default_newline=self.module.default_newline, provider=provider,
                                              line=self.starts[statement])
        statement._codegen(state)
        if not self.source.startswith("".join(state.tokens), self.offset(self.starts[statement])):
            return False
        self.computed.update(provider._computed)
        self.done.add(statement)
        return True

    def offset(self, line: int) -> int:
        """Where line `line` (1-based) starts in the source; past its end for a line it does not have."""
        if self._line_offsets is None:
            self._line_offsets = [0] + [match.end() for match in NEWLINE.finditer(self.source)]
        return self._line_offsets[line - 1] if 0 < line <= len(self._line_offsets) else len(self.source) + 1

    def _whole_file(self) -> None:
        self.computed = dict(PositionProvider()._gen(self.wrapper))
        self.whole = True


def _statement_starts(module: cst.Module, source: str) -> dict[cst.CSTNode, int]:
    """Each top-level statement's first line: its first `ast` statement's line (the first decorator's, for a
    decorated one) less its leading lines; empty when `ast` cannot read the source or the two parsers disagree on
    the number of statements."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            body = python_tree(source).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return {}
    starts, index = {}, 0
    for statement in module.body:
        if index >= len(body):
            return {}
        first = body[index]
        decorators = getattr(first, "decorator_list", None)
        line = decorators[0].lineno if decorators else first.lineno
        starts[statement] = line - len(statement.leading_lines)
        index += len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
    return starts if index == len(body) else {}
